"""The share of communication hidden compares like with like (the cache-free pipeline, the
computation compute-only does, when measured, else `leo`), per round, with its interval; a
share wholly above 1 is flagged."""

from __future__ import annotations

import pytest

from leo_cli.bench.report import hidden_shares, markdown, share_lines, share_warning


def _row(mode: str, rounds: list[float], world: int = 4) -> dict[str, object]:
    return {"system": "leo", "mode": mode, "world_size": world, "round_medians": rounds}


def test_hidden_share_uses_the_cache_free_pipeline_when_measured() -> None:
    rows = [_row("blocking", [2.0] * 5), _row("compute-only", [1.0] * 5), _row("leo", [0.5] * 5)]
    assert hidden_shares(rows)[4]["share"] == pytest.approx(1.5)  # the cache removed work too
    rows.append(_row("leo-no-cache", [1.25] * 5))
    share = hidden_shares(rows)[4]
    assert share["share"] == pytest.approx(0.75) and share["interval"] == "bootstrap95"


def test_hidden_share_is_paired_per_round() -> None:
    # Round 2 ran on a slower machine for every variant: per round the share is 0.5 each time.
    rows = [
        _row("blocking", [2.0, 4.0, 2.0]),
        _row("leo-no-cache", [1.5, 3.0, 1.5]),
        _row("compute-only", [1.0, 2.0, 1.0]),
    ]
    share = hidden_shares(rows)[4]
    assert share == {"share": 0.5, "ci_low": 0.5, "ci_high": 0.5, "interval": "range"}


def test_no_share_without_a_floor_below_blocking() -> None:
    assert hidden_shares([_row("blocking", [1.0]), _row("leo", [0.8])]) == {}
    rows = [_row("blocking", [1.0]), _row("compute-only", [1.0]), _row("leo", [0.8])]
    assert hidden_shares(rows)[4]["share"] is None


def test_a_share_wholly_above_one_is_flagged() -> None:
    rows = [
        _row("blocking", [2.0, 2.1, 1.9]),
        _row("leo-no-cache", [0.5, 0.6, 0.4]),
        _row("compute-only", [1.0, 1.1, 0.9]),
    ]
    share = hidden_shares(rows)[4]
    assert share["ci_low"] > 1 and share_warning(share) is not None
    assert "not like for like" in share_lines(rows)[0]
    rows[1] = _row("leo-no-cache", [1.2, 1.3, 1.1])
    assert share_warning(hidden_shares(rows)[4]) is None


def test_tables_name_the_kind_of_interval() -> None:
    base = {"system": "leo", "world_size": 2, "dataset": "x", "model": "gcn"}
    row = dict.fromkeys(
        ("epoch_time_p10_s", "epoch_time_p90_s", "vs_pyg", "vs_pyg_ci_low", "vs_pyg_ci_high")
    )
    row.update(base, mode="blocking", static_aggregate=False, epoch_time_s=1.0, exact=True)
    row.update(vs_blocking=1.0, vs_blocking_ci_low=0.9, vs_blocking_ci_high=1.1, interval="range")
    row.update(dict.fromkeys(("setup_s", "cost_200_epochs_s", "predicted_epoch_time_s")))
    row.update(comm_bytes_per_epoch=0, comm_wait_s=0.0, test_acc=0.5, round_medians=[1.0, 1.0])
    env = {"cpu": "c", "cores": 2, "gpu": None, "versions": {"torch": "t"}, "command": "leo"}
    assert "vs blocking (range)" in markdown([row], env)
    row["interval"] = "bootstrap95"
    assert "vs blocking (95% CI)" in markdown([row], env)
