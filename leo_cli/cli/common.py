"""What every command shares: the --config/--set options, config loading and error rendering."""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from leo_cli.comm import segments
from leo_cli.config import LeoConfig, load_config
from leo_cli.config.schema import MAX_CHUNKS
from leo_cli.errors import LeoError
from leo_cli.launch import emulate
from leo_cli.registry import DEFAULT_MODE, mode_settings
from leo_cli.util.interrupt import Interrupted, raise_on_signals

console = Console()
err_console = Console(stderr=True)

ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        metavar="FILE",
        help="YAML config file (sections run, data, partition, model, train, cache, pipeline, "
        "launch, bench; `leo config keys` lists every key). Without it the built-in default "
        "trains on the synthetic graph.",
        show_default=False,
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        metavar="KEY=VALUE",
        help="Override one config key, e.g. --set partition.num_parts=4 or "
        "--set model.dropout=0; the value is parsed as YAML. Repeatable; wins over the YAML "
        f"file. pipeline.mode takes {', '.join(mode_settings())} (default {DEFAULT_MODE}: the "
        "fastest exact mode, measured by the workers before the first epoch among the "
        "candidates the cache plan keeps and kept as wisdom for the next run; "
        "pipeline.choose=estimate picks by the plan's prediction alone). "
        f"pipeline.num_chunks takes `auto` or 1 to {MAX_CHUNKS} (chunks per peer). "
        "Unequal workers: partition.part_weights=measured (or [w0,w1,...]) sizes the parts by "
        "each worker's speed; launch.cpu_affinity=[[0],[1],[1]] pins each local worker to "
        "its cores; partition.method=file with partition.owners_path=OWNERS.npy trains on "
        "parts made elsewhere.",
        show_default=False,
    ),
]

P = ParamSpec("P")
R = TypeVar("R")


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Render `LeoError` as one red sentence on stderr and exit with code 2 (no traceback);
    SIGINT and SIGTERM end the command as one line too, with exit code 130 / 143 (cleanup runs
    on the way out: util/interrupt.py)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        raise_on_signals()
        try:
            return fn(*args, **kwargs)
        except LeoError as exc:
            err_console.print(
                f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True
            )
            raise typer.Exit(code=2) from None
        except KeyboardInterrupt as exc:
            stop = exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT)
            err_console.print(f"[bold red]{escape(stop.sentence())}[/]", soft_wrap=True)
            raise typer.Exit(code=stop.exit_code) from None

    return wrapper


def resolve_config(config: Path | None, overrides: list[str] | None) -> LeoConfig:
    """Defaults < YAML < --set (explicit flags are applied by each command on top)."""
    return load_config(config, overrides or [])


def sweep_segments(say: Console = console) -> None:
    """Remove shared-memory segments and emulated clusters' namespaces that ended jobs left
    behind, saying what was freed on `say` (at the start of every `leo train` and `leo
    bench`)."""
    freed = segments.sweep_stale()
    if freed.count:
        say.print(f"[yellow]Note:[/] {escape(segments.describe(freed))}")
    gone = emulate.sweep()
    if gone:
        say.print(
            f"[yellow]Note:[/] removed {gone} network namespace{'s' * (gone != 1)} of emulated "
            "nodes a killed run left behind."
        )
