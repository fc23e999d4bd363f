"""torch._dynamo imported where something compiles, not at the first call of a custom op or
an optimizer method.

torch wraps a custom op's kernels and the optimizer's methods in `torch._disable_dynamo`, which
imports torch._dynamo (as long as importing torch itself) at their first call, only to keep the
call out of a graph being compiled. While torch._dynamo is not imported, nothing in the process
can be compiling, and the wrapper's only effect is that import: `deferred` calls the wrapped
function itself until then, and torch's wrapper from the first call after it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import CodeType
from typing import Any

import torch

DYNAMO = "torch._dynamo"


@functools.cache
def _disabled_code() -> CodeType:
    """The code of torch's `_disable_dynamo` wrapper: one code object, whatever it wraps."""
    return torch._disable_dynamo(_disabled_code).__code__  # type: ignore[attr-defined]


def dynamo_loaded() -> bool:
    """Whether torch._dynamo is imported (anything compiling imports it first)."""
    return DYNAMO in sys.modules


def deferred(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """`wrapper`, a function torch wrapped in `torch._disable_dynamo`, called as the function it
    wraps while torch._dynamo is not imported, and as itself once it is. Any other function
    (another decorator's, or one already deferred) is returned as it is."""
    original = getattr(wrapper, "__wrapped__", None)
    if original is None or getattr(wrapper, "__code__", None) is not _disabled_code():
        return wrapper

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        if DYNAMO in sys.modules:
            return wrapper(*args, **kwargs)
        return original(*args, **kwargs)

    call._leo_deferred = True  # type: ignore[attr-defined]
    return call


def defer_kernels(op: Any) -> None:
    """The kernels registered so far for custom op `op` (a `torch.library.custom_op`), each
    `deferred`; again after registering another kernel. An op object without torch's table of
    kernels (`_backend_fns`) is left as it is."""
    kernels: dict[Any, Callable[..., Any]] | None = getattr(op, "_backend_fns", None)
    if not isinstance(kernels, dict):
        return
    for device_type, kernel in kernels.items():
        kernels[device_type] = deferred(kernel)
