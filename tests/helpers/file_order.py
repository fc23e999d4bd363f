"""The order the suite's files run in: the longest first, by the seconds a whole run gave them.

Under pytest-xdist with `--dist loadfile --no-loadscope-reorder` each pytest process takes the
next file of the collection when it runs low, so with the long files first they start at once
and the run ends on short files: the processes finish close together instead of one running a
long file alone at the end. The weights (tests/file_seconds.json) are each file's setup, call
and teardown seconds in one whole run, written by `pytest --file-seconds PATH`; a file they do
not name goes first (its length is unknown). Weights change only the order, never what runs.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest

WEIGHTS = Path(__file__).resolve().parents[1] / "file_seconds.json"


def test_file(nodeid: str) -> str:
    """The file part of a test's node id (`tests/x/test_y.py::test_z[1]` -> `tests/x/test_y.py`)."""
    return nodeid.split("::", 1)[0]


def load_weights(path: Path = WEIGHTS) -> dict[str, float]:
    """Seconds per test file, or none where the file is missing."""
    return json.loads(path.read_text()) if path.is_file() else {}


def longest_first(items: list[pytest.Item], weights: dict[str, float]) -> None:
    """Order `items` in place by their file's weight, highest first (unknown files first); a
    file's tests stay together and in their own order (the sort is stable)."""
    items.sort(key=lambda item: -weights.get(test_file(item.nodeid), math.inf))


class FileSeconds:
    """A plugin summing each file's reported durations and writing them as JSON at the end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[test_file(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        ranked = sorted(self.seconds.items(), key=lambda kv: (-kv[1], kv[0]))
        self.path.write_text(json.dumps({k: round(v, 1) for k, v in ranked}, indent=1) + "\n")
