"""TensorBoard event files of rank 0 (`run.tensorboard`): the scalars of metrics.jsonl."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from leo_cli.errors import TrainError, tensorboard_missing


class Board:
    """One SummaryWriter in the run folder's `tensorboard/`: every number of a metrics row
    (loss, accuracies, times, bytes) tagged by its key at the row's epoch. A resumed run
    starts at `start + 1`, and TensorBoard drops the dead attempt's events from there on."""

    def __init__(self, folder: Path, start: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise TrainError(tensorboard_missing()) from exc
        # Events of epochs after `start` (a dead attempt's) are dropped; none on a new folder.
        self._writer = SummaryWriter(log_dir=str(folder), purge_step=start + 1)

    def add_row(self, row: dict[str, Any]) -> None:
        for key, value in row.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if key != "epoch" and number and math.isfinite(value):
                self._writer.add_scalar(key, value, global_step=row["epoch"])
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
