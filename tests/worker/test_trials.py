"""`auto`'s trials on the workers (worker/trials.py): the winner's rule, the recorded choice,
and on real gloo ranks: every rank picks alike, nothing a trial does changes the numbers the
winner then trains, and the levels `pipeline.levels` names stay exact."""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import random_graph
from helpers.ranks import dataset_info, spawn_ranks

from leo_cli import kernels
from leo_cli.comm.levels import RankLevels
from leo_cli.config import LeoConfig, load_config
from leo_cli.errors import TrainError
from leo_cli.graph.layout import LocalPart, build_parts
from leo_cli.graph.partitioners import assign_parts
from leo_cli.graph.types import DatasetInfo
from leo_cli.kernels import cpu, slabs, variants
from leo_cli.planner.auto_mode import ModeChoice, read_choice, with_mode
from leo_cli.run_dir import RunDir
from leo_cli.util.timing import Laps
from leo_cli.worker import trials as trials_module
from leo_cli.worker.assemble import PartTensors, assemble, chosen_levels, part_tensors
from leo_cli.worker.step import Job, train_step
from leo_cli.worker.trials import (
    STOP,
    TIE,
    Trial,
    choose_spmm,
    frozen_heap,
    measure,
    measured_choice,
    spmm_trials,
    spmm_winner,
    winner,
)

LEVELS = RankLevels(True, [0, 2], [1, 3])


def cfg(*overrides: str) -> LeoConfig:
    return load_config(None, list(overrides))


def test_the_fastest_median_wins() -> None:
    trials = [Trial("leo", [0.30, 0.10, 0.11]), Trial("blocking", [0.12, 0.13, 0.12])]
    won, rule = winner(trials, {})
    assert (won.name, rule) == ("leo", "measured fastest")


def test_a_tie_goes_to_smaller_buffers_and_a_variant_counts_its_modes() -> None:
    trials = [Trial("leo", [0.100]), Trial("shared-memory", [0.102]), Trial("blocking", [0.2])]
    won, rule = winner(trials, {"leo": 50_000_000, "shared-memory": 10_000_000})
    assert won.name == "shared-memory"
    assert rule == "measured within 3% of the fastest, 40.0 MB less in buffers"
    # 4% slower is no tie; a variant without its own prediction counts its mode's buffers
    assert winner([Trial("leo", [0.100]), Trial("shared-memory", [0.104])], {
        "leo": 5, "shared-memory": 1})[0].name == "leo"  # fmt: skip
    tied = [Trial("leo/no-replicas", [0.100]), Trial("shared-memory", [0.101])]
    assert winner(tied, {"leo": 1, "shared-memory": 9})[0].name == "leo/no-replicas"
    # a tied candidate without any prediction: the fastest, memory is never guessed
    assert winner(tied, {"shared-memory": 1})[0].name == "leo/no-replicas"


def test_slabs_win_an_spmm_tie_only_where_no_plain_variant_is_within_it() -> None:
    """torch-slabs copies x into slabs: a variant that copies nothing within the tie wins."""
    tied = [Trial("torch-slabs", [0.942]), Trial("torch", [0.968]), Trial("leo", [1.2])]
    won, rule = spmm_winner(tied)
    assert (
        won.name == "torch"
        and rule == "measured within 3% of torch-slabs, which copies x into slabs"
    )
    clear = [Trial("torch-slabs", [0.90]), Trial("torch", [0.968])]
    assert spmm_winner(clear)[0].name == "torch-slabs"
    assert spmm_winner([Trial("leo", [0.5]), Trial("torch", [0.51])])[0].name == "leo"


def test_a_stopped_trial_never_wins_and_is_noted() -> None:
    trials = [Trial("blocking", [0.2, 0.2]), Trial("leo", [0.01], stopped=True)]
    won, rule = winner(trials, {})
    assert won.name == "blocking" and trials[1].median_s is None
    asked = ModeChoice("auto", "leo", "to be measured", {"leo": 0.1}, {}, "planned",
                       ["leo", "blocking"], notes={"fine-grained": "not tried"})  # fmt: skip
    chosen = measured_choice(asked, trials, won, rule)
    assert (chosen.mode, chosen.levels, chosen.trials) == ("blocking", "planned", [])
    assert chosen.measured_s == {"blocking": 0.2, "leo": None}
    assert chosen.notes == {"fine-grained": "not tried",
                            "leo": "stopped after its first step: 0.010 s"}  # fmt: skip
    assert chosen.describe() == "blocking (auto: measured fastest, 0.200 s)"


def test_a_variants_levels_come_from_its_name() -> None:
    asked = ModeChoice("auto", "leo", "to be measured", levels="planned", trials=["leo"])
    chosen = measured_choice(asked, [Trial("leo/no-replicas", [0.1])], Trial("leo/no-replicas",
                             [0.1]), "measured fastest")  # fmt: skip
    assert (chosen.mode, chosen.levels, chosen.name) == ("leo", "no-replicas", "leo/no-replicas")


