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
    for mode in registry.MODES.values():
        assert mode.transport in TRANSPORTS, mode.name
        assert registry.mode_of(mode.pipeline_mode).runs_as is None, mode.name
    for conv in registry.CONVS.values():
        assert conv.attention or conv.name in LAYERS, conv.name


def test_the_roles_the_bench_reads_are_found_by_capability() -> None:
    assert registry.mode_of(registry.baseline_mode()).transport == "all-to-all"
    assert not registry.mode_of(registry.floor_mode()).exact
    overlap = registry.mode_of(registry.overlap_mode())
    assert overlap.overlap and overlap.cache_policy == "none"
    assert registry.mode_of(registry.planned_mode()).planned
    assert registry.prediction_key(registry.planned_mode(), cached=False) == overlap.name


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
