"""Runs are kept: every `leo train` without run.out_dir gets a folder of its own, a named folder
that holds a run is refused without --resume or --overwrite, and runs share their partitions
through run.cache_dir."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.cli import leo, leo_here

from leo_cli.config import load_config
from leo_cli.errors import ConfigError
from leo_cli.launch.run_folder import for_command, for_train, fresh, holds_results, newest
from leo_cli.run_dir import RunDir

TINY = ["--set", "data.synthetic.num_nodes=600", "--set", "data.synthetic.num_features=16",
        "--set", "model.hidden_channels=16", "--set", "train.num_epochs=2"]  # fmt: skip


def a_run(folder: Path, results: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    RunDir(folder).config.write_text("run: {}\n")
    if results:
        RunDir(folder).metrics.write_text("{}\n")
    return folder


def test_unnamed_runs_get_a_new_folder_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["run.name=my run/1"])
    first = for_train(cfg, resume=False, overwrite=False, now=0).run.folder
    assert first.parent == Path("runs/my-run-1")
    a_run(first)
    second = for_train(cfg, resume=False, overwrite=False, now=0).run.folder
    assert second == first.with_name(first.name + "-2")
    assert fresh(first.parent, now=3600) > second  # later stamps sort after
    assert for_command(cfg).run.folder == Path("runs/my-run-1")


def test_resume_continues_the_newest_run_of_the_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, [])
    with pytest.raises(ConfigError, match="--resume found no run under runs/default"):
        for_train(cfg, resume=True, overwrite=False)
    a_run(Path("runs/default/20260101-000000"))
    a_run(Path("runs/default/20260102-000000"))
    (Path("runs/default/20260103-000000")).mkdir()  # no run in it
    a_run(Path("runs/default/p4"))  # a benchmark's folder, not a run of this name
    assert newest(Path("runs/default")).name == "20260102-000000"
    a_run(Path("runs/default/20260102-000000-2"))
    a_run(Path("runs/default/20260102-000000-10"))
    assert for_train(cfg, resume=True, overwrite=False).run.folder.name == "20260102-000000-10"


def test_a_named_folder_holding_a_run_is_refused(tmp_path: Path) -> None:
    folder = a_run(tmp_path / "run")
    cfg = load_config(None, [f"run.out_dir={folder}"])
    with pytest.raises(ConfigError, match="already holds a run; continue it with --resume"):
        for_train(cfg, resume=False, overwrite=False)
    assert for_train(cfg, resume=True, overwrite=False) == cfg
    assert for_train(cfg, resume=False, overwrite=True) == cfg
    joining = load_config(None, [f"run.out_dir={folder}", "launch.nnodes=2", "launch.node_rank=1"])
    with pytest.raises(ConfigError, match="already holds a run"):  # every node checks alike
        for_train(joining, resume=False, overwrite=False)
    prepared = a_run(tmp_path / "prepared", results=False)  # partitions or a plan only
    assert not holds_results(prepared)
    with pytest.raises(ConfigError, match="launch.nnodes > 1 needs run.out_dir"):
        for_train(load_config(None, ["launch.nnodes=2"]), resume=False, overwrite=False)


@pytest.mark.parametrize("command", ["partition", "profile-cache"])
def test_partition_and_plan_commands_leave_a_trained_run_as_it_was(
    tmp_path: Path, command: str
) -> None:
    """A trained run's resolved_config.yaml is the record its --resume is checked against:
    `leo partition` or `leo profile-cache` into its folder is refused before writing."""
    folder = a_run(tmp_path / "run")
    before = RunDir(folder).config.read_text()
    res = leo_here(command, "--set", f"run.out_dir={folder}", "--set", "model.dropout=0.3")
    assert res.returncode == 2
    assert "holds a trained run, whose resolved_config.yaml" in " ".join(res.stderr.split())
    assert RunDir(folder).config.read_text() == before
    assert sorted(p.name for p in folder.iterdir()) == ["metrics.jsonl", "resolved_config.yaml"]


@pytest.mark.integration
def test_two_runs_keep_their_results_and_share_partitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(2):
        res = leo("train", *TINY, cwd=tmp_path, timeout=300)
        assert res.returncode == 0, res.stderr
    runs = sorted(p for p in (tmp_path / "runs" / "default").iterdir() if p.name != "leo-cache")
    assert len(runs) == 2
    for run in runs:
        assert len(RunDir(run).read_metrics()) == 2 and RunDir(run).summary.is_file()
        assert RunDir(run).partitions.is_symlink()
    cache = tmp_path / "runs" / "default" / "leo-cache" / "partitions"
    entries = [p for p in cache.iterdir() if p.is_dir()]
    assert len(entries) == 1
    assert all(RunDir(r).partitions.resolve() == entries[0].resolve() for r in runs)
    second = json.loads(RunDir(runs[1]).summary.read_text())
    assert "partition_s" in second["setup_reused_s"]  # built by the first run only
    monkeypatch.chdir(tmp_path)
    res = leo_here("train", *TINY, "--set", f"run.out_dir={runs[0]}")  # refused: in this process
    assert res.returncode == 2 and "already holds a run" in res.stderr
    assert len(RunDir(runs[0]).read_metrics()) == 2  # untouched
    res = leo("train", *TINY, "--set", f"run.out_dir={runs[0]}", "--overwrite", cwd=tmp_path)
    assert res.returncode == 0, res.stderr


def test_several_machines_keep_partitions_in_the_shared_run_folder() -> None:
    from leo_cli.launch.stages import partition_cache_dir

    one = load_config(None, [])
    assert partition_cache_dir(one, Path("/r/runs/x/1")) == Path("/r/runs/x/leo-cache")
    mine = load_config(None, ["run.cache_dir=/c"])
    assert partition_cache_dir(mine, Path("/r/runs/x/1")) == Path("/c")
    two = load_config(None, ["launch.nnodes=2", "run.out_dir=/shared/run"])
    assert partition_cache_dir(two, Path("/shared/run")) is None  # nodes share the run folder


@pytest.mark.parametrize(
    "refused",
    [
        ["--set", "launch.emulate={nodes: 3}", "--set", "partition.num_parts=2"],
        ["--set", "launch.device=cuda"] if not torch.cuda.is_available() else ["--set", "x.y=1"],
    ],
)
def test_a_refused_run_leaves_no_empty_folder(
    refused: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run refused after its new folder was made (`fresh`) removes that folder again."""
    monkeypatch.chdir(tmp_path)
    out = leo_here("train", *refused)
    assert out.returncode != 0 and "error" in out.stderr.lower()
    made = tmp_path / "runs" / "default"
    assert not (made.is_dir() and any(made.iterdir()))
