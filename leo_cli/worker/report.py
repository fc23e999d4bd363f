"""What a worker reports: its set-up's parts (status.json while it runs, summary.json's
set-up fields), what every metrics row carries, and rank 0's report of a finished run
(summary.json's numbers from the metrics rows, the loss and accuracy curves: curves.png)."""

from __future__ import annotations

import contextlib
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import leo_cli
from leo_cli import kernels
from leo_cli.comm.dist import all_reduce_
from leo_cli.config import LeoConfig
from leo_cli.planner.auto_mode import summary_fields
from leo_cli.planner.plan import CachePlan, predicted_busy, predicted_time
from leo_cli.registry import mode_of
from leo_cli.run_dir import RunDir
from leo_cli.util import figures, files
from leo_cli.util.timing import WORKER_PARTS, Laps, setup_summary
from leo_cli.worker.assemble import keeps_plan_levels


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
    # Margins fixed for this size: tight_layout's text measuring costs more than the drawing.
    fig = figures.figure(figsize=(10, 4))
    ax_loss, ax_acc = fig.subplots(1, 2)
    fig.subplots_adjust(left=0.07, right=0.985, bottom=0.12, top=0.92, wspace=0.22)
    epochs = [r["epoch"] for r in rows]
    ax_loss.plot(epochs, [r["loss"] for r in rows])
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="loss")
    ax_loss.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))  # fits the margin
    ev = [r for r in rows if r.get("val_acc") is not None]
    for key in ("train_acc", "val_acc", "test_acc"):
        ax_acc.plot([r["epoch"] for r in ev], [r[key] for r in ev], label=key)
    ax_acc.set(xlabel="epoch", ylabel="accuracy", title="accuracy")
    ax_acc.legend()
    with files.atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=100)


def row_extras(cfg: LeoConfig, cache_plan: CachePlan | None, world_size: int) -> dict[str, Any]:
    """What every metrics row of the run carries besides the epoch's own numbers: the worker
    count (a run resumed on another one has segments, summary.json's `segments`), the bytes
    per cache level of one step, all workers (from the plan; modes that hold its levels and
    move one row per halo node move exactly these, a test checks them against the measured
    bytes), and whether the numbers are exact."""
    mode = mode_of(cfg.pipeline.mode)
    extras: dict[str, Any] = {"exact": mode.exact or world_size == 1, "workers": world_size}
    if (
        cache_plan is not None
        and cfg.cache.enabled
        and mode.cache_levels
        and not mode.per_edge_rows
        and keeps_plan_levels(cfg)
    ):
        for level in ("L2", "L3"):
            rows = cache_plan.bytes_per_level
            extras[f"step_{level}_bytes"] = sum(r[f"{level}_bytes_per_step"] for r in rows)
    return extras


def reduce_setup(laps: Laps, entered_at: float, launched_at: float | None) -> dict[str, float]:
    """This worker's set-up parts, each the slowest rank's, and when the slowest rank starts
    its first step (`first_step_at`, wall clock)."""
    now = time.time()
    mine = {k: laps.seconds.get(k, 0.0) for k in WORKER_PARTS}
    mine["worker_setup_s"] = now - entered_at
    mine["launch_s"] = entered_at - launched_at if launched_at is not None else 0.0
    mine["first_step_at"] = now
    values = torch.tensor(list(mine.values()), dtype=torch.float64)
    return dict(zip(mine, all_reduce_(values, op="max").tolist(), strict=True))


def attempt_setup(
    run: RunDir, restart: int, launched_at: float | None, worker: dict[str, float]
) -> dict[str, Any]:
    """summary.json's set-up fields, on rank 0 before the first step: the first attempt's
    (kept in the run folder), and for an attempt the elastic agent restarted (a failure, a
    lost machine) the first attempt's with this one's set-up added to `restart_setup_s`."""
    first_step_at = worker.pop("first_step_at")
    earlier = run.read_first_setup(launched_at) if restart > 0 else {}
    if not earlier:
        earlier = setup_summary(run.read_setup(launched_at), worker, first_step_at)
        if restart > 0:  # the first attempt never reached its first step
            earlier["restart_setup_s"] = []
    if restart > 0:
        earlier["restart_setup_s"] = [*earlier.get("restart_setup_s", []), worker["worker_setup_s"]]
    with contextlib.suppress(OSError):  # costs only a restart's accounting
        run.write_first_setup(launched_at, earlier)
    return earlier


def finish(
    cfg: LeoConfig,
    run: RunDir,
    cache_plan: CachePlan | None,
    world_size: int,
    setup: dict[str, Any],
) -> None:
    """Rank 0 at the end: summary.json, curves.png and the final status."""
    rows = run.read_metrics()
    predicted = predicted_time(cache_plan, cfg)
    summary = summarize(rows, world_size, cfg.pipeline.mode, cfg.run.name, predicted)
    summary["predicted_rank_busy_s"] = predicted_busy(cache_plan, cfg)
    summary["halo_dtype"] = cfg.pipeline.halo_dtype
    summary.update(summary_fields(run.root, cfg.pipeline.mode))  # mode_requested and why
    run.write_summary({**summary, **setup})
    plot_curves(rows, run.curves)
    run.write_status("done")


def setup_progress(run: RunDir) -> Callable[[dict[str, float]], None]:
    """Rank 0's finished set-up stages in status.json (state `setup`), for the parent's
    display (cli/train.py); a write that fails only costs the display."""

    def show(seconds: dict[str, float]) -> None:
        with contextlib.suppress(OSError):
            run.write_status("setup", stages=rounded(seconds))

    return show


def rounded(seconds: dict[str, float]) -> dict[str, float]:
    """Set-up stages as status.json records them (ms)."""
    return {k: round(v, 3) for k, v in seconds.items()}
