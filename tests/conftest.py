"""Shared fixtures: small generated graphs, tiny OGB folders, pickles that run code, and the
location of ../shared/datasets."""

from __future__ import annotations

import os

# Idle OpenMP threads sleep instead of spinning: the suite keeps both cores of a 2-core machine
# busy, and torch's threads spinning in every parallel region's barrier burned CPU the other
# processes waited for (the CPU library's parity check on a loaded host: 57 s of CPU spinning,
# 15 s sleeping, the same kernels and threads). Read when torch (libgomp) loads: before any
# import of it, and inherited by every process the suite starts.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import fcntl
import gzip
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import leo_cli.cli.app  # noqa: F401  (imported once here, not inside the first unit test that runs it)
import leo_cli.launch.stages  # noqa: F401  (what the commands import when they act)
from leo_cli.graph.types import Graph, symmetrize
from leo_cli.planner.profile.hardware import FORMAT_VERSION, HardwareProfile

# A unit test (none of these markers) whose call takes longer fails, named: slow tests are
# marked, so `make test-fast` stays fast. LEO_UNIT_LIMIT_S changes it. The limit is on the
# test process's CPU time, which other jobs on the machine (`make test` runs mypy and nvcc
# beside pytest) do not stretch; a call that waits (sleeps, subprocesses) is held to
# WALL_FACTOR times the limit in wall time.
SLOW_MARKERS = ("integration", "dist", "slow")
# `leo train` builds LEO's CPU kernels on first use (launch/cpu_kernels.py): not in every
# test's fresh cache. The suite runs the kernels the checkout has (LEO_CPU_BUILD=auto opts in);
# tests of the build ask for it themselves.
os.environ.setdefault("LEO_CPU_BUILD", "never")
UNIT_LIMIT_S = float(os.environ.get("LEO_UNIT_LIMIT_S", "2"))
WALL_FACTOR = 5
CPU_TIME = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, None]:
    """The call phase's CPU time, for the unit limit."""
    start = time.process_time()
    yield
    item.stash[CPU_TIME] = time.process_time() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Fail a passing unit test whose call phase (fixtures apart) took over UNIT_LIMIT_S of
    CPU time, or WALL_FACTOR times that in wall time."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when != "call" or not report.passed:
        return
    if any(item.get_closest_marker(name) for name in SLOW_MARKERS):
        return
    cpu = item.stash.get(CPU_TIME, 0.0)
    if cpu > UNIT_LIMIT_S or report.duration > WALL_FACTOR * UNIT_LIMIT_S:
        report.outcome = "failed"
        report.longrepr = (
            f"took {cpu:.1f} s of CPU ({report.duration:.1f} s of wall time), over the "
            f"{UNIT_LIMIT_S:g} s of a unit test ({item.nodeid}): make it faster, or mark it "
            f"{' / '.join(SLOW_MARKERS)} if it must be slow."
        )


