"""The `leo` command leaves without the interpreter's teardown (cli/app.py `leave`) yet as
Python would: its exit code, other threads finished and atexit's handlers run first."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration  # starts Python processes


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        timeout=60, env={**os.environ, **env},
    )  # fmt: skip


def test_leave_waits_for_threads_and_runs_atexit_before_its_code() -> None:
    done = run("""
        import atexit, threading, time
        from leo_cli.cli.app import leave
        atexit.register(lambda: print("atexit ran", flush=False))
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread done"))).start()
        print("unflushed", end="")
        leave(3)
    """)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "unflushedthread done\natexit ran\n"


@pytest.mark.parametrize(
    ("code", "rc", "err"), [(None, 0, ""), ("no such run", 1, "no such run\n")]
)
def test_leave_exits_as_systemexit_would(code: str | None, rc: int, err: str) -> None:
    done = run(f"from leo_cli.cli.app import leave\nleave({code!r})")
    assert (done.returncode, done.stderr) == (rc, err)


def test_the_command_keeps_its_exit_code() -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "leo_cli", "train", "--no-such-flag"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "no-such-flag" in bad.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "leo_cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0 and "train" in ok.stdout


def test_leave_flushes_c_stdio_and_survives_a_closed_stdout() -> None:
    """What a C library printed through its own buffered stdio reaches a pipe; a command
    started with stdout closed (`sys.stdout` None) still leaves with its code."""
    done = run(
        """
        import ctypes
        from leo_cli.cli.app import leave
        ctypes.CDLL(None).printf(b"from C")
        leave(0)
    """,
        PYTHONUNBUFFERED="",
    )  # (set, it makes C's stdout unbuffered too)
    assert (done.returncode, done.stdout) == (0, "from C"), done.stderr
    closed = run("import sys\nsys.stdout = None\nfrom leo_cli.cli.app import leave\nleave(4)")
    assert (closed.returncode, closed.stderr) == (4, "")
