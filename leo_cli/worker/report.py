"""Rank 0's report of a finished run: summary.json's numbers from the metrics rows, and the
loss and accuracy curves (curves.png)."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

import leo_cli
from leo_cli import kernels
from leo_cli.registry import mode_of
from leo_cli.util import files


def git_sha() -> str | None:
    root = Path(leo_cli.__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def summarize(
    rows: list[dict[str, Any]],
    world_size: int,
    mode: str,
    name: str,
    predicted_s: float | None = None,
) -> dict[str, Any]:
    """summary.json: name, best val (and test at best val), final loss, warm epoch time, bytes."""
    evaluated = [r for r in rows if r.get("val_acc") is not None]
    best = max(evaluated, key=lambda r: r["val_acc"]) if evaluated else {}
    warm_rows = [r for r in rows if not r.get("cold", False)]
    warm = [r["epoch_time_s"] for r in warm_rows]
    return {
        "name": name,
        "best_val_acc": best.get("val_acc"),
        "test_acc": best.get("test_acc"),
        "best_epoch": best.get("epoch"),
        "final_loss": rows[-1]["loss"] if rows else None,
        "final_test_acc": evaluated[-1]["test_acc"] if evaluated else None,
        "num_epochs": len(rows),
        "mean_epoch_time_s": sum(warm) / len(warm) if warm else None,
        "predicted_epoch_time_s": predicted_s,
        "mean_comm_wait_s": _mean(warm_rows, "comm_wait_s"),
        "mean_comm_transfer_s": _mean(warm_rows, "comm_transfer_s"),
        "mean_step_comm_bytes": _mean(warm_rows, "step_comm_bytes"),
        # of which read in place from published rows, or published for their owners
        "mean_step_published_bytes": _mean(warm_rows, "step_published_bytes"),
        **rank_means([r for r in warm_rows if len(r.get("rank_step_s") or []) == world_size]),
        "total_comm_bytes": sum(r["comm_bytes"] for r in rows),
        "world_size": world_size,
        "segments": segments(rows),
        "mode": mode,
        # An inexact mode's numbers are not the model's (compute-only skips the exchange on
        # purpose), and a run resumed in another mode is exact only if every epoch was.
        "exact": all(r.get("exact", mode_of(mode).exact or world_size == 1) for r in rows),
        "kernels": kernels.backend_name(),
        "kernels_cpu_reason": kernels.active_backend().cpu_reason,  # why these serve CPU tensors
        "versions": {
            "leo": leo_cli.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "git_sha": git_sha(),
    }


def segments(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run's stretches of epochs with one worker count (several when it was resumed on
    another `partition.num_parts`): `workers`, `first_epoch`, `last_epoch`."""
    out: list[dict[str, Any]] = []
    for r in rows:
        workers = r.get("workers")
        if out and out[-1]["workers"] == workers:
            out[-1]["last_epoch"] = r["epoch"]
        else:
            out.append({"workers": workers, "first_epoch": r["epoch"], "last_epoch": r["epoch"]})
    return out


def rank_means(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per rank, the mean step and busy time over `rows` (`rank_mean_step_s`,
    `rank_mean_busy_s`), and `rank_spread`: the slowest rank's mean busy time over the
    fastest's (1: workers finish their own work together)."""
    out: dict[str, Any] = {}
    for key in ("step", "busy"):
        lists = [r[f"rank_{key}_s"] for r in rows if isinstance(r.get(f"rank_{key}_s"), list)]
        same = lists and all(len(x) == len(lists[0]) for x in lists)
        out[f"rank_mean_{key}_s"] = (
            [sum(c) / len(c) for c in zip(*lists, strict=True)] if same else None
        )
    busy = out["rank_mean_busy_s"]
    out["rank_spread"] = max(busy) / min(busy) if busy and min(busy) > 0 else None
    return out


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return sum(values) / len(values) if values else None


def plot_curves(rows: list[dict[str, Any]], path: Path) -> None:
    """curves.png: loss and accuracies per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    epochs = [r["epoch"] for r in rows]
    ax_loss.plot(epochs, [r["loss"] for r in rows])
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="loss")
    ev = [r for r in rows if r.get("val_acc") is not None]
    for key in ("train_acc", "val_acc", "test_acc"):
        ax_acc.plot([r["epoch"] for r in ev], [r[key] for r in ev], label=key)
    ax_acc.set(xlabel="epoch", ylabel="accuracy", title="accuracy")
    ax_acc.legend()
    fig.tight_layout()
    with files.atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
