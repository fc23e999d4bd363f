"""The share of communication hidden compares like with like (the cache-free pipeline, the
computation compute-only does, when measured, else `leo`), per round, with its interval; a
share wholly above 1 is flagged."""

from __future__ import annotations

from pathlib import Path

import pytest

from leo_cli.bench.report import (
    hidden_shares,
    make_rows,
    markdown,
    package_version,
    share_lines,
    share_warning,
)
from leo_cli.bench.suite import Measured, Variant
from leo_cli.config import load_config


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


def test_variants_pair_with_the_first_variant_and_show_each_rank(tmp_path: Path) -> None:
    """Rows of bench variants: the ratio to the first variant is paired by round (a slow
    round hits both), final losses and per-rank busy times (measured and predicted) shown."""
    variants = (
        "[{name: uniform, set: []}, {name: measured, set: [partition.part_weights=measured]}]"
    )
    cfg = load_config(None, [f"bench.variants={variants}"])

    def measured(name: str, rounds: list[float], busy: list[float]) -> Measured:
        run = {"final_loss": 0.5, "rank_busy_s": busy, "predicted_rank_busy_s": [0.2, 0.2]}
        jemalloc = "jemalloc (/usr/lib/libjemalloc.so.2), freed memory kept"
        run["allocator"] = jemalloc if name == "uniform" else "system malloc (no jemalloc found)"
        run["kernels"] = "cpu" if name == "uniform" else "reference"
        run["spmm"] = "leo" if name == "uniform" else "torch"
        m = Measured(Variant("leo", "leo", 2, variant=name), round_medians=rounds)
        m.epochs, m.runs = list(rounds), [run] * len(rounds)
        return m

    rows = make_rows(
        cfg,
        [
            measured("uniform", [1.0, 2.0, 1.0], [0.1, 0.3]),
            measured("measured", [0.8, 1.6, 0.8], [0.2, 0.25]),
        ],
        tmp_path,
    )
    assert [r["vs_variant"] for r in rows] == [pytest.approx(1.0), pytest.approx(0.8)]
    assert rows[1]["vs_variant_ci_low"] == pytest.approx(0.8)  # paired: the slow round cancels
    assert rows[0]["rank_spread"] == pytest.approx(3.0)
    assert rows[1]["rank_prediction_error"] == pytest.approx(0.05 / 0.25)
    env = {"cpu": "c", "cores": 2, "gpu": None, "versions": {"torch": "t"}, "command": "leo"}
    md = markdown(rows, env)
    assert "| leo | measured | 2 |" in md and "0.200 / 0.250 (0.200 / 0.200)" in md
    assert "vs first variant (range)" in md and "0.500000" in md
    # The workers' allocator as each run had it (launch.allocator): in the rows and the table.
    assert [r["allocator"][:8] for r in rows] == ["jemalloc", "system m"]
    both = "jemalloc (/usr/lib/libjemalloc.so.2), freed memory kept; system malloc (no jemalloc"
    # ... and which kernels served them (summary.json's `kernels`).
    assert [r["kernels"] for r in rows] == ["cpu", "reference"]
    assert [r["spmm"] for r in rows] == [["leo"], ["torch"]]  # the variant each trained with
    assert f"{both} found); LEO's kernels: cpu, reference (CPU SpMM: leo, torch)." in md


def test_a_variant_lists_one_part_weight_per_worker_of_its_row(tmp_path: Path) -> None:
    """`partition.part_weights=[2,1,1]` in a variant is checked at the row's 3 workers, not at
    the config's own partition.num_parts (2 by default)."""
    from leo_cli.bench.suite import LEO, leo_config

    cfg = load_config(
        None,
        [
            "bench.world_sizes=[3]",
            "bench.variants=[{name: w, set: ['partition.part_weights=[2,1,1]']}]",
        ],
    )
    run_cfg = leo_config(cfg, Variant(LEO, "leo", 3, variant="w"), tmp_path)
    assert run_cfg.partition.num_parts == 3 and run_cfg.partition.part_weights == [2, 1, 1]


