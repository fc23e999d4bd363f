"""The `leo` command: a Typer app with one thin module per subcommand."""

from __future__ import annotations

import typer

from leo_cli.cli import bench, partition, profile_cache, train
from leo_cli.cli import compile as compile_cli

app = typer.Typer(
    name="leo",
    help="LEO: full-graph GNN training across workers with a communication-computation "
    "pipeline and hierarchical caching of remote neighbour features.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("partition")(partition.partition_cmd)
app.command("profile-cache")(profile_cache.profile_cache_cmd)
app.command("train")(train.train_cmd)
app.command("bench")(bench.bench_cmd)
app.command("compile")(compile_cli.compile_cmd)


def main() -> None:
    """Console-script entry point."""
    app()
