"""Rich rendering shared by commands: stage progress and result tables."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from leo_cli.cli.common import console
from leo_cli.graph.layout import ProgressFn

STAGE_LABELS = {
    "load": "load dataset",
    "partition": "assign parts",
    "layout": "build + write parts",
    "write": "write parts",
    "probe": "hardware probe",
    "plan": "cache plan",
}


@contextmanager
def stage_progress() -> Iterator[ProgressFn]:
    """A Rich progress display fed by `(stage, done, total)` callbacks."""
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description:<24}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    tasks: dict[str, Any] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = progress.add_task(STAGE_LABELS.get(stage, stage), total=total)
        progress.update(tasks[stage], completed=done, total=total)

    with progress:
        yield update


def partition_table(meta: dict[str, Any]) -> Table:
    """Per-part nodes, edges and halo sizes; with unequal part weights, each part's target
    share and the share it got of the measure its nodes were weighed in."""
    stats = meta["stats"]
    table = Table(title=f"{meta['dataset']['name']}: {meta['num_parts']} parts ({meta['method']})")
    table.add_column("part", justify="right")
    for name in ("nodes", "edges", "halo nodes"):
        table.add_column(name, justify="right")
    targets, achieved = meta.get("part_weights"), meta.get("achieved_shares")
    shares = list(zip(targets, achieved, strict=True)) if targets and achieved else None
    if shares:
        rule = (meta.get("vertex_weights") or {}).get("rule", "degree")
        table.add_column("target share", justify="right")
        table.add_column(f"share ({rule})", justify="right")
    for r in range(meta["num_parts"]):
        cells = [f"{stats[k][r]:,}" for k in ("nodes", "edges", "halo_nodes")]
        if shares:
            cells += [f"{shares[r][0]:.3f}", f"{shares[r][1]:.3f}"]
        table.add_row(str(r), *cells)
    return table


def stats_table(meta: dict[str, Any]) -> Table:
    """Graph-level partition quality."""
    stats, ds = meta["stats"], meta["dataset"]
    table = Table(show_header=False, title="partition quality")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("nodes / undirected edges", f"{ds['num_nodes']:,} / {stats['num_undirected_edges']:,}"),
        ("edge cut", f"{stats['edge_cut']:,} ({100 * stats['edge_cut_fraction']:.2f}%)"),
        ("edge balance (max/mean)", f"{stats['balance']:.3f}"),
        ("node balance (max/mean)", f"{stats['node_balance']:.3f}"),
        ("replication factor", f"{stats['replication_factor']:.3f}"),
    ]
    plan = meta.get("metis")
    if plan:
        limit = plan["memory_limit_gb"]
        rows.append(
            (
                "METIS edges seen",
                f"{plan['edge_fraction']:.0%} (projected {plan['projected_gb']:.3g} GB, "
                + ("no limit" if limit is None else f"limit {limit:g} GB")
                + ")",
            )
        )
    rows += [(f"time: {k}", f"{v:.2f} s") for k, v in meta.get("timings_s", {}).items()]
    rows += [
        (f"peak memory after {k}", f"{v:.2f} GB") for k, v in meta.get("peak_rss_gb", {}).items()
    ]
    for row in rows:
        table.add_row(*row)
    return table
