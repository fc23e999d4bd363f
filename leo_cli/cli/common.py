"""What every command shares: the --config/--set options, config loading and error rendering."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from leo_cli.config import LeoConfig, load_config
from leo_cli.errors import LeoError

console = Console()
err_console = Console(stderr=True)

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="YAML config file (sections run, data, partition, model, train, cache, pipeline, "
        "launch, bench). Without it the built-in default trains on the synthetic graph.",
        show_default=False,
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        help="Override one config key, e.g. --set partition.num_parts=4 or "
        "--set model.dropout=0; the value is parsed as YAML. Repeatable; wins over the YAML "
        "file.",
        show_default=False,
    ),
]

P = ParamSpec("P")
R = TypeVar("R")


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Render `LeoError` as one red sentence on stderr and exit with code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except LeoError as exc:
            err_console.print(
                f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True
            )
            raise typer.Exit(code=2) from None
        except KeyboardInterrupt:
            err_console.print("[bold red]interrupted[/]")
            raise typer.Exit(code=130) from None

    return wrapper


def resolve_config(config: Path | None, overrides: list[str] | None) -> LeoConfig:
    """Defaults < YAML < --set (explicit flags are applied by each command on top)."""
    return load_config(config, overrides or [])
