"""cache-plan.png: the sweep on the scale of the whole halo, and every rank's rows per level."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from test_cost import hardware, part

from leo_cli.config.schema import CacheConfig
from leo_cli.planner import plot
from leo_cli.planner.access import PartAccess
from leo_cli.planner.cost import ModelShape
from leo_cli.planner.make import make_plan

# Two layers, 16 -> 8 -> 4, input dropout on: replicas apply (no static aggregate).
SHAPE = ModelShape((16, 8, 4), 0.5, 0.5, 4, extra_gemm=False)


def test_plot_written_for_a_plan_with_levels(tmp_path: Path) -> None:
    made = make_plan(CacheConfig(), [part(0), part(1)], SHAPE, hardware(), ("k", "i", "g"))
    assert made.levels is not None and made.sweep
    path = tmp_path / "cache-plan.png"
    plot.plot_plan(made, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    halo_mb = plot.whole_halo_mb(made)
    assert halo_mb is not None and halo_mb * 2**20 == 4 * 16 * 4  # 4 rows of 16 float32


def test_plot_of_one_worker_without_halo(tmp_path: Path) -> None:
    alone = PartAccess(
        rank=0, num_inner=10, num_boundary=0, inner_edges=20,
        reuse_H=np.zeros(0, dtype=np.int64), owner_H=np.zeros(0, dtype=np.int64),
        send_counts=[0], recv_counts=[0], rows_reading_halo=0, rows_reading_peer=[0],
    )  # fmt: skip
    made = make_plan(CacheConfig(), [alone], SHAPE, hardware(), ("k", "i", "g"))
    assert made.levels == [{"L1": 0, "L2": 0, "L3": 0, "in_place": 0}]
    plot.plot_plan(made, tmp_path / "cache-plan.png")
    assert (tmp_path / "cache-plan.png").stat().st_size > 1000


def test_level_rows_stack_to_the_halo() -> None:
    # Rows read in place are L3 rows first, then L2 rows (of the pairs reading every row).
    l3_only = plot.level_rows({"L1": 2, "L2": 5, "L3": 3, "in_place": 3})
    assert l3_only == {"L1": 2, "L2": 5, "L3": 0, "in place": 3}
    every = plot.level_rows({"L1": 2, "L2": 5, "L3": 3, "in_place": 7})
    assert every == {"L1": 2, "L2": 1, "L3": 0, "in place": 7}
    assert sum(every.values()) == 2 + 5 + 3


def test_without_a_sweep_the_baselines_set_the_scale() -> None:
    """A plan without replicas to sweep draws only the baselines' lines: the axis runs from 0
    to just above them (lines under a second alone leave it at 0..1)."""
    from leo_cli.util import figures

    made = make_plan(CacheConfig(), [part(0), part(1)], SHAPE, hardware(), ("k", "i", "g"))
    made.sweep = []
    ax = figures.figure().subplots()
    plot.sweep_panel(ax, made)
    drawn = [line.get_ydata()[0] for line in ax.get_lines()]
    bottom, top = ax.get_ylim()
    assert drawn and bottom == 0 and max(drawn) < top <= 1.3 * max(drawn)
