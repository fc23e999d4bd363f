"""`leo train` end to end through the elastic launcher: run files, resume, faults, multi-node."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import TrainedRun, ended_pid
from helpers.cli import TINY, leo, leo_here, start_tied
from helpers.ports import free_port

from leo_cli.config import load_config
from leo_cli.graph.storage import read_meta
from leo_cli.kernels import backend_name
from leo_cli.planner.auto_mode import from_json
from leo_cli.planner.plan import UNPRICED_LEVELS, read_plan
from leo_cli.registry import auto_candidates
from leo_cli.run_dir import RunDir

pytestmark = pytest.mark.dist

# The runs the kill tests interrupt: a kill comes once epoch KILL_AT is done (a checkpoint
# exists by then) and must land mid-run, so MEDIUM_EPOCHS leaves that many epochs more (a few
# seconds of them: the tests poll every 0.1 s, on a loaded machine too) to train after it.
KILL_AT, MEDIUM_EPOCHS = 5, 50
MEDIUM = [
    *("--set", "data.synthetic.num_nodes=20000", "--set", "data.synthetic.num_features=64"),
    *("--set", "train.checkpoint_every=2", "--set", f"train.num_epochs={MEDIUM_EPOCHS}"),
]


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "leo_cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def metrics(run: Path) -> list[dict[str, Any]]:
    """Every line of a finished run's metrics.jsonl, strictly (a torn line fails the test)."""
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def summary(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "summary.json").read_text()))


def wait_for_epoch(run: Path, epoch: int, proc: subprocess.Popen[str], limit: float = 240) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        # the run is writing: a line that crosses a page boundary can be read half-appended
        rows = RunDir(run).read_metrics()
        if rows and rows[-1]["epoch"] >= epoch and list((run / "checkpoints").glob("*.pt")):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError(f"run did not reach epoch {epoch}")


@pytest.mark.integration
def test_the_summary_in_a_pipe_is_plain_lines(trained_run: TrainedRun) -> None:
    """Off a terminal (the session's run prints into a pipe) the summary is its title, then
    one `metric<TAB>value` line per metric; no bars or box characters."""
    out = trained_run.stdout
    assert not re.search("[\u2500-\u257f]", out), out
    lines = out.splitlines()
    start = lines.index("training summary: tiny-run")
    end = lines.index("", start)
    rows = dict(line.split("\t") for line in lines[start + 1 : end])
    assert rows["workers"] == "2" and rows["epochs"] == "6", rows
    assert rows["final loss"] == f"{summary(trained_run.folder)['final_loss']:.5f}"
    assert lines[-1] == f"Run folder: {trained_run.folder.resolve()}"


