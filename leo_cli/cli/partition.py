"""`leo partition`: dataset -> METIS partitions on disk, with a stats table."""

from __future__ import annotations

from typing import Annotated

import typer

from leo_cli.cli.common import ConfigOpt, SetOpt, console, handle_errors, resolve_config
from leo_cli.cli.render import partition_table, stage_progress, stats_table
from leo_cli.config import write_resolved
from leo_cli.launch.run_folder import for_command


@handle_errors
def partition_cmd(
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    num_parts: Annotated[
        int | None,
        typer.Option(
            "--num-parts",
            "-p",
            help="Number of parts (overrides partition.num_parts).",
            show_default=False,
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Rebuild even if up-to-date partitions exist (in run.cache_dir, where other "
            "runs with the same settings share them).",
        ),
    ] = False,
) -> None:
    """Partition the dataset (METIS, random, range or an owners file) into run.cache_dir,
    linked from <run.out_dir>/partitions.

    Partitions are reused while the dataset, partition settings and seed are unchanged (and,
    with unequal partition.part_weights, the hardware profile and model the shares and vertex
    weights are priced with).
    """
    cfg = resolve_config(
        config,
        (overrides or []) + ([f"partition.num_parts={num_parts}"] if num_parts is not None else []),
    )
    cfg = for_command(cfg)
    # here, once the config is read: the partitioners import torch and numpy, which
    # `leo --help` and refused inputs do not need
    from leo_cli.graph.partition_cache import metis_note
    from leo_cli.launch.setup import Ask, run_setup

    with stage_progress() as progress:  # unequal part_weights probe the machine first
        result = run_setup(Ask.partition(cfg, force, progress), last="partitions").parts
    assert result is not None
    write_resolved(cfg)
    if result.reused:
        console.print(f"[green]Up to date:[/] reusing {result.path} (use --force to rebuild).")
    else:
        console.print(f"[green]Wrote[/] {result.path}")
    console.print(partition_table(result.meta))
    console.print(stats_table(result.meta))
    note = metis_note(result.meta)
    if note is not None:
        console.print(f"[yellow]Note:[/] {note}")
