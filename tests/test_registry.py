"""The mode, priced-run, bench-mode and convolution tables: every record has an
implementation, the config schema accepts exactly the tables' names, a new mode would need
nothing else to be accepted, and no code outside the registries compares those names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import ValidationError

from leo_cli import registry
from leo_cli.bench.modes import (
    ROLES,
    baseline_mode,
    bench_mode_of,
    bench_modes,
    floor_mode,
    overlap_mode,
)
from leo_cli.bench.peers import PEER_MODELS
from leo_cli.comm.modes import TRANSPORTS
from leo_cli.config import load_config
from leo_cli.config.schema import BenchConfig, PipelineConfig
from leo_cli.errors import ConfigError
from leo_cli.models.layers import LAYERS

PACKAGE = Path(__file__).resolve().parents[1] / "leo_cli"
REGISTRIES = ("registry.py", "bench/modes.py")
# Comparisons with a string that other tables spell alike (the kernel backend `leo`, the
# partition rule `degree`, the probe setting and a transport's reach `none`, DGL's modules),
# by their text, wherever they live.
OTHER_TABLES = {
    "work.rule == 'degree'",
    "self.rule == 'degree'",
    "backend.cpu == 'leo'",
    "current.cpu == 'leo'",
    "active.cpu == 'leo'",
    "now.cpu != 'leo'",
    "what != 'none'",
    "transport.in_place != 'none'",
    "n == 'dgl'",
}


def test_every_mode_has_its_transport_and_every_conv_its_layers() -> None:
    assert set(registry.WIRES) == set(TRANSPORTS)  # every wire has its run-time class
    for mode in registry.MODES.values():
        assert mode.wire.name == mode.transport and mode.transport in TRANSPORTS, mode.name
    for conv in registry.CONVS.values():
        assert conv.attention or conv.name in LAYERS, conv.name
        assert conv.pyg_peer is None or conv.pyg_peer in PEER_MODELS, conv.name


def test_every_conv_names_its_pyg_model_and_keys() -> None:
    for conv in registry.CONVS.values():
        pyg = conv.pyg_model
        assert pyg is not None, conv.name
        theirs = [k for k, _ in pyg.keys]
        assert len(set(theirs)) == len(theirs) and len({k for _, k in pyg.keys}) == len(theirs)
        assert {pyg.weight, pyg.width, *pyg.unsqueezed} <= set(theirs), conv.name


def test_every_priced_run_runs_a_mode_and_only_the_planned_one_has_the_levels() -> None:
    runs = registry.priced_runs()
    assert [p.name for p in runs[: len(registry.MODES)]] == list(registry.MODES)
    for run in runs:
        assert registry.mode_of(run.mode) is run.runs and registry.priced_of(run.name) == run
        assert registry.prediction_key(run.mode, run.cached) == run.name
    assert [p.mode for p in runs if p.cached] == [registry.planned_mode()]
    assert registry.mode_of(registry.planned_mode()).planned
    uncached = registry.prediction_key(registry.planned_mode(), cached=False)
    assert registry.priced_of(uncached).runs.planned and uncached != registry.planned_mode()
    assert uncached not in registry.MODES  # a priced run, not a mode to train in
    assert registry.priced_of(uncached).label == uncached  # its name says it
    assert registry.priced_of(baseline_mode()).label == f"{baseline_mode()} (no cache)"


def test_every_bench_mode_is_a_priced_run_of_a_runtime_mode() -> None:
    assert [m.name for m in bench_modes()] == registry.priced_names()
    assert BenchConfig().modes == registry.priced_names()  # the default: every one
    for name in registry.priced_names():
        mode = bench_mode_of(name)
        assert mode.runs is registry.mode_of(mode.priced.mode), name
        assert (mode.policy is None) == mode.priced.cached, name  # else cache.policy none
        assert mode.policy is None or not registry.policy_of(mode.policy).caches, name


def test_each_bench_role_is_named_by_one_record_that_can_play_it() -> None:
    assert sorted(ROLES) == ["baseline", "floor", "overlap"]
    for role, name in ROLES.items():
        assert [m.name for m in bench_modes() if m.role == role] == [name], role
    baseline = bench_mode_of(baseline_mode()).runs
    assert baseline.exact and baseline.transport == "all-to-all" and not baseline.overlap
    assert not baseline.per_edge_rows  # the deduplicated halo
    assert not bench_mode_of(floor_mode()).runs.exact
    overlap = bench_mode_of(overlap_mode())
    assert overlap.runs.overlap and overlap.runs.planned and not overlap.priced.cached
    assert registry.prediction_key(registry.planned_mode(), cached=False) == overlap.name


def test_a_second_exact_all_to_all_mode_leaves_the_baseline_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The roles are named, not found by capability: a twin of the baseline that comes first
    in the table does not become the bench's baseline."""
    twin = registry.Mode("all-to-all-twin", "a copy of blocking", transport="all-to-all")
    monkeypatch.setattr(registry, "MODES", {twin.name: twin, **registry.MODES})
    assert baseline_mode() == "blocking"
    assert bench_mode_of(twin.name).role is None


