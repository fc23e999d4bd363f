"""A profile of several machines is reused only when every rank finds its own entry measured
where it runs now (host, torch, threads): only a node knows its host, so the ranks decide
together (`probe.py --keep-if-same`)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks

from leo_cli.comm.dist import DistEnv
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.planner.profile.probe import agreed_quick
from leo_cli.planner.profile.store import same_rank


def probe(out: Path, *flags: str) -> None:
    cmd = [sys.executable, "-m", "leo_cli.planner.profile.probe", str(out), "--quick", *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr


def edited(path: Path, **rank0: object) -> None:
    data = json.loads(path.read_text())
    data["ranks"][0].update(rank0)
    path.write_text(json.dumps(data))


@pytest.mark.integration
def test_the_probe_keeps_a_profile_only_when_every_rank_is_where_it_was(tmp_path: Path) -> None:
    out = tmp_path / "hardware.json"
    probe(out)
    hw = HardwareProfile.read(out)
    threads = torch.get_num_threads()  # this test process's may differ from the probe's
    torch.set_num_threads(hw.ranks[0].threads)
    try:
        assert same_rank(hw, 0) and not same_rank(hw, 1)  # a rank the profile does not have
        assert not same_rank(hw.model_copy(update={"torch_version": "0.0"}), 0)
        other_host = hw.ranks[0].model_copy(update={"hostname": "elsewhere"})
        assert not same_rank(hw.model_copy(update={"ranks": [other_host]}), 0)
        more_threads = hw.ranks[0].model_copy(update={"threads": hw.ranks[0].threads + 1})
        assert not same_rank(hw.model_copy(update={"ranks": [more_threads]}), 0)
    finally:
        torch.set_num_threads(threads)

    kept = out.read_bytes()
    probe(out, "--keep-if-same")
    assert out.read_bytes() == kept  # every rank where it was: not measured again

    edited(out, hostname="elsewhere")  # which node is which changed
    probe(out, "--keep-if-same")
    again = HardwareProfile.read(out)
    assert again.ranks[0].hostname == socket.gethostname()

    data = json.loads(out.read_text())
    data["quick"] = False  # measured with the full sizes: not this probe's
    out.write_text(json.dumps(data))
    probe(out, "--keep-if-same")
    assert HardwareProfile.read(out).quick


def _agree(rank: int, world: int) -> tuple[bool, bool]:
    """Rank 0 asks for the tiny sizes, rank 1 (another node's environment) does not."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    env = DistEnv(rank=rank, world_size=world, local_rank=0, restart=0)
    return agreed_quick(env, rank == 0), agreed_quick(env, rank == 0, src=1)


@pytest.mark.dist
def test_every_probe_rank_measures_the_sizes_rank_0_asks_for() -> None:
    """Nodes read their own LEO_PROBE_QUICK: one rank measuring other sizes than the others
    would wait for collectives they never make."""
    assert spawn_ranks(_agree, 2) == [(True, False), (True, False)]
