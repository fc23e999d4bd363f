"""Dropout whose mask depends on (seed, epoch, layer, global node id, column), not on the worker.

A counter-based generator (splitmix64 over int64 tensors) gives every entry of the matrix its
own random number, so P = 1, 2, 4 workers drop exactly the same entries and produce the same
numbers. Attention dropout (GAT) uses the same masks with an edge's two global ids in place of
the node id and one column per head. Legend: N rows (nodes), F columns, E edges, H heads.
"""

from __future__ import annotations

import weakref
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor

from leo_cli import kernels
from leo_cli.registry import KEPT_DROPPED_BYTES
from leo_cli.util.keyed import random_bytes, salted, splitmix64, splitmix64_int

_ATTENTION_SALT = 0x2545F4914F6CDD1D  # separates a layer's attention stream from its inputs'
_ROWS_SALT = 0x3C6EF372FE94F82B  # ... and the rounding of the rows it reads
_CHUNK_ROWS = 1 << 15  # bounds the int64 temporaries to a few MB per chunk


def stream_key(seed: int, epoch: int, layer: int) -> int:
    """One int64 key per (seed, epoch, layer), for 0 <= seed < 2**63 (`run.seed`'s range).

    The parts are hashed in turn (each step is a bijection), so every bit of each changes
    the key; a linear mix of them overflowed int64 for large seeds.
    """
    return splitmix64_int(splitmix64_int(splitmix64_int(seed) ^ epoch) ^ layer)


def threshold(p: float) -> int:
    """Drop an entry when its random byte is below this; p is rounded to a multiple of 1/256."""
    return min(255, round(p * 256))


def keep_mask(ids_N: Tensor, num_cols: int, key: int, p: float) -> Tensor:
    """Boolean [N, F] mask: entry (i, j) kept with probability 1 - threshold(p)/256, from
    one random byte per entry (util/keyed.py), which keeps dropout cheap next to the
    aggregation it precedes."""
    return random_bytes(ids_N, num_cols, key) >= threshold(p)


