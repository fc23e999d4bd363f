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

from leo_cli.util.dynamo import deferred, dynamo_loaded

_Optimizer = torch.optim.Optimizer
# Adam.step without its decorator (`_use_grad_for_differentiable`), which sets grad mode from
# `differentiable` around it and imports torch._dynamo for its graph breaks; None where a torch
# has no such decorator (its own step is then called as it is).
_STEP: Callable[..., Any] | None = getattr(torch.optim.Adam.step, "__wrapped__", None)


class Adam(torch.optim.Adam):
    """`torch.optim.Adam`, importing torch._dynamo only where something compiles."""

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        if _STEP is None or dynamo_loaded():
            torchs: float | None = super().step(closure)
            return torchs
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            loss: float | None = _STEP(self, closure)
        return loss

    zero_grad = deferred(_Optimizer.zero_grad)
    add_param_group = deferred(_Optimizer.add_param_group)
    state_dict = deferred(_Optimizer.state_dict)
    load_state_dict = deferred(_Optimizer.load_state_dict)
