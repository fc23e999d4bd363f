"""The `leo` command: a Typer app with one thin module per subcommand."""

from __future__ import annotations

import typer

from leo_cli.cli import bench, convert, export, partition, profile_cache, train
from leo_cli.cli import compile as compile_cli
from leo_cli.cli.config import config_app

app = typer.Typer(
    name="leo",
    help="LEO: full-graph GNN training across workers with a communication-computation "
    "pipeline and hierarchical caching of remote neighbour features.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts print every character they hold ([...] included)
)
app.command("partition")(partition.partition_cmd)
app.command("profile-cache")(profile_cache.profile_cache_cmd)
app.command("train")(train.train_cmd)
app.command("bench")(bench.bench_cmd)
app.command("compile")(compile_cli.compile_cmd)
app.command("convert")(convert.convert_cmd)
app.command("export")(export.export_cmd)
app.add_typer(config_app, name="config")


def main() -> None:
    """Console-script entry point."""
    from leo_cli.util.timing import started_as_command

    started_as_command()
    app()
