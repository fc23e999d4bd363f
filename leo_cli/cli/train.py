"""`leo train`: partition if needed, start torchrun workers, follow progress, print results."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from leo_cli.api import train
from leo_cli.cli.common import (
    ConfigOpt,
    SetOpt,
    handle_errors,
    resolve_config,
    sweep_segments,
)
from leo_cli.cli.render import Format, FormatOpt, Sheet, output, stage_progress
from leo_cli.config import LeoConfig
from leo_cli.launch.run_folder import resume_note
from leo_cli.planner.auto_mode import from_json, read_choice
from leo_cli.run_dir import RunDir
from leo_cli.util.interrupt import Interrupted

# Modules that import torch or numpy are imported where the command acts, so that
# `leo train --help` and refused inputs answer without them.


def follow_metrics(
    run_dir: Path, num_epochs: int, stop: threading.Event, shown_on: Console
) -> None:
    """Show rank 0's metrics.jsonl as a progress bar on `shown_on` until `stop` is set (the
    bar on a terminal only; the set-up lines and notes everywhere)."""
    columns = (
        TextColumn("epoch"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    )
    run = RunDir(run_dir)
    printed: set[str] = set()
    regrouped = run.read_regrouped().get("at")  # an earlier attempt's is not news
    with Progress(*columns, console=shown_on, disable=not shown_on.is_terminal) as progress:
        task = progress.add_task("train", total=num_epochs, info="starting workers...")
        while True:
            change = run.read_regrouped()
            if change.get("at") != regrouped and isinstance(change.get("note"), str):
                regrouped = change.get("at")
                progress.console.print(f"[yellow]Note:[/] {change['note']}")
            rows = run.read_metrics()
            shown = progress_of(rows[-1]) if rows else None
            if shown is not None:
                progress.update(task, completed=shown[0], info=shown[1])
            elif not rows:
                choice = read_choice(run.root)  # the workers try candidates first?
                trials = choice is not None and bool(choice.trials)
                lines, current = setup_lines(run.read_status(), printed, trials)
                for line in lines:
                    progress.console.print(line)
                if current is not None:
                    progress.update(task, info=current)
            if stop.wait(0.5):
                break


SETUP_LABELS = {
    "process_group_s": "process group",
    "read_part_s": "part files",
    "choose_s": "trials of auto's candidates",
    "graph_s": "local graph",
    "levels_s": "cache levels",
    "aggregator_s": "aggregator",
    "model_s": "model",
}
SLOW_STAGE_S = 1.0  # set-up stages at least this long get a line of their own


def setup_lines(
    status: dict[str, Any], printed: set[str], trials: bool = False
) -> tuple[list[str], str | None]:
    """From rank 0's status.json during set-up (and at the start of training, which keeps
    the stages): a line for each newly finished stage that took `SLOW_STAGE_S` or longer
    (their names join `printed`), and what runs now (None outside set-up); `trials`: the
    workers try `auto`'s candidates (a stage only then)."""
    stages = status.get("stages")
    if status.get("state") not in ("setup", "running") or not isinstance(stages, dict):
        return [], None
    lines = []
    for name, took in stages.items():
        if name in printed or not isinstance(took, int | float):
            continue
        printed.add(name)
        if took >= SLOW_STAGE_S:
            lines.append(f"worker set-up (rank 0): {SETUP_LABELS.get(name, name)} {took:.1f} s")
    following = [n for n in SETUP_LABELS if n not in stages and (trials or n != "choose_s")]
    running = following and status["state"] == "setup"
    current = SETUP_LABELS[following[0]] if running else "first step"
    return lines, f"set-up: {current}..."


def progress_of(row: Any) -> tuple[int, str] | None:
    """(epoch, "loss ... val ...") of a metrics row, or None for a row that is not one (an
    edited file: the workers name it; the bar waits for a row it can show)."""
    try:
        info = f"loss {row['loss']:.4f}"
        if row.get("val_acc") is not None:
            info += f"  val {row['val_acc']:.3f}"
        return int(row["epoch"]), info
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        return None


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def mode_line(summary: dict[str, Any]) -> str:
    """`leo (auto: predicted fastest, 0.053 s vs blocking 0.062 s)`, or the mode alone (set
    by name, or a summary written before the choice was recorded)."""
    try:
        return from_json(summary).describe()
    except ValueError:
        return str(summary["mode"])


