"""A process's peak resident memory is its own, not the one of the process that exec'd it."""

from __future__ import annotations

import subprocess
import sys

import pytest

_TOUCH = "block = bytearray({mib} * 2**20); block[::4096] = b'x' * len(block[::4096])"
_PEAK = "from leo_cli.util.rss import peak_rss_bytes; print(peak_rss_bytes())"


def run(code: str, *args: str) -> str:
    cmd = [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=120).stdout


def test_the_peak_grows_with_what_the_process_touches() -> None:
    code = f"{_PEAK}\n{_TOUCH.format(mib=256)}\n{_PEAK}"
    before, after = (int(line) for line in run(code).split())
    assert after - before > 200 * 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss inheritance is Linux's")
def test_the_peak_is_not_inherited_across_exec() -> None:
    touch_then_exec = f"import os, sys\n{_TOUCH.format(mib=400)}\n"
    touch_then_exec += "os.execv(sys.executable, [sys.executable, '-c', sys.argv[1]])"
    assert int(run(touch_then_exec, _PEAK)) < 200 * 2**20  # the exec'ing process's 400 MiB