def test_a_later_candidate_stops_past_the_best_ones_noise() -> None:
    steady = Trial("leo", [0.100, 0.101, 0.100])
    assert steady.stop_at == pytest.approx(0.100 * (1 + 2 * TIE))  # its spread is below 2 ties
    noisy = Trial("leo", [0.100, 0.112, 0.090])
    assert noisy.stop_at == pytest.approx(0.112)  # its slowest step, not median + its spread
    assert Trial("leo", [0.1, 0.3, 0.1]).stop_at == pytest.approx(0.1 * STOP)  # at most STOP
    assert Trial("leo", [0.1], stopped=True).stop_at is None


def _stepping(monkeypatch: pytest.MonkeyPatch, times: dict[str, list[float]]) -> list[str]:
    """`trial_step` replaced: each job (a candidate's name) steps through its `times`, the
    first being its warm-up step; returns the names of the steps taken, in order."""
    taken: list[str] = []

    def step(job: Any, seed: int) -> float:
        taken.append(job)
        return times[job][taken.count(job) - 1]

    monkeypatch.setattr(trials_module, "trial_step", step)
    return taken


def test_steps_that_agree_within_a_tie_are_not_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two timed steps within `TIE` of each other settle a candidate's median (it cannot
    move by more than the tie the winner is chosen within): no third step."""
    taken = _stepping(monkeypatch, {"leo": [0.4, 0.30, 0.305, 0.3], "fg": [0.4, 0.3, 0.4, 0.3]})
    steady = trials_module.try_candidate("leo", "leo", 0, 3, None)  # type: ignore[arg-type]
    assert steady.steps_s == [0.30, 0.305] and steady.median_s == pytest.approx(0.3025)
    spread = trials_module.try_candidate("fg", "fg", 0, 3, None)  # type: ignore[arg-type]
    assert spread.steps_s == [0.3, 0.4, 0.3]  # 33% apart: all the steps asked for
    assert taken == ["leo"] * 3 + ["fg"] * 4
    assert not trials_module.settled([0.3]) and trials_module.settled([0.3, 0.3 * (1 + TIE)])


def test_a_warm_up_past_the_best_by_the_warm_ups_seen_stops_before_any_timed_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A later candidate whose warm-up step alone is past the best's `stop_at` times the most
    a finished candidate's warm-up took over its median stops there (noted, never wins, no
    calibration step); one under it takes its steps, and its first decides as before."""
    taken = _stepping(monkeypatch, {
        "leo": [0.15, 0.10, 0.101],  # warm-up 1.5x its median
        "blocking": [0.25, 0.2],  # 0.25 > 0.1005 * 1.06 * 1.49: stopped
        "fine-grained": [0.15, 0.2],  # under: a step, past the best's stop_at
    })  # fmt: skip
    names = ["leo", "blocking", "fine-grained"]
    trials, _ = measure(names, lambda name: name, seed=0, steps=2)  # type: ignore[arg-type,return-value]
    assert taken == ["leo"] * 3 + ["blocking"] + ["fine-grained"] * 2
    best, warm, first = trials
    assert best.warmup_over == pytest.approx(0.15 / 0.1005)
    assert trials_module.warmup_stop_at([best]) == pytest.approx(best.stop_at * 0.15 / 0.1005)
    assert (warm.stopped, warm.steps_s, warm.warmup_s) == (True, [], 0.25)
    assert (first.stopped, first.steps_s) == (True, [0.2])
    chosen = measured_choice(ModeChoice("auto", "leo", trials=names), trials, best, "measured")
    assert chosen.notes == {
        "blocking": "stopped after its warm-up step: 0.250 s",
        "fine-grained": "stopped after its first step: 0.200 s",
    }
    assert "first_step_s" not in chosen.trial_s["blocking"]
    assert chosen.trial_s["fine-grained"]["first_step_s"] == 0.2
    assert trials_module.warmup_stop_at([warm, first]) is None  # no finished trial


def test_one_slow_warm_up_does_not_drop_the_eventual_fastest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The grid's miss (2 emulated nodes at 10 Gbit/s, SAGE, 4 workers): `leo`'s warm-up
    (0.239 s) was past the warm-up line set by `blocking` (0.183 s a step) and dropped it,
    though its steps were the fastest. A warm-up past its line by less than `FAR` stops a
    candidate only with its first timed step also past the best's `stop_at`."""
    taken = _stepping(monkeypatch, {
        "blocking": [0.200, 0.183, 0.183],
        "leo": [0.239, 0.170, 0.172],
    })  # fmt: skip
    trials, _ = measure(["blocking", "leo"], lambda name: name, seed=0, steps=3)  # type: ignore[arg-type,return-value]
    best, leo = trials
    assert (leo.stopped, leo.steps_s) == (False, [0.170, 0.172])  # settled after two
    assert winner(trials, {})[0].name == "leo"
    assert taken == ["blocking"] * 3 + ["leo"] * 3
    line = trials_module.warmup_stop_at([best])
    assert line is not None and line < 0.239 < line * trials_module.FAR  # past, not far


