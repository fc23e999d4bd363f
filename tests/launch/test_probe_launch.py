"""The hardware probe through the training launcher: 2 gloo workers write a valid profile;
a worker that fails becomes one CacheError saying where its log is."""

from __future__ import annotations

from pathlib import Path

import pytest

from leo_cli.config import load_config
from leo_cli.errors import CacheError
from leo_cli.launch import stages as plan_stage
from leo_cli.launch.allocator import allocator_of
from leo_cli.launch.elastic import worker_threads
from leo_cli.launch.probe import PROBE_FOLDER, run_probe
from leo_cli.planner.profile.hardware import HARDWARE_FILE, HardwareProfile
from leo_cli.planner.profile.rates import Rates

pytestmark = pytest.mark.dist


@pytest.fixture(autouse=True)
def _restore_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher sets OMP_NUM_THREADS in this process; later tests must not inherit it."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


@pytest.mark.integration
def test_probe_on_two_workers(tmp_path: Path) -> None:
    cfg = load_config(None, ["partition.num_parts=2", f"run.out_dir={tmp_path}"])
    profile = run_probe(cfg, tmp_path, quick=True)
    assert HardwareProfile.read(tmp_path / HARDWARE_FILE) == profile
    assert profile.world_size == 2 and profile.quick
    assert profile.threads_per_worker == int(worker_threads(2))
    for link in (profile.links.gloo, profile.links.shm):
        assert link is not None and [p.ranks for p in link.pairs] == [(0, 1)]
    assert Rates(profile).barrier_seconds() > 0
    assert Rates(profile).transfer_seconds(1 << 20, 1) > Rates(profile).transfer_seconds(1 << 10, 1)
    assert list((tmp_path / PROBE_FOLDER / "logs").iterdir())
    in_place = profile.links.in_place  # both workers on this host read each other's rows
    assert in_place is not None and in_place.widths == list(profile.sizes.widths)
    assert len(in_place.local_edges_per_s) == len(in_place.mapped_edges_per_s) == 2
    assert Rates(profile, 1).in_place_slowdown() >= 1.0
    assert profile.allocator == allocator_of("auto").name  # the workers' own, recorded


@pytest.mark.integration
def test_failed_probe_names_the_log(tmp_path: Path) -> None:
    (tmp_path / HARDWARE_FILE).mkdir()  # rank 0 cannot write the profile over a folder
    cfg = load_config(None, ["partition.num_parts=2", f"run.out_dir={tmp_path}"])
    with pytest.raises(CacheError, match="hardware probe failed") as info:
        run_probe(cfg, tmp_path, quick=True)
    assert str(tmp_path / PROBE_FOLDER / "logs") in str(info.value)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_probe_for_gpu_training_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], device: str
) -> None:
    """The probe measures the host; a plan for GPU workers says its times are CPU figures."""
    probed: list[Path] = []

    class _Profile:
        load = None  # not recorded

        def write(self, path: Path) -> None:
            probed.append(path)

    monkeypatch.setenv("LEO_HARDWARE_CACHE", str(tmp_path / "machine"))
    monkeypatch.setattr(plan_stage, "run_probe", lambda cfg, run_dir, quick: _Profile())
    cfg = load_config(None, [f"launch.device={device}", f"run.out_dir={tmp_path}"])
    plan_stage.hardware_profile(cfg, tmp_path, None, num_workers=2)
    assert len(probed) == 1
    warned = "do not describe GPU training" in capsys.readouterr().err
    assert warned == (device == "cuda")
