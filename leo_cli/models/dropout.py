"""Dropout whose mask depends on (seed, epoch, layer, global node id, column), not on the worker.

A counter-based generator (splitmix64 over int64 tensors) gives every entry of the matrix its
own random number, so P = 1, 2, 4 workers drop exactly the same entries and produce the same
numbers. Attention dropout (GAT) uses the same masks with an edge's two global ids in place of
the node id and one column per head. Legend: N rows (nodes), F columns, E edges, H heads.
"""

from __future__ import annotations

import torch
from torch import Tensor

_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # int64 views of the splitmix64 constants
_MUL1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MUL2 = 0x94D049BB133111EB - (1 << 64)
_COL_SALT = 0x5851F42D4C957F2D
_ATTENTION_SALT = 0x2545F4914F6CDD1D  # separates a layer's attention stream from its inputs'
_CHUNK_ROWS = 1 << 15  # bounds the int64 temporaries to a few MB per chunk


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


def stream_key(seed: int, epoch: int, layer: int) -> int:
    """One int64 key per (seed, epoch, layer), for 0 <= seed < 2**63 (`run.seed`'s range).

    The parts are hashed in turn (each step is a bijection), so every bit of each changes
    the key; a linear mix of them overflowed int64 for large seeds.
    """
    z = splitmix64(torch.tensor([seed], dtype=torch.int64))
    z = splitmix64(z ^ epoch)
    return int(splitmix64(z ^ layer).item())


def threshold(p: float) -> int:
    """Drop an entry when its random byte is below this; p is rounded to a multiple of 1/256."""
    return min(255, round(p * 256))


def keep_mask(ids_N: Tensor, num_cols: int, key: int, p: float) -> Tensor:
    """Boolean [N, F] mask: entry (i, j) kept with probability 1 - threshold(p)/256.

    Rows and groups of eight columns are hashed once with splitmix64; one 64-bit finaliser
    over their xor then yields eight random bytes, one per entry, which keeps dropout cheap
    next to the aggregation it precedes. The row hash keeps all 64 bits: it is a bijection
    of `id ^ key`, so two rows never share a stream (a 32-bit row hash made thousands of rows
    of a 2.4M-node graph share their whole mask).
    """
    num_groups = (num_cols + 7) // 8
    row_N = splitmix64(ids_N.to(torch.int64) ^ key)
    groups = torch.arange(num_groups, dtype=torch.int64, device=ids_N.device)
    col_G = splitmix64(groups + _COL_SALT)
    hashed_NG = mix64(row_N.unsqueeze(1) ^ col_G)
    bytes_NF = hashed_NG.view(torch.uint8).view(ids_N.shape[0], 8 * num_groups)[:, :num_cols]
    return bytes_NF >= threshold(p)


def counter_dropout(x_NF: Tensor, ids_N: Tensor, p: float, key: int) -> Tensor:
    """Inverted dropout with a mask that only depends on global row ids and the key."""
    if p == 0.0:
        return x_NF
    scale = 256.0 / (256 - threshold(p))  # 1 / (keep probability): unbiased after rounding
    masks = [
        keep_mask(ids_N[s : s + _CHUNK_ROWS], x_NF.shape[1], key, p)
        for s in range(0, ids_N.shape[0], _CHUNK_ROWS)
    ]
    mask_NF = torch.cat(masks) if masks else torch.zeros_like(x_NF, dtype=torch.bool)
    return torch.where(mask_NF, x_NF * scale, torch.zeros((), dtype=x_NF.dtype))


def attention_key(seed: int, epoch: int, layer: int) -> int:
    """The key of a layer's attention dropout: a stream of its own beside its input dropout."""
    z = torch.tensor([stream_key(seed, epoch, layer) ^ _ATTENTION_SALT], dtype=torch.int64)
    return int(splitmix64(z).item())


def edge_ids(src_E: Tensor, dst_E: Tensor) -> Tensor:
    """One int64 id per (global source, global destination) pair, the same on every worker."""
    return splitmix64(splitmix64(dst_E.to(torch.int64)) ^ src_E.to(torch.int64))