def test_one_slow_first_step_does_not_drop_the_eventual_fastest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One host, GAT, 2 workers: `blocking`'s first step (1.528 s) was past `shared-memory`'s
    `stop_at` (1.418 s x 1.06) and stopped it, though `blocking` by name was the fastest that
    round. A first step past it by less than `FAR` is decided by the next one."""
    _stepping(monkeypatch, {
        "shared-memory": [1.50, 1.418, 1.419, 1.420],
        "blocking": [1.45, 1.528, 1.390, 1.385],
    })  # fmt: skip
    trials, _ = measure(["shared-memory", "blocking"], lambda n: n, seed=0, steps=3)  # type: ignore[arg-type,return-value]
    best, slow_first = trials
    assert (slow_first.stopped, slow_first.steps_s) == (False, [1.528, 1.390, 1.385])
    assert winner(trials, {})[0].name == "blocking"
    assert best.stop_at is not None and best.stop_at < 1.528 < best.stop_at * trials_module.FAR


def test_two_steps_in_a_row_past_the_line_or_one_far_past_it_stop_a_candidate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a slower candidate costs: past its lines by less than `FAR`, one step more than
    one step would (its warm-up and first step, or its first two steps); `FAR` past, the
    step alone. A slow step after the first two stops nothing."""
    taken = _stepping(monkeypatch, {
        "leo": [0.10, 0.100, 0.100, 0.100],  # best: stop_at 0.106, warm-up line 0.106
        "blocking": [0.12, 0.12, 0.5],  # warm-up past, first step past: stopped after it
        "fine-grained": [0.10, 0.12, 0.13, 0.5],  # first two timed steps past: stopped
        "shared-memory": [0.10, 0.12, 0.10, 0.13, 0.5],  # first past, second under: timed
        "leo/no-replicas": [0.10, 0.10, 0.12, 0.5],  # a third slow step: never stops it
        "late-far": [0.10, 0.10, 0.5, 0.10],  # the second alone, FAR past: does not stop it
        "far": [0.2, 0.5],  # warm-up FAR past its line: stopped before any timed step
        "far-first": [0.10, 0.2, 0.5],  # first timed step FAR past stop_at: stopped
    })  # fmt: skip
    names = ["leo", "blocking", "fine-grained", "shared-memory", "leo/no-replicas", "late-far",
             "far", "far-first"]  # fmt: skip
    # MIN_TRIAL_S adds steps to short ones: these 0.1 s steps stand for longer ones
    monkeypatch.setattr(trials_module, "MIN_TRIAL_S", 0.0)
    trials, _ = measure(names, lambda n: n, seed=0, steps=3)  # type: ignore[arg-type,return-value]
    got = {t.name: (t.stopped, t.steps_s) for t in trials}
    assert got == {
        "leo": (False, [0.100, 0.100]),
        "blocking": (True, [0.12]),
        "fine-grained": (True, [0.12, 0.13]),
        "shared-memory": (False, [0.12, 0.10, 0.13]),
        "leo/no-replicas": (False, [0.10, 0.12, 0.5]),
        "late-far": (False, [0.10, 0.5, 0.10]),
        "far": (True, []),
        "far-first": (True, [0.2]),
    }
    assert [taken.count(n) for n in names] == [3, 2, 3, 4, 4, 4, 1, 2]
    chosen = measured_choice(ModeChoice("auto", "leo", trials=names), trials, trials[0], "m")
    assert chosen.notes["fine-grained"] == "stopped after its first 2 steps: 0.120, 0.130 s"
    assert chosen.notes["blocking"] == "stopped after its first step: 0.120 s"
    assert chosen.trial_s["fine-grained"]["first_step_s"] == 0.12


def _fake_try(
    name: str, job: object, seed: int, steps: int, stop_s: float | None, warm_stop_s: Any = None
) -> Trial:
    return Trial(name, [0.1 if name == "leo" else 0.2] * steps)


def test_candidates_are_freed_without_walking_the_objects_alive_before_the_trials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A full collection walks every object of the process (0.2 s with torch loaded): the
    objects alive before the trials are frozen out of the collections between candidates."""
    monkeypatch.setattr(trials_module, "try_candidate", _fake_try)
    frozen: list[int] = []

    def build(name: str) -> Any:
        frozen.append(gc.get_freeze_count())
        return object()

    got, _ = measure(["leo", "blocking"], build, seed=0, steps=2)
    assert all(n > 1000 for n in frozen) and gc.get_freeze_count() == 0
    assert all(t.phases["free_s"] >= 0 and t.phases["build_s"] >= 0 for t in got)


def test_a_freeze_over_the_trials_keeps_what_they_made_collectable() -> None:
    """`train_winner` frees the last candidate inside the freeze the trials ran under: a
    nested block does not freeze again, which would keep that candidate's cycles."""

    class Cycle:
        me: Any = None

    with frozen_heap():
        made = Cycle()
        made.me = made
        ref = weakref.ref(made)
        del made
        with frozen_heap():
            gc.collect()
        assert ref() is None
    assert gc.get_freeze_count() == 0


