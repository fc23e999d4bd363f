"""The suite's own helpers: `free_port` (a port no other process is handed, and none an
outgoing connection can take, between a test choosing it and its launch binding it: two pytest
processes run the suite at once) and `start_tied` (a process that ends with the test process,
however that ends)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.ports import ephemeral_range, free_port

HELPERS = str(Path(__file__).parent)

TAKE = f"""
import json, sys
sys.path.insert(0, {HELPERS!r})
from helpers.ports import free_port
print(json.dumps([free_port() for _ in range(200)]), flush=True)
sys.stdin.read()  # holds its ports until the test is done with them
"""


def test_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if low <= p <= high], (ports, low, high)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


@pytest.mark.integration
def test_two_processes_taking_ports_at_once_never_share_one() -> None:
    """Each holds its ports while the other takes: none handed to both, none to this process."""
    takers = [
        subprocess.Popen(
            [sys.executable, "-c", TAKE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        taken = [set(json.loads(p.stdout.readline())) for p in takers if p.stdout]
        mine = {free_port() for _ in range(200)}
    finally:
        for p in takers:
            p.communicate("")
    assert [len(t) for t in taken] == [200, 200]
    assert not taken[0] & taken[1] and not mine & (taken[0] | taken[1])
    low, high = ephemeral_range()
    assert not [p for p in taken[0] | taken[1] if low <= p <= high]


# A stand-in for pytest running `two_nodes`: it starts a node of its own session (here one that
# would wait for good), then a launch hangs past `leo`'s timeout and faulthandler ends it.
HANGS = f"""
import faulthandler, sys, time
sys.path.insert(0, {HELPERS!r})
from helpers.cli import start_tied
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
node = start_tied(sleeper, start_new_session=True, stdout=-3, stderr=-3)  # DEVNULL
print(node.pid, flush=True)
faulthandler.dump_traceback_later(0.2, exit=True)
time.sleep(600)
"""


@pytest.mark.integration
def test_a_tied_node_ends_with_a_test_process_that_faulthandler_ends() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", HANGS], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 1 and "Timeout" in proc.stderr, proc.stderr
    node = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 10
    while alive(node) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(node):
        os.kill(node, 9)
        raise AssertionError("the node outlived the test process that started it")


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not yet reaped by init, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