def test_no_name_comparison_outside_the_registries() -> None:
    """Code asks a record what it can do; only the registries compare mode, run,
    convolution, peer and policy names."""
    names = {*registry.priced_names(), *registry.CONVS, *registry.PEERS, *registry.POLICIES}
    found = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in REGISTRIES:
            continue
        compares = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Compare)]
        for node in compares:
            text = ast.unparse(node)
            if text not in OTHER_TABLES and names & compared_strings(node):
                found.add(f"{rel}:{node.lineno}: {text}")
    assert not found, sorted(found)


def compared_strings(node: ast.Compare) -> set[str]:
    """The string constants a comparison compares with, alone or in a literal collection."""
    out = set()
    for side in (node.left, *node.comparators):
        items = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
        out |= {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
    return out


def test_policies_say_whether_they_cache() -> None:
    assert [p.name for p in registry.POLICIES.values() if not p.caches] == [registry.NO_CACHE]
    for name, policy in registry.POLICIES.items():
        cfg = load_config(None, [f"cache.policy={name}"])
        assert cfg.cache.enabled == policy.caches


def test_the_schema_accepts_the_tables_names_only() -> None:
    for name in registry.pipeline_modes():
        assert PipelineConfig(mode=name).mode == name
    names = registry.priced_names()
    assert BenchConfig(modes=names).modes == names
    assert "leo-no-cache" in names  # a bench mode (the planned mode without a cache) ...
    with pytest.raises(ValidationError, match="must be one of"):
        PipelineConfig(mode="leo-no-cache")  # ... not a mode to run
    with pytest.raises(ConfigError, match="must be one of gcn, sage, gin, gat"):
        load_config(None, ["model.name=gatv2"])


def test_a_new_mode_is_one_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """What adding a mode takes before its cost terms: a record (and a transport); the plan
    prices it and the bench times it."""
    twin = registry.Mode("blocking-twin", "a copy of blocking", transport="all-to-all")
    monkeypatch.setitem(registry.MODES, twin.name, twin)
    assert PipelineConfig(mode="blocking-twin").mode == "blocking-twin"
    assert "blocking-twin" in BenchConfig(modes=["blocking-twin"]).modes
    assert bench_mode_of("blocking-twin").runs is twin and twin.exact


def test_settings_a_mode_would_ignore_are_refused() -> None:
    with pytest.raises(ValidationError, match="num_chunks applies to modes"):
        PipelineConfig(mode="blocking", num_chunks=2)
    assert PipelineConfig(mode="leo", num_chunks=2).num_chunks == 2
    for key, value in (("static_aggregate", "false"), ("replica_budget_mb", "8")):
        with pytest.raises(ConfigError, match="no effect with cache.policy=none"):
            load_config(None, ["cache.policy=none", f"cache.{key}={value}"])


def test_the_schema_lists_the_policy_and_transport_tables() -> None:
    from typing import get_args

    from leo_cli.config.schema import CacheConfig

    assert get_args(CacheConfig.model_fields["policy"].annotation) == tuple(registry.POLICIES)
    transports = get_args(PipelineConfig.model_fields["transport"].annotation)
    assert transports == tuple(registry.ROW_TRANSPORTS)
