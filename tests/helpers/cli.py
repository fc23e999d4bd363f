"""The `leo` command in tests: `leo` runs it in a fresh interpreter, as a user would;
`leo_here` runs it in the test process, for a command refused before any worker starts.
Both report as `subprocess.run` does (`returncode`, `stdout`, `stderr`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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


def leo(*args: str, timeout: float = 600, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """`leo args` in a subprocess (`python -m leo_cli`), its output captured as text; a failing
    exit is returned, not raised. `kwargs` go to `subprocess.run` (env, cwd, ...)."""
    return subprocess.run(
        [sys.executable, "-m", "leo_cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,
    )


def leo_here(*args: str) -> subprocess.CompletedProcess[str]:
    """`leo args` in this process (Typer's test runner), as `subprocess.run` would report it:
    for a command refused before any worker starts, without a fresh interpreter's ~4 s of
    imports. An exception other than the command's exit propagates (with its traceback); the
    environment and the signal handlers the command sets are put back."""
    from unittest import mock

    from typer.testing import CliRunner

    from leo_cli.cli.app import app

    signals = (signal.SIGINT, signal.SIGTERM)
    saved = {sig: signal.getsignal(sig) for sig in signals}
    try:
        with mock.patch.dict(os.environ):
            res = CliRunner().invoke(app, list(args), catch_exceptions=False)
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)
    return subprocess.CompletedProcess(["leo", *args], res.exit_code, res.stdout, res.stderr)