def test_a_process_frozen_for_good_stays_frozen_after_the_trials() -> None:
    """A forked worker freezes its imports once (harness/process.py): the trials' block
    neither unfreezes them nor freezes what the trials made."""
    gc.freeze()
    try:
        held = gc.get_freeze_count()
        with frozen_heap():
            made = [object()]
            assert gc.get_freeze_count() == held
        assert gc.get_freeze_count() == held
        del made
    finally:
        gc.unfreeze()


def test_a_candidate_that_fails_to_build_is_skipped_with_its_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trials_module, "try_candidate", _fake_try)

    def build(name: str) -> Any:
        if name == "shared-memory":
            raise TrainError("pipeline.mode=shared-memory needs 2.0 GB of /dev/shm")
        if name == "fine-grained":
            raise MemoryError()
        return object()

    names = ["blocking", "shared-memory", "leo", "fine-grained"]
    got, last = measure(names, build, seed=0, steps=3)
    assert last is None  # the last one failed: the winner is built again
    assert [t.name for t in got] == names and got[2].median_s == 0.1
    assert got[1].failed == "rank 0: pipeline.mode=shared-memory needs 2.0 GB of /dev/shm"
    assert got[3].failed == "rank 0: MemoryError" and got[3].median_s is None
    assert set(got[0].phases) == {"free_s", "build_s"}  # (the fake try times no steps)
    won, rule = winner(got, {})
    asked = ModeChoice("auto", "blocking", "to be measured", levels="planned", trials=names)
    chosen = measured_choice(asked, got, won, rule)
    assert chosen.mode == "leo" and chosen.measured_s["shared-memory"] is None
    why = "rank 0: pipeline.mode=shared-memory needs 2.0 GB of /dev/shm"
    assert chosen.notes["shared-memory"] == f"skipped: failed while being built ({why})"
    assert set(chosen.trial_s) == set(names)


def test_when_every_candidate_fails_the_first_failure_ends_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(trials_module, "try_candidate", _fake_try)

    def build(name: str) -> Any:
        raise TrainError(f"{name} does not fit")

    with pytest.raises(TrainError, match="blocking does not fit"):
        measure(["blocking", "leo"], build, seed=0, steps=3)


def _one_rank_fails(rank: int, world: int) -> Any:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    trials_module.try_candidate = _fake_try  # (this process only)

    def build(name: str) -> Any:
        if name == "leo" and rank == 1:  # at its end, after the assembly's collectives
            raise MemoryError("out of memory on rank 1")
        return object()

    got, _ = measure(["blocking", "leo"], build, seed=0, steps=2)
    return [(t.name, t.failed) for t in got]


@pytest.mark.dist
def test_a_candidate_that_fails_on_one_rank_is_skipped_by_every_rank() -> None:
    by_rank = spawn_ranks(_one_rank_fails, 2)
    for r in by_rank:
        assert r == [("blocking", None), ("leo", "rank 1: out of memory on rank 1")], r


@pytest.mark.parametrize(
    ("mode", "levels", "replicas", "l3", "every"),
    [
        ("leo", "own", [0, 2], [1, 3], [1]),
        ("leo", "planned", [0, 2], [1, 3], [1]),
        ("leo", "no-replicas", [], [1, 3], [1]),
        ("leo", "no-in-place", [0, 2], [], None),
        ("blocking", "planned", [0, 2], [], None),  # reads nothing in place: rows in bulk
        ("blocking", "own", [0, 2], [1, 3], [1]),  # its own plan: as made
        ("blocking", "no-replicas", [], [], None),
    ],
)
def test_pipeline_levels_take_the_plan_as_named(
    mode: str, levels: str, replicas: list[int], l3: list[int], every: list[int] | None
) -> None:
    run = cfg(f"pipeline.mode={mode}", f"pipeline.levels={levels}")
    got, every_row = chosen_levels(run, LEVELS, [1])
    assert got == RankLevels(True, replicas, l3) and every_row == every


def _parts(world: int) -> tuple[list[LocalPart], DatasetInfo]:
    g = random_graph(300, 1500, 12, 4, seed=3)
    return build_parts(g, assign_parts(g, world, "metis", seed=0), world), dataset_info(g)


