"""Number types for files read back as untrusted input (pydantic): finite, never true/false.

pydantic's lax mode reads JSON `true` as 1 and accepts `Infinity`/`NaN` unless told not to;
a run file holding either was not written by LEO. `Finite` takes a JSON number (integer or
not) that is finite, `Whole` a JSON integer; `NoBool` refuses true/false in front of any
other number type.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be a number, not true/false")
    return value


NoBool = BeforeValidator(_no_bool)
Finite = Annotated[float, NoBool, Field(strict=True, allow_inf_nan=False)]  # no "2.5" either
NonNegative = Annotated[Finite, Field(ge=0)]
Whole = Annotated[int, NoBool, Field(strict=True)]  # a JSON integer: no 2.0, no "2"
