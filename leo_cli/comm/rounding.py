"""Neighbour rows in a narrower type (`pipeline.halo_dtype`), the same on every worker count.

Quantizing only the rows that cross a cut (AdaQP and its successors) makes the numbers depend
on the partition. Here every row an aggregation reads is rounded, the worker's own rows
included and on one worker too, by a rule that depends on the row alone: its values, and for
`int8` its global id and a key. A row is then the same number wherever it is read, so 1, 2
or 4 workers train the same model for a given type.

- `bfloat16`, `float16`: round to nearest; rows travel in that type (2 bytes an element).
- `int8`: a scale per row, the smallest power of two at or above its largest magnitude / 127
  (float32's whole range, since gradient rows are small; one byte, its exponent; exact to
  multiply by), and stochastic rounding, `floor(x / scale + u)`, whose `u` comes from the
  counter-based generator of the dropout masks keyed by (seed, epoch, layer, direction,
  global row id, column): unbiased, and drawn alike by every worker. Without a key
  (evaluation) it rounds to nearest. A row travels as `width + 1` bytes: its int8 values,
  then the scale's exponent.

Legend: X rows, F width, W wire width.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from leo_cli.util.keyed import random_bytes, splitmix64

_BACKWARD_SALT = 0x6A09E667F3BCC909  # gradients draw from a stream of their own
SCALE_BYTES = 1  # int8 rows carry their scale's exponent
INT8_MAX = 127


class RowCodec(Protocol):
    """How rows are rounded, and packed for the wire."""

    name: str
    wire_dtype: torch.dtype  # the type rows travel in

    def wire_width(self, width: int) -> int:
        """Elements of the wire type per row of `width`."""
        ...

    def encode(self, h_XF: Tensor, ids_X: Tensor, key: int | None) -> Tensor:
        """Rows as they travel (`ids_X`: their global ids; `key`: None rounds to nearest)."""
        ...

    def decode(self, wire_XW: Tensor, dtype: torch.dtype) -> Tensor:
        """The rounded rows in `dtype`, from their wire form."""
        ...


class FloatCodec:
    """Round to nearest in a narrower float type (bfloat16, float16)."""

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        self.name, self.wire_dtype = name, dtype

    def wire_width(self, width: int) -> int:
        return width

    def encode(self, h_XF: Tensor, ids_X: Tensor, key: int | None) -> Tensor:
        return h_XF.to(self.wire_dtype)

    def decode(self, wire_XW: Tensor, dtype: torch.dtype) -> Tensor:
        return wire_XW.to(dtype)


def scale_exponent(top_X: Tensor) -> Tensor:
    """int8 e per row with 2**e the smallest power of two at or above `top / 127` (so no value
    of the row is more than 127 steps of 2**e), within float32's normal range; 0 (a scale
    of 1) for a row of zeros."""
    _, e_X = torch.frexp((top_X / INT8_MAX).to(torch.float32))  # x = m * 2**e, m in [0.5, 1)
    e_X = torch.where(top_X > 0, e_X, torch.zeros_like(e_X))
    return e_X.clamp_(-126, 127).to(torch.int8)


class Int8Codec:
    """A power-of-two scale per row and stochastic rounding to int8, packed as bytes."""

    name = "int8"
    wire_dtype = torch.uint8

    def wire_width(self, width: int) -> int:
        return width + SCALE_BYTES

    def encode(self, h_XF: Tensor, ids_X: Tensor, key: int | None) -> Tensor:
        e_X = scale_exponent(h_XF.abs().amax(1))
        y_XF = torch.ldexp(h_XF, -e_X.to(h_XF.dtype).unsqueeze(1))  # exact: a power of two
        if key is None:
            q_XF = torch.round(y_XF)
        else:  # floor(y + u), u uniform in (0, 1) on a grid of 1/256
            u_XF = random_bytes(ids_X, h_XF.shape[1], key).to(h_XF.dtype).add_(0.5).div_(256)
            q_XF = torch.floor(y_XF.add_(u_XF))
        q_XF = q_XF.clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        return torch.cat([q_XF, e_X.unsqueeze(1)], 1).view(torch.uint8)

    def decode(self, wire_XW: Tensor, dtype: torch.dtype) -> Tensor:
        signed = wire_XW.view(torch.int8)
        q_XF, e_X = signed[:, :-SCALE_BYTES].to(dtype), signed[:, -SCALE_BYTES:].to(dtype)
        return torch.ldexp(q_XF, e_X)


CODECS: dict[str, RowCodec | None] = {
    "float32": None,
    "bfloat16": FloatCodec("bfloat16", torch.bfloat16),
    "float16": FloatCodec("float16", torch.float16),
    "int8": Int8Codec(),
}


def wire_bytes(halo_dtype: str, width: int, dtype_bytes: int) -> int:
    """Bytes of one row of `width` as it travels (`dtype_bytes`: the training dtype's)."""
    if halo_dtype == "int8":
        return width + SCALE_BYTES
    return width * (2 if halo_dtype in ("bfloat16", "float16") else dtype_bytes)


def backward_key(key: int | None) -> int | None:
    """The key of a layer's gradient rows: a stream apart from its forward rows'."""
    if key is None:
        return None
    return int(splitmix64(torch.tensor([key ^ _BACKWARD_SALT], dtype=torch.int64)).item())
