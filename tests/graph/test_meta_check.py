"""partitions/META.json is untrusted input: an edited field stops a run in one sentence naming
it, instead of a KeyError/TypeError traceback or a file opened outside the partitions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from leo_cli.config.schema import DataConfig, PartitionConfig, SyntheticConfig
from leo_cli.errors import PartitionError
from leo_cli.graph.partition_cache import ensure_partitions
from leo_cli.graph.storage import META, read_meta, read_part


@pytest.fixture(scope="module")
def meta_text(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("meta")
    data = DataConfig(synthetic=SyntheticConfig(num_nodes=200, num_features=4))
    result = ensure_partitions(data, PartitionConfig(num_parts=2, method="range"), 0, out)
    return result.path, (result.path / META).read_text()


def first_file(d: dict[str, Any]) -> str:
    return next(iter(d["files"]))


BAD: dict[str, tuple[str, str]] = {
    "parts as text": ("d['num_parts'] = '2'", "num_parts"),
    "parts as true": ("d['num_parts'] = True", "num_parts"),
    "zero parts": ("d['num_parts'] = 0", "num_parts"),
    "features as true": ("d['dataset']['num_features'] = True", "dataset.num_features"),
    "negative training count": ("d['dataset']['num_train'] = -3", "dataset.num_train"),
    "missing dataset": ("del d['dataset']", "dataset"),
    "short halo list": ("d['stats']['halo_nodes'] = [1]", "stats.halo_nodes"),
    "file outside the parts": (
        "d['files']['../../etc/passwd'] = d['files'].pop(first_file(d))",
        "'../../etc/passwd' is not an array",
    ),
    "file of a part that does not exist": (
        "d['files'][first_file(d).replace('part_0', 'part_7')] = 'a' * 64",
        "part_7",
    ),
    "missing array": ("del d['files'][first_file(d)]", "files: part_0 lacks"),
    "bad digest": ("d['files'][first_file(d)] = 'xyz'", "files.part_0"),
    "NaN timing": ("d['timings_s']['load'] = float('nan')", "timings_s.load"),
    "unknown vertex rule": ("d['vertex_weights']['rule'] = 'edges'", "vertex_weights.rule"),
    "short node shares": ("d['achieved_node_shares'] = [1.0]", "achieved_node_shares"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_edited_meta_is_one_sentence(
    tmp_path: Path, meta_text: tuple[Path, str], case: str
) -> None:
    source, text = meta_text
    edit, field = BAD[case]
    d = json.loads(text)
    exec(edit, {"first_file": first_file}, {"d": d})
    root = tmp_path / "partitions"
    root.mkdir()
    (root / META).write_text(json.dumps(d))
    with pytest.raises(PartitionError) as info:
        read_meta(root)
    message = str(info.value)
    assert str(root / META) in message and field in message, message
    assert "leo partition --force" in message and "\n" not in message
    if "files" in field or "num_parts" in field:  # read_part reads only these: same check
        with pytest.raises(PartitionError, match="is not what LEO wrote"):
            read_part(root, 0)


def test_meta_as_written_is_accepted(meta_text: tuple[Path, str]) -> None:
    source, _ = meta_text
    assert read_meta(source)["num_parts"] == 2
    read_part(source, 1)