def summary_sheet(summary: dict[str, Any]) -> Sheet:
    """The run's summary: mode, workers, accuracy, loss, times, bytes, allocator."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.2f}%"

    epoch = summary["mean_epoch_time_s"]
    rows = [
        ["mode", mode_line(summary)],
        ["workers", str(summary["world_size"])],
        ["epochs", str(summary["num_epochs"])],
        ["best val acc (epoch)", f"{pct(summary['best_val_acc'])} ({summary['best_epoch']})"],
        ["test acc at best val", pct(summary["test_acc"])],
        ["final loss", f"{summary['final_loss']:.5f}"],
        ["mean epoch time (warm)", "-" if epoch is None else f"{epoch:.4f} s"],
        ["communication", f"{summary['total_comm_bytes'] / 2**20:.2f} MiB"],
        ["set-up (start to first step)", seconds(summary.get("setup_s"))],
        ["wall time", seconds(summary.get("wall_s"))],
        ["allocator", str(summary.get("allocator") or "-")],
    ]
    title = f"training summary: {summary['name']}"
    return Sheet("summary", title, ("metric", "value"), rows, header=False, right=("value",))


@handle_errors
def train_cmd(
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the run in run.out_dir (unset: the newest run of run.name) from "
            "its latest checkpoint, appending to metrics.jsonl.",
        ),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Train afresh in a run.out_dir that already holds a run, replacing its "
            "metrics, checkpoints and summary (without it such a folder is refused).",
        ),
    ] = False,
    allow_inexact: Annotated[
        bool,
        typer.Option(
            "--allow-inexact",
            help="Permit pipeline.mode=compute-only, which skips the halo exchange and so "
            "trains on wrong numbers on purpose: the floor `leo bench` compares against.",
        ),
    ] = False,
    fmt: FormatOpt = "auto",
) -> None:
    """Train on the partitions with one torchrun worker per part (partitions first if needed).

    Writes metrics.jsonl, summary.json, curves.png and checkpoints/ into run.out_dir (unset:
    a new folder runs/<run.name>/<date>-<time> per run; partitions are shared through
    run.cache_dir).
    """
    shown = output(fmt)
    run_train(resolve_config(config, overrides), resume, overwrite, allow_inexact, shown)


def run_train(
    given: LeoConfig, resume: bool, overwrite: bool, allow_inexact: bool, shown: Format
) -> None:
    """`leo train` as `api.train` runs it (run folder, checks, emulated nodes, set-up stages,
    workers), shown: the set-up bars, notes, the epochs' progress and the summary table."""
    if given.launch.emulate is not None:  # every emulated node runs `leo train` and shows it
        train(given, resume=resume, overwrite=overwrite, allow_inexact=allow_inexact)
        return
    chat = shown.console
    sweep_segments(chat)
    stop = threading.Event()
    followers: list[threading.Thread] = []  # the epochs' progress, once set-up is done
    folder: list[Path] = []  # the run folder, named once set-up is done

    def on_start(cfg: LeoConfig, run_dir: Path) -> None:
        """Set-up is done: the notes, then the epochs' progress bar."""
        from leo_cli.graph.partition_cache import metis_note
        from leo_cli.graph.storage import read_meta
        from leo_cli.launch.allocator import allocator_of, fallback_note

        notes = [metis_note(read_meta(RunDir(run_dir).partitions))]
        if resume:
            notes.append(resume_note(run_dir, cfg.partition.num_parts))
        if cfg.launch.allocator == "auto":  # (`jemalloc` missing is refused at the launch)
            notes.append(fallback_note(allocator_of("auto")))
        for note in notes:
            if note is not None and cfg.launch.node_rank == 0:
                chat.print(f"[yellow]Note:[/] {escape(note)}")
        args = (run_dir, cfg.train.num_epochs, stop, chat)
        folder.append(run_dir)
        followers.append(threading.Thread(target=follow_metrics, args=args, daemon=True))
        followers[0].start()

    try:
        with contextlib.ExitStack() as bars:
            update = bars.enter_context(stage_progress(chat))

            def started(cfg: LeoConfig, run_dir: Path) -> None:
                bars.close()  # the set-up bars end; the epochs' bar follows
                on_start(cfg, run_dir)

            summary = train(
                given, resume=resume, overwrite=overwrite, allow_inexact=allow_inexact,
                progress=update, on_start=started,
            )  # fmt: skip
    except Interrupted as exc:
        exc.note = (
            f"workers stopped; {folder[0]} keeps the checkpoints written so far: continue with "
            "the same command and --resume."
            if followers and followers[0].is_alive()
            else "nothing was half-written; run the command again."
        )
        raise
    finally:
        stop.set()
        for follower in followers:
            follower.join()
    if summary is not None:
        shown.sheet(summary_sheet(summary.raw))
        shown.say(f"Run folder: {summary.run_dir}")
