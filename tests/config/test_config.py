"""Config loading: precedence, overrides parsed as YAML, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from leo_cli.config import dump_config, load_config
from leo_cli.errors import ConfigError


def test_defaults_yaml_set_precedence(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 1.0e-3\n  num_epochs: 7\npartition:\n  num_parts: 3\n")
    cfg = load_config(path, ["train.lr=0.5", "bench.modes=[leo,blocking]"])
    assert cfg.train.lr == 0.5  # --set wins over YAML
    assert cfg.train.num_epochs == 7  # YAML wins over defaults
    assert cfg.partition.num_parts == 3
    assert cfg.model.name == "gcn"  # default
    assert cfg.bench.modes == ["leo", "blocking"]


def test_dump_round_trips(tmp_path: Path) -> None:
    cfg = load_config(None, ["data.synthetic.num_nodes=500", "pipeline.num_chunks=4"])
    path = tmp_path / "resolved.yaml"
    path.write_text(dump_config(cfg))
    assert load_config(path) == cfg


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["train.lr=abc"], "train.lr"),
        (["train.lrr=0.1"], "train.lrr"),
        (["partition.num_parts=-2"], "partition.num_parts"),
        (["model.name=transformer"], "model.name"),
        (["trainlr"], "dotted.key=value"),
        (["train=3"], "train"),
        (["pipeline.num_chunks=0"], "pipeline.num_chunks"),
        (["bench.variants=[{name: x, set: [partition.part_weights=[1,2]]}]"], "quote items"),
        (["bench.variants=[{name: x, set: [run.out_dir=y]}]"], "set by leo bench itself"),
        (["bench.variants=[{name: x}, {name: x}]"], "variant names must differ"),
    ],
)
def test_bad_overrides_name_the_key(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_config(None, overrides)


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(scalar)


def test_payback_epochs_is_at_least_one() -> None:
    with pytest.raises(ConfigError, match="payback_epochs"):
        load_config(None, ["pipeline.payback_epochs=0"])


def test_shipped_configs_load() -> None:
    root = Path(__file__).resolve().parents[2] / "configs"
    for path in sorted(root.glob("*.yaml")):
        assert path.read_text().startswith("# leo "), f"{path} must start with its command"
        load_config(path)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("bench.modes=[nonsense]", "'bench.modes'.*compute-only"),
        ("bench.modes=[leo,blocking,leo]", "'bench.modes'.*twice"),
        ("bench.modes=[]", "'bench.modes'"),
        ("bench.world_sizes=[-5]", "'bench.world_sizes'.*greater than or equal to 1"),
        ("bench.world_sizes=[2,2]", "'bench.world_sizes'.*twice"),
        ("bench.peers=[dlg]", "'bench.peers'.*pyg, pyg-csr, dgl"),
        ("run.seed=18446744073709551616", "'run.seed'.*less than"),
        ("run.seed=-1", "'run.seed'.*greater than or equal to 0"),
        ("model.dropout=0.001", "'model.dropout'.*1/256"),
        ("model.dropout=0.999", "'model.dropout'.*255/256"),
        ("model.input_dropout=0.001", "'model.input_dropout'.*1/256"),
        ("model.attention_dropout=0.001", "'model.attention_dropout'.*1/256"),
        ("model.heads=0", "'model.heads'.*greater than or equal to 1"),
        ("model.name=gatv2", "'model.name'.*gat"),
        ("bench.warmup_epochs=-1", "'bench.warmup_epochs'"),
        ("model.heads=4", "--set model.heads=4: model.heads applies to model.name=gat only"),
        ("model.name=sage model.output_heads=2", "model.output_heads applies to model.name=gat"),
        ("model.attention_dropout=0", "model.attention_dropout applies to model.name=gat only"),
        (
            "partition.method=random partition.metis_edge_fraction=0.5",
            "applies to partition.method=metis",
        ),
        ("partition.method=range partition.metis_edge_fraction=0.9", "method is range"),
        ("partition.method=random partition.metis_memory_gb=null", "partition.metis_memory_gb"),
    ],
)
def test_values_no_code_can_use_are_refused(override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as info:
        load_config(None, override.split())
    assert "Value error" not in str(info.value)


@pytest.mark.parametrize(
    "override",
    [
        "bench.modes=[leo-no-cache,compute-only]",
        "bench.world_sizes=[1,4]",
        "bench.peers=[pyg,pyg-csr]",
        "run.seed=9223372036854775807",
        "model.dropout=0.00390625",
        "model.dropout=0",
        "model.input_dropout=0",
        "model.input_dropout=null",
        "model.name=gat",
        "model.name=gat model.attention_dropout=0 model.heads=1",
        "partition.metis_edge_fraction=0.5",
        "partition.metis_memory_gb=null",
        "partition.metis_memory_gb=0.5",
    ],
)
def test_values_at_the_limits_are_accepted(override: str) -> None:
    load_config(None, override.split())


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("pipeline.num_chunks=0", "'pipeline.num_chunks'.*1 to 64"),
        ("pipeline.num_chunks=65", "'pipeline.num_chunks'.*1 to 64"),
        ("pipeline.num_chunks=1000000000000", "'pipeline.num_chunks'.*1 to 64"),
        ("pipeline.num_chunks=true", "'pipeline.num_chunks'.*not true/false"),
        ("cache.replica_budget_mb=true", "'cache.replica_budget_mb'.*not true/false"),
        ("cache.halo_budget_mb=.inf", "'cache.halo_budget_mb'.*finite"),
        ("cache.replica_budget_mb=.nan", "'cache.replica_budget_mb'.*finite"),
        ("train.lr=true", "'train.lr'.*not true/false"),
        ("train.num_epochs=false", "'train.num_epochs'.*not true/false"),
        ("bench.world_sizes=[1,true]", "'bench.world_sizes'.*not true/false"),
    ],
)
def test_numbers_are_bounded_and_never_booleans(override: str, needle: str) -> None:
    """`true` read as 1 (a 1 MiB budget, one chunk) and 10**12 chunks (a worker out of
    memory) used to be accepted."""
    with pytest.raises(ConfigError, match=needle):
        load_config(None, [override])


def test_booleans_stay_booleans_and_the_bound_is_accepted() -> None:
    cfg = load_config(None, ["pipeline.num_chunks=64", "cache.static_aggregate=false"])
    assert cfg.pipeline.num_chunks == 64 and cfg.cache.static_aggregate is False


def test_chunk_bound_is_in_help() -> None:
    from typer.testing import CliRunner

    from leo_cli.cli.app import app

    for command in ("train", "profile-cache", "bench"):
        res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        text = " ".join(res.stdout.split())
        assert "pipeline.num_chunks takes `auto` or 1 to 64" in text
        assert "partition.part_weights=measured" in text and "launch.cpu_affinity" in text
    res = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert "bench.variants=[{name: uniform" in " ".join(res.stdout.split())
