"""`launch.cpu_affinity`: placements this machine cannot honour are refused in one sentence;
a pinned worker runs on its cores with one thread per core unless the user chose threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from leo_cli.errors import ConfigError
from leo_cli.harness.placement import AFFINITY_ENV, check_affinity, describe, placement_env

CORES = sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("affinity", "nproc", "needle"),
    [
        ([[CORES[0]]], 2, "launch.cpu_affinity lists 1 core sets but this node starts 2 workers"),
        ([[CORES[0]], [CORES[0]]], 3, "lists 2 core sets but this node starts 3 workers"),
        ([[CORES[0]], [1 << 20]], 2, f"names core {1 << 20}, which this machine does not offer"),
    ],
)
def test_placements_the_machine_lacks_are_refused(
    affinity: list[list[int]], nproc: int, needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        check_affinity(affinity, nproc)
    message = str(info.value)
    assert needle in message and message.endswith(".") and "\n" not in message


def test_placements_that_fit_and_no_placement_pass() -> None:
    check_affinity(None, 4)
    check_affinity([[CORES[0]], [CORES[-1]], [CORES[-1]]], 3)
    assert describe({0, 1, 2, 5, 7, 8}) == "0-2, 5, 7-8"


def pinned(user_threads: str | None) -> dict[str, object]:
    """What a rank process sees after pinning itself to the first core."""
    code = (
        "import json, os, torch; from leo_cli.harness.placement import pin_rank; "
        "cores = pin_rank(1); print(json.dumps({'cores': cores, "
        "'mask': sorted(os.sched_getaffinity(0)), 'threads': torch.get_num_threads()}))"
    )
    env = dict(os.environ)
    env[AFFINITY_ENV] = placement_env([CORES, [CORES[0]]], user_threads) or ""
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.integration
def test_a_pinned_worker_runs_on_its_cores_with_as_many_threads() -> None:
    got = pinned(None)
    assert got == {"cores": [CORES[0]], "mask": [CORES[0]], "threads": 1}
    assert pinned("3")["threads"] == 3  # the user's OMP_NUM_THREADS wins
