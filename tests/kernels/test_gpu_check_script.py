"""scripts/gpu-check.sh, the one prepared run of a GPU slot, without a GPU: in a sandbox whose
.venv/bin/python only answers the script's environment probe, and whose `make` and `pip`
record that they were called. Plus its report helper on made-up run folders."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import gpu_check_report  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def sandbox(tmp_path: Path, env_facts: dict[str, object]) -> tuple[Path, dict[str, str]]:
    """A checkout with the real scripts, a fake .venv python printing `env_facts`, and `make` /
    `pip` stand-ins on PATH that log their arguments to calls.log."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("gpu-check.sh", "gpu-check-train.sh", "gpu_check_report.py"):
        shutil.copy2(SCRIPTS / name, repo / "scripts" / name)
    (repo / "pyproject.toml").write_text("# newer than .venv/.installed\n")
    calls = tmp_path / "calls.log"
    executable(
        repo / ".venv" / "bin" / "python",
        f"#!/bin/sh\necho \"python $*\" >> {calls}\necho '{json.dumps(env_facts)}'\n",
    )
    for tool in ("make", "pip", "pip3"):
        executable(tmp_path / "bin" / tool, f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexit 1\n')
    path = f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"
    return repo, {**os.environ, "PATH": path}


def run_check(repo: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], dict]:
    proc = subprocess.run(
        ["bash", "scripts/gpu-check.sh", "out"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc, json.loads((repo / "out" / "summary.json").read_text())


CUDA_TORCH = {"torch": "2.13.0+cu130", "cuda": "13.0", "gpus": 0, "names": []}


@pytest.mark.integration
def test_a_venv_with_cuda_torch_needs_no_registry(tmp_path: Path) -> None:
    repo, env = sandbox(tmp_path, CUDA_TORCH)
    proc, summary = run_check(repo, env)
    calls = (tmp_path / "calls.log").read_text()
    assert "make" not in calls and "pip" not in calls, calls
    # No GPU here: the run stops after the environment step, and says why.
    assert proc.returncode == 1 and summary["failed_steps"] == ["env"]
    assert summary["steps"][0]["detail"] == "no CUDA device visible"
    assert summary["env"]["cuda"] == "13.0"


@pytest.mark.integration
def test_a_venv_without_cuda_torch_is_installed_first(tmp_path: Path) -> None:
    repo, env = sandbox(tmp_path, {**CUDA_TORCH, "cuda": None})
    proc, summary = run_check(repo, env)
    assert "make install" in (tmp_path / "calls.log").read_text()
    assert proc.returncode == 1 and "no CUDA build of torch" in summary["steps"][0]["detail"]


def write_run(folder: Path, losses: list[float], **summary: object) -> Path:
    folder.mkdir(parents=True)
    rows = [{"epoch": i + 1, "loss": loss} for i, loss in enumerate(losses)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = {"mode": "leo", "world_size": 2, "kernels": "cuda", "exact": True, **summary}
    (folder / "summary.json").write_text(json.dumps(done))
    return folder


def test_compare_accepts_rounding_and_names_every_problem(tmp_path: Path) -> None:
    ref = write_run(tmp_path / "p1", [2.0, 1.5, 1.25], world_size=1)
    same = write_run(tmp_path / "leo", [2.0, 1.5 * (1 + 1e-12), 1.25])
    assert gpu_check_report.compare(tmp_path, ref, [same]) == 0
    drift = write_run(tmp_path / "drift", [2.0, 1.5 * (1 + 1e-6), 1.25], kernels="reference")
    assert gpu_check_report.compare(tmp_path, ref, [same, drift]) == 1
    report = json.loads((tmp_path / "exactness.json").read_text())
    problems = report["runs"][1]["problems"]
    assert any("losses differ" in p for p in problems) and any("not cuda" in p for p in problems)


def test_summary_gathers_steps_tests_and_bench(tmp_path: Path) -> None:
    for step, status in [("env", "ok"), ("compile", "ok"), ("tests", "fail"), ("bench", "ok")]:
        gpu_check_report.record(tmp_path, step, status, "12.0", "exit 0")
    (tmp_path / "pytest-gpu.log").write_text("....F\n1 failed, 300 passed, 2 skipped in 80.1s\n")
    bench = {"device": "H200", "backend": "cuda", "copy_bandwidth": 4.1e12, "rows": [{"k": 1}]}
    (tmp_path / "bench_gpu.json").write_text(json.dumps(bench))
    assert gpu_check_report.summarize(tmp_path) == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["failed_steps"] == ["tests"] and summary["wall_s"] == 48.0
    assert summary["gpu_tests"] == {"failed": 1, "passed": 300, "skipped": 2}
    assert summary["bench"]["copy_bandwidth"] == 4.1e12


def test_compare_wants_rows_read_in_place_where_asked_and_a_finished_run(tmp_path: Path) -> None:
    """The two-GPU run with pipeline.transport=shared-memory must have read rows in place (a
    run that quietly moved every row through NCCL would otherwise pass), and a run that
    stopped is a problem, not a crash."""
    ref = write_run(tmp_path / "p1", [2.0, 1.5], world_size=1)
    peer = write_run(tmp_path / "peer", [2.0, 1.5], mode="fine-grained")
    (peer / "resolved_config.yaml").write_text("pipeline:\n  transport: shared-memory\n")
    assert gpu_check_report.compare(tmp_path, ref, [peer]) == 1
    summary = json.loads((peer / "summary.json").read_text())
    (peer / "summary.json").write_text(json.dumps({**summary, "mean_step_published_bytes": 8.0}))
    assert gpu_check_report.compare(tmp_path, ref, [peer]) == 0
    assert gpu_check_report.compare(tmp_path, ref, [tmp_path / "stopped"]) == 1
    report = json.loads((tmp_path / "exactness.json").read_text())
    assert report["runs"][0]["problems"] == ["the run did not finish (see train.log)"]
