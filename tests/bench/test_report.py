"""The share of communication hidden compares like with like: the cache-free pipeline
(`leo-no-cache`, the computation compute-only does) when it was measured, else `leo`."""

from __future__ import annotations

import pytest

from leo_cli.bench.report import hidden_shares


def _row(mode: str, seconds: float, world: int = 4) -> dict[str, object]:
    return {"system": "leo", "mode": mode, "world_size": world, "epoch_time_s": seconds}


def test_hidden_share_uses_the_cache_free_pipeline_when_measured() -> None:
    rows = [_row("blocking", 2.0), _row("compute-only", 1.0), _row("leo", 0.5)]
    assert hidden_shares(rows) == {4: pytest.approx(1.5)}  # the cache also removed work
    rows.append(_row("leo-no-cache", 1.25))
    assert hidden_shares(rows) == {4: pytest.approx(0.75)}


def test_no_share_without_a_floor_below_blocking() -> None:
    assert hidden_shares([_row("blocking", 1.0), _row("leo", 0.8)]) == {}
    rows = [_row("blocking", 1.0), _row("compute-only", 1.0), _row("leo", 0.8)]
    assert hidden_shares(rows) == {4: None}
