"""`leo bench` end to end on a tiny suite: files, schema, table; bad settings in one sentence."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from helpers.cli import leo, leo_here

from leo_cli.bench.report import COLUMNS

pytestmark = pytest.mark.dist

TINY = [
    "--set", "data.synthetic.num_nodes=400",
    "--set", "data.synthetic.num_features=8",
    "--set", "model.hidden_channels=8",
    "--set", "bench.repeats=1",
    "--set", "bench.num_epochs=2",
    "--set", "bench.warmup_epochs=1",
]  # fmt: skip


@pytest.mark.integration
def test_tiny_suite_writes_every_file(tmp_path: Path) -> None:
    """Every mode at two workers, one round: each file the bench writes, the rows' columns
    and how the modes compare (rounds and their ranges: tests/bench/test_suite.py)."""
    out = tmp_path / "bench"
    res = leo(
        "bench",
        *TINY,
        "--set", f"run.out_dir={out}",
        "--set", "bench.modes=[leo,leo-no-cache,blocking,fine-grained,compute-only,auto]",
        "--set", "bench.world_sizes=[2]",
        "--set", "bench.peers=[]",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    data = json.loads((out / "bench.json").read_text())
    rows = data["rows"]
    assert {"cpu", "cores", "versions", "command"} <= set(data["env"])
    assert [(r["system"], r["mode"], r["world_size"]) for r in rows] == [
        ("leo", "leo", 2),
        ("leo", "leo-no-cache", 2),
        ("leo", "blocking", 2),
        ("leo", "fine-grained", 2),
        ("leo", "compute-only", 2),
        ("leo", "auto", 2),
    ]
    for r in rows:
        assert set(COLUMNS) <= set(r)
        assert r["epoch_time_s"] > 0 and r["epochs_kept"] + r["epochs_dropped"] == 2
        # a fresh run's set-up counts the partitions and plan this row reused (made by an
        # earlier row); what the run paid itself lies within its wall time
        assert 0 < r["run_setup_s"] < r["wall_s"] and r["run_setup_s"] <= r["setup_s"], r
        assert r["cost_200_epochs_s"] == pytest.approx(r["setup_s"] + 200 * r["epoch_time_s"])
        assert r["interval"] is None  # one round: no interval
    assert "vs blocking" in (out / "bench.md").read_text()
    shares = data["hidden_share"]["2"]
    assert set(shares) == {"share", "ci_low", "ci_high", "interval"}
    by_mode = {r["mode"]: r for r in rows}
    assert by_mode["blocking"]["vs_blocking"] == pytest.approx(1.0)
    assert by_mode["compute-only"]["exact"] is False and by_mode["leo"]["exact"] is True
    assert by_mode["compute-only"]["comm_bytes_per_epoch"] == 0
    assert (
        by_mode["fine-grained"]["comm_bytes_per_epoch"]
        > by_mode["blocking"]["comm_bytes_per_epoch"]
    )
    blocking_bytes = by_mode["blocking"]["comm_bytes_per_epoch"]
    assert by_mode["leo-no-cache"]["comm_bytes_per_epoch"] == blocking_bytes
    # leo may read rows in place (pipeline.transport=auto), counted once per reading edge like
    # fine-grained's rows; its cache (static aggregate, replicas) still moves less than that.
    assert by_mode["leo"]["comm_bytes_per_epoch"] < by_mode["fine-grained"]["comm_bytes_per_epoch"]
    # auto: a user's default run, trials in its set-up, what it ran and its regret
    auto = by_mode["auto"]
    assert auto["setup_parts_s"]["choose_s"] > 0 and auto["exact"] is True
    assert auto["fastest_mode"] in ("leo", "leo-no-cache", "blocking", "fine-grained")
    assert auto["vs_fastest"] > 0 and auto["vs_fastest_ci_low"] is None
    ran = [part.split(" x")[0] for part in auto["mode_ran"].split(", ")]
    assert set(ran) <= {"leo", "leo/no-replicas", "leo/no-in-place", "blocking", "fine-grained",
                        "shared-memory"}, auto["mode_ran"]  # fmt: skip
    assert f"auto at P=2 ran {auto['mode_ran']}; its epoch over the fastest" in " ".join(
        (out / "bench.md").read_text().split()
    )
    # Exact modes train the same model: same accuracy.
    exact = ("leo", "leo-no-cache", "blocking", "fine-grained", "auto")
    assert len({by_mode[m]["test_acc"] for m in exact}) == 1
    with (out / "bench.csv").open() as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    md = (out / "bench.md").read_text()
    assert "| compute-only | 2 |" in md
    # Every LEO row's processes together: more than its largest process, set-up included.
    for row in json.loads((out / "bench.json").read_text())["rows"]:
        assert row["peak_rss_total_bytes"] > row["peak_rss_max_bytes"] > 0, row["mode"]
    assert "hidden at P=2" in md and "(blocking - leo-no-cache) / (blocking - compute-only)" in md
    assert (out / "bench.png").stat().st_size > 1000
    assert "leo bench" in res.stdout


@pytest.mark.parametrize(
    ("model", "sizes", "modes"),
    [("gcn", "[1]", "[leo]"), ("gat", "[2]", "[leo,blocking]")],
)
@pytest.mark.integration
def test_rows_beside_the_pyg_peer(tmp_path: Path, model: str, sizes: str, modes: str) -> None:
    """GCN at one worker, where every mode is one process: one row, and a second without the
    static aggregate of layer 0; GAT at two workers (attention: no static aggregate), its
    modes exact alike. The PyG peer (GCNConv, GATConv) runs at one worker."""
    out = tmp_path / "bench"
    peers = "[pyg]" if _has_pyg() else "[]"
    res = leo(
        "bench",
        *TINY,
        "--set", f"model.name={model}",
        *(["--set", "model.heads=2"] if model == "gat" else []),
        "--set", f"run.out_dir={out}",
        "--set", f"bench.modes={modes}",
        "--set", f"bench.world_sizes={sizes}",
        "--set", "bench.repeats=1",
        "--set", f"bench.peers={peers}",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = json.loads((out / "bench.json").read_text())["rows"]
    leo_rows = [r for r in rows if r["system"] == "leo"]
    found = [(r["mode"], r["world_size"], r["static_aggregate"]) for r in leo_rows]
    if model == "gcn":  # input dropout 0 by default: layer 0 aggregates once
        assert found == [("leo", 1, True), ("leo", 1, False)]
    else:
        assert found == [("leo", 2, False), ("blocking", 2, False)]
        assert len({r["test_acc"] for r in leo_rows}) == 1 and all(r["exact"] for r in leo_rows)
    for r in rows:
        assert set(COLUMNS) <= set(r) and r["epoch_time_s"] > 0
        assert r["interval"] is None  # one round: no interval
    for r in leo_rows:
        assert 0 < r["setup_s"] < r["wall_s"], r
    if _has_pyg():
        assert rows[-1]["system"] == "pyg" and rows[-1]["vs_pyg"] == pytest.approx(1.0)


@pytest.mark.integration
def test_variants_of_part_weights_run_interleaved_with_equal_losses(tmp_path: Path) -> None:
    """Two bench variants (uniform and measured part weights, three workers placed on two
    cores): a row each, its own run folders, ratios to the first, the same losses."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the placement needs cores 0 and 1")
    out = tmp_path / "bench"
    variants = (
        "bench.variants=[{name: uniform, set: [partition.part_weights=uniform]},"
        " {name: measured, set: [partition.part_weights=measured]}]"
    )
    res = leo(
        "bench",
        *TINY,
        "--set", f"run.out_dir={out}",
        "--set", "bench.modes=[leo]",
        "--set", "bench.world_sizes=[3]",
        "--set", "bench.peers=[]",
        "--set", "bench.repeats=1",  # one round: ratios to the first variant still paired
        "--set", "launch.cpu_affinity=[[0],[1],[1]]",
        "--set", variants,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert [(r["variant"], r["mode"], r["world_size"]) for r in rows] == [
        ("uniform", "leo", 3),
        ("measured", "leo", 3),
    ]
    uniform, measured = rows
    assert uniform["vs_variant"] == pytest.approx(1.0) and measured["vs_variant"] > 0
    assert measured["final_loss"] == pytest.approx(uniform["final_loss"], rel=1e-5)
    assert len(measured["rank_busy_s"]) == 3 and measured["rank_spread"] >= 1.0
    meta = json.loads((out / "measured" / "p3" / "partitions" / "META.json").read_text())
    assert len(meta["part_weights"]) == 3 and len(meta["achieved_shares"]) == 3
    uniform_meta = json.loads((out / "uniform" / "p3" / "partitions" / "META.json").read_text())
    assert uniform_meta["part_weights"] is None
    rules = (meta["vertex_weights"]["rule"], uniform_meta["vertex_weights"]["rule"])
    assert rules == ("cost", "degree")  # measured shares are shares of predicted time
    md = (out / "bench.md").read_text()
    assert "| variant |" in md and "| leo | measured | 3 |" in md


def _has_pyg() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch_geometric") is not None


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--set", "bench.modes=[nonsense]"], "bench.modes"),
        (["--set", "bench.world_sizes=[0]"], "bench.world_sizes"),
        (["--set", "launch.nnodes=2"], "one machine"),
        (["--set", "launch.nproc=2"], "launch.nproc"),
        (  # a placement of 2 workers for a suite of 4: said before the first run
            ["--set", "launch.cpu_affinity=[[0],[0]]"],
            "launch.cpu_affinity lists 2 core sets but this node starts 4 workers",
        ),
        (
            ["--set", "bench.variants=[{name: x, set: ['partition.part_weights=[1,2]']}]"],
            "bench variant x at 4 workers",
        ),
    ],
)
def test_bad_bench_settings_are_one_sentence(tmp_path: Path, args: list[str], needle: str) -> None:
    res = leo_here("bench", "--set", f"run.out_dir={tmp_path / 'b'}", *args)
    assert res.returncode == 2
    assert needle in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "b" / "bench.json").exists()
