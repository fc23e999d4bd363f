"""The set-up pipeline (launch/setup.py): the stages each command runs and in which order,
the prefixes of `leo partition` and `leo profile-cache`, the waits of nodes other than 0, and
the pipeline's timing of each stage (fake stages and a fake clock: nothing is run)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from leo_cli.config import LeoConfig, load_config
from leo_cli.launch import setup
from leo_cli.launch.setup import MADE, Ask, Cost, Setup, Stage, run_stages, stages_for
from leo_cli.util.timing import RunTimer

TAIL = ["plan", "mode", "mode_plan", "resolved", "launch"]  # after the partitions, training


def config(tmp_path: Path, *settings: str) -> LeoConfig:
    return load_config(None, [f"run.out_dir={tmp_path / 'run'}", *settings])


def names(stages: list[Stage]) -> list[str]:
    return [stage.name for stage in stages]


@pytest.mark.parametrize(
    ("settings", "resume", "want"),
    [
        ((), False, ["nodes_probe", "partitions", "attempt", "hardware", *TAIL]),
        (  # under auto, the mode it started with
            (),
            True,
            ["resume", "nodes_probe", "partitions", "attempt", "started", "hardware", *TAIL],
        ),
        (
            ("pipeline.mode=leo",),
            True,
            ["resume", "nodes_probe", "partitions", "attempt", "hardware", *TAIL],
        ),
        (  # a resumed auto run keeps its mode without a plan too
            ("cache.policy=none",),
            True,
            ["resume", "nodes_probe", "partitions", "attempt", "started", *TAIL[1:]],
        ),
        (  # unequal weights are priced with the profile: it comes first
            ("partition.part_weights=measured",),
            False,
            ["nodes_probe", "hardware", "part_weights", "partitions", "attempt", *TAIL],
        ),
        (  # no plan, no profile: the plan's stages pass
            ("cache.policy=none",),
            False,
            ["nodes_probe", "partitions", "attempt", "mode", "mode_plan", "resolved", "launch"],
        ),
    ],
)
def test_train_runs_the_stages_in_order(
    tmp_path: Path, settings: tuple[str, ...], resume: bool, want: list[str]
) -> None:
    ask = Ask.train(config(tmp_path, *settings), resume=resume)
    assert names(stages_for(ask)) == ["checks", "preload", *want]
    assert names(stages_for(ask, last="resolved")) == ["checks", "preload", *want[:-1]]


def test_each_stage_function_runs_once_at_its_place(tmp_path: Path) -> None:
    """The hardware profile has one function at one of two places; every other stage one."""
    for settings in ((), ("partition.part_weights=measured",)):
        todo = stages_for(Ask.train(config(tmp_path, *settings), resume=True))
        assert len({stage.run for stage in todo}) == len(todo)
    assert [s.run for s in setup.STAGES if s.name == "hardware"] == [setup.hardware] * 2


@pytest.mark.parametrize(
    ("settings", "want"),
    [
        ((), ["checks", "partitions"]),
        (("partition.part_weights=[1,2]",), ["checks", "hardware", "part_weights", "partitions"]),
    ],
)
def test_partition_runs_a_prefix(
    tmp_path: Path, settings: tuple[str, ...], want: list[str]
) -> None:
    ask = Ask.partition(config(tmp_path, *settings), force=True, progress=None)
    assert names(stages_for(ask, last="partitions")) == want
    assert ask.rebuild and not ask.force  # parts rebuilt; nobody else joins its probes
    assert not ask.joined and ask.checks == "none"


@pytest.mark.parametrize(
    ("force", "given", "want"),
    [
        (False, False, ["nodes_probe", "partitions", "hardware", "plan"]),
        (True, False, ["nodes_probe", "hardware", "partitions", "plan"]),  # measured first
        (True, True, ["nodes_probe", "partitions", "hardware", "plan"]),  # given: not measured
    ],
)
def test_profile_cache_runs_a_prefix(
    tmp_path: Path, force: bool, given: bool, want: list[str]
) -> None:
    """Whatever the policy (here none too): the plan's stages, not training's."""
    cfg = config(tmp_path, "cache.policy=none")
    ask = Ask.profile_cache(cfg, force, tmp_path / "hw.json" if given else None, progress=None)
    assert names(stages_for(ask, last="plan")) == ["checks", *want]
    assert names(stages_for(ask)) == ["checks", *want]  # training's stages are not its own


def test_other_nodes_wait_where_node_0_works(tmp_path: Path) -> None:
    """Node 1 checks and preloads as node 0 does, joins node 0's probes in place of them,
    waits for its resolved config in place of the stages that write the run folder, then
    launches its own workers."""
    node = ["launch.nnodes=2", "launch.node_rank=1", "partition.part_weights=measured"]
    todo = stages_for(Ask.train(config(tmp_path, *node), resume=True))
    assert names(todo) == ["checks", "preload", "nodes_probe", "resolved", "launch"]
    runs = [stage.run for stage in todo]
    assert runs == [setup.checks, setup.preload, setup.join, setup.wait_resolved, setup.launch]
    assert all(stage.timed_as is None for stage in todo)  # node 0 books the stages it ran
    ask = Ask.profile_cache(config(tmp_path, *node), False, None, progress=None)
    assert [s.run for s in stages_for(ask, last="plan")] == [setup.checks, setup.join]


class Clock:
    """Each reading one second after the last."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def fake(name: str, cost: Cost | None, seen: list[tuple[str, dict[str, float]]]) -> Stage:
    """A stage that notes what it was handed (the earlier stages' times) and returns `cost`."""

    def run(s: Setup) -> tuple[Setup, Cost | None]:
        seen.append((name, dict(s.seconds)))
        return s, cost

    return Stage(name, run, timed_as=f"{name}_s")


def test_the_pipeline_times_each_stage_once(tmp_path: Path) -> None:
    """Every stage is timed once, by the pipeline, after the ones before it; the timer books
    the seconds of a stage that made its output, the recorded cost of one that reused it, and
    nothing for one that did neither."""
    seen: list[tuple[str, dict[str, float]]] = []
    stages = [
        fake("partition", MADE, seen),
        fake("probe", Cost(7.5), seen),
        fake("plan", None, seen),
        Stage("untimed", lambda s: (s, MADE)),
    ]
    timer = RunTimer()
    ask = replace(Ask.train(config(tmp_path)), timer=timer)
    done = run_stages(stages, Setup(ask), clock=Clock())
    assert [name for name, _ in seen] == ["partition", "probe", "plan"]
    assert seen[1][1] == {"partition": 1.0} and seen[2][1] == {"partition": 1.0, "probe": 1.0}
    assert done.seconds == {"partition": 1.0, "probe": 1.0, "plan": 1.0, "untimed": 1.0}
    assert timer.parts == {"partition_s": 1.0} and timer.reused == {"probe_s": 7.5}


def test_a_set_up_continued_runs_only_the_stages_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`leo train` checks, decides on emulated nodes, then continues: no stage twice."""
    seen: list[tuple[str, dict[str, float]]] = []
    table = [fake(name, None, seen) for name in ("checks", "partitions", "launch")]
    monkeypatch.setattr(setup, "stages_for", lambda ask, last="launch": table)
    ask = Ask.train(config(tmp_path))
    checked = run_stages(table[:1], Setup(ask))
    setup.run_setup(ask, done=checked)
    assert [name for name, _ in seen] == ["checks", "partitions", "launch"]
