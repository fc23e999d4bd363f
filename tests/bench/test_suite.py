"""The bench's runs: an emulated row's nodes may train again in the folder of an earlier
round (every round reuses its variant's folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from leo_cli.bench import suite
from leo_cli.bench.suite import Variant
from leo_cli.config import load_config
from leo_cli.planner.auto_mode import epochs_to_repay


class Stop(Exception):
    pass


def test_emulated_rows_train_again_in_their_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[str]] = []

    def fake(cfg: object, command: str, flags: list[str], quiet: bool = False) -> None:
        seen.append([command, *flags])
        raise Stop

    monkeypatch.setattr(suite, "run_nodes", fake)
    cfg = load_config(None, ["launch.emulate={nodes: 2}", f"run.out_dir={tmp_path}"])
    for mode, inexact in (("blocking", []), ("compute-only", ["--allow-inexact"])):
        with pytest.raises(Stop):
            suite.run_leo(cfg, Variant("leo", mode, 2), tmp_path, None)
        assert seen[-1] == ["train", "--overwrite", *inexact]


def test_the_auto_row_repays_its_trials_over_the_users_run(tmp_path: Path) -> None:
    """`auto`'s row trains the bench's few epochs but weighs its trials by the config's own
    `train.num_epochs`, unless the config sets `pipeline.payback_epochs`; other rows keep
    the config's."""
    cfg = load_config(None, ["train.num_epochs=300"])
    row = suite.leo_config(cfg, Variant("leo", "auto", 2), tmp_path)
    epochs = cfg.bench.warmup_epochs + cfg.bench.num_epochs
    assert row.train.num_epochs == epochs and row.pipeline.payback_epochs == 300
    assert epochs_to_repay(row) == 300
    own = load_config(None, ["train.num_epochs=300", "pipeline.payback_epochs=40"])
    assert epochs_to_repay(suite.leo_config(own, Variant("leo", "auto", 2), tmp_path)) == 40
    blocking = suite.leo_config(cfg, Variant("leo", "blocking", 2), tmp_path)
    assert blocking.pipeline.payback_epochs is None
