"""Neighbour rows in a narrower type (`pipeline.halo_dtype`), the same on every worker count.

Every row an aggregation reads is rounded, the worker's own rows included, by a rule that
depends on the row alone (its values, and for `int8` its global id and a key), so 1, 2 or 4
workers train the same model for a given type. `bfloat16` rounds to nearest; `float16` and
`int8` scale each row by a power of two whose exponent travels with it as one byte.

Specification: docs/design/rounding.md.
Legend: X rows, F width, W wire width (bytes for scaled rows).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from leo_cli.util.keyed import random_bytes, salted

_BACKWARD_SALT = 0x6A09E667F3BCC909  # gradients draw from a stream of their own
SCALE_BYTES = 1  # a scaled row carries its scale's exponent
INT8_MAX = 127
NOT_FINITE = -128  # the exponent of a row that held a value not finite: decodes to NaN
MIN_EXP, MAX_EXP = -126, 126  # powers of two whose inverse is a normal float32 too


class RowCodec(Protocol):
    """How rows are rounded, and packed for the wire."""

    name: str
    wire_dtype: torch.dtype  # the type rows travel in
    element_bytes: int  # bytes of one element on the wire...
    row_bytes: int  # ... and of what a row carries besides (its scale)
    stochastic: bool  # draws random bytes (keyed) to round

    def wire_width(self, width: int) -> int:
        """Elements of the wire type per row of `width`."""
        ...

    def encode(self, h_XF: Tensor, ids_X: Tensor, key: int | None) -> Tensor:
        """Rows as they travel (`ids_X`: their global ids; `key`: None rounds to nearest)."""
        ...

    def decode(self, wire_XW: Tensor, dtype: torch.dtype) -> Tensor:
        """The rounded rows in `dtype`, from their wire form."""
        ...


def pow2(e_X: Tensor, dtype: torch.dtype) -> Tensor:
    """2**e in `dtype`, built from its bits (exact), for MIN_EXP <= e <= MAX_EXP."""
    if dtype == torch.float64:
        return ((e_X.to(torch.int64) + 1023) << 52).view(torch.float64)
    return ((e_X.to(torch.int32) + 127) << 23).view(torch.float32).to(dtype)


def exponents(top_X: Tensor, bound: float) -> Tensor:
    """int8 e per row, the smallest with `top <= bound * 2**e` (MIN_EXP at least; a row of
    zeros gets 0), or NOT_FINITE where `top` is not finite or needs more than MAX_EXP."""
    m_X, e_X = torch.frexp(top_X / bound)  # top / bound = m * 2**e, m in [0.5, 1)
    e_X = e_X - (m_X == 0.5).to(e_X.dtype)  # an exact power of two is its own bound
    e_X = torch.where(top_X > 0, e_X, torch.zeros_like(e_X)).clamp_(min=MIN_EXP)
    bad = ~torch.isfinite(top_X) | (e_X > MAX_EXP)
    return torch.where(bad, torch.full_like(e_X, NOT_FINITE), e_X).to(torch.int8)


def _unscaled(h_XF: Tensor, e_X: Tensor) -> Tensor:
    """h / 2**e per row (rows whose e is NOT_FINITE: NaN)."""
    finite = e_X != NOT_FINITE
    scale_X = pow2(torch.where(finite, -e_X, torch.zeros_like(e_X)), h_XF.dtype)
    out = h_XF * scale_X.unsqueeze(1)
    return torch.where(finite.unsqueeze(1), out, torch.full_like(out, float("nan")))


def _pack(values_XF: Tensor, e_X: Tensor) -> Tensor:
    """The values' bytes, then the exponent: one uint8 row per row."""
    return torch.cat([values_XF.view(torch.uint8), e_X.view(torch.uint8).unsqueeze(1)], 1)


