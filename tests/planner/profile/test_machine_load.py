"""The probe's load meter counts its own workers' CPU, also while they are children of a living
server rather than of the launcher (launch/preload.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from leo_cli.planner.profile import machine_load

BURN = "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"
# A "server" that starts a worker, burns 0.4 s in it, waits for it, then lives on.
SERVER = (
    "import subprocess, sys, time\n"
    f"subprocess.run([sys.executable, '-c', {BURN!r}], check=True)\n"
    "print('reaped', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.integration  # starts processes
def test_a_living_childs_reaped_children_are_our_own_cpu() -> None:
    before = machine_load.own_cpu_s()
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "reaped"
        assert server.pid in machine_load.living_descendants()
        assert machine_load.process_cpu_s(server.pid) >= 0.4
        assert machine_load.own_cpu_s() - before >= 0.4
    finally:
        server.kill()
        server.wait()
    assert machine_load.process_cpu_s(server.pid) == 0.0  # gone


# A "server" whose worker burns 0.4 s and lives on, not waited for (a worker still running).
WORKER = BURN + "print('burnt', flush=True)\ntime.sleep(60)\n"
LIVING = (
    "import subprocess, sys, time\n"
    f"worker = subprocess.Popen([sys.executable, '-c', {WORKER!r}], stdout=subprocess.PIPE,"
    " text=True)\n"
    "print(worker.pid, worker.stdout.readline().strip(), flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.integration  # starts processes
def test_a_living_grandchilds_cpu_is_our_own() -> None:
    """Workers forked from a living server are this process's grandchildren while they run."""
    before = machine_load.own_cpu_s()
    server = subprocess.Popen([sys.executable, "-c", LIVING], stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        assert server.stdout is not None
        pid, said = server.stdout.readline().split()
        worker = int(pid)
        assert said == "burnt" and worker in machine_load.living_descendants()
        assert machine_load.process_cpu_s(server.pid) < 0.4  # its worker is not reaped
        assert machine_load.own_cpu_s() - before >= 0.4
    finally:
        if worker is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
        server.kill()
        server.wait()
