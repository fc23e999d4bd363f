"""The mode and convolution tables: every record has an implementation, the config schema
accepts exactly the table's names, and a new mode would need nothing else to be accepted."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from leo_cli import registry
from leo_cli.comm.modes import TRANSPORTS
from leo_cli.config import load_config
from leo_cli.config.schema import BenchConfig, PipelineConfig
from leo_cli.errors import ConfigError
from leo_cli.models.layers import LAYERS


def test_every_mode_has_its_transport_and_every_conv_its_layers() -> None:
    assert set(registry.WIRES) == set(TRANSPORTS)  # every wire has its run-time class
    for mode in registry.MODES.values():
        assert mode.wire.name == mode.transport and mode.transport in TRANSPORTS, mode.name
        assert registry.mode_of(mode.pipeline_mode).runs_as is None, mode.name
    for conv in registry.CONVS.values():
        assert conv.attention or conv.name in LAYERS, conv.name


def test_each_bench_role_is_named_by_one_record_that_can_play_it() -> None:
    for role in ("baseline", "floor", "overlap"):
        assert sum(m.bench_role == role for m in registry.MODES.values()) == 1, role
    baseline = registry.mode_of(registry.baseline_mode())
    assert baseline.exact and baseline.transport == "all-to-all" and not baseline.overlap
    assert not baseline.per_edge_rows  # the deduplicated halo
    assert not registry.mode_of(registry.floor_mode()).exact
    overlap = registry.mode_of(registry.overlap_mode())
    assert overlap.overlap and overlap.cache_free
    assert registry.mode_of(registry.planned_mode()).planned
    assert registry.prediction_key(registry.planned_mode(), cached=False) == overlap.name


def test_a_second_exact_all_to_all_mode_leaves_the_baseline_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The roles are named, not found by capability: a twin of the baseline that comes first
    in the table does not become the bench's baseline."""
    twin = registry.Mode(
        "all-to-all-twin", "a copy of blocking", exact=True, transport="all-to-all"
    )
    monkeypatch.setattr(registry, "MODES", {twin.name: twin, **registry.MODES})
    assert registry.baseline_mode() == "blocking"


def test_policies_say_whether_they_cache() -> None:
    assert [p.name for p in registry.POLICIES.values() if not p.caches] == [registry.NO_CACHE]
    for name, policy in registry.POLICIES.items():
        cfg = load_config(None, [f"cache.policy={name}"])
        assert cfg.cache.enabled == policy.caches


def test_the_schema_accepts_the_tables_names_only() -> None:
    for name in registry.pipeline_modes():
        assert PipelineConfig(mode=name).mode == name
    assert BenchConfig(modes=list(registry.MODES)).modes == list(registry.MODES)
    with pytest.raises(ValidationError, match="must be one of"):
        PipelineConfig(mode="leo-no-cache")  # a benchmark variant, not a mode to run
    with pytest.raises(ConfigError, match="must be one of gcn, sage, gin, gat"):
        load_config(None, ["model.name=gatv2"])


def test_a_new_mode_is_one_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """What adding a mode takes before its cost terms: a record (and a transport)."""
    twin = registry.Mode("blocking-twin", "a copy of blocking", exact=True, transport="all-to-all")
    monkeypatch.setitem(registry.MODES, twin.name, twin)
    assert PipelineConfig(mode="blocking-twin").mode == "blocking-twin"
    assert "blocking-twin" in BenchConfig(modes=["blocking-twin"]).modes


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