def _scaled(values_XF: Tensor, wire_XW: Tensor, dtype: torch.dtype) -> Tensor:
    """values * 2**e per row, the exponent read from the last byte of the wire rows."""
    e_X = wire_XW[:, -SCALE_BYTES].view(torch.int8)
    finite = e_X != NOT_FINITE
    scale_X = pow2(torch.where(finite, e_X, torch.zeros_like(e_X)), dtype)
    out = values_XF.to(dtype) * scale_X.unsqueeze(1)
    return torch.where(finite.unsqueeze(1), out, torch.full_like(out, float("nan")))


class BFloat16Codec:
    """Round to nearest in bfloat16 (float32's exponent range: no scale needed)."""

    name, wire_dtype, element_bytes, row_bytes = "bfloat16", torch.bfloat16, 2, 0
    stochastic = False

    def wire_width(self, width: int) -> int:
        return width

    def encode(self, h_XF: Tensor, ids_X: Tensor, key: int | None) -> Tensor:
        return h_XF.to(torch.bfloat16)

    def decode(self, wire_XW: Tensor, dtype: torch.dtype) -> Tensor:
        return wire_XW.to(dtype)


class Float16Codec:
    """A power-of-two scale per row bringing its largest magnitude into [0.5, 1], then round
    to nearest in float16; packed as bytes."""

    name, wire_dtype, element_bytes, row_bytes = "float16", torch.uint8, 2, SCALE_BYTES
    stochastic = False

    def wire_width(self, width: int) -> int:
        return 2 * width + SCALE_BYTES

    def encode(self, h_XF: Tensor, ids_X: Tensor, key: int | None) -> Tensor:
        e_X = exponents(h_XF.abs().amax(1), 1.0)
        return _pack(_unscaled(h_XF, e_X).to(torch.float16), e_X)

    def decode(self, wire_XW: Tensor, dtype: torch.dtype) -> Tensor:
        # A fresh copy: a slice of one row counts as contiguous with the wire's odd stride,
        # which a view as float16 refuses.
        values_XW = wire_XW.new_empty((wire_XW.shape[0], wire_XW.shape[1] - SCALE_BYTES))
        values_XW.copy_(wire_XW[:, :-SCALE_BYTES])
        return _scaled(values_XW.view(torch.float16), wire_XW, dtype)


class Int8Codec:
    """A power-of-two scale per row and stochastic rounding to int8, packed as bytes."""

    name, wire_dtype, element_bytes, row_bytes = "int8", torch.uint8, 1, SCALE_BYTES
    stochastic = True

    def wire_width(self, width: int) -> int:
        return width + SCALE_BYTES

    def encode(self, h_XF: Tensor, ids_X: Tensor, key: int | None) -> Tensor:
        e_X = exponents(h_XF.abs().amax(1), float(INT8_MAX))
        y_XF = _unscaled(h_XF, e_X)  # |y| <= 127; exact (a power of two)
        if key is None:
            q_XF = torch.round(y_XF)
        else:  # floor(y + u), u uniform in (0, 1) on a grid of 1/256
            u_XF = random_bytes(ids_X, h_XF.shape[1], key).to(h_XF.dtype).add_(0.5).div_(256)
            q_XF = torch.floor(y_XF.add_(u_XF))
        q_XF = torch.nan_to_num(q_XF, nan=0.0).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        return _pack(q_XF, e_X)

    def decode(self, wire_XW: Tensor, dtype: torch.dtype) -> Tensor:
        return _scaled(wire_XW[:, :-SCALE_BYTES].view(torch.int8), wire_XW, dtype)


CODECS: dict[str, RowCodec | None] = {
    "float32": None,  # rows as computed, in train.dtype
    "bfloat16": BFloat16Codec(),
    "float16": Float16Codec(),
    "int8": Int8Codec(),
}


def wire_bytes(halo_dtype: str, width: int, dtype_bytes: int) -> int:
    """Bytes of one row of `width` as it travels (`dtype_bytes`: the training dtype's)."""
    codec = CODECS[halo_dtype]
    if codec is None:
        return width * dtype_bytes
    return width * codec.element_bytes + codec.row_bytes


def backward_key(key: int | None) -> int | None:
    """The key of a layer's gradient rows: a stream apart from its forward rows'."""
    if key is None:
        return None
    return salted(key, _BACKWARD_SALT)
