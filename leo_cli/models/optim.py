"""The workers' optimizer: torch's Adam, whose methods import torch._dynamo only where
something compiles (util/dynamo.py).

torch.optim's `step` imports torch._dynamo at every call (to break a graph being compiled, a
no-op otherwise) and its other methods at their first (`torch._disable_dynamo`): in a worker,
seconds of a core before the first step, or on the server every worker forks from. `Adam`
runs torch's own code, the same numbers and state dicts, without those imports while nothing
compiles, and torch's methods as they are once torch._dynamo is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim import optimizer as torch_optimizer

from leo_cli.util.dynamo import deferred, dynamo_loaded

_Optimizer = torch.optim.Optimizer


def _torch_step() -> Callable[..., Any]:
    """torch's `Adam.step` as torch defines it: without the hooks' and profiler's wrapper
    (`hooked`) that creating an optimizer patches onto its class, which would otherwise run a
    second time inside this class's own patched step."""
    step = torch.optim.Adam.__dict__["step"]
    while getattr(step, "hooked", False) and hasattr(step, "__wrapped__"):
        step = step.__wrapped__
    return step  # type: ignore[no-any-return]


def _undecorated(step: Callable[..., Any]) -> Callable[..., Any] | None:
    """`step` without torch's `_use_grad_for_differentiable` (which sets grad mode from
    `differentiable` around it and imports torch._dynamo for its graph breaks); None where
    `step` is not that decorator's."""
    use_grad = getattr(torch_optimizer, "_use_grad_for_differentiable", None)
    if use_grad is None or getattr(step, "__code__", None) is not use_grad(_torch_step).__code__:
        return None
    return getattr(step, "__wrapped__", None)


_TORCH_STEP = _torch_step()
_STEP = _undecorated(_TORCH_STEP)


class Adam(torch.optim.Adam):
    """`torch.optim.Adam`, importing torch._dynamo only where something compiles."""

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        if _STEP is None or dynamo_loaded():
            torchs: float | None = _TORCH_STEP(self, closure)
            return torchs
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            loss: float | None = _STEP(self, closure)
        return loss

    zero_grad = deferred(_Optimizer.zero_grad)
    add_param_group = deferred(_Optimizer.add_param_group)
    state_dict = deferred(_Optimizer.state_dict)
    load_state_dict = deferred(_Optimizer.load_state_dict)
