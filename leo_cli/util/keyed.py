"""Counter-based random numbers: every (key, row id, column) gets its own, on any worker.

splitmix64 over int64 tensors: a row's numbers depend on its global id and a key only, never
on which worker draws them or how many rows it draws at once. The dropout masks
(models/dropout.py) and the stochastic rounding of halo rows (comm/rounding.py) draw here.
Legend: N rows, F columns, G groups of eight columns.
"""

from __future__ import annotations

import torch
from torch import Tensor

_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # int64 views of the splitmix64 constants
_MUL1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MUL2 = 0x94D049BB133111EB - (1 << 64)
_COL_SALT = 0x5851F42D4C957F2D


# Shift amounts as 0-d tensors: `z >> 30` with a Python int takes a slow scalar path on the
# CPU (12 ms against 3 ms for a 0-d tensor on 200k x 8 int64, one thread); same result.
_BITS = {bits: torch.tensor(bits, dtype=torch.int64) for bits in (27, 30, 31)}


def _shr(z: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 (torch's `>>` is arithmetic, so mask the sign bits)."""
    return (z >> _BITS[bits]) & ((1 << (64 - bits)) - 1)


def mix64(z: Tensor) -> Tensor:
    """The splitmix64 finaliser, elementwise: a bijection of int64 (multiplication wraps)."""
    z = (z ^ _shr(z, 30)) * _MUL1
    z = (z ^ _shr(z, 27)) * _MUL2
    return z ^ _shr(z, 31)


def splitmix64(z: Tensor) -> Tensor:
    """One splitmix64 step: the golden-ratio increment, then the finaliser."""
    return mix64(z + _GOLDEN)


_MASK = (1 << 64) - 1


def mix64_int(z: int) -> int:
    """`mix64` of one int64 as a Python int (the same bits, as a signed value): a key's few
    hashes per layer and epoch without a tensor op each."""
    z &= _MASK
    z = ((z ^ (z >> 30)) * (_MUL1 & _MASK)) & _MASK
    z = ((z ^ (z >> 27)) * (_MUL2 & _MASK)) & _MASK
    z ^= z >> 31
    return z - (1 << 64) if z >> 63 else z


def splitmix64_int(z: int) -> int:
    """`splitmix64` of one int64 as a Python int (signed, like the tensor's value)."""
    return mix64_int(z + _GOLDEN)


def random_bytes(ids_N: Tensor, num_cols: int, key: int) -> Tensor:
    """uint8 [N, F]: one random byte per (row id, column) under `key`.

    Rows and groups of eight columns are hashed once with splitmix64; one 64-bit finaliser
    over their xor then yields eight random bytes, one per entry. The row hash keeps all 64
    bits: it is a bijection of `id ^ key`, so two rows never share a stream (a 32-bit row
    hash made thousands of rows of a 2.4M-node graph share their whole stream).
    """
    num_groups = (num_cols + 7) // 8
    row_N = splitmix64(ids_N.to(torch.int64) ^ key)
    groups = torch.arange(num_groups, dtype=torch.int64, device=ids_N.device)
    col_G = splitmix64(groups + _COL_SALT)
    hashed_NG = mix64(row_N.unsqueeze(1) ^ col_G)
    return hashed_NG.view(torch.uint8).view(ids_N.shape[0], 8 * num_groups)[:, :num_cols]


def salted(key: int, salt: int) -> int:
    """A key of its own derived from `key` (a stream apart from the key's: `salt` tells them
    apart)."""
    return splitmix64_int(key ^ salt)