def _trials_then_train(rank: int, world: int, names: list[str], keep_last: bool) -> Any:
    """Trials of `names`, then 3 epochs of the winner: on the last trial's job (`keep_last`)
    or a fresh one; beside 3 epochs of the winner built fresh without any trial."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parts, info = _parts(world)
    base = cfg("train.dtype=float64", "model.input_dropout=0.5", "cache.static_aggregate=false")
    halo = parts[rank].num_halo
    levels = RankLevels(False, list(range(0, halo, 2)), list(range(1, halo, 4)))

    shared = part_tensors(base, parts[rank], info, torch.device("cpu"))

    def build(name: str, tensors: PartTensors | None = shared) -> Job:
        """A candidate's job, on the part's tensors the trials share (as the workers do)."""
        mode, _, variant = name.partition("/")
        run = with_mode(base, mode, variant or "planned")
        cached, every = chosen_levels(run, levels, None)
        cpu = torch.device("cpu")
        return assemble(run, parts[rank], info, world, cpu, cached, every_row_from=every,
                        tensors=tensors)  # fmt: skip

    def losses(j: Job) -> list[float]:
        return [train_step(j.model, j.optimizer, j.reducer, j.graph, j.data, 0, e)[0]
                for e in range(1, 4)]  # fmt: skip

    # The winner as this test names it (not by its time), trained before any trial from
    # the part alone: nothing shared with a trial, no state a trial could have left.
    won = names[-1] if keep_last else names[0]
    fresh = losses(build(won, None))
    seen = bool(shm_mappings(build("shared-memory")))  # a live job's segment is seen
    gc.collect()
    rng = torch.get_rng_state()
    trials, last = measure(names, build, seed=0, steps=2)
    same_rng = bool(torch.equal(rng, torch.get_rng_state()))
    if not keep_last:
        del last
        gc.collect()
    held = shm_mappings()  # segments of freed candidates (the last one maps none)
    job = last if keep_last else build(won)
    result = {"trials": trials, "after": losses(job), "fresh": fresh, "rng": same_rng}
    return result | {"held": held, "seen": seen}


def shm_mappings(alive: Job | None = None) -> list[str]:
    """This process's mappings of LEO's /dev/shm segments (a segment stays mapped, unlinked,
    while a job holds it; `alive`: a job kept alive while they are read)."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    return [line for line in maps if "/dev/shm/leo-" in line]


@pytest.mark.dist
@pytest.mark.parametrize("keep_last", [True, False])
def test_trials_leave_the_winners_numbers_unchanged(keep_last: bool) -> None:
    names = ["leo", "blocking", "leo/no-replicas", "shared-memory", "leo/no-in-place"]
    by_rank = spawn_ranks(_trials_then_train, 2, names, keep_last)
    for r in by_rank:
        assert not isinstance(r, Exception), r
        assert r["rng"], "the trials left the torch random state changed"
        assert r["seen"] and r["held"] == [], r["held"]  # no freed candidate's segment mapped
        assert r["after"] == r["fresh"], (r["after"], r["fresh"])  # to the last bit
    # every rank timed the same steps (the slowest rank's), so every rank picks alike
    assert by_rank[0]["trials"] == by_rank[1]["trials"]
    assert [t.name for t in by_rank[0]["trials"]] == names


def _levels_losses(rank: int, world: int, settings: list[tuple[str, str]]) -> Any:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parts, info = _parts(world)
    halo = parts[rank].num_halo
    levels = RankLevels(False, list(range(0, halo, 2)), list(range(1, halo, 4)))
    out = []
    for mode, setting in settings:
        run = with_mode(cfg("train.dtype=float64", "model.input_dropout=0.5"), mode, setting)
        cached, every = chosen_levels(run, levels, None)
        job = assemble(
            run, parts[rank], info, world, torch.device("cpu"), cached, every_row_from=every
        )
        out.append([train_step(job.model, job.optimizer, job.reducer, job.graph, job.data, 0, e)[0]
                    for e in range(1, 4)])  # fmt: skip
    return out


@pytest.mark.dist
def test_every_levels_setting_trains_one_processs_numbers() -> None:
    settings = [("leo", "planned"), ("leo", "no-replicas"), ("leo", "no-in-place"),
                ("blocking", "planned"), ("fine-grained", "no-replicas")]  # fmt: skip
    parts, info = _parts(1)
    one = cfg("train.dtype=float64", "model.input_dropout=0.5", "pipeline.mode=leo")
    job = assemble(one, parts[0], info, 1, torch.device("cpu"))
    ref = [train_step(job.model, job.optimizer, job.reducer, job.graph, job.data, 0, e)[0]
           for e in range(1, 4)]  # fmt: skip
    for result in spawn_ranks(_levels_losses, 2, settings):
        assert not isinstance(result, Exception), result
        for (mode, setting), losses in zip(settings, result, strict=True):
            np.testing.assert_allclose(losses, ref, rtol=1e-10, err_msg=f"{mode} {setting}")