@pytest.mark.integration
def test_train_writes_run_folder(trained_run: TrainedRun) -> None:
    """The session's trained run (tests/conftest.py): TINY, 2 workers, 6 epochs, checkpoints
    every 2, named tiny-run, printed on a console 200 columns wide."""
    run, stdout = trained_run.folder, trained_run.stdout
    rows = metrics(run)
    assert [r["epoch"] for r in rows] == list(range(1, 7))
    keys = ("loss", "train_acc", "val_acc", "test_acc", "epoch_time_s", "comm_bytes")
    keys += ("comm_wait_s", "comm_wait_max_s", "comm_transfer_s", "step_comm_bytes")
    for key in keys:
        assert key in rows[-1]
    assert all(r["comm_bytes"] > 0 for r in rows)
    assert all(0 <= r["comm_wait_s"] <= r["comm_wait_max_s"] for r in rows)
    s = summary(run)
    assert s["world_size"] == 2 and s["final_loss"] == rows[-1]["loss"]
    # pipeline.mode=auto (the default): the candidates the cost model keeps, tried by the
    # workers, the fastest measured (or a tie with smaller buffers) trains; recorded with the
    # predictions and the measured steps (worker/trials.py)
    predicted, buffers = s["mode_predicted_s"], s["mode_buffer_bytes"]
    measured = {n: t for n, t in s["mode_measured_s"].items() if t is not None}
    assert s["mode_requested"] == "auto" and s["mode_trials"] == []
    assert set(predicted) == set(auto_candidates()) <= set(buffers)
    assert all(n.startswith("leo/") for n in set(buffers) - set(predicted))  # leo's variants
    name = from_json(s).name
    assert measured[name] <= min(measured.values()) * 1.03, s["mode_measured_s"]
    assert s["mode_rule"].startswith("measured "), s["mode_rule"]
    assert s["setup_parts_s"]["choose_s"] > 0
    # Priced by the plan the workers ran with (made again for the chosen mode when that mode
    # reads other rows in place than the planned one): what it chose by, or that plan's.
    # A winner without part of the plan's levels has no prediction of its own.
    plan = read_plan(run)
    priced = None if s["mode_levels"] in UNPRICED_LEVELS else plan.predicted_run[s["mode"]]
    assert plan is not None and s["predicted_epoch_time_s"] == priced
    resolved = load_config(run / "resolved_config.yaml")
    assert resolved.pipeline.mode == s["mode"]  # what every rank read, and a resume reads
    assert resolved.pipeline.levels == s["mode_levels"]
    line = " ".join(stdout.split())
    assert f"{name} (auto: {s['mode_rule']}" in line, line
    assert s["exact"] is True and s["mean_comm_transfer_s"] >= 0
    assert s["name"] == "tiny-run"
    assert s["kernels"] == backend_name() and s["total_comm_bytes"] == sum(
        r["comm_bytes"] for r in rows
    )
    assert (run / "curves.png").stat().st_size > 0
    assert sorted(p.name for p in (run / "checkpoints").glob("*.pt")) == [
        "best.pt",
        "epoch_000004.pt",  # epoch 2's deleted: the newest two are kept
        "epoch_000006.pt",
    ]
    assert "training summary: tiny-run" in stdout
    # Set-up is counted: from the start of `leo train` to the first step, split in stages.
    parts = s["setup_parts_s"]
    assert 0 < s["setup_s"] < s["wall_s"]
    assert parts["partition_s"] > 0 and "partition_s" not in s["setup_reused_s"]
    for key in ("plan_s", "launch_s", "worker_setup_s", "process_group_s", "aggregator_s"):
        assert parts[key] >= 0, key
    top = ("partition_s", "probe_s", "plan_s", "launch_s", "worker_setup_s", "other_s")
    assert sum(parts.get(k, 0.0) for k in top) == pytest.approx(s["setup_s"], abs=0.01)
    # Each worker's peak resident memory, by rank (a Python process with torch: > 50 MB).
    assert len(s["peak_rss_bytes"]) == 2 and all(b > 50e6 for b in s["peak_rss_bytes"])
    # The launcher and its workers together, sampled: at least one worker's worth, and less
    # than three full copies (pages they share count once).
    assert max(s["peak_rss_bytes"]) < s["peak_rss_total_bytes"] < 3 * sum(s["peak_rss_bytes"])


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The rows of one process on the trained run's graph (TINY), 4 epochs, evaluated each:
    the numbers every worker count and part shape must give."""
    run = tmp_path_factory.mktemp("p1") / "run"
    res = leo("train", *TINY, *["--set", "partition.num_parts=1", "--set", f"run.out_dir={run}"],
              *["--set", "train.num_epochs=4", "--set", "train.eval_every=1"])  # fmt: skip
    assert res.returncode == 0, res.stderr
    return metrics(run)


@pytest.mark.integration
def test_train_gives_same_numbers_for_1_2_4_workers(
    tmp_path: Path, one_worker: list[dict[str, Any]], trained_run: TrainedRun
) -> None:
    """The real path (launcher, elastic workers, read_part, build_job, META's training count):
    float32 loss curves agree to 1e-5 across P, all-reduced accuracies exactly. The 4 workers
    keep freed memory without huge pages, the others run the defaults (memory handed back,
    huge pages), all on the same allocator (`auto`): how memory is kept changes no number.
    2 workers: the first 4 epochs of the session's trained run (the same graph and model;
    an epoch's numbers do not depend on train.num_epochs)."""
    assert set(TINY[1::2]) <= set(trained_run.settings)  # TINY's graph and width
    assert summary(trained_run.folder)["world_size"] == 2
    curves = {1: one_worker, 2: metrics(trained_run.folder)[:4]}
    assert ("huge pages" in summary(trained_run.folder)["allocator"]) is True
    kept = ["launch.keep_freed_memory=true", "launch.huge_pages=false"]
    run = tmp_path / "p4"
    res = leo(
        "train",
        *TINY,
        *["--set", "partition.num_parts=4", "--set", f"run.out_dir={run}"],
        *["--set", "train.num_epochs=4", "--set", "train.eval_every=1"],
        *[arg for setting in kept for arg in ("--set", setting)],
    )
    assert res.returncode == 0, res.stderr
    curves[4] = metrics(run)
    assert ("huge pages" in summary(run)["allocator"]) is False
    assert [r["epoch"] for r in curves[1]] == [1, 2, 3, 4]
    for p in (2, 4):
        np.testing.assert_allclose(
            [r["loss"] for r in curves[p]], [r["loss"] for r in curves[1]], rtol=1e-5
        )
        for key in ("train_acc", "val_acc", "test_acc"):
            assert [r[key] for r in curves[p]] == [r[key] for r in curves[1]], (p, key)


@pytest.mark.integration
def test_losses_do_not_depend_on_part_weights_or_owners(
    tmp_path: Path, one_worker: list[dict[str, Any]]
) -> None:
    """Unequal parts (explicit weights 3:1 and 2:1:1, METIS's vertex weights priced by the cost
    model, and owners from a file) train the numbers of one process (its first 3 epochs);
    every rank's step and busy time are logged and summarised."""
    owners = tmp_path / "owners.npy"
    np.save(owners, (np.arange(600) % 3 == 0).astype(np.int64))  # a third on rank 1
    curves = {"p1": [r["loss"] for r in one_worker[:3]]}
    cases = {
        "weighted": ["--set", "partition.part_weights=[3,1]"],
        "three": ["--set", "partition.num_parts=3", "--set", "partition.part_weights=[2,1,1]"],
        "file": ["--set", "partition.method=file", "--set", f"partition.owners_path={owners}"],
    }
    for name, args in cases.items():
        run = tmp_path / name
        res = leo(
            "train", *TINY, *args, "--set", f"run.out_dir={run}", "--set", "train.num_epochs=3"
        )
        assert res.returncode == 0, res.stderr
        curves[name] = [r["loss"] for r in metrics(run)]
        parts = 3 if name == "three" else 2
        assert all(len(r["rank_step_s"]) == parts for r in metrics(run))
        s = summary(run)
        assert len(s["rank_mean_busy_s"]) == parts and s["rank_spread"] >= 1.0
    meta = json.loads((tmp_path / "weighted" / "partitions" / "META.json").read_text())
    assert meta["part_weights"] == [0.75, 0.25] and meta["achieved_shares"][0] > 0.6
    assert meta["vertex_weights"]["rule"] == "cost"  # unequal shares: shares of time
    meta = json.loads((tmp_path / "three" / "partitions" / "META.json").read_text())
    assert meta["vertex_weights"]["rule"] == "cost" and meta["vertex_weights"]["per_edge"] > 0
    assert meta["part_weights"] == pytest.approx([0.5, 0.25, 0.25])
    for name in ("weighted", "three", "file"):
        np.testing.assert_allclose(curves[name], curves["p1"], rtol=1e-5, err_msg=name)


@pytest.fixture(scope="module")
def medium(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """MEDIUM with one cache for the module's runs of it (`run.cache_dir`): the reference run
    makes the partitions, the plan and auto's measured choice (its wisdom), which the runs
    that are killed reuse; their set-up is not what those tests check."""
    return [*MEDIUM, "--set", f"run.cache_dir={tmp_path_factory.mktemp('medium-cache')}"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, medium: list[str]) -> dict[str, Any]:
    run = tmp_path_factory.mktemp("ref") / "run"
    res = leo("train", *medium, "--set", f"run.out_dir={run}")
    assert res.returncode == 0, res.stderr
    return summary(run)


@pytest.mark.integration
def test_killed_job_resumes_to_same_result(
    tmp_path: Path, medium: list[str], reference: dict[str, Any]
) -> None:
    run = tmp_path / "run"
    proc = start("train", *medium, "--set", f"run.out_dir={run}")
    wait_for_epoch(run, KILL_AT, proc)
    workers = list(heartbeat_pids(run).values())
    os.kill(proc.pid, signal.SIGKILL)  # the launcher only: its workers must not outlive it
    proc.wait()
    assert len(RunDir(run).read_metrics()) < MEDIUM_EPOCHS  # workers may still append a row
    deadline = time.monotonic() + 10
    while any(pid_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(w) for w in workers), "orphan workers survived the launcher"
    started = load_config(run / "resolved_config.yaml").pipeline.mode  # what auto chose
    res = leo("train", *medium, "--set", f"run.out_dir={run}", "--resume")
    assert res.returncode == 0, res.stderr
    assert [r["epoch"] for r in metrics(run)] == list(range(1, MEDIUM_EPOCHS + 1))
    assert summary(run)["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-5)
    assert (summary(run)["mode"], summary(run)["mode_requested"]) == (started, "auto")


@pytest.mark.integration
def test_killed_worker_is_restarted(
    tmp_path: Path, medium: list[str], reference: dict[str, Any]
) -> None:
    run = tmp_path / "run"
    proc = start("train", *medium, "--set", f"run.out_dir={run}", "--set", "launch.max_restarts=1")
    wait_for_epoch(run, KILL_AT, proc)
    os.kill(heartbeat_pids(run)[1], signal.SIGKILL)
    killed_at = time.time()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert [r["epoch"] for r in metrics(run)] == list(range(1, MEDIUM_EPOCHS + 1))
    assert summary(run)["final_loss"] == pytest.approx(reference["final_loss"], rel=1e-5)
    # set-up is the first attempt's (it ended before the kill), counted from the run's start;
    # the restart's (which ended after the kill) apart
    s = summary(run)
    started_at = json.loads(RunDir(run).setup_file.read_text())["started_at"]
    assert len(s["restart_setup_s"]) == 1 and s["setup_s"] < killed_at - started_at


@pytest.mark.integration
def test_stalled_worker_ends_job_naming_rank(tmp_path: Path) -> None:
    """A stopped worker handles no SIGTERM; the job must still end soon after launch.timeout_s
    (a bound on a hang, not a speed claim) and leave no worker behind."""
    run, timeout_s = tmp_path / "run", 6
    endless = [*TINY, "--set", "train.checkpoint_every=2", "--set", "train.num_epochs=100000"]
    proc = start(
        "train", *endless, "--set", f"run.out_dir={run}", "--set", f"launch.timeout_s={timeout_s}"
    )
    wait_for_epoch(run, 3, proc)
    workers = heartbeat_pids(run)
    os.kill(workers[1], signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - stopped
        left = [pid for pid in workers.values() if pid_alive(pid)]
    finally:
        for pid in workers.values():
            os.kill(pid, signal.SIGKILL) if pid_alive(pid) else None
    assert proc.returncode == 2
    assert "rank 1" in err and "Traceback" not in err
    assert took < timeout_s + 10, f"the stalled job ended {took:.1f} s after the stop"
    assert not left, f"worker processes {left} outlived the job"


def heartbeat_pids(run: Path) -> dict[int, int]:
    """Rank -> pid, from the heartbeat files."""
    return {
        int(p.name.split("_")[1]): int(p.read_text().split()[0])
        for p in (run / ".heartbeat").glob("rank_*")
    }


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (exited, waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.integration
def test_nan_loss_stops_cleanly(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = leo(
        "train",
        *TINY,
        "--set",
        f"run.out_dir={run}",
        "--set",
        "train.lr=1.0e+30",
        "--set",
        "train.num_epochs=20",
        "--set",
        "train.checkpoint_every=1",
    )
    assert res.returncode == 2
    assert "loss became" in res.stderr and "Traceback" not in res.stderr
    status = json.loads((run / "status.json").read_text())  # not left "running"
    assert status["state"] == "failed" and "loss became" in status["reason"]


@pytest.mark.integration
def test_resume_with_other_settings_is_refused(tmp_path: Path, trained_run: TrainedRun) -> None:
    """A copy of the session's trained run (6 epochs) without its checkpoints: a resume starts
    over and must not duplicate epochs; one with another partition method is refused."""
    run = trained_run.copy(tmp_path / "run")
    args = [arg for item in trained_run.settings for arg in ("--set", item)]
    args += ["--set", f"run.out_dir={run}"]
    for ckpt in (run / "checkpoints").glob("*.pt"):
        ckpt.unlink()
    res = leo("train", *args, "--resume")
    assert res.returncode == 0, res.stderr
    assert [r["epoch"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]
    res = leo_here("train", *args, "--set", "partition.method=random", "--resume")
    assert res.returncode == 2 and "partition.method" in res.stderr


@pytest.mark.integration
def test_resume_on_other_worker_counts_keeps_the_numbers(
    tmp_path: Path, trained_run: TrainedRun
) -> None:
    """2 workers to epoch 4, then 3 to epoch 5, then 1 to epoch 6: the losses of 2 workers
    throughout (the session's trained run, relative 1e-5), each segment's worker count in the
    rows and the summary."""
    ref, run = trained_run.folder, tmp_path / "run"
    args = [arg for item in trained_run.settings for arg in ("--set", item)]
    segments = [(2, 4), (3, 5), (1, 6)]
    for i, (workers, last) in enumerate(segments):
        flags = ["--set", f"partition.num_parts={workers}", "--set", f"train.num_epochs={last}"]
        res = leo("train", *args, "--set", f"run.out_dir={run}", *flags, *["--resume"] * (i > 0))
        assert res.returncode == 0, res.stderr
        if i > 0:  # the note, on one line of the console's width or two
            assert f"on {workers} worker" in " ".join(res.stdout.split()), res.stdout
        assert read_meta(run / "partitions")["num_parts"] == workers
    rows = metrics(run)
    assert [r["workers"] for r in rows] == [2] * 4 + [3] * 1 + [1] * 1
    np.testing.assert_allclose(
        [r["loss"] for r in rows], [r["loss"] for r in metrics(ref)], rtol=1e-5
    )
    assert summary(run)["segments"] == [
        {"workers": 2, "first_epoch": 1, "last_epoch": 4},
        {"workers": 3, "first_epoch": 5, "last_epoch": 5},
        {"workers": 1, "first_epoch": 6, "last_epoch": 6},
    ]
    assert summary(run)["exact"] and summary(run)["world_size"] == 1


def two_nodes(flags: list[str], log: Path) -> None:
    """Node 1 as a process of its own (its output into `log`), node 0 in this one: its workers
    fork from this process's preloading server, as they would in a Python session. Node 1 dies
    with this process (a hung node 0 ends pytest without the `finally`)."""
    with log.open("w") as out:
        node1 = start_tied(
            [sys.executable, "-m", "leo_cli", "train", *flags, "--set", "launch.node_rank=1"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            res = leo("train", *flags, "--set", "launch.node_rank=0", timeout=300)
            assert res.returncode == 0, res.stderr
            assert node1.wait(timeout=300) == 0, log.read_text()
        finally:
            if node1.poll() is None:
                os.killpg(node1.pid, signal.SIGKILL)
                node1.wait()


@pytest.mark.integration
def test_two_nodes_match_one_launch(tmp_path: Path, trained_run: TrainedRun) -> None:
    """Two nodes with the default cache policy: both join one probe, then train; the one
    launch is the session's trained run (TINY, 2 workers, 6 epochs)."""
    common = [*TINY, "--set", "train.num_epochs=6", "--set", "launch.nnodes=2"]
    run = tmp_path / "multi"
    flags = [*common, "--set", f"launch.master_port={free_port()}", "--set", f"run.out_dir={run}"]
    two_nodes(flags, tmp_path / "node1.log")
    single = trained_run.folder
    assert "train.num_epochs=6" in trained_run.settings
    assert summary(run)["final_loss"] == pytest.approx(summary(single)["final_loss"], rel=1e-6)
    assert summary(run)["world_size"] == 2
    # auto: node 0 chose, node 1 started its worker with the same mode (one fingerprint)
    assert summary(run)["mode_requested"] == "auto"
    assert summary(run)["mode"] == load_config(run / "resolved_config.yaml").pipeline.mode
    hw = json.loads((run / "hardware.json").read_text())
    assert hw["nnodes"] == 2 and [r["rank"] for r in hw["ranks"]] == [0, 1]
    assert hw["links"]["shm"] is None  # one worker per node: no shared segment between them
    assert (run / "cache-plan.json").is_file()

    # Again on the same folder: every probe rank finds its entry measured where it runs (a
    # short check, no probe); then with rank 1's host edited, as if another machine were node
    # 1: only node 1 knows, and both measure again.
    def again(log: str) -> None:
        port = ["--set", f"launch.master_port={free_port()}"]
        two_nodes([*common, *port, "--set", f"run.out_dir={run}", "--overwrite"], tmp_path / log)

    kept = (run / "hardware.json").read_bytes()
    again("again.log")
    assert (run / "hardware.json").read_bytes() == kept
    hw["ranks"][1]["hostname"] = "elsewhere"
    (run / "hardware.json").write_text(json.dumps(hw))
    again("edited.log")
    remade = json.loads((run / "hardware.json").read_text())
    assert remade["ranks"][1]["hostname"] == socket.gethostname()


@pytest.mark.integration
def test_two_nodes_with_different_configs_fail(tmp_path: Path) -> None:
    """Node 1 runs node 0's resolved config; it must not silently replace its own. Node 0 in
    this process (as in `two_nodes`), node 1 a process of its own, dying with this one."""
    common = [*TINY, "--set", "launch.nnodes=2", "--set", f"launch.master_port={free_port()}"]
    common += ["--set", f"run.out_dir={tmp_path / 'run'}", "--set", "cache.policy=none"]
    log = tmp_path / "node1.log"  # a file, not a pipe nobody reads while node 0 runs
    with log.open("w") as out:
        node1 = start_tied(
            [sys.executable, "-m", "leo_cli", "train", *common, "--set", "launch.node_rank=1",
             "--set", "train.lr=0.5"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        node0 = leo("train", *common, "--set", "launch.node_rank=0", timeout=300)
        node1.wait(timeout=300)
        err1 = log.read_text()
    finally:
        if node1.poll() is None:
            os.killpg(node1.pid, signal.SIGKILL)
            node1.wait()
    for code, err in ((node0.returncode, node0.stderr), (node1.returncode, err1)):
        assert code == 2, err
        err = " ".join(err.split())
        assert "ranks [1] were started with another config than rank 0" in err, err
        assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "train.lr=abc"], "train.lr"),
        (["--set", "data.name=cora", "--set", "data.root=/nonexistent"], "/nonexistent"),
        (["--set", "partition.num_parts=1000"], "partition.num_parts=1000"),
        (["--set", "launch.nproc=3"], "launch.nproc=3"),
        (["--set", "pipeline.mode=compute-only"], "--allow-inexact"),
        (["--set", "cache.replica_budget_mb=lots"], "cache.replica_budget_mb"),
        (["--set", "model.name=gatv2"], "model.name"),  # gat exists; its v2 does not
        (
            ["--set", "launch.cpu_affinity=[[0]]"],
            "launch.cpu_affinity lists 1 core sets but this node starts 2 workers",
        ),
        (
            ["--set", "launch.cpu_affinity=[[0],[1048576]]"],
            "launch.cpu_affinity names core 1048576, which this machine does not offer",
        ),
        (
            ["--set", "partition.method=file", "--set", "partition.owners_path=/nonexistent.npy"],
            "partition.owners_path=/nonexistent.npy does not exist",
        ),
        (["--set", "partition.part_weights=[1,2,3]"], "partition.part_weights lists 3 weights"),
    ],
)
def test_bad_input_through_train(tmp_path: Path, args: list[str], needle: str) -> None:
    run = tmp_path / "run"
    res = leo_here("train", *TINY, "--set", f"run.out_dir={run}", *args)
    assert res.returncode == 2, res.stderr
    assert needle in " ".join(res.stderr.split()) and "Traceback" not in res.stderr
    assert not (run / "metrics.jsonl").exists()


@pytest.mark.integration
def test_corrupt_part_fails_through_train(tmp_path: Path, trained_run: TrainedRun) -> None:
    """A copy of the session's trained run with its cache beside it (`leo-cache`, where its
    partitions link), trained again over itself on a truncated part."""
    shutil.copytree(trained_run.folder.parent / "leo-cache", tmp_path / "leo-cache")
    run = Path(shutil.copytree(trained_run.folder, tmp_path / "run", symlinks=True))
    assert (run / "partitions").resolve().is_relative_to(tmp_path)  # the copy is corrupted
    victim = run / "partitions" / "part_1" / "indices.npy"
    victim.write_bytes(victim.read_bytes()[:-8])
    args = [arg for item in trained_run.settings for arg in ("--set", item)]
    res = leo("train", *args, "--set", f"run.out_dir={run}", "--overwrite")
    assert res.returncode == 2
    err = " ".join(res.stderr.split())
    assert "part_1/indices.npy" in err and "leo partition --force" in err
    assert "Traceback" not in err and "exitcode" not in err


@pytest.mark.integration
def test_resume_skips_a_corrupt_newest_checkpoint(tmp_path: Path, trained_run: TrainedRun) -> None:
    """A copy of the session's trained run (6 epochs, checkpoints at 4 and 6)."""
    run = trained_run.copy(tmp_path / "run")
    newest = run / "checkpoints" / "epoch_000006.pt"
    newest.write_bytes(newest.read_bytes()[:100])
    args = [arg for item in trained_run.settings for arg in ("--set", item)]
    res = leo("train", *args, "--set", f"run.out_dir={run}", "--resume")
    assert res.returncode == 0, res.stderr
    assert f"checkpoint {newest} cannot be read" in " ".join(res.stderr.split())
    assert [r["epoch"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]  # 5 and 6 trained again
    assert torch.load(newest, weights_only=True)["epoch"] == 6


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.integration
def test_signal_ends_train_in_one_line_and_resumes(tmp_path: Path, signum: int, code: int) -> None:
    """Ctrl-C (SIGINT to the launcher's process group; workers run in sessions of their own)
    or SIGTERM to the launcher: one line, 130 / 143, workers stopped, status "interrupted",
    no temporary file left, and --resume finishes the run (checked after SIGTERM). A segment
    in /dev/shm left by an ended job is removed at the start (the note printed for it:
    tests/launch/test_nodes.py)."""
    stale = Path("/dev/shm") / f"leo-{ended_pid()}-1-test-{os.getpid():012x}"
    stale.write_bytes(b"\0" * 4096)
    run = tmp_path / "run"
    args = [*TINY, "--set", f"run.out_dir={run}", "--set", "cache.policy=none"]
    args += ["--set", "train.checkpoint_every=1"]
    proc = start("train", *args, "--set", "train.num_epochs=100000")
    try:
        wait_for_epoch(run, 3, proc)
        swept = not stale.exists()  # by this launch's start (or another's: /dev/shm is shared)
        workers = heartbeat_pids(run)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
        out, err = proc.communicate(timeout=60)
    finally:
        stale.unlink(missing_ok=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "interrupted by SIG" in lines[0] and "--resume" in lines[0], err
    assert swept  # the note it prints: tests/launch/test_nodes.py
    assert json.loads((run / "status.json").read_text())["state"] == "interrupted"
    assert not [pid for pid in workers.values() if pid_alive(pid)]
    leftovers = [p.name for p in run.rglob("*.tmp")]
    assert not leftovers, leftovers
    if signum == signal.SIGINT:
        return  # resuming is the same after either signal: checked once (a full run costs)
    done = max(r["epoch"] for r in metrics(run))
    last = int(sorted((run / "checkpoints").glob("*.pt"))[-1].name[6:12])
    res = leo("train", *args, "--set", f"train.num_epochs={last + 1}", "--resume")
    assert res.returncode == 0, res.stderr
    assert [r["epoch"] for r in metrics(run)] == list(range(1, last + 2)) and done >= last
    assert json.loads((run / "status.json").read_text())["state"] == "done"


@pytest.mark.integration
def test_plan_edited_for_one_rank_stops_every_worker_in_seconds(
    tmp_path: Path, hw_profile: Any
) -> None:
    """The workers check the whole plan, every rank's entries, after comparing its bytes: a
    static aggregate on rank 1 only used to hang rank 0 until launch.timeout_s."""
    from leo_cli.config import load_config
    from leo_cli.errors import TrainError
    from leo_cli.launch.elastic import run_workers
    from leo_cli.launch.setup import prepare

    given = tmp_path / "hardware.json"
    hw_profile.write(given)
    run = tmp_path / "run"
    cfg = load_config(
        None,
        [
            "data.synthetic.num_nodes=600",
            "data.synthetic.num_features=16",
            "model.hidden_channels=16",
            "train.num_epochs=2",
            f"run.out_dir={run}",
            f"cache.hardware={given}",
            "launch.timeout_s=120",
        ],
    )
    prepare(cfg, resume=False, progress=None)
    plan = json.loads((run / "cache-plan.json").read_text())
    plan["ranks"][1]["static_aggregate"] = not plan["ranks"][0]["static_aggregate"]
    (run / "cache-plan.json").write_text(json.dumps(plan))
    began = time.monotonic()
    with pytest.raises(TrainError) as info:
        run_workers(cfg, run, resume=False)
    message = " ".join(str(info.value).split())
    assert "cache-plan.json" in message and "static_aggregate" in message, message
    assert time.monotonic() - began < 60  # a bound on a hang, not a speed claim
    assert json.loads((run / "status.json").read_text())["state"] == "failed"