def shared_datasets() -> Path:
    env = os.environ.get("LEO_SHARED_DATASETS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "datasets"


def shared_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary folder every pytest process of this run shares: under pytest-xdist, the
    parent of each process's own base folder; else the base folder."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `path` (made where missing) for the block: one pytest
    process of the run at a time."""
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(autouse=True, scope="session")
def hardware_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One machine profile per worker count for the whole run (never ~/.cache), probed
    with the tiny sizes (about 4 s against 13) and saved however busy the machine is: tests
    check behaviour, not rates, and the suite shares its cores with other jobs (a test of
    the load rule sets its own limit). The pytest processes of one run share the folder, as
    runs on one machine share ~/.cache/leo/hardware (profiles are written atomically): a
    worker count one of them probed is not probed again by the other."""
    folder = shared_tmp(tmp_path_factory) / "hardware-cache"
    folder.mkdir(exist_ok=True)
    wanted = {
        "LEO_HARDWARE_CACHE": str(folder),
        "LEO_PROBE_LOAD_LIMIT": "1000",
        "LEO_PROBE_QUICK": "1",
    }
    old = {key: os.environ.get(key) for key in wanted}
    os.environ.update(wanted)
    yield folder
    for key, value in old.items():
        if value is None:
            del os.environ[key]
        else:
            os.environ[key] = value


def rank_rates(compute: dict[str, Any], world_size: int) -> list[dict[str, Any]]:
    """Every rank of a profile measuring `compute` (equal workers), as JSON data."""
    return [
        {"rank": r, "hostname": "test", "cores": None, "threads": 1, "compute": compute}
        for r in range(world_size)
    ]


def hardware_dict(world_size: int = 2) -> dict[str, Any]:
    """A valid hardware profile of `world_size` workers (1 or 2), as JSON data."""
    fit = {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-4}
    link = {"concurrent": fit, "pairs": [{"ranks": [0, 1], **fit}]}
    two = world_size == 2
    rates = [1e6, 1e6]
    compute = {
        "widths": [8, 64],
        "spmm_bytes": [1 << 14, 1 << 16],
        "spmm_edges_per_s": [rates, rates],
        "spmm_t_edges_per_s": [rates, rates],
        "gemm_flop_per_s": [1e9, 1e9],
        "gemm_narrow_bytes_per_s": [1e9, 1e9],
        "mask_rows_per_s": rates,
        "mask_backward_rows_per_s": rates,
        "gather_rows_per_s": rates,
        "scatter_add_rows_per_s": rates,
        "pass_bytes": [1 << 14, 1 << 16],
        "pass_bytes_per_s": [1e9, 1e9],
    }
    return {
        "format_version": FORMAT_VERSION,
        "created_utc": "2026-12-01T00:00:00+00:00",
        "hostname": "test",
        "device": "cpu",
        "torch_version": "2.13.0",
        "kernels_backend": "reference",
        "dtype": "float32",
        "world_size": world_size,
        "threads_per_worker": 1,
        "quick": True,
        "probe_s": 1.0,
        "sizes": {},
        "compute": compute,
        "ranks": rank_rates(compute, world_size),
        "links": {
            "gloo": link if two else None,
            "shm": link if two else None,
            "barrier_s": 1e-4 if two else None,
            "alltoall": fit if two else None,
            "overlap": 0.5 if two else None,
        },
    }


@dataclass(frozen=True)
class TrainedRun:
    """A finished `leo train` run shared by the session's tests: its folder (read it, never
    write it: `copy` it first) and what the command printed."""

    folder: Path
    stdout: str
    stderr: str
    settings: tuple[str, ...]  # the `--set` pairs it ran with

    def copy(self, to: Path) -> Path:
        """The run folder copied to `to`, partitions included (not a link to the cache)."""
        shutil.copytree(self.folder, to, symlinks=False)
        return to


# The session's trained run: 2 workers on helpers.cli's TINY graph, checkpoints every 2 epochs
# (the newest two kept: epochs 4 and 6), evaluation and TensorBoard events each epoch.
TRAINED_SETTINGS = (
    *("data.synthetic.num_nodes=600", "data.synthetic.num_features=16"),
    *("model.hidden_channels=16", "train.num_epochs=6", "train.checkpoint_every=2"),
    *("train.eval_every=1", "run.name=tiny-run", "run.tensorboard=true"),
    "pipeline.trial_payback=false",  # auto's trials, though 6 epochs would not repay them
)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainedRun]:
    """One 2-worker `leo train` for the whole pytest run: the first pytest process that asks
    makes it in its own process (the other, under pytest-xdist, waits for it and reads what
    it printed); run-folder, export, board, summary and edited-file tests read it instead of
    training; a test that writes into it fails its process's session end."""
    from helpers.cli import leo

    shared = shared_tmp(tmp_path_factory) / "trained"
    shared.mkdir(exist_ok=True)
    folder, printed = shared / "run", shared / "printed.json"
    with locked(shared / "lock"):
        if not printed.is_file():
            sets = [arg for item in TRAINED_SETTINGS for arg in ("--set", item)]
            # COLUMNS: the summary table's mode line on one line
            env = {**os.environ, "COLUMNS": "200"}
            res = leo("train", *sets, "--set", f"run.out_dir={folder}", env=env)
            made = {"returncode": res.returncode, "stdout": res.stdout, "stderr": res.stderr}
            printed.write_text(json.dumps(made))
        res = subprocess.CompletedProcess(["leo"], **json.loads(printed.read_text()))
    assert res.returncode == 0, res.stderr
    made = snapshot(folder)
    yield TrainedRun(folder, res.stdout, res.stderr, TRAINED_SETTINGS)
    assert snapshot(folder) == made, "a test wrote into the shared trained run: copy it first"


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` (partitions through their link): size and modification time."""
    out = {}
    for root, _, names in os.walk(folder, followlinks=True):
        for name in names:
            stat = (Path(root) / name).stat()
            out[os.path.relpath(Path(root) / name, folder)] = (stat.st_size, stat.st_mtime_ns)
    return out


@pytest.fixture
def hw_profile() -> HardwareProfile:
    """A valid two-worker hardware profile."""
    return HardwareProfile.model_validate(hardware_dict())


@pytest.fixture
def planetoid_root() -> Path:
    root = shared_datasets() / "planetoid"
    if not (root / "ind.cora.graph").is_file():
        pytest.skip(f"real Cora files not found under {root} (set LEO_SHARED_DATASETS)")
    return root


def random_graph(
    num_nodes: int = 60,
    num_edges: int = 200,
    num_features: int = 5,
    num_classes: int = 3,
    seed: int = 0,
) -> Graph:
    """A small random undirected graph with random features, labels and splits."""
    rng = np.random.default_rng(seed)
    edges = rng.integers(0, num_nodes, size=(2, num_edges))
    split = rng.integers(0, 3, num_nodes)
    return Graph(
        name="random",
        edge_index_2E=symmetrize(edges, num_nodes),
        x_NF=rng.standard_normal((num_nodes, num_features)).astype(np.float32),
        y_N=rng.integers(0, num_classes, num_nodes).astype(np.int64),
        train_mask_N=split == 0,
        val_mask_N=split == 1,
        test_mask_N=split == 2,
        num_classes=num_classes,
    )


def write_csv_gz(path: Path, rows: np.ndarray) -> None:
    """Header-less gzip CSV, one row of `rows` per line (as OGB ships its files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = rows.reshape(len(rows), -1)
    lines = "".join(",".join(str(v) for v in row) + "\n" for row in rows.tolist())
    with gzip.open(path, "wt") as f:
        f.write(lines)


def write_ogb(root: Path, name: str, split: str, labels: np.ndarray) -> Path:
    """A tiny OGB node-property folder as ogb downloads it (no RELEASE file, no processed/)."""
    rng = np.random.default_rng(0)
    num_nodes = labels.shape[0]
    edges = rng.integers(0, num_nodes, size=(120, 2))
    folder = root / name.replace("-", "_")
    write_csv_gz(folder / "raw" / "edge.csv.gz", edges)
    write_csv_gz(folder / "raw" / "num-node-list.csv.gz", np.array([num_nodes]))
    write_csv_gz(folder / "raw" / "num-edge-list.csv.gz", np.array([len(edges)]))
    write_csv_gz(folder / "raw" / "node-feat.csv.gz", rng.random((num_nodes, 4)).round(3))
    write_csv_gz(folder / "raw" / "node-label.csv.gz", labels)
    write_csv_gz(folder / "raw" / "node_year.csv.gz", rng.integers(2000, 2020, num_nodes))
    thirds = np.array_split(np.arange(num_nodes), 3)
    for part, ids in zip(["train", "valid", "test"], thirds, strict=True):
        write_csv_gz(folder / "split" / split / f"{part}.csv.gz", ids)
    return folder


class Payload:
    """Unpickling this runs code: it creates the file `marker` (pickled as a call to `open`)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def ended_pid() -> int:
    """The pid of a process that has ended (for files named after a writer that is gone)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid
