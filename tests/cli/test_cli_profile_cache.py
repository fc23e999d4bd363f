"""`leo profile-cache` and the cache through the real `leo train` path."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import hardware_dict
from helpers.cli import leo, leo_here

from leo_cli.cli.profile_cache import profile_line
from leo_cli.planner.auto_mode import leanest
from leo_cli.planner.profile.hardware import HardwareProfile

pytestmark = pytest.mark.dist

TINY = [
    "--set", "data.synthetic.num_nodes=600",
    "--set", "data.synthetic.num_features=16",
    "--set", "model.hidden_channels=16",
    "--set", "model.input_dropout=0.5",
    "--set", "partition.num_parts=3",
    "--set", "train.num_epochs=4",
]  # fmt: skip
# Part of the halo replicated, the rest exchanged: L1 at layer 0 and L2.
LEVELS = [
    "--set", "cache.policy=degree",
    "--set", "cache.replica_budget_mb=30%",
]  # fmt: skip


def read(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.integration
def test_profile_cache_writes_plan_table_and_plot(tmp_path: Path) -> None:
    run = tmp_path / "run"
    wide = {**os.environ, "COLUMNS": "300"}  # the list of candidates on one line
    # (every candidate listed, though 4 epochs would not repay a trial: auto_mode `payback`)
    every = ["--set", "pipeline.trial_payback=false"]
    res = leo("profile-cache", *TINY, *LEVELS, *every, "--set", f"run.out_dir={run}", env=wide)
    assert res.returncode == 0, res.stderr
    plan = read(run / "cache-plan.json")
    assert len(plan["ranks"]) == 3 and plan["policy"] == "degree"
    assert any(r["replica_rows"] for r in plan["ranks"])
    assert not any(r["l3_rows"] for r in plan["ranks"])
    modes = {"leo", "leo-no-cache", "blocking", "fine-grained", "shared-memory", "compute-only"}
    assert set(plan["predicted_epoch_time_s"]) == modes
    assert all(v > 0 for v in plan["predicted_epoch_time_s"].values())
    assert (run / "cache-plan.png").stat().st_size > 1000 and (run / "hardware.json").is_file()
    assert "predicted training step per mode" in res.stdout
    run_s = plan["predicted_run_s"]  # every exact mode run with the plan's levels
    buffers = plan["predicted_buffer_bytes"]  # ... and the bytes moving its rows
    assert set(run_s) <= set(buffers) and all(b > 0 for b in buffers.values())
    assert {n for n in set(buffers) - set(run_s)} == {"leo/no-replicas", "leo/no-in-place"}
    # pipeline.choose=measure (the default): the candidates the workers would try, fastest
    # predicted first, leo's plan without its replicas among them
    line = next(x for x in res.stdout.splitlines() if "pipeline.mode=auto would" in x)
    tried = line.removeprefix("pipeline.mode=auto would try: ").split(", ")
    assert "leo/no-replicas" in tried and "leo" in tried, line
    ranked = [n for n in tried if "/" not in n]
    assert ranked == sorted(ranked, key=lambda m: run_s[m]), (ranked, run_s)
    assert "row buffers: the bytes each mode holds at its peak" in " ".join(res.stdout.split())
    # Each rank's predicted step and busy time, and their spread, per mode; printed per rank.
    leo_ranks = plan["predicted_ranks_s"]["leo"]
    assert len(leo_ranks) == 3 and all(r["busy_s"] > 0 for r in leo_ranks)
    assert plan["predicted_rank_spread"]["leo"] >= 1.0
    assert "busy s" in res.stdout and "slowest busy / fastest busy" in " ".join(res.stdout.split())
    # When the rates were measured: a kept profile ages with the machine's load.
    assert "Hardware profile: measured" in res.stdout and "ago) on" in res.stdout
    # A saved profile is read, not measured again; other budgets make the plan stale.
    other = tmp_path / "other"
    res = leo(
        "profile-cache", *TINY, *LEVELS, "--set", f"run.out_dir={other}",
        "--set", "cache.replica_budget_mb=0", "--hardware", str(run / "hardware.json"),
        "--set", "pipeline.choose=estimate",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert not (other / "probe").exists()
    # pipeline.choose=estimate: the mode the plan predicts fastest (or leaner within 10%)
    run_s, buffers = (read(other / "cache-plan.json")[k] for k in
                      ("predicted_run_s", "predicted_buffer_bytes"))  # fmt: skip
    fastest = min(run_s, key=lambda m: run_s[m] or float("inf"))
    chosen = leanest(run_s, buffers, fastest, 0.1)
    said = f"pipeline.mode=auto would run: {chosen} (auto: "
    said += "predicted fastest" if chosen == fastest else "within 10% of the fastest"
    assert said in " ".join(res.stdout.split())
    assert read(other / "cache-plan.json")["key"] != plan["key"]
    assert not any(r["replica_rows"] for r in read(other / "cache-plan.json")["ranks"])


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.integration
def test_train_with_every_level_equals_no_cache(tmp_path: Path) -> None:
    cached, spilled, plain = tmp_path / "cached", tmp_path / "spilled", tmp_path / "plain"
    # leo named (not auto's choice): the levels' bytes below are leo's.
    pg = ["--set", "pipeline.transport=process-group", "--set", "pipeline.mode=leo"]
    res = leo("train", *TINY, *LEVELS, *pg, "--set", f"run.out_dir={cached}")
    assert res.returncode == 0, res.stderr
    # A halo budget below the buffer: the least-read rows go to L3, read in place.
    small = ["--set", "cache.halo_budget_mb=1%", "--set", "pipeline.mode=leo"]
    res = leo("train", *TINY, *LEVELS, *small, "--set", f"run.out_dir={spilled}")
    assert res.returncode == 0, res.stderr
    res = leo("train", *TINY, "--set", "cache.policy=none", "--set", f"run.out_dir={plain}")
    assert res.returncode == 0, res.stderr
    a, s, b = (read(r / "summary.json") for r in (cached, spilled, plain))
    for got in (a, s):
        assert got["final_loss"] == pytest.approx(b["final_loss"], rel=1e-5)
        assert got["predicted_epoch_time_s"] > 0
    assert b["predicted_epoch_time_s"] is None
    rows = metrics(cached)
    for row in rows:  # the plan's bytes per level are what the workers moved
        assert row["step_L2_bytes"] + row["step_L3_bytes"] == row["step_comm_bytes"]
        assert row["step_published_bytes"] == 0
    assert rows[-1]["step_L3_bytes"] == 0 and rows[-1]["step_L2_bytes"] > 0
    assert a["total_comm_bytes"] < b["total_comm_bytes"]  # replicas leave layer 0's exchange
    plan = read(spilled / "cache-plan.json")
    assert any(r["l3_rows"] for r in plan["ranks"])
    published = sum(r["bytes_per_level"]["published_bytes_per_step"] for r in plan["ranks"])
    for row in metrics(spilled):  # ... and what they read in place or published back
        moved = row["step_L2_bytes"] + row["step_L3_bytes"] + row["step_published_bytes"]
        assert moved == row["step_comm_bytes"] and row["step_published_bytes"] == published > 0


@pytest.mark.integration
def test_rounded_rows_move_the_bytes_the_plan_says(tmp_path: Path) -> None:
    """`pipeline.halo_dtype=int8` through `leo train`: the plan replicates nothing (a
    replica would read the unrounded row), prices rows and gradient rows at a byte an
    element and one a row, and the workers move exactly that; summary.json says which type
    rows had."""
    run = tmp_path / "int8"
    narrow = ["--set", "pipeline.halo_dtype=int8", "--set", "pipeline.mode=leo"]
    res = leo("train", *TINY, *LEVELS, *narrow, "--set", f"run.out_dir={run}")
    assert res.returncode == 0, res.stderr
    plan = read(run / "cache-plan.json")
    assert not any(r["replica_rows"] or r["static_aggregate"] for r in plan["ranks"])
    for row in metrics(run):
        assert row["step_L2_bytes"] == row["step_comm_bytes"] > 0
    assert read(run / "summary.json")["halo_dtype"] == "int8"


@pytest.mark.integration
def test_halo_budget_below_the_halo_is_one_sentence(tmp_path: Path) -> None:
    """Refused where no row can be read in place instead (every row through the process
    group: a row fetched per edge takes more buffer, not less)."""
    res = leo(
        "train", *TINY, "--set", "cache.halo_budget_mb=1%", "--set", f"run.out_dir={tmp_path}",
        "--set", "pipeline.transport=process-group",
    )  # fmt: skip
    assert res.returncode == 2
    assert "cache.halo_budget_mb is below the halo buffer" in " ".join(res.stderr.split())
    assert "Traceback" not in res.stderr


def test_bad_hardware_file_is_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "hw.json"
    bad.write_text("{}")
    res = leo_here(
        "profile-cache", *TINY, "--set", f"run.out_dir={tmp_path}", "--hardware", str(bad)
    )
    assert res.returncode == 2
    assert str(bad) in " ".join(res.stderr.split()) and "Traceback" not in res.stderr


def test_the_profile_line_says_how_old_the_rates_are() -> None:
    hw = HardwareProfile.model_validate(hardware_dict())
    hw = hw.model_copy(update={"created_utc": "2026-12-03T14:39:24+00:00", "hostname": "box"})
    line = profile_line(hw, datetime(2026, 12, 3, 16, 45, tzinfo=UTC))
    assert "measured 2026-12-03 14:39 UTC (2.1 h ago) on box" in line and "--force" in line
    soon = profile_line(hw, datetime(2026, 12, 3, 14, 49, 30, tzinfo=UTC))
    assert "(10 min ago)" in soon
    # Written elsewhere: no zone is taken as UTC, another zone converted, anything else shown.
    naive = hw.model_copy(update={"created_utc": "2026-12-03T14:39:24"})
    assert "14:39 UTC (2.1 h ago)" in profile_line(naive, datetime(2026, 12, 3, 16, 45, tzinfo=UTC))
    paris = hw.model_copy(update={"created_utc": "2026-12-03T15:39:24+01:00"})
    assert "14:39 UTC" in profile_line(paris, datetime(2026, 12, 3, 16, 45, tzinfo=UTC))
    odd = hw.model_copy(update={"created_utc": "yesterday"})
    assert "measured at 'yesterday' on box" in profile_line(odd, datetime.now(UTC))
    # A profile named by the user is not measured again by --force.
    assert "--force" not in profile_line(hw, datetime.now(UTC), given=True)


@pytest.mark.integration
def test_profile_cache_as_tsv_parses_from_a_pipe(tmp_path: Path) -> None:
    """`--format tsv`: stdout holds the per-rank plan and the per-mode predictions, a header
    line and tab-separated rows each, a blank line between; the sentences go to stderr."""
    hardware = tmp_path / "hardware.json"
    hardware.write_text(json.dumps(hardware_dict(2)))
    sets = [*TINY, "--set", "partition.num_parts=2", "--set", f"run.out_dir={tmp_path / 'run'}"]
    res = leo("profile-cache", *sets, "--hardware", str(hardware), "--format", "tsv")
    assert res.returncode == 0, res.stderr
    ranks, modes = (
        [line.split("\t") for line in block.splitlines()] for block in res.stdout.split("\n\n")
    )
    assert ranks[0][:2] == ["rank", "static Â·X"] and [r[0] for r in ranks[1:]] == ["0", "1"]
    assert all(len(r) == len(ranks[0]) for r in ranks)
    predicted = read(tmp_path / "run" / "cache-plan.json")["predicted_epoch_time_s"]
    assert modes[0][:2] == ["mode", "step s"] and {r[0] for r in modes[1:]} == set(predicted)
    for mode, step, *_ in modes[1:]:
        assert float(step) == pytest.approx(predicted[mode], abs=5e-4), mode
    assert "pipeline.mode=auto would" in res.stderr and "Wrote" in res.stderr
