"""Checkpoints: model + optimizer + epoch, written atomically, loaded safely.

Dropout masks are keyed by (seed, epoch, layer, node), so the epoch is the whole RNG state of
training; torch's global generator is saved too for anything else that draws from it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from leo_cli.errors import TrainError

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


def save_checkpoint(run_dir: Path, epoch: int, state: dict[str, Any]) -> Path:
    """Write `checkpoints/epoch_<e>.pt` via a temporary file and an atomic rename."""
    folder = checkpoint_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"epoch_{epoch:06d}.pt"
    tmp = folder / f".epoch_{epoch:06d}.pt.tmp-{os.getpid()}"
    for stale in folder.glob(".epoch_*.pt.tmp-*"):  # left by a save that was killed
        stale.unlink(missing_ok=True)
    torch.save({"epoch": epoch, "rng": torch.get_rng_state(), **state}, tmp)
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    tmp.replace(path)
    for _, old in list_checkpoints(run_dir)[:-KEEP]:
        old.unlink(missing_ok=True)
    return path


def load_latest(run_dir: Path) -> dict[str, Any] | None:
    """The newest checkpoint (weights_only=True), or None when there is none."""
    found = list_checkpoints(run_dir)
    if not found:
        return None
    epoch, path = found[-1]
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a corrupt file must name itself, not crash with a traceback
        raise TrainError(
            f"Checkpoint {path} cannot be read ({exc}); delete it to resume from the one before."
        ) from None
    torch.set_rng_state(state["rng"])
    return state
