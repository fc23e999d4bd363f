"""Parts sized by speed: per-rank rates become METIS target part weights (`tpwgts`), weighted
`random` and `range`, partitions rebuilt for other weights or owners, and owners files made
elsewhere (`partition.method=file`) checked with one sentence naming the key."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import hardware_dict, random_graph

from leo_cli.config import load_config
from leo_cli.config.schema import DataConfig, PartitionConfig
from leo_cli.errors import ConfigError, PartitionError
from leo_cli.graph import partitioners
from leo_cli.graph.partition_cache import Weigher, ensure_partitions
from leo_cli.graph.partitioners import assign_parts, owners_from_file
from leo_cli.launch.stages import run_partitions
from leo_cli.planner.profile.hardware import HardwareProfile

DATA = DataConfig.model_validate({"synthetic": {"num_nodes": 600, "num_features": 8}})


def slower(compute: dict[str, Any], factor: float) -> dict[str, Any]:
    """`compute` with every rate divided by `factor` (sizes and widths kept)."""
    out = copy.deepcopy(compute)
    for key, value in out.items():
        if key.endswith("_per_s"):
            out[key] = (np.asarray(value, dtype=float) / factor).tolist()
    return out


def spy_tpwgts(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record the `tpwgts` of every METIS call (METIS still runs)."""
    seen: list[Any] = []
    real = partitioners.pymetis.part_graph

    def part_graph(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("tpwgts"))
        return real(*args, **kwargs)

    monkeypatch.setattr(partitioners.pymetis, "part_graph", part_graph)
    return seen


