"""A worker's checkpoints read back: the model and optimizer restored from a checked
checkpoint (`restore`, `optimizer_problem`), and `checkpoints/best.pt` kept to the best
validation epoch of a resumed run (`keep_best_of`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from leo_cli.errors import TrainError
from leo_cli.run_dir import RunDir
from leo_cli.worker.step import ACCURACY_KEYS


def keep_best_of(run: RunDir, start: int) -> float | None:
    """The best validation accuracy of epochs 1 .. `start` (a resumed run's), and
    `checkpoints/best.pt` made to hold its model: a best model of a later epoch belongs to the
    attempt that died and goes, replaced by the checkpoint of the best epoch where one is kept
    (else none is left until a resumed epoch does better)."""
    rows = [r for r in run.read_metrics() if isinstance(r, dict) and r.get("val_acc") is not None]
    top = max(rows, key=lambda r: r["val_acc"], default=None)
    if not run.best.is_file():
        return None if top is None else float(top["val_acc"])
    if run.read_best()["epoch"] > start:
        run.best.unlink()
        kept = dict(run.list_checkpoints())
        if top is not None and top["epoch"] in kept:
            try:
                state = run.read_recorded(kept[top["epoch"]])
            except Exception:  # an unreadable checkpoint (read_latest names it) leaves no best
                return float(top["val_acc"])
            run.save_best(top["epoch"], row_accuracies(top), state["model"])
    return None if top is None else float(top["val_acc"])


def row_accuracies(row: dict[str, Any]) -> dict[str, Any]:
    """The accuracies of a metrics row that `checkpoints/best.pt` keeps."""
    return {k: row.get(k) for k in ACCURACY_KEYS}


def restore(
    state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path
) -> None:
    """Load a checked checkpoint into the model and optimizer; the optimizer's settings must be
    the config's and its state the model's (shapes, finite, one step per epoch).

    Raises:
        TrainError: it was written for another model or config, or its state is not sound.
    """
    where = f"checkpoint of epoch {state['epoch']} in {folder}"
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TrainError(
            f"{where} does not fit this model ({reason}); start again without --resume or "
            "use the run's settings."
        ) from None
    problem = optimizer_problem(state["optimizer"], optimizer, state["epoch"])
    if problem is not None:
        raise TrainError(f"{where} {problem}; start again without --resume or use its settings.")
    optimizer.load_state_dict(state["optimizer"])


# The optimizer settings that come from the config, by the key that sets them.
CONFIG_KEYS = {"lr": "train.lr", "weight_decay": "train.weight_decay"}


def optimizer_problem(saved: Any, optimizer: torch.optim.Optimizer, epoch: int) -> str | None:
    """What makes a checkpoint's optimizer state unfit for `optimizer` (built from the config),
    or None: its groups' settings (learning rate, weight decay, betas, eps, ...) must be
    `optimizer`'s, and each parameter's state the parameter's shape, finite, `epoch` steps."""
    built = optimizer.state_dict()
    groups, state = saved.get("param_groups"), saved.get("state")
    if not isinstance(state, dict) or len(groups) != len(built["param_groups"]):
        return "holds optimizer state for another model"
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for mine, theirs in zip(built["param_groups"], groups, strict=True):
        if not isinstance(theirs, dict) or theirs.get("params") != mine["params"]:
            return "holds optimizer state for another model"
        for key, value in mine.items():
            if key != "params" and key in theirs and theirs[key] != value:
                name = CONFIG_KEYS.get(key, f"the optimizer's {key}")
                return f"was trained with {name}={theirs[key]!r}, the config gives {value!r}"
    for index, entry in state.items():
        if not isinstance(index, int) or not 0 <= index < len(params):
            return f"holds optimizer state for a parameter {index!r} the model does not have"
        if not isinstance(entry, dict):
            return f"holds optimizer state for parameter {index} that is not a dictionary"
        for key, value in entry.items():
            if not isinstance(value, Tensor):
                return f"holds optimizer state {key!r} that is not a tensor"
            if not bool(torch.isfinite(value).all()):
                return f"holds a non-finite optimizer {key} for parameter {index}"
            if key == "step":
                if value.numel() != 1 or float(value) != epoch:
                    return f"says parameter {index} took {value.tolist()} steps, not {epoch}"
            elif value.shape != params[index].shape:
                return (
                    f"holds an optimizer {key} of shape {list(value.shape)} for parameter "
                    f"{index} of shape {list(params[index].shape)}"
                )
    return None
