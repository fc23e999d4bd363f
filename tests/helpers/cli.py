"""The `leo` command in tests, run in the test process (`leo_here`) or, where a process start
matters, in a fresh interpreter (`leo(..., fresh=True)`); both report as `subprocess.run`
does (`returncode`, `stdout`, `stderr`)."""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

# A small synthetic graph and model for end-to-end runs of a few seconds (`--set` pairs).
TINY = [
    "--set",
    "data.synthetic.num_nodes=600",
    "--set",
    "data.synthetic.num_features=16",
    "--set",
    "model.hidden_channels=16",
]


# Loaded here: a forked child must not load a library (another thread may hold a lock).
LIBC = ctypes.CDLL("libc.so.6", use_errno=True) if sys.platform.startswith("linux") else None


def start_tied(cmd: Sequence[str], **popen: Any) -> subprocess.Popen[str]:
    """`subprocess.Popen(cmd, text=True, **popen)` whose process Linux SIGKILLs when the
    thread that started it ends (call it from the main thread: then when this process ends,
    however it ends): a launch hung past `leo`'s timeout ends pytest
    through faulthandler, which runs no `finally`, and a node started beside it would wait at
    its rendezvous for good (a process of its own session, it gets no terminal signal)."""
    parent = os.getpid()

    def tie() -> None:
        if LIBC is not None:
            LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent ended before the tie was made
            os._exit(1)

    return subprocess.Popen(list(cmd), text=True, preexec_fn=tie, **popen)


def leo(
    *args: str,
    fresh: bool = False,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`leo args`, its output captured as text; a failing exit is returned, not raised.

    In this process by default (`leo_here`): a launch forks its workers from the preloading
    server this pytest process keeps (`launch/preload.py`), as a user's Python session calling
    `leo_cli.api` would, without a fresh interpreter's imports and server per call. `fresh`: a
    new interpreter (`python -m leo_cli`), for what a process start decides
    (imports, the environment read at import, the exit code a signal gives). A launch still
    running after `timeout` seconds ends the pytest process with every thread's traceback."""
    if fresh:
        return subprocess.run(
            [sys.executable, "-m", "leo_cli", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
            cwd=cwd,
        )
    faulthandler.dump_traceback_later(timeout, exit=True)  # a hung launch ends the session
    try:
        return leo_here(*args, env=env, cwd=cwd)
    finally:
        faulthandler.cancel_dump_traceback_later()


def leo_here(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`leo args` in this process (Typer's test runner), as `subprocess.run` would report it,
    in `env` (else this process's environment), less PYTEST_CURRENT_TEST, and `cwd`. An
    exception other than the command's exit propagates (with its traceback); the environment,
    the working directory and the signal handlers the command sets are put back. The CLI's
    consoles follow the call's COLUMNS, as a new process's would (Rich fixes a console's width
    to the COLUMNS it was made under, which would be the first call's that imported the CLI)."""
    from unittest import mock

    from typer.testing import CliRunner

    from leo_cli.cli import common
    from leo_cli.cli.app import app

    signals = (signal.SIGINT, signal.SIGTERM)
    saved = {sig: signal.getsignal(sig) for sig in signals}
    here = os.getcwd()
    try:
        with (
            mock.patch.dict(os.environ, clear=env is not None),
            mock.patch.object(common.console, "_width", None),
            mock.patch.object(common.err_console, "_width", None),
        ):
            os.environ.update(env or {})
            # Not PYTEST_CURRENT_TEST (pytest's running test and phase): the workers' server
            # starts again for another environment (launch/preload.py `ensure_server`), and
            # one server serves every launch of this process.
            os.environ.pop("PYTEST_CURRENT_TEST", None)
            if cwd is not None:
                os.chdir(cwd)
            res = CliRunner().invoke(app, list(args), catch_exceptions=False)
    finally:
        os.chdir(here)
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)
    return subprocess.CompletedProcess(["leo", *args], res.exit_code, res.stdout, res.stderr)
