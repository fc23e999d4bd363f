"""The scalar hashes of util/keyed.py give the bits the tensor ones give, so the keys of every
layer and epoch (models/dropout.py) are the ones the tensors drew."""

from __future__ import annotations

import torch

from leo_cli.models.dropout import rows_key, stream_key
from leo_cli.util.keyed import mix64, mix64_int, salted, splitmix64, splitmix64_int

EDGES = [0, 1, -1, 2**63 - 1, -(2**63), 2**62, 0x9E3779B97F4A7C15 - (1 << 64)]


def test_scalar_hashes_match_the_tensor_ones_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.cat([torch.tensor(EDGES), torch.randint(-(2**63), 2**63 - 1, (2000,), generator=g)])
    assert [mix64_int(v) for v in z.tolist()] == mix64(z).tolist()
    assert [splitmix64_int(v) for v in z.tolist()] == splitmix64(z).tolist()


def test_keys_are_the_tensor_hashes_of_seed_epoch_and_layer() -> None:
    def by_tensors(seed: int, epoch: int, layer: int) -> int:
        t = splitmix64(torch.tensor([seed], dtype=torch.int64))
        return int(splitmix64(splitmix64(t ^ epoch) ^ layer).item())

    for seed, epoch, layer in [(0, 1, 0), (0, 200, 1), (2**63 - 1, 7, 3), (12345, 0, 0)]:
        key = stream_key(seed, epoch, layer)
        assert key == by_tensors(seed, epoch, layer)
        assert -(2**63) <= key < 2**63
        salt = 0x3C6EF372FE94F82B
        want = int(splitmix64(torch.tensor([key ^ salt], dtype=torch.int64)).item())
        assert salted(key, salt) == want
        assert rows_key(seed, epoch, layer) == want