def test_an_auto_row_says_what_it_ran_and_its_regret(tmp_path: Path) -> None:
    """`auto`'s epoch over the fastest exact mode's of the same workers, paired by round; the
    inexact floor and other worker counts never count as the fastest."""
    cfg = load_config(None, [])

    def measured(mode: str, rounds: list[float], world: int = 2, ran: str = "") -> Measured:
        m = Measured(Variant("leo", mode, world), round_medians=rounds)
        m.epochs, m.runs = list(rounds), [{"mode_ran": ran or mode}] * len(rounds)
        return m

    auto = measured("auto", [1.1, 2.2, 1.0], ran="leo/no-replicas")
    auto.runs = [
        {"mode_ran": "leo/no-replicas", "calibrated_epoch_time_s": 0.9},
        {"mode_ran": "leo/no-replicas", "calibrated_epoch_time_s": None},
        {"mode_ran": "blocking", "calibrated_epoch_time_s": 1.3},
    ]
    rows = make_rows(cfg, [
        measured("blocking", [1.2, 2.4, 1.2]), measured("leo", [1.0, 2.0, 1.0]),
        measured("compute-only", [0.1, 0.2, 0.1]), measured("leo", [0.1, 0.1, 0.1], world=4),
        auto,
    ], tmp_path)  # fmt: skip
    row = rows[-1]
    assert row["mode_ran"] == "leo/no-replicas x2, blocking x1" and row["fastest_mode"] == "leo"
    assert row["vs_fastest"] == pytest.approx(1.1) and row["vs_fastest_ci_low"] == 1.0
    assert row["calibrated_epoch_time_s"] == pytest.approx(1.1)  # of the rounds that had one
    assert [(r["mode_ran"], r["epoch_time_s"]) for r in row["auto_rounds"]] == [
        ("leo/no-replicas", 1.1), ("leo/no-replicas", 2.2), ("blocking", 1.0)
    ]  # fmt: skip
    assert rows[0]["vs_fastest"] is None and rows[0]["mode_ran"] is None
    env = {"cpu": "c", "cores": 2, "gpu": None, "versions": {"torch": "t"}, "command": "leo"}
    md = markdown(rows, env)
    assert "| leo | auto (leo/no-replicas x2, blocking x1) | 2 |" in md
    assert "auto at P=2 ran leo/no-replicas x2, blocking x1; its epoch over the fastest exact " \
        "mode's (leo): 1.10 (1.00-1.10), per round." in md  # fmt: skip


def _dist_info(root: Path, name: str, version: str, files: list[str]) -> None:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))


def test_package_version_is_the_one_import_would_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed: its metadata; a source checkout ahead of it on the path: its own
    `__version__`; metadata left without its package (a broken install): none."""
    site, checkout, broken = tmp_path / "site", tmp_path / "checkout", tmp_path / "broken"
    (site / "leo_fake_pkg").mkdir(parents=True)
    (site / "leo_fake_pkg" / "__init__.py").write_text("__version__ = 'not read'\n")
    _dist_info(site, "leo_fake_pkg", "1.2.3", ["leo_fake_pkg/__init__.py"])
    _dist_info(broken, "leo_fake_gone", "4.5.6", ["leo_fake_gone/__init__.py"])
    (checkout / "leo_fake_pkg").mkdir(parents=True)
    (checkout / "leo_fake_pkg" / "__init__.py").write_text('__version__ = "7.8.9.dev0"\n')
    monkeypatch.syspath_prepend(str(broken))
    monkeypatch.syspath_prepend(str(site))
    assert package_version("leo_fake_pkg") == "1.2.3"
    assert package_version("leo_fake_gone") is None
    monkeypatch.syspath_prepend(str(checkout))
    assert package_version("leo_fake_pkg") == "7.8.9.dev0"