def test_a_per_rank_rate_table_flows_into_tpwgts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 measured at half rank 0's rates: METIS is asked for parts of 2/3 and 1/3, META
    records them, and the parts come out near them."""
    data = hardware_dict(2)
    data["ranks"][1]["compute"] = slower(data["compute"], 2.0)
    path = tmp_path / "hardware.json"
    HardwareProfile.model_validate(data).write(path)
    cfg = load_config(
        None,
        [
            "data.synthetic.num_nodes=600",
            "data.synthetic.num_features=8",
            "partition.part_weights=measured",
            f"cache.hardware={path}",
        ],
    )
    seen = spy_tpwgts(monkeypatch)
    result = run_partitions(cfg, tmp_path / "run")
    assert len(seen) == 1 and seen[0] == pytest.approx([2 / 3, 1 / 3], rel=1e-3)
    assert result.meta["part_weights"] == pytest.approx(seen[0])
    achieved = result.meta["achieved_shares"]
    assert achieved[0] == pytest.approx(2 / 3, abs=0.05)
    # Equal rates give equal weights: the same numbers as uniform parts ask METIS for.
    HardwareProfile.model_validate(hardware_dict(2)).write(path)
    run_partitions(cfg, tmp_path / "run")
    assert len(seen) == 2 and seen[1] == pytest.approx([0.5, 0.5], rel=1e-6)


def test_parts_are_rebuilt_for_other_weights(tmp_path: Path) -> None:
    run = tmp_path / "run"

    def ensure(weights: Any, weigher: Weigher | None = None) -> Any:
        part = PartitionConfig(num_parts=2, part_weights=weights)
        return ensure_partitions(DATA, part, 0, run, weigher=weigher)

    first = ensure([1, 1])
    assert not first.reused and first.meta["part_weights"] == [0.5, 0.5]
    assert ensure([2, 2]).reused is False  # other numbers, same shares: the key is the config
    assert ensure([2, 2]).reused
    skewed = ensure([3, 1])
    assert not skewed.reused and skewed.meta["part_weights"] == [0.75, 0.25]
    assert skewed.meta["achieved_shares"][0] == pytest.approx(0.75, abs=0.05)
    nodes = skewed.meta["stats"]["nodes"]
    assert nodes[0] > 2 * nodes[1]
    uniform = ensure("uniform")
    assert not uniform.reused and uniform.meta["part_weights"] is None
    # Measured weights: rebuilt when what they come from (the weigher's key) changes.
    assert not ensure("measured", Weigher("profile-a", lambda g: [1.0, 3.0])).reused
    assert ensure("measured", Weigher("profile-a", lambda g: [1.0, 3.0])).reused
    again = ensure("measured", Weigher("profile-b", lambda g: [3.0, 1.0]))
    assert not again.reused and again.meta["part_weights"] == [0.75, 0.25]


def test_uniform_weights_keep_the_parts_of_before() -> None:
    """`uniform` (the default) adds nothing to the source key's partition section, and METIS
    without weights gives the very parts it gave before weights existed."""
    g = random_graph(num_nodes=80, num_edges=300)
    for method in ("metis", "random", "range"):
        plain = assign_parts(g, 3, method, seed=0)
        assert np.array_equal(plain, assign_parts(g, 3, method, seed=0, weights=None)), method
    dumped = PartitionConfig().model_dump(mode="json")
    assert dumped["part_weights"] == "uniform" and dumped["owners_path"] is None


@pytest.mark.parametrize("method", ["random", "range"])
def test_random_and_range_honour_the_weights(method: str) -> None:
    g = random_graph(num_nodes=4000, num_edges=8000)
    owners = assign_parts(g, 3, method, seed=0, weights=[2.0, 1.0, 1.0])
    shares = np.bincount(owners, minlength=3) / g.num_nodes
    assert shares == pytest.approx([0.5, 0.25, 0.25], abs=0.03 if method == "random" else 1e-3)
    if method == "range":
        assert np.all(np.diff(owners) >= 0)  # still contiguous blocks


def test_owners_file_is_used_and_keyed(tmp_path: Path) -> None:
    path = tmp_path / "owners.npy"
    owners = (np.arange(600) * 7 % 3).astype(np.int32)
    np.save(path, owners)
    part = PartitionConfig(num_parts=3, method="file", owners_path=path)
    first = ensure_partitions(DATA, part, 0, tmp_path / "run")
    assert first.meta["stats"]["nodes"] == np.bincount(owners).tolist()
    assert first.meta["method"] == "file" and first.meta["owners_sha256"]
    assert ensure_partitions(DATA, part, 0, tmp_path / "run").reused
    np.save(path, owners[::-1].copy())  # new content, same path: rebuilt
    assert not ensure_partitions(DATA, part, 0, tmp_path / "run").reused


@pytest.mark.parametrize(
    ("owners", "needle"),
    [
        (np.zeros(5, dtype=np.int64), "has shape (5,), the graph has 6 nodes"),
        (np.zeros((6, 1), dtype=np.int64), "has shape (6, 1)"),
        (np.array([0, 1, 2, 0, 1, 2], dtype=np.float32), "dtype is float32"),
        (np.array([0, 1, 3, 0, 1, 2]), "ranks run from 0 to 3, outside 0..2"),
        (np.array([0, 1, -1, 0, 1, 2]), "ranks run from -1 to 2"),
        (np.array([0, 1, 0, 0, 1, 0]), "part 2 owns no node"),
    ],
)
def test_bad_owners_files_are_one_sentence(tmp_path: Path, owners: Any, needle: str) -> None:
    path = tmp_path / "owners.npy"
    np.save(path, owners)
    with pytest.raises(ConfigError) as info:
        owners_from_file(path, num_nodes=6, num_parts=3)
    message = str(info.value)
    assert f"partition.owners_path={path}" in message and needle in message
    assert message.count(". ") == 0 and message.endswith(".")


def test_missing_or_unreadable_owners_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="partition.owners_path=.* does not exist"):
        owners_from_file(tmp_path / "none.npy", 6, 3)
    (tmp_path / "text.npy").write_text("0 1 2")
    with pytest.raises(ConfigError, match="cannot be read .*give a .npy array"):
        owners_from_file(tmp_path / "text.npy", 6, 3)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["partition.method=file"], "partition.owners_path names the owners file"),
        (["partition.owners_path=/x.npy"], "applies to it only"),
        (
            [
                "partition.method=file",
                "partition.owners_path=/x.npy",
                "partition.part_weights=[1,1]",
            ],
            "partition.part_weights does not apply to partition.method=file",
        ),
        (["partition.part_weights=[1,2,3]"], "lists 3 weights for partition.num_parts=2"),
        (["partition.part_weights=[1,0]"], "partition.part_weights"),
        (["partition.part_weights=[1000000,1e-40]"], "partition.part_weights"),
        (
            ["partition.part_weights=[2001,2]"],
            "spans 1,000.5x from the smallest to the largest; keep it within 1,000x",
        ),
        (["partition.part_weights=fast"], "uniform, measured or a list of positive numbers"),
        (["launch.cpu_affinity=[[0],[]]"], "launch.cpu_affinity"),
        (["launch.cpu_affinity=[[0,0]]"], "distinct core ids"),
    ],
)
def test_bad_partition_and_placement_keys_are_named(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("[", r"\[")) as info:
        load_config(None, overrides)
    assert "Value error" not in str(info.value)


def test_measured_shares_are_bounded() -> None:
    from leo_cli.planner.weights import bounded

    shares = bounded([1 - 1e-13, 1e-13])
    assert sum(shares) == pytest.approx(1.0)
    assert max(shares) / min(shares) == pytest.approx(1e3)
    assert bounded([0.5, 0.5]) == [0.5, 0.5]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["metis", "random", "range"])
def test_a_part_left_empty_is_refused_for_every_method(tmp_path: Path, method: str) -> None:
    cfg = load_config(
        None,
        [
            "data.synthetic.num_nodes=12",
            "data.synthetic.avg_degree=2",
            "partition.num_parts=4",
            "partition.part_weights=[1000,1,1000,1000]",  # part 1 worth 0.004 nodes
            f"partition.method={method}",
        ],
    )
    with pytest.raises(
        PartitionError, match=rf"partition.method={method} left part \d without a node"
    ):
        run_partitions(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "partitions").exists()
