"""Real data: Kipf & Welling's GCN on Cora reaches the published accuracy on 2 and 4 workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow]
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "cora_gcn.yaml"


@pytest.mark.parametrize("workers", [2, 4])
def test_cora_gcn_reaches_published_accuracy(
    tmp_path: Path, planetoid_root: Path, workers: int
) -> None:
    run = tmp_path / "run"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "leo_cli",
            "train",
            "--config",
            str(CONFIG),
            "--set",
            f"data.root={planetoid_root}",
            "--set",
            f"partition.num_parts={workers}",
            "--set",
            f"run.out_dir={run}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == workers and summary["num_epochs"] == 200
    assert summary["test_acc"] >= 0.80, summary
