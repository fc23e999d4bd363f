"""curves.png: drawn from the metrics rows, without pyplot (a worker pays its import)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from leo_cli.worker.report import plot_curves


def test_curves_are_a_png_drawn_without_pyplot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)  # importing it raises
    rows: list[dict[str, object]] = [
        {"epoch": e, "loss": 2e5 / e, "train_acc": 0.5, "val_acc": 0.4, "test_acc": 0.3}
        for e in range(1, 6)
    ]
    rows.append({"epoch": 6, "loss": 3e4})  # an epoch without evaluation
    out = tmp_path / "curves.png"
    plot_curves(rows, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]