def keep_scale(p: float, dtype: torch.dtype) -> float:
    """1 / (keep probability), unbiased after `threshold`'s rounding, as `dtype` holds it (the
    multiplier a kept entry gets)."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    return float(torch.tensor(256.0 / (256 - threshold(p)), dtype=wide).to(dtype))


def counter_dropout(x_NF: Tensor, ids_N: Tensor, p: float, key: int) -> Tensor:
    """Inverted dropout with a mask that only depends on global row ids and the key. Without
    a gradient to x (the input features) in one op (`kernels.keyed_dropout`) that allocates no
    multiplier as large as x."""
    if p == 0.0:
        return x_NF
    scale = keep_scale(p, x_NF.dtype)
    if not (x_NF.requires_grad and torch.is_grad_enabled()):
        return kernels.keyed_dropout(x_NF, ids_N, key, threshold(p), scale)
    mult_NF = torch.empty_like(x_NF)
    for s in range(0, ids_N.shape[0], _CHUNK_ROWS):
        mult_NF[s : s + _CHUNK_ROWS] = keep_mask(ids_N[s : s + _CHUNK_ROWS], x_NF.shape[1], key, p)
    out: Tensor = _Scale.apply(x_NF, mult_NF.mul_(scale))  # type: ignore[no-untyped-call]
    return out


class Recomputed:
    """Keeps dropped copies of tensors without a gradient (the input features) out of memory
    between the forward and the backward: inside `saving()`, a layer that saves such a copy
    for its backward (a linear map's weight gradient needs its input) saves how to draw it
    instead, and the backward draws it again from the same keyed masks, the same numbers.
    The hooks are Python's: a compiled model would not trace them.

    A copy under `KEPT_BYTES` is kept as it is: drawing it again costs a pass over x in every
    backward, which on a small graph (Cora: 8 MB of features a worker) is time that holding it
    would not cost."""

    KEPT_BYTES = KEPT_DROPPED_BYTES  # small beside a worker's memory, large beside Cora's x

    def __init__(self) -> None:
        self._drawn: list[tuple[weakref.ref[Tensor], int, tuple[Tensor, Tensor, float, int]]] = []

    def dropout(self, x_NF: Tensor, ids_N: Tensor, p: float, key: int) -> Tensor:
        """`counter_dropout(x_NF, ids_N, p, key)`, remembered when x needs no gradient and the
        copy is not under `KEPT_BYTES`."""
        out_NF = counter_dropout(x_NF, ids_N, p, key)
        large = out_NF.numel() * out_NF.element_size() >= self.KEPT_BYTES
        if out_NF is not x_NF and not x_NF.requires_grad and large:
            self._drawn.append((weakref.ref(out_NF), out_NF._version, (x_NF, ids_N, p, key)))
        return out_NF

    def saving(self) -> AbstractContextManager[None]:
        """The saved-tensor hooks to run the layer under (none where nothing was dropped)."""
        if not self._drawn:
            return nullcontext()
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: Tensor) -> Any:
        for ref, version, recipe in self._drawn:
            out_NF = ref()
            if (
                out_NF is not None
                and out_NF._version == version  # not written since it was drawn
                and t.layout == torch.strided
                and t.data_ptr() == out_NF.data_ptr()
                and t.shape == out_NF.shape
                and t.stride() == out_NF.stride()
                and t.dtype == out_NF.dtype
            ):
                return _Redraw(recipe)
        return t

    @staticmethod
    def _unpack(saved: Any) -> Tensor:
        if isinstance(saved, _Redraw):
            return counter_dropout(*saved.recipe)
        assert isinstance(saved, Tensor)
        return saved


class _Redraw:
    """What a saved dropped copy is replaced by: the arguments of `counter_dropout`."""

    def __init__(self, recipe: tuple[Tensor, Tensor, float, int]) -> None:
        self.recipe = recipe


def relu_dropout(h_NF: Tensor, bias_F: Tensor | None, ids_N: Tensor, p: float, key: int) -> Tensor:
    """`counter_dropout(relu(h + bias), ids_N, p, key)` in one pass over the rows (the leo::
    op `bias_relu_dropout`): the same masks, the same numbers, forward and backward."""
    t = threshold(p) if p > 0 else 0
    scale = keep_scale(p, h_NF.dtype) if t > 0 else 1.0
    return kernels.bias_relu_dropout(h_NF, bias_F, ids_N, key, t, scale)


class _Scale(torch.autograd.Function):
    """x -> x·m for a constant multiplier m (0 or 1/keep): one pass each way. (`torch.where`
    on the mask and its backward took twice as long on the CPU, measured on 200k x 64.)"""

    @staticmethod
    def forward(ctx: Any, x_NF: Tensor, mult_NF: Tensor) -> Tensor:
        ctx.save_for_backward(mult_NF)
        return x_NF * mult_NF

    @staticmethod
    def backward(ctx: Any, grad_NF: Tensor) -> tuple[Tensor, None]:
        (mult_NF,) = ctx.saved_tensors
        return grad_NF * mult_NF, None


def attention_key(seed: int, epoch: int, layer: int) -> int:
    """The key of a layer's attention dropout: a stream of its own beside its input dropout."""
    return salted(stream_key(seed, epoch, layer), _ATTENTION_SALT)


def rows_key(seed: int, epoch: int, layer: int) -> int:
    """The key of the stochastic rounding of a layer's rows (comm/rounding.py), a stream
    apart from the layer's dropout and attention dropout."""
    return salted(stream_key(seed, epoch, layer), _ROWS_SALT)


def edge_ids(src_E: Tensor, dst_E: Tensor) -> Tensor:
    """One int64 id per (global source, global destination) pair, the same on every worker."""
    return splitmix64(splitmix64(dst_E.to(torch.int64)) ^ src_E.to(torch.int64))
