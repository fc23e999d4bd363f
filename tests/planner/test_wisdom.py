"""Wisdom (planner/wisdom.py): kept trials read back, refused when edited or foreign, and a
key that changes with what decides the trials."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from leo_cli.config import load_config
from leo_cli.errors import CacheError
from leo_cli.planner.wisdom import Wisdom, read_wisdom, wisdom_key, wisdom_path, write_wisdom

NAMES = ["leo", "blocking"]


def key(*overrides: str, names: list[str] = NAMES, inputs: str = "parts") -> str:
    return wisdom_key(load_config(None, list(overrides)), [inputs], "reference", names)


def kept(tmp_path: Path) -> Path:
    path = wisdom_path(tmp_path, key())
    write_wisdom(path, Wisdom(key(), "leo", "measured fastest", {"leo": 0.1, "blocking": None}, {}))
    return path


def test_wisdom_reads_back(tmp_path: Path) -> None:
    path = kept(tmp_path)
    assert path.parent == tmp_path / "wisdom"
    got = read_wisdom(path, NAMES)
    assert got is not None and (got.winner, got.measured_s["leo"]) == ("leo", 0.1)
    assert read_wisdom(tmp_path / "wisdom" / "missing.json", NAMES) is None


def test_the_key_follows_what_decides_the_trials() -> None:
    same = key()
    assert key() == same
    for other in (
        key("model.hidden_channels=32"),
        key("pipeline.halo_dtype=bfloat16"),
        key("partition.num_parts=4"),
        key("launch.cpu_affinity=[[0],[1]]"),
        key("train.dtype=float64"),
        key(inputs="other parts"),
        key(names=["blocking", "leo"]),
    ):
        assert other != same
    # not what only names the run or its length
    assert key("train.num_epochs=7", "run.name=x") == same


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: "not json", "is not readable wisdom (JSONDecodeError)"),
        (lambda d: {**d, "format_version": 99}, "another key or by another LEO"),
        (lambda d: {**d, "key": "0" * 64}, "another key or by another LEO"),
        (lambda d: {**d, "winner": "compute-only"}, "names a winner ('compute-only')"),
        (lambda d: {**d, "winner": "blocking"}, "that was not measured here"),
        (lambda d: {k: v for k, v in d.items() if k != "measured_s"}, "(KeyError)"),
        (lambda d: {**d, "measured_s": {"leo": "fast"}}, "(ValueError)"),
    ],
)
def test_edited_or_foreign_wisdom_is_refused_in_one_sentence(
    tmp_path: Path, edit: object, needle: str
) -> None:
    path = kept(tmp_path)
    data = edit(json.loads(path.read_text()))  # type: ignore[operator]
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(CacheError, match="^" + str(path).replace(".", r"\.")) as err:
        read_wisdom(path, NAMES)
    assert needle in str(err.value) and "\n" not in str(err.value)
