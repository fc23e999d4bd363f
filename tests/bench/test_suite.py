"""The bench's runs: an emulated row's nodes may train again in the folder of an earlier
round (every round reuses its variant's folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from leo_cli.bench import suite
from leo_cli.bench.suite import Variant
from leo_cli.config import load_config


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
