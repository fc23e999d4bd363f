"""Node 1 of a two-machine run starts its workers only once node 0 has prepared this launch:
an earlier launch's files in the folder (`--overwrite` on the same run.out_dir) must not
pass for node 0's. The race of `test_two_nodes_match_one_launch`, step by step: node 1 leaves
the probe both nodes joined, finds the earlier launch's partitions, plan and resolved
config, and (before the fix) started its agent while node 0 was still preparing."""

from __future__ import annotations

import shutil
import types
from pathlib import Path
from typing import Any

import pytest
from conftest import hardware_dict

from leo_cli.config import LeoConfig, load_config, write_resolved
from leo_cli.errors import TrainError
from leo_cli.launch import launcher, setup
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.run_dir import RunDir

TINY = ["data.synthetic.num_nodes=600", "data.synthetic.num_features=16"]


def config(run: Path, given: Path, *settings: str) -> LeoConfig:
    return load_config(None, [*TINY, f"run.out_dir={run}", f"cache.hardware={given}", *settings])


@pytest.fixture(scope="module")
def earlier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder as an earlier launch left it: partitions, plan and resolved config."""
    root = tmp_path_factory.mktemp("earlier")
    given = root / "hardware.json"
    HardwareProfile.model_validate(hardware_dict()).write(given)
    setup.prepare(config(root / "run", given), resume=False, progress=None)
    return root


def node1(earlier: Path, tmp_path: Path) -> LeoConfig:
    run = tmp_path / "run"
    shutil.copytree(earlier / "run", run)
    node = ["launch.nnodes=2", "launch.node_rank=1", "launch.master_port=29999"]
    return config(run, earlier / "hardware.json", *node, "launch.timeout_s=30")


class Clock:
    """`launcher.time` for node 1: each sleep is a moment in which node 0 may act
    (`node0`, called with the number of the sleep)."""

    def __init__(self, node0: Any) -> None:
        self.now, self.sleeps, self.node0 = 0.0, 0, node0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        self.node0(self.sleeps)


def patch(monkeypatch: pytest.MonkeyPatch, clock: Clock, probed: bool) -> None:
    """Node 1's clock is `clock`; it joined a probe with node 0 or not (`probed`: the probe's
    launch itself is not run; the profile given in `config` only spares the earlier launch
    its own)."""
    fake = types.SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep)
    monkeypatch.setattr(launcher, "time", fake)
    monkeypatch.setattr(setup, "join_probe", lambda cfg, run_dir, *how: probed)


def test_node1_waits_for_node0s_config_after_the_probe_they_joined(
    earlier: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = node1(earlier, tmp_path)
    run = RunDir(cfg.run.folder)
    before = run.config.stat().st_ino
    rewritten: list[int] = []

    def node0(sleeps: int) -> None:  # node 0 writes its resolved config on node 1's 3rd look
        if sleeps == 3:
            write_resolved(cfg.model_copy(update={"launch": cfg.launch.model_copy(
                update={"node_rank": 0})}))  # fmt: skip
            rewritten.append(sleeps)

    clock = Clock(node0)
    patch(monkeypatch, clock, probed=True)
    assert setup.prepare(cfg, resume=False, progress=None) == cfg.run.folder.resolve()
    assert rewritten == [3] and clock.sleeps == 3  # not before node 0's write, nor long after
    assert run.config.stat().st_ino != before  # node 0's, not the earlier launch's


def test_node1_waiting_for_a_config_that_never_comes_names_the_folder(
    earlier: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = node1(earlier, tmp_path)
    patch(monkeypatch, Clock(lambda sleeps: None), probed=True)
    with pytest.raises(TrainError, match="waited 30 s for node 0"):
        setup.prepare(cfg, resume=False, progress=None)


def test_node1_without_a_probe_takes_the_files_there(
    earlier: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No probe launch: no store on node 0's port before its training agent's, whose
    rendezvous node 1's workers wait for (node 0 has prepared by then)."""
    cfg = node1(earlier, tmp_path)
    clock = Clock(lambda sleeps: None)
    patch(monkeypatch, clock, probed=False)
    setup.prepare(cfg, resume=False, progress=None)
    assert clock.sleeps == 0


def test_node1_waits_while_the_folder_is_empty(
    earlier: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = node1(earlier, tmp_path)
    saved = tmp_path / "saved.yaml"
    RunDir(cfg.run.folder).config.rename(saved)

    def node0(sleeps: int) -> None:
        if sleeps == 2:
            saved.rename(RunDir(cfg.run.folder).config)

    clock = Clock(node0)
    patch(monkeypatch, clock, probed=False)
    setup.prepare(cfg, resume=False, progress=None)
    assert clock.sleeps == 2