def _one_worker_job() -> Job:
    """One worker's job whose middle layer aggregates 64 columns (slabs can cut them)."""
    parts, info = _parts(1)
    run = cfg(
        "train.dtype=float64", "model.input_dropout=0.5", "cache.static_aggregate=false",
        "pipeline.mode=leo", "model.num_layers=3", "model.hidden_channels=64",
    )  # fmt: skip
    return assemble(run, parts[0], info, 1, torch.device("cpu"))


def _losses(job: Job, epochs: int = 3) -> list[float]:
    return [
        train_step(job.model, job.optimizer, job.reducer, job.graph, job.data, 0, e)[0]
        for e in range(1, epochs + 1)
    ]


@pytest.mark.slow  # a job's first steps (torch.compile of the masks): seconds of CPU
def test_spmm_trials_leave_the_numbers_and_the_variant_as_they_were(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fresh = _losses(_one_worker_job())
    job = _one_worker_job()
    rng = torch.get_rng_state()
    monkeypatch.setattr(slabs, "last_level_cache_bytes", lambda: 1 << 40)  # no x wider
    monkeypatch.setattr(trials_module, "MIN_TRIAL_S", 0.0)  # one timed step
    if kernels.active_backend().cpu != "leo":  # a rank without the library skips leo
        monkeypatch.setattr(cpu, "_LOADED", None)
    names = [variants.LEO, variants.TORCH, variants.TORCH_SLABS]
    stepped: list[int] = []
    step = trials_module.trial_step
    monkeypatch.setattr(trials_module, "trial_step", lambda *a: stepped.append(1) or step(*a))
    got, notes = spmm_trials(names, job, seed=0, steps=1)
    assert len(stepped) == 1  # one step records the SpMMs; the variants time those alone
    assert got[0].phases["record_s"] > 0 and got[-1].phases["passes"] >= 1
    assert [t.name for t in got][-1] == variants.TORCH and got[-1].median_s is not None
    assert notes["spmm=torch-slabs"] == f"not tried: {trials_module.NO_SLABS}"
    if kernels.active_backend().cpu != "leo":
        assert notes["spmm=leo"] == "not tried: LEO's CPU library is not loaded on every rank"
    assert variants.cpu_spmm() == variants.AUTO and torch.equal(torch.get_rng_state(), rng)
    assert _losses(job) == fresh  # no optimizer step, no state kept: to the last bit


@pytest.mark.slow
def test_every_spmm_variant_trains_the_same_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    # x of the middle layer (300 x 64 float64, 154 kB) over a fifth of the cache: slabs of 16
    monkeypatch.setattr(slabs, "last_level_cache_bytes", lambda: 200_000)
    monkeypatch.setattr(slabs, "sharing_processes", lambda: 1)
    names = [variants.TORCH, variants.TORCH_SLABS]
    if kernels.active_backend().cpu == "leo":
        names.append(variants.LEO)
    by_variant = {}
    try:
        for name in names:
            variants.set_cpu_spmm(name)
            variants.slabs_taken(reset=True)
            by_variant[name] = _losses(_one_worker_job())
            assert variants.slabs_taken() == (name == variants.TORCH_SLABS)
    finally:
        variants.set_cpu_spmm(variants.AUTO)
    for name, losses in by_variant.items():  # float64: the exactness tolerance of the modes
        np.testing.assert_allclose(losses, by_variant[variants.TORCH], rtol=1e-10, err_msg=name)


def test_the_fastest_variant_is_kept_recorded_and_in_the_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = {variants.TORCH: 0.3, variants.TORCH_SLABS: 0.2}
    monkeypatch.setattr(
        trials_module,
        "spmm_trials",
        lambda names, job, seed, steps, *payback: (
            [Trial(n, [fake[n]], phases={"steps_s": 1.0}) for n in names],
            {},
        ),
    )
    asked = ModeChoice("leo", "leo", spmm_trials=list(fake))
    run = RunDir(tmp_path)
    laps = Laps()
    try:
        run_cfg, chosen = choose_spmm(run, cfg("pipeline.mode=leo"), asked, object(), 0, laps)  # type: ignore[arg-type]
        assert variants.cpu_spmm() == variants.TORCH_SLABS  # in use from here on
    finally:
        variants.set_cpu_spmm(variants.AUTO)
    assert run_cfg.pipeline.spmm == variants.TORCH_SLABS and chosen.spmm_trials == []
    assert chosen.spmm_measured_s == fake and chosen.spmm_rule == "measured fastest"
    recorded = read_choice(tmp_path)
    assert recorded is not None and recorded.spmm == variants.TORCH_SLABS and recorded.measured_here
    assert load_config(run.config).pipeline.spmm == variants.TORCH_SLABS
    assert "choose_s" in laps.seconds


class _Passes:
    """A replay whose first passes (`spmm_calls.STOP_AFTER`) take `first_s` at their
    fastest and all of them `rest_s`."""

    def __init__(self, first_s: float, rest_s: float) -> None:
        self.first_s, self.rest_s = first_s, rest_s

    def time(self, passes: int, min_s: float, max_passes: int, stop: Any) -> tuple[float, int]:
        if stop(self.first_s):
            return self.first_s, 2
        return self.rest_s, passes


def test_an_spmm_variant_far_past_the_best_stops_after_its_first_passes() -> None:
    best = trials_module.spmm_trial("torch", _Passes(0.012, 0.010), 3, {})  # type: ignore[arg-type]
    assert (best.median_s, best.stopped, best.phases["passes"]) == (0.010, False, 3.0)
    far = trials_module.spmm_trial("torch-slabs", _Passes(0.016, 0.015), 3, {}, 0.010)  # type: ignore[arg-type]
    assert far.stopped and far.median_s is None and far.phases["passes"] == 2.0
    near = trials_module.spmm_trial("leo", _Passes(0.012, 0.009), 3, {}, 0.010)  # type: ignore[arg-type]
    assert not near.stopped and near.median_s == 0.009
    assert winner([best, far, near], {})[0].name == "leo"


def test_a_candidate_is_tried_only_where_what_it_may_save_repays_its_trial() -> None:
    """The payback rule on the workers (`not_repaid`), on the slowest rank's times: against
    the best median so far, a candidate expected as fast (on this run's scale) may step
    `UNCERTAIN` faster; its trial costs its build (in steps, as the finished trials' took), a
    warm-up and two timed steps. Tried only where that saving over the run beats the cost."""
    from leo_cli.planner.auto_mode import UNCERTAIN

    assert UNCERTAIN == 0.5  # the numbers below
    choice = ModeChoice("auto", "leo", predicted_s={"leo": 0.1, "blocking": 0.1})
    done = [Trial("leo", [0.5, 0.5], build_s=1.0)]  # median 0.5 s, built in two of its steps
    # blocking may step in 0.25 s, saving 0.25 s an epoch; its trial: (2 + 1 + 2) * 0.5 s
    why = trials_module.not_repaid("blocking", done, choice, 10, 3)
    assert why == (
        "not tried: could save at most 2.50 s over 10 epochs, its trial costs about 2.50 s"
    )
    assert trials_module.not_repaid("blocking", done, choice, 11, 3) is None
    assert trials_module.not_repaid("blocking", [], choice, 1, 3) is None  # nothing measured
    # expected at twice leo's step on this run's scale: not faster than 0.5 s at best, by
    # the default uncertainty alone: not this rule's to leave out (it would at any length)
    slow = replace(choice, predicted_s={"leo": 0.1, "blocking": 0.2})
    assert trials_module.not_repaid("blocking", done, slow, 10**6, 3) is None
    # by its calibration's error: left out, nothing to save
    bounded = replace(slow, uncertainty={"blocking": 0.1})
    never = trials_module.not_repaid("blocking", done, bounded, 10**6, 3)
    assert never is not None and never.startswith("not tried: could save at most 0.00 s")
    # its calibration's error bounds it closer: 0.5 * (1 - 0.1) saves 0.05 s an epoch
    sure = replace(choice, uncertainty={"blocking": 0.1})
    assert trials_module.not_repaid("blocking", done, sure, 50, 3) is not None
    assert trials_module.not_repaid("blocking", done, sure, 51, 3) is None


def test_the_parent_keeps_no_comparison_the_workers_cut_after_the_first_trial() -> None:
    """The parent's payback (auto_mode `repaid`, on predictions) counts a comparison as the
    workers will once the first candidate is measured (`not_repaid`: the others scaled by
    its measured step): the first candidate the parent keeps after it is not left out by the
    workers, whatever that first step measures, its build taking the `BUILD_STEPS` the
    parent counts on (a trial of the first would otherwise be spent for nothing)."""
    from leo_cli.planner.auto_mode import BUILD_STEPS, repaid

    predicted = {"blocking": 0.053, "leo": 0.062, "shared-memory": 0.070, "fine-grained": 0.1}
    choice = ModeChoice("auto", "blocking", predicted_s=predicted)
    names = ["blocking", "leo", "leo/no-replicas", "shared-memory", "fine-grained"]
    compared = 0
    for epochs in range(1, 80):
        kept, _ = repaid(choice, names, epochs, 3)
        for step in (0.001, 0.053, 0.4):  # the first's measured step
            first = Trial("blocking", [step, step], build_s=BUILD_STEPS * step)
            for name in kept[1:2]:
                compared += 1
                why = trials_module.not_repaid(name, [first], choice, epochs, 3)
                assert why is None, (name, epochs, step, why)
    assert compared > 100  # most lengths keep one


def _as_expected(name: str, predicted: dict[str, float], scale: float) -> Trial:
    """A trial of candidate `name` stepping in its mode's predicted step times `scale`, built
    in `BUILD_STEPS` of its steps."""
    from leo_cli.planner.auto_mode import BUILD_STEPS

    step = scale * predicted[name.split("/")[0]]
    return Trial(name, [step, step], build_s=BUILD_STEPS * step)


def test_the_workers_expect_a_plan_variant_as_the_parent_does() -> None:
    """A plan variant (`leo/no-replicas`) has no prediction of its own: the parent's payback
    (`repaid`) expects it at its mode's step, and so do the workers (`not_repaid`), whether
    the variant is the candidate weighed or the trial it is weighed against. With each trial
    measuring its expected step times one scale (any), the first candidate the parent keeps
    is not cut by the workers, and on every later candidate (the reference's own trial paid
    by then, and weighed against the same fastest trial) the workers decide as the parent
    did: they cut none it keeps and keep none it cuts."""
    from leo_cli.planner.auto_mode import repaid

    fast = {"blocking": 0.053, "shared-memory": 0.055, "leo": 0.075, "fine-grained": 0.1}
    slow = {**fast, "leo": 0.12}  # leo far slower than blocking
    scenarios = [
        (fast, ["blocking", "shared-memory", "leo", "leo/no-replicas", "fine-grained"]),
        (slow, ["leo/no-replicas", "blocking", "shared-memory"]),  # a variant first
    ]
    first, later = 0, {True: 0, False: 0}  # later variants, by whether both kept them
    for predicted, names in scenarios:
        choice = ModeChoice("auto", names[0], predicted_s=predicted)
        for epochs in range(1, 80):
            for scale in (0.01, 1.0, 8.0):  # the measured steps over the predicted
                trial = partial(_as_expected, predicted=predicted, scale=scale)
                kept, why = repaid(choice, names, epochs, 3)
                done = [trial(names[0])]
                for name in kept[1:2]:  # the first comparison: as the parent counted it
                    got = trials_module.not_repaid(name, done, choice, epochs, 3)
                    assert got is None, (names[0], name, epochs, scale, got)
                    first += name.startswith("leo/") or names[0].startswith("leo/")
                if names[0].startswith("leo/") or len(kept) < 2:
                    continue  # (the fastest trial would not be the reference)
                done.append(trial(kept[1]))
                for name in names[names.index(kept[1]) + 1 :]:
                    got = trials_module.not_repaid(name, done, choice, epochs, 3)
                    assert (got is None) == (name in kept), (name, epochs, scale, got, why)
                    if name.startswith("leo/"):
                        later[name in kept] += 1
                    if name in kept:
                        done.append(trial(name))
    assert first > 10 and min(later.values()) > 10, (first, later)


def test_a_candidate_that_cannot_repay_is_not_built_and_is_noted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`measure` builds no candidate the payback rule leaves out, keeps the last one built
    (the winner needs no rebuild), and the choice notes why with no median for it."""
    monkeypatch.setattr(trials_module, "try_candidate", _fake_try)
    built: list[str] = []

    def build(name: str) -> Any:
        built.append(name)
        return name

    def worth(name: str, done: list[Trial]) -> str | None:
        return "not tried: too short" if name == "blocking" and done else None

    names = ["leo", "blocking"]
    got, last = measure(names, build, seed=0, steps=2, worth=worth)  # type: ignore[arg-type]
    assert built == ["leo"] and last == "leo"
    assert got[1].not_tried == "not tried: too short" and got[1].median_s is None
    won, rule = winner(got, {})
    assert rule == "measured alone: no other trial would repay itself"
    chosen = measured_choice(ModeChoice("auto", "leo", trials=names), got, won, rule)
    assert chosen.measured_here and chosen.notes == {"blocking": "not tried: too short"}
    assert chosen.measured_s == {"leo": 0.1} and set(chosen.trial_s) == {"leo"}
    # another stopped after its first step was tried: measured fastest, not alone
    stopped = [got[0], Trial("shared-memory", [0.9], stopped=True), got[1]]
    assert winner(stopped, {})[1] == "measured fastest"


def test_spmm_variants_are_tried_only_where_they_may_repay_their_passes() -> None:
    """The payback rule for the CPU SpMM variants: before any, their comparison (a recording
    step and two variants' passes) against `UNCERTAIN` of the job's step over the run; after
    one, the next may take `UNCERTAIN` less than the best's SpMM seconds, its passes
    `MIN_SPMM_S` at least."""
    not_repaid = trials_module.spmm_not_repaid
    # a 0.25 s step may save 0.125 s an epoch; recording and passes cost 0.25 + 0.2 s
    assert not_repaid([], 3, 3, 0.25) is not None and not_repaid([], 3, 4, 0.25) is None
    assert not_repaid([], 3, 1, None) is None  # the step not known: tried
    best = [Trial("torch", [0.25])]  # may save 0.125 s an epoch; passes 3 * 0.25 s
    assert not_repaid(best, 3, 6, None) == (
        "not tried: could save at most 0.75 s over 6 epochs, its trial costs about 0.75 s"
    )
    assert not_repaid(best, 3, 7, None) is None
