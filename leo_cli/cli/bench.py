"""`leo bench`: LEO's modes against its baselines and PyTorch Geometric, side by side."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from leo_cli.bench import report
from leo_cli.bench.suite import LEO, Measured, Variant, leo_config, run_suite, variants
from leo_cli.cli.common import (
    ConfigOpt,
    SetOpt,
    console,
    handle_errors,
    resolve_config,
    sweep_segments,
)
from leo_cli.cli.render import STAGE_LABELS
from leo_cli.config import LeoConfig
from leo_cli.config.load import validate
from leo_cli.errors import ConfigError
from leo_cli.launch.launcher import check_supported
from leo_cli.util.interrupt import Interrupted

DEFAULT_BENCH_CONFIG = Path(__file__).resolve().parent.parent / "bench" / "default.yaml"


def check_bench(cfg: LeoConfig) -> None:
    """Settings a benchmark cannot run with, as one sentence each."""
    if cfg.launch.nnodes > 1:
        raise ConfigError(
            "leo bench runs on one machine (launch.nnodes=1); benchmark multi-node jobs with "
            "leo train on each node."
        )
    if cfg.launch.nproc is not None:
        raise ConfigError(
            "launch.nproc is set by leo bench from bench.world_sizes; remove launch.nproc."
        )
    check_runs(cfg)


def check_runs(cfg: LeoConfig) -> None:
    """Every `leo train` the suite will run, checked before the first (a bench variant's
    override, or a placement for another worker count, would otherwise stop it midway)."""
    for v in variants(cfg, lambda _: None):
        if v.system == LEO:
            try:  # validated again: the suite sets num_parts, which part_weights must fit
                run_cfg = leo_config(cfg, v, Path(cfg.run.out_dir))
                validate(run_cfg.model_dump(mode="json"), "leo bench")
                check_supported(run_cfg, allow_inexact=True)
            except ConfigError as exc:
                where = f"bench variant {v.variant} at " if v.variant else "at "
                raise ConfigError(f"{where}{v.world_size} workers: {exc}") from None


def results_table(rows: list[dict[str, Any]]) -> Table:
    """The terminal table: bench.md's columns, the hidden shares below it."""
    table = Table(title="leo bench (median epoch time; ratios paired by round)")
    for name in report.head(rows):
        table.add_column(name, justify="left" if name in ("system", "mode") else "right")
    for r in rows:
        table.add_row(*report.md_cells(r, report.with_variants(rows)))
    table.caption = "\n".join(report.share_lines(rows)) or None
    return table


@handle_errors
def bench_cmd(config: ConfigOpt = None, overrides: SetOpt = None) -> None:
    """Time LEO's pipeline modes, its baselines and PyG peers on one graph, interleaved.

    Without --config the default bench graph is used (synthetic, 200k nodes, GCN). Every LEO
    row runs through `leo train` (same launcher and workers), once per bench.variants entry
    (named --set overrides); rows run interleaved over bench.repeats rounds;
    bench.warmup_epochs are not timed. Writes bench.json, bench.csv,
    bench.md and bench.png into run.out_dir.

    Variants, e.g. part weights: --set "bench.variants=[{name: uniform, set:
    [partition.part_weights=uniform]}, {name: measured, set: [partition.part_weights=measured]}]"
    (ratios `vs first variant` are to the first; quote an item holding brackets or commas).
    """
    cfg = resolve_config(config or DEFAULT_BENCH_CONFIG, overrides)
    check_bench(cfg)
    sweep_segments()  # every row is a `leo train`
    out_dir = Path(cfg.run.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    env = report.environment("leo bench " + " ".join(shlex.quote(a) for a in sys.argv[2:]))
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description:<30}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        runs = progress.add_task("runs", total=None)
        stages: dict[str, Any] = {}

        def on_run(done: int, total: int, v: Variant) -> None:
            label = "done" if done == total else f"run {v.label}"
            progress.update(runs, completed=done, total=total, description=label)

        def on_stage(stage: str, done: int, total: int) -> None:
            if stage not in stages:
                stages[stage] = progress.add_task(STAGE_LABELS.get(stage, stage), total=total)
            progress.update(stages[stage], completed=done, total=total)

        def on_round(measured: list[Measured]) -> None:
            report.write_outputs(out_dir, report.make_rows(cfg, measured, out_dir), env)

        try:
            measured = run_suite(cfg, out_dir, on_run, on_stage, console.print, on_round)
        except Interrupted as exc:
            exc.note = f"runs stopped; finished rounds, if any, are in {out_dir / 'bench.md'}."
            raise
    rows = report.make_rows(cfg, measured, out_dir)
    paths = report.write_outputs(out_dir, rows, env)
    console.print(results_table(rows))
    console.print("Wrote " + ", ".join(str(p) for p in paths))
