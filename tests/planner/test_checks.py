"""Settings training cannot honour yet are refused with one sentence, by `leo train` and by a
worker started without it (plain `torchrun -m leo_cli.worker.entry RUN_DIR`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from leo_cli.cli.app import app
from leo_cli.comm.dist import uses_cuda
from leo_cli.config import LeoConfig, load_config, write_resolved
from leo_cli.errors import ConfigError
from leo_cli.launch.launcher import check_device
from leo_cli.planner.checks import check_backend, check_config, check_transport

REFUSED = [
    ("pipeline.mode=compute-only", "pipeline.mode=compute-only skips the halo exchange"),
]


@pytest.mark.parametrize(("override", "message"), REFUSED)
def test_check_config_names_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(".", r"\.")):
        check_config(load_config(None, [override]))


@pytest.mark.parametrize(
    "override",
    [
        "pipeline.num_chunks=4",
        "run.name=x",
        "train.lr=0.5",
        "pipeline.mode=leo",
        "pipeline.mode=shared-memory",
        "bench.repeats=5",
        "cache.policy=degree",
        "cache.replica_budget_mb=64",
        "cache.halo_budget_mb=50%",
        "launch.nnodes=2",  # every node joins the probe: no cache.hardware needed
        "launch.nnodes=2 cache.policy=none",
    ],
)
def test_defaults_and_read_options_pass(override: str) -> None:
    check_config(load_config(None, override.split()))


def test_compute_only_needs_the_bench_flag() -> None:
    check_config(load_config(None, ["pipeline.mode=compute-only"]), allow_inexact=True)


def test_shared_memory_is_refused_across_hosts() -> None:
    cfg = load_config(None, ["pipeline.mode=shared-memory", "launch.nnodes=2", "cache.policy=none"])
    with pytest.raises(ConfigError, match="one host"):
        check_config(cfg)


def test_leo_train_refuses_before_partitioning(tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["train", "--set", f"run.out_dir={run}", "--set", "pipeline.mode=compute-only"]
    )
    assert result.exit_code == 2
    assert "--allow-inexact" in " ".join(result.stderr.split())
    assert not (run / "partitions").exists()


@pytest.mark.parametrize(("override", "message"), REFUSED)
@pytest.mark.integration
def test_worker_without_launcher_refuses_in_one_sentence(
    tmp_path: Path, override: str, message: str
) -> None:
    run = tmp_path / "run"
    write_resolved(load_config(None, [f"run.out_dir={run}", override]))
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "leo_cli.worker.entry", str(run)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert res.returncode == 3, res.stderr
    assert message in res.stderr and "Traceback" not in res.stderr


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's device check as on a machine with two GPUs (none is used)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_gloo_with_cuda_tensors_is_refused_in_one_sentence(two_gpus: None, device: str) -> None:
    cfg = load_config(None, [f"launch.device={device}", "launch.backend=gloo"])
    with pytest.raises(ConfigError, match=r"launch\.backend=gloo cannot move the CUDA tensors"):
        check_device(cfg.launch, 2, uses_cuda(cfg.launch))
    result = CliRunner().invoke(
        app, ["train", "--set", f"launch.device={device}", "--set", "launch.backend=gloo"]
    )
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "launch.backend=gloo cannot move" in " ".join(result.stderr.split())


@pytest.mark.parametrize("setting", ["launch.backend=auto", "launch.backend=nccl"])
def test_gpu_backends_pass_the_device_check(two_gpus: None, setting: str) -> None:
    launch = load_config(None, [setting]).launch
    check_device(launch, 2, uses_cuda(launch))


def test_gloo_on_the_cpu_passes_even_beside_gpus(two_gpus: None) -> None:
    launch = load_config(None, ["launch.device=cpu", "launch.backend=gloo"]).launch
    check_device(launch, 2, uses_cuda(launch))


def test_a_worker_refuses_gloo_on_its_gpu() -> None:
    with pytest.raises(ConfigError, match="launch.device=cpu"):
        check_backend("gloo", on_cuda=True)
    check_backend("gloo", on_cuda=False)
    check_backend("cpu:gloo,cuda:nccl", on_cuda=True)


def test_shared_memory_transport_is_refused_where_nothing_is_read_in_place() -> None:
    def cfg(*overrides: str) -> LeoConfig:
        return load_config(None, list(overrides))

    check_transport(cfg("pipeline.transport=shared-memory"), on_cuda=False)
    check_transport(cfg("pipeline.transport=process-group", "pipeline.mode=blocking"), True)
    blocking = cfg("pipeline.transport=shared-memory", "pipeline.mode=blocking")
    with pytest.raises(ConfigError, match="does not apply to pipeline.mode=blocking"):
        check_transport(blocking, on_cuda=False)
    from leo_cli.planner import checks

    with pytest.MonkeyPatch.context() as patch:  # a torch that cannot map peer GPUs
        patch.setattr(checks, "peer_memory_available", lambda: False)
        with pytest.raises(ConfigError, match="symmetric memory"):
            check_transport(cfg("pipeline.transport=shared-memory"), on_cuda=True)
    gat = cfg("pipeline.transport=shared-memory", "model.name=gat")
    with pytest.raises(ConfigError, match="does not apply to model.name=gat"):
        check_transport(gat, on_cuda=False)


def test_cuda_workers_read_peer_gpus_in_place_only_when_asked_and_able(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPUs read a peer's rows in place under pipeline.transport=shared-memory alone (auto
    keeps them on the process group until the path has run on GPUs), where torch can map
    peer memory; CPU workers as before."""
    from leo_cli.planner import checks
    from leo_cli.planner import reach as in_place

    def cfg(*overrides: str) -> LeoConfig:
        return load_config(None, ["pipeline.mode=leo", *overrides])

    shm, auto = cfg("pipeline.transport=shared-memory"), cfg("pipeline.transport=auto")
    x86 = in_place.platform.machine().lower() in in_place.ORDERED_STORES
    for able in (False, True):
        monkeypatch.setattr(in_place, "peer_memory_available", lambda able=able: able)
        monkeypatch.setattr(checks, "peer_memory_available", lambda able=able: able)
        assert in_place.reads_in_place(shm, "cuda") is (able and x86)
        assert in_place.reads_in_place(auto, "cuda") is False
        assert in_place.reads_in_place(auto, "cpu") is x86
        if able and x86:
            check_transport(shm, on_cuda=True)
        else:
            with pytest.raises(ConfigError, match="symmetric memory|store order"):
                check_transport(shm, on_cuda=True)
