"""Checks of the run files a resumed run reads back: metrics.jsonl rows and checkpoints.

They are untrusted input (an edit, a copy cut short, a file from another version): a row or
a checkpoint that is not what LEO wrote must stop the run with one sentence naming the file,
not with a traceback in a worker log or, worse, wrong numbers in summary.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import torch
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from leo_cli.errors import TrainError
from leo_cli.util.strict import Finite

Count = Annotated[StrictInt, Field(ge=0)]


class MetricsRow(BaseModel):
    """The fields of a metrics.jsonl row that summary.json is computed from (others pass)."""

    model_config = ConfigDict(extra="allow")

    epoch: Annotated[StrictInt, Field(ge=1)]
    loss: Finite
    epoch_time_s: Annotated[Finite, Field(ge=0)]
    comm_bytes: Count
    train_acc: Annotated[Finite, Field(ge=0, le=1)] | None = None
    val_acc: Annotated[Finite, Field(ge=0, le=1)] | None = None
    test_acc: Annotated[Finite, Field(ge=0, le=1)] | None = None
    comm_wait_s: Annotated[Finite, Field(ge=0)] | None = None
    comm_transfer_s: Annotated[Finite, Field(ge=0)] | None = None
    step_comm_bytes: Count | None = None
    step_published_bytes: Count | None = None
    rank_step_s: list[Annotated[Finite, Field(ge=0)]] | None = None
    rank_busy_s: list[Annotated[Finite, Field(ge=0)]] | None = None
    cold: StrictBool = False
    exact: StrictBool = True


def check_rows(rows: list[Any], path: Path) -> None:
    """Every row a metrics row, epochs increasing.

    Raises:
        TrainError: naming the line and the field.
    """
    last = 0
    for line, row in enumerate(rows, start=1):
        try:
            epoch = MetricsRow.model_validate(row).epoch
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "the row"
            problem = f"{where}: {err['msg']}"
        else:
            if epoch > last:
                last = epoch
                continue
            problem = f"epoch {epoch} does not follow epoch {last}"
        raise TrainError(
            f"{path} line {line} is not a metrics row LEO wrote ({problem}); delete that line "
            "and the ones after it to resume, or start again without --resume."
        )


def check_checkpoint(state: Any, epoch: int) -> None:
    """What `save_checkpoint` writes: the epoch of its file name, torch's RNG state, and the
    model's and optimizer's state dicts.

    Raises:
        ValueError: what is wrong (the caller names the file).
    """
    if not isinstance(state, dict):
        raise ValueError("not a checkpoint dictionary")
    saved = state.get("epoch")
    if type(saved) is not int or saved != epoch:
        raise ValueError(f"its epoch is {saved!r}, its name says {epoch}")
    rng = state.get("rng")
    if not isinstance(rng, torch.Tensor) or rng.dtype != torch.uint8 or rng.dim() != 1:
        raise ValueError("its rng entry is not torch's generator state")
    model = state.get("model")
    if not isinstance(model, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()
    ):
        raise ValueError("its model entry is not a state dict of tensors")
    opt = state.get("optimizer")
    if not isinstance(opt, dict) or not isinstance(opt.get("param_groups"), list):
        raise ValueError("its optimizer entry is not an optimizer state dict")
    for name, value in model.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ValueError(f"its weight {name} is not finite")


def restore(
    state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path
) -> None:
    """Load a checked checkpoint into the model and optimizer.

    Raises:
        TrainError: it was written for another model (names, shapes, optimizer groups).
    """
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TrainError(
            f"checkpoint of epoch {state['epoch']} in {folder} does not fit this model "
            f"({reason}); start again without --resume or use the run's settings."
        ) from None
