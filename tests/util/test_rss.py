"""A process's peak resident memory is its own, not the one of the process that exec'd it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from leo_cli.util.rss import peak_rss_bytes

_TOUCH_THEN_EXEC = """
import os, sys
block = bytearray(400 * 2**20)
block[:: 4096] = b"x" * len(block[:: 4096])
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
"""

_REPORT = "from leo_cli.util.rss import peak_rss_bytes; print(peak_rss_bytes())"


def test_peak_is_this_process_and_grows_with_what_it_touches() -> None:
    before = peak_rss_bytes()
    block = bytearray(64 * 2**20)
    block[::4096] = b"x" * len(block[::4096])
    assert before > 1e6 and peak_rss_bytes() >= before
    assert peak_rss_bytes() > 64 * 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss inheritance is Linux's")
def test_peak_is_not_inherited_across_exec() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _TOUCH_THEN_EXEC, _REPORT],
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(out.stdout) < 200 * 2**20  # the 400 MiB the exec'ing process touched are not ours
