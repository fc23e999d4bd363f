"""The Python API: `from leo_cli import train, bench` takes a path, a dict or a config with
dotted overrides, and returns the run's summary as an object."""

from __future__ import annotations

from pathlib import Path

import pytest

from leo_cli import RunSummary, train
from leo_cli.api import resolve
from leo_cli.config import load_config
from leo_cli.errors import ConfigError

TINY = {"data.synthetic.num_nodes": 600, "data.synthetic.num_features": 16,
        "model.hidden_channels": 16, "train.num_epochs": 3}  # fmt: skip


def test_every_kind_of_config_resolves_alike(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("train: {lr: 0.05}\nmodel: {name: sage}\n")
    want = load_config(path, ["partition.num_parts=3"])
    over = {"partition.num_parts": 3}
    assert resolve(path, over) == want
    assert resolve(str(path), over) == want
    assert resolve({"train": {"lr": 0.05}, "model": {"name": "sage"}}, over) == want
    assert resolve(load_config(path), over) == want
    assert resolve(None, {"train.lr": 0.05}).train.lr == 0.05
    with pytest.raises(ConfigError, match=r"overrides\['train.lrr'\].*did you mean train.lr"):
        resolve(None, {"train.lrr": 1})


@pytest.mark.integration
def test_train_returns_the_runs_summary(tmp_path: Path) -> None:
    run = train(None, {**TINY, "run.out_dir": tmp_path / "run"})
    assert isinstance(run, RunSummary)
    assert run.run_dir == (tmp_path / "run").resolve() and run.num_epochs == 3
    assert run.final_loss == run.raw["final_loss"] and run.exact
    assert run.test_acc is not None and 0 <= run.test_acc <= 1


def test_bench_is_callable_after_its_modules_were_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import leo_cli.bench.report  # noqa: F401  (sets leo_cli.bench to the subpackage)
    from leo_cli import api, bench

    calls: list[tuple[object, object]] = []
    monkeypatch.setattr(
        api, "bench", lambda config=None, overrides=None: calls.append((config, overrides))
    )
    bench("c.yaml", {"bench.repeats": 1})
    assert calls == [("c.yaml", {"bench.repeats": 1})]
    assert bench.report is leo_cli.bench.report  # still the package


def test_a_config_dict_is_not_changed(tmp_path: Path) -> None:
    given = {"train": {"lr": 0.05}}
    resolve(given, {"train.lr": 0.5})
    assert given == {"train": {"lr": 0.05}}
