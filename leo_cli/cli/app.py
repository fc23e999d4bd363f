"""The `leo` command: a Typer app with one thin module per subcommand."""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
from typing import NoReturn

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


def main() -> NoReturn:
    """Console-script entry point: the command, then `leave` with its exit code."""
    from leo_cli.util.timing import started_as_command

    started_as_command()
    code: object = 0
    try:
        app()
    except SystemExit as exc:  # typer ends every command with one
        code = exc.code
    leave(code)


def leave(code: object) -> NoReturn:
    """Exit as the interpreter would with `code` (a SystemExit's), less its teardown: other
    threads are waited for and atexit's handlers run (logging, multiprocessing, weakref
    finalizers), the streams are flushed, then the process ends without freeing every module
    and running the libraries' destructors (with torch loaded, a wait after the run's end)."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # as Python does with SystemExit("message")
        code = 1
    shutdown = getattr(threading, "_shutdown", None)  # non-daemon threads, executors' exit
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # (None: the command started with it closed)
                stream.flush()
        except (OSError, ValueError):  # a closed pipe: Python's own exit code for it
            code = code or 120
    ctypes.CDLL(None).fflush(None)  # what C libraries wrote to their own buffered stdio
    os._exit(code or 0)
