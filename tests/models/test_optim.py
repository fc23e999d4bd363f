"""The workers' Adam (models/optim.py) is torch's: the same parameters, moments and state dicts
step for step, with torch._dynamo imported or not; and a worker's training steps leave
torch._dynamo unimported (util/dynamo.py)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from leo_cli.models import optim
from leo_cli.util import dynamo

ROOT = Path(__file__).resolve().parents[2]


def _pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    b = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    b.load_state_dict(a.state_dict())
    return a, b


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    x = torch.randn(20, 12, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()


@pytest.fixture(scope="module")
def torchs_adam_ready() -> None:
    """torch.optim imports torch._dynamo (seconds of a core) at its first use: set-up's."""
    import torch._dynamo  # noqa: F401


@pytest.mark.parametrize("compiling", [False, True], ids=["no-dynamo", "dynamo"])
@pytest.mark.usefixtures("torchs_adam_ready")
def test_adam_is_torchs_bit_for_bit(compiling: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not compiling:  # as in a worker: nothing imported torch._dynamo
        monkeypatch.setattr(dynamo, "DYNAMO", "leo_test_absent_module")
    ours_model, torchs_model = _pair()
    ours = optim.Adam(ours_model.parameters(), lr=0.01, weight_decay=5e-4)
    torchs = torch.optim.Adam(torchs_model.parameters(), lr=0.01, weight_decay=5e-4)
    _train(ours_model, ours, 7)
    _train(torchs_model, torchs, 7)
    for p, q in zip(ours_model.parameters(), torchs_model.parameters(), strict=True):
        assert torch.equal(p, q)
    mine, theirs = ours.state_dict(), torchs.state_dict()
    assert mine["param_groups"] == theirs["param_groups"]
    for i, state in theirs["state"].items():
        assert mine["state"][i].keys() == state.keys()
        assert all(torch.equal(mine["state"][i][k], v) for k, v in state.items())
    # Restored from a copy of torch's state dict, both go on alike.
    ours.load_state_dict(copy.deepcopy(theirs))
    _train(ours_model, ours, 2)
    _train(torchs_model, torchs, 2)
    for p, q in zip(ours_model.parameters(), torchs_model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_deferred_calls_the_wrapped_function_until_dynamo_is_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    def original(x: int) -> int:
        calls.append("original")
        return x + 1

    def wrapper(x: int) -> int:
        calls.append("wrapper")
        return original(x)

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    assert dynamo.deferred(wrapper) is wrapper  # another decorator's: left as it is
    monkeypatch.setattr(dynamo, "_disabled_code", lambda: wrapper.__code__)  # as torch's
    call = dynamo.deferred(wrapper)
    assert dynamo.deferred(call) is call
    monkeypatch.setattr(dynamo, "DYNAMO", "leo_test_absent_module")
    assert call(1) == 2 and calls == ["original"]
    monkeypatch.setattr(dynamo, "DYNAMO", "sys")  # imported: torch's wrapper from now on
    assert call(2) == 3 and calls == ["original", "wrapper", "original"]


def test_every_kernel_of_leos_ops_is_deferred() -> None:
    from leo_cli.kernels import gat_ops, ops

    for module in (ops, gat_ops):
        for op in vars(module).values():
            if isinstance(op, torch._library.custom_ops.CustomOpDef):
                assert op._backend_fns, op
                assert all(getattr(f, "_leo_deferred", False) for f in op._backend_fns.values())


SCRIPT = """
import sys
import torch
from leo_cli.kernels import ops
from leo_cli.models.optim import Adam

x = torch.randn(4, 3, requires_grad=True)
indptr, indices = torch.arange(5), torch.arange(4)
w = torch.nn.Parameter(torch.randn(3, 2))
opt = Adam([w], lr=0.01, weight_decay=5e-4)
for _ in range(2):
    opt.zero_grad()
    out = ops.spmm_csr(indptr, indices, torch.ones(4), x @ w, indptr, indices, indices, 4)
    out.sum().backward()
    ops.keyed_dropout(out.detach(), torch.arange(4), 7, 128, 2.0)
    opt.step()
opt.load_state_dict(opt.state_dict())
print("torch._dynamo" in sys.modules)
"""


@pytest.mark.integration  # a fresh interpreter importing torch
def test_a_workers_steps_import_no_dynamo() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.stdout.strip() == "False", done.stderr


HOOKS = """
import sys
import torch
w = torch.nn.Parameter(torch.ones(3))
torch.optim.Adam([torch.nn.Parameter(torch.ones(1))])  # patches torch's Adam.step with its hooks
from leo_cli.models import optim
assert optim._STEP is not None and optim._STEP.__code__.co_name == "step", optim._STEP
calls = []
opt = optim.Adam([w], lr=0.1)
opt.register_step_post_hook(lambda *_: calls.append(1))
for _ in range(3):
    opt.zero_grad()
    w.square().sum().backward()
    opt.step()
print(len(calls), "torch._dynamo" in sys.modules)
"""


@pytest.mark.integration  # a fresh interpreter importing torch
def test_a_step_runs_its_hooks_once_after_torchs_adam_patched_its_class() -> None:
    """torch patches an optimizer class's step with its hooks when one is made: LEO's Adam,
    made after a torch Adam, runs a post hook once a step and torch's own step undecorated."""
    done = subprocess.run(
        [sys.executable, "-c", HOOKS], cwd=ROOT, capture_output=True, text=True, check=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.stdout.split()[0] == "3", done.stdout + done.stderr
