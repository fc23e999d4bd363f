"""`leo bench`: LEO's modes against its baselines and PyTorch Geometric, side by side."""

from __future__ import annotations

import shlex
import sys
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from leo_cli.api import DEFAULT_BENCH_CONFIG, bench
from leo_cli.cli.common import ConfigOpt, SetOpt, handle_errors, resolve_config, sweep_segments
from leo_cli.cli.render import STAGE_LABELS, FormatOpt, Sheet, output
from leo_cli.launch.run_folder import for_command
from leo_cli.util.interrupt import Interrupted

if TYPE_CHECKING:
    from leo_cli.bench.suite import Variant

# The bench's modules import torch: they are imported where the command acts (after the
# config is read), so that `leo --help` and refused inputs answer without it.


def results_sheet(rows: list[dict[str, Any]]) -> Sheet:
    """bench.md's columns, the hidden shares below them; as JSON, bench.csv's columns."""
    from leo_cli.bench import report

    head = tuple(report.head(rows))
    return Sheet(
        name="bench",
        title="leo bench (median epoch time; ratios paired by round)",
        columns=head,
        rows=[report.md_cells(r, report.with_variants(rows)) for r in rows],
        notes=[line.replace("**", "") for line in report.share_lines(rows)],
        records=[{k: r.get(k) for k in report.COLUMNS} for r in rows],
        right=tuple(h for h in head if h not in ("system", "mode", "variant")),
    )


@handle_errors
def bench_cmd(config: ConfigOpt = None, overrides: SetOpt = None, fmt: FormatOpt = "auto") -> None:
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
    shown = output(fmt)
    cfg = for_command(resolve_config(config or DEFAULT_BENCH_CONFIG, overrides))
    from leo_cli.bench.suite import check_bench

    check_bench(cfg)
    sweep_segments(shown.console)  # every row is a `leo train`
    out_dir = cfg.run.folder.resolve()
    command = "leo bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description:<30}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    chat = shown.console
    with Progress(*columns, console=chat, disable=not chat.is_terminal) as progress:
        runs = progress.add_task("runs", total=None)
        stages: dict[str, Any] = {}

        def on_run(done: int, total: int, v: Variant) -> None:
            label = "done" if done == total else f"run {v.label}"
            progress.update(runs, completed=done, total=total, description=label)

        def on_stage(stage: str, done: int, total: int) -> None:
            if stage not in stages:
                stages[stage] = progress.add_task(STAGE_LABELS.get(stage, stage), total=total)
            progress.update(stages[stage], completed=done, total=total)

        try:
            result = bench(
                cfg, progress=on_stage, on_run=on_run, say=lambda t: chat.print(escape(t)),
                command=command,
            )  # fmt: skip
        except Interrupted as exc:
            exc.note = f"runs stopped; finished rounds, if any, are in {out_dir / 'bench.md'}."
            raise
    shown.sheet(results_sheet(result.rows))
    shown.say("Wrote " + ", ".join(str(p) for p in result.written))
