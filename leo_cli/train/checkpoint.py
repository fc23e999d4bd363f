"""Checkpoints: model + optimizer + epoch, written atomically, loaded safely and checked.

Dropout masks are keyed by (seed, epoch, layer, node), so the epoch is the whole RNG state of
training; torch's global generator is saved too for anything else that draws from it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import torch

from leo_cli.errors import TrainError
from leo_cli.train.readback import check_checkpoint
from leo_cli.util import files

KEEP = 2  # newest checkpoints kept; older ones are deleted after a successful write


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(epoch, path) of every complete checkpoint, oldest first."""
    found = []
    for path in checkpoint_dir(run_dir).glob("epoch_*.pt"):
        m = re.fullmatch(r"epoch_(\d+)\.pt", path.name)
        if m:
            found.append((int(m.group(1)), path))
    return sorted(found)


def epoch_of(path: Path) -> int:
    """The epoch in a checkpoint's file name."""
    return int(path.name.removeprefix("epoch_").removesuffix(".pt"))


def save_checkpoint(run_dir: Path, epoch: int, state: dict[str, Any]) -> Path:
    """Write `checkpoints/epoch_<e>.pt` via a temporary file and an atomic rename."""
    folder = checkpoint_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"epoch_{epoch:06d}.pt"
    files.sweep_temporaries(folder)  # left by a save that was killed
    with files.atomic_file(path, fsync=True) as f:
        torch.save({"epoch": epoch, "rng": torch.get_rng_state(), **state}, f)
    for _, old in list_checkpoints(run_dir)[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


def read_latest(run_dir: Path) -> dict[str, Any] | None:
    """The newest checkpoint that loads (weights_only=True), or None when there is none.

    A file that cannot be read (a disk error, a copy cut short) is reported on stderr and the
    one before it is tried, so one bad file costs `train.checkpoint_every` epochs, not the run.
    """
    newest_first = [path for _, path in reversed(list_checkpoints(run_dir))]
    for i, path in enumerate(newest_first):
        try:
            state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
            check_checkpoint(state, epoch_of(path))  # untrusted: loads, but is it ours?
        except Exception as exc:  # a corrupt file must name itself, not crash with a traceback
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if i + 1 == len(newest_first):
                raise TrainError(
                    f"No checkpoint in {checkpoint_dir(run_dir)} can be read ({path.name}: "
                    f"{reason}); start again without --resume."
                ) from None
            older = newest_first[i + 1].name
            print(
                f"warning: checkpoint {path} cannot be read ({reason}); trying {older} instead.",
                file=sys.stderr,
            )
            continue
        return state
    return None


def load_latest(run_dir: Path) -> dict[str, Any] | None:
    """`read_latest`, with torch's global generator restored from it."""
    state = read_latest(run_dir)
    if state is not None:
        torch.set_rng_state(state["rng"])
    return state
