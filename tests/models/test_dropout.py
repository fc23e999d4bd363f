"""Counter-based dropout: masks depend on global ids and the key only, at the right rate."""

from __future__ import annotations

import pytest
import torch

from leo_cli.models.dropout import counter_dropout, keep_mask, stream_key


def test_mask_of_any_row_subset_equals_the_full_mask() -> None:
    ids = torch.arange(5000)
    key = stream_key(seed=3, epoch=7, layer=1)
    full = keep_mask(ids, 37, key, 0.5)
    subset = torch.randperm(5000, generator=torch.Generator().manual_seed(0))[:1234]
    assert torch.equal(keep_mask(ids[subset], 37, key, 0.5), full[subset])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_keep_rate_and_unbiased_scale(p: float) -> None:
    x = torch.ones(20000, 64, dtype=torch.float64)
    y = counter_dropout(x, torch.arange(20000), p, stream_key(0, 1, 0))
    assert (y > 0).double().mean().item() == pytest.approx(1 - p, abs=0.01)
    assert y.mean().item() == pytest.approx(1.0, abs=0.01)


def test_keys_give_independent_masks() -> None:
    ids = torch.arange(4000)
    a = keep_mask(ids, 64, stream_key(0, 1, 0), 0.5).double() - 0.5
    for other in (stream_key(0, 2, 0), stream_key(0, 1, 1), stream_key(1, 1, 0)):
        b = keep_mask(ids, 64, other, 0.5).double() - 0.5
        assert abs((a * b).mean().item() * 4) < 0.02


def test_zero_rate_is_identity() -> None:
    x = torch.randn(10, 3)
    assert counter_dropout(x, torch.arange(10), 0.0, 5) is x
