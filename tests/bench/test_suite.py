"""The bench's runs: an emulated row's nodes may train again in the folder of an earlier
round (every round reuses its variant's folder); rounds run every row once each, interleaved,
and several rounds give each ratio its range."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from leo_cli.bench import suite
from leo_cli.bench.report import hidden_shares, make_rows, markdown
from leo_cli.bench.suite import Variant
from leo_cli.config import load_config
from leo_cli.planner.auto_mode import epochs_to_repay


class Stop(Exception):
    pass


def test_emulated_rows_train_again_in_their_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []

    def fake(cfg: object, command: str, flags: list[str], quiet: bool = False) -> None:
        seen.append([command, *flags])
        raise Stop

    monkeypatch.setattr(suite, "run_nodes", fake)
    cfg = load_config(None, ["launch.emulate={nodes: 2}", f"run.out_dir={tmp_path}"])
    for mode, inexact in (("blocking", []), ("compute-only", ["--allow-inexact"])):
        with pytest.raises(Stop):
            suite.run_leo(cfg, Variant("leo", mode, 2), tmp_path, None)
        assert seen[-1] == ["train", "--overwrite", *inexact]


def test_the_auto_row_repays_its_trials_over_the_users_run(tmp_path: Path) -> None:
    """`auto`'s row trains the bench's few epochs but weighs its trials by the config's own
    `train.num_epochs`, unless the config sets `pipeline.payback_epochs`; other rows keep
    the config's."""
    cfg = load_config(None, ["train.num_epochs=300"])
    row = suite.leo_config(cfg, Variant("leo", "auto", 2), tmp_path)
    epochs = cfg.bench.warmup_epochs + cfg.bench.num_epochs
    assert row.train.num_epochs == epochs and row.pipeline.payback_epochs == 300
    assert epochs_to_repay(row) == 300
    own = load_config(None, ["train.num_epochs=300", "pipeline.payback_epochs=40"])
    assert epochs_to_repay(suite.leo_config(own, Variant("leo", "auto", 2), tmp_path)) == 40
    blocking = suite.leo_config(cfg, Variant("leo", "blocking", 2), tmp_path)
    assert blocking.pipeline.payback_epochs is None


# Each mode's epoch in round 1; round 2 is a slower phase of the machine (every row x1.5).
EPOCH_S = {"blocking": 0.4, "leo-no-cache": 0.3, "compute-only": 0.2, "leo": 0.25, "auto": 0.26}


def test_rounds_run_every_row_interleaved_and_give_each_ratio_its_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rounds (the tiny bench's end-to-end run has one): A B C A B C, each row's epochs
    kept over both rounds, partial results after each round, and the ratios, the auto row's
    regret and the hidden share with the range of their per-round values, so named in the
    table."""
    calls: list[tuple[str, int]] = []

    def fake_run(cfg: Any, v: Variant, out_dir: Path, progress: Any) -> dict[str, Any]:
        slow = 1.5 if len(calls) >= len(EPOCH_S) else 1.0
        calls.append((v.mode, v.world_size))
        epoch = EPOCH_S[v.mode] * slow
        ran = {"mode_ran": "leo"} if v.mode == "auto" else {}
        return {"epoch_times": [epoch] * 2, "setup_s": 1.0, "run_setup_s": 1.0,
                "wall_s": 2.0, "exact": v.mode != "compute-only", **ran}  # fmt: skip

    monkeypatch.setattr(suite, "run_leo", fake_run)
    modes = ",".join(EPOCH_S)
    cfg = load_config(None, [f"bench.modes=[{modes}]", "bench.world_sizes=[2]",
                             "bench.peers=[]", "bench.repeats=2"])  # fmt: skip
    rounds: list[list[int]] = []
    on_round = lambda ms: rounds.append([len(m.round_medians) for m in ms])  # noqa: E731
    measured = suite.run_suite(cfg, tmp_path, lambda i, n, v: None, on_round=on_round)
    assert calls == [(m, 2) for m in EPOCH_S] * 2
    assert rounds == [[1] * len(EPOCH_S), [2] * len(EPOCH_S)]
    rows = {r["mode"]: r for r in make_rows(cfg, measured, tmp_path)}
    for mode, r in rows.items():
        assert r["epochs_kept"] + r["epochs_dropped"] == 4 and r["interval"] == "range"
        ratio = EPOCH_S[mode] / EPOCH_S["blocking"]  # the same in both rounds: paired
        assert r["vs_blocking"] == pytest.approx(ratio)
        assert r["vs_blocking_ci_low"] == pytest.approx(ratio)
        assert r["round_medians"] == pytest.approx([EPOCH_S[mode], 1.5 * EPOCH_S[mode]])
    auto = rows["auto"]
    assert auto["fastest_mode"] == "leo" and auto["mode_ran"] == "leo x2"
    assert auto["vs_fastest_ci_low"] == pytest.approx(auto["vs_fastest"])
    assert auto["vs_fastest"] == pytest.approx(EPOCH_S["auto"] / EPOCH_S["leo"])
    share = hidden_shares(list(rows.values()))[2]
    assert share["interval"] == "range" and share["share"] == pytest.approx(0.5)
    env = {"cpu": "c", "cores": 2, "gpu": None, "versions": {"torch": "t"}, "command": "leo"}
    assert "vs blocking (range)" in markdown(list(rows.values()), env)
