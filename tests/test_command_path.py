"""The path from `leo train` to the first training step stays short (docs/architecture.md):
the files on the call stack, parent side up to torch's elastic launch, worker side from the
entry point to the step.

Parent: cli/train.py -> api.py -> launch/setup.py -> launch/elastic.py -> torch's launch;
torch starts each rank in harness/process.py (`run_started`, workers forked from the
launcher's server) or in worker/entry.py itself (`python -m`); the rank: worker/entry.py ->
worker/trainer.py -> worker/step.py. That is 8 file-to-file calls (7 for a spawned rank).

Set-up goes down the layers in order: scripts/setup_trace.py follows `prepare` call by call
and counts the calls that climb back to a higher layer (those launch/setup.py makes apart: a
stage calling its steps in turn). Each step a stage calls goes down on its own: what the checks
need of the lower layers is read once (`Workers`), a step is handed the paths and placement it
looks for a profile with, and a helper reads the machine before the registry's records.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from leo_cli.config import load_config
from leo_cli.harness import process
from leo_cli.kernels import variants
from leo_cli.launch import elastic, setup
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.worker import entry, step, trainer

PACKAGE = Path(entry.__file__).resolve().parent.parent

SMALL = [
    "data.synthetic.num_nodes=200",
    "data.synthetic.num_features=8",
    "model.hidden_channels=8",
    "partition.num_parts=1",
    "cache.policy=none",
    "pipeline.mode=blocking",
    "pipeline.spmm=torch",
    "train.num_epochs=1",
]

# In the first 77 entries of set-up (issue 56's target), and in all (the count when the steps
# went down in order; the calls left: scripts/setup_trace.py prints them).
FIRST_CLIMBS, ALL_CLIMBS = 3, 9


def leo_files(stack: traceback.StackSummary) -> list[str]:
    """The package's files on `stack`, outermost first, each run of one file once."""
    files: list[str] = []
    for frame in stack:
        path = Path(frame.filename).resolve()
        if path.is_relative_to(PACKAGE):
            name = str(path.relative_to(PACKAGE))
            if not files or files[-1] != name:
                files.append(name)
    return files


@pytest.fixture
def no_preload(monkeypatch: pytest.MonkeyPatch) -> None:
    """Set-up without the parent's head starts (the CPU kernels' build, the fork server)."""
    monkeypatch.setattr(setup, "ensure_cpu_kernels", lambda *_: None)
    monkeypatch.setattr(setup, "start_early", lambda *_: None)


class Launched(Exception):
    """Raised where torch's elastic launch would start the workers."""


@pytest.mark.usefixtures("no_preload")
def test_leo_train_reaches_the_elastic_launch_through_three_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from leo_cli.cli.render import output
    from leo_cli.cli.train import run_train

    stacks: list[list[str]] = []

    def launch(config: Any, entrypoint: Any) -> None:
        stacks.append(leo_files(traceback.extract_stack()))
        raise Launched

    monkeypatch.setattr(elastic, "entry_point", lambda module, args: (module, args, "spawn"))
    monkeypatch.setattr(elastic, "elastic_launch", launch)
    cfg = load_config(None, [*SMALL, f"run.out_dir={tmp_path / 'run'}"])
    with pytest.raises(Launched):
        run_train(cfg, resume=False, overwrite=False, allow_inexact=False, shown=output("plain"))
    assert stacks == [["cli/train.py", "api.py", "launch/setup.py", "launch/elastic.py"]]


@pytest.mark.integration  # a whole (one-rank) worker trains an epoch
@pytest.mark.usefixtures("no_preload")
def test_a_rank_reaches_its_first_step_through_two_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(None, [*SMALL, f"run.out_dir={tmp_path / 'run'}"])
    run_dir = setup.prepare(cfg, resume=False, progress=None)
    stacks: list[list[str]] = []
    train_step = step.train_step

    def spy(*args: Any, **kwargs: Any) -> Any:
        stacks.append(leo_files(traceback.extract_stack()))
        return train_step(*args, **kwargs)

    monkeypatch.setattr(step, "train_step", spy)
    monkeypatch.setattr(process, "die_with_parent", lambda: None)  # the test process stays
    monkeypatch.setattr(process, "start_heartbeat", lambda *_: None)
    monkeypatch.setattr(entry, "fix_mmap_threshold", lambda: None)  # this process's malloc
    monkeypatch.setattr(trainer, "after_setup", lambda *_: None)
    spmm = variants.cpu_spmm()
    try:
        assert entry.main([str(run_dir)]) == 0
    finally:
        variants.set_cpu_spmm(spmm)  # the variant in use is process-wide
    assert stacks == [["worker/entry.py", "worker/trainer.py", "worker/step.py"]]


def setup_trace() -> ModuleType:
    """scripts/setup_trace.py, loaded by its path (once)."""
    path = PACKAGE.parent / "scripts" / "setup_trace.py"
    if path.stem not in sys.modules:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module  # its dataclass looks its module up
        spec.loader.exec_module(module)
    return sys.modules[path.stem]


def test_the_trace_knows_the_layers_of_the_layout_test() -> None:
    from test_layout import LAYERS

    assert setup_trace().LAYERS == LAYERS


@pytest.mark.slow  # partitions and a plan made, then set-up traced call by call
@pytest.mark.usefixtures("no_preload")
def test_set_up_goes_down_the_layers(tmp_path: Path, hw_profile: HardwareProfile) -> None:
    """Set-up to the resolved config, profile, partitions and plan reused: few calls go back
    to a file of a higher layer than the call before them (scripts/setup_trace.py)."""
    trace = setup_trace()
    hw_profile.write(tmp_path / "hw.json")
    settings = ["data.synthetic.num_nodes=600", f"cache.hardware={tmp_path / 'hw.json'}"]
    entries = trace.traced_setup(tmp_path, settings)
    assert entries[0].caller == "launch/setup.py"
    first, every = trace.climbs(entries[:77]), trace.climbs(entries)
    assert first <= FIRST_CLIMBS and every <= ALL_CLIMBS, trace.report(entries, 77)


def test_the_launch_checks_hand_this_nodes_workers_to_the_stages_after_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks stage reads the worker count, device and module once (`Workers`); the
    preload starts the fork server with that record rather than asking the config again."""
    started: list[elastic.Workers] = []
    monkeypatch.setattr(setup, "ensure_cpu_kernels", lambda *_: None)
    monkeypatch.setattr(setup, "start_early", lambda cfg, workers, cache: started.append(workers))
    cfg = load_config(None, [*SMALL, "launch.device=cpu", f"run.out_dir={tmp_path / 'run'}"])
    done = setup.run_setup(setup.Ask.train(cfg), last="preload")
    assert list(done.seconds) == ["checks", "preload"]
    assert started == [done.workers] == [elastic.Workers(1, False, "leo_cli.worker.entry")]
