"""After the workers, the parent keeps what their trials measured (launch/choice.py
keep_trials): as wisdom and calibration samples, only for a choice measured by this run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from leo_cli.config import load_config, write_resolved
from leo_cli.launch.choice import from_wisdom, keep_trials, kept
from leo_cli.launch.setup import choose_mode
from leo_cli.planner.auto_mode import (
    FIRST_STEP,
    FROM_WISDOM,
    ModeChoice,
    kept_spmm,
    read_choice,
    resumed_spmm,
    with_choice,
    write_choice,
)
from leo_cli.planner.wisdom import calibration_path, read_samples, read_wisdom, wisdom_path

KEY = "a" * 64


def measured(cache: Path) -> ModeChoice:
    return ModeChoice(
        "auto", "leo", "measured fastest", {"leo": 0.1, "blocking": 0.2}, {}, "planned", [],
        {"leo": 0.15, "leo/no-replicas": 0.2, "blocking": None}, {"blocking": "stopped"},
        str(wisdom_path(cache, KEY)),
    )  # fmt: skip


def test_a_measured_choice_is_kept_as_wisdom_and_calibration(tmp_path: Path) -> None:
    cache, run = tmp_path / "cache", tmp_path / "run"
    run.mkdir()
    write_choice(run, measured(cache))
    keep_trials(load_config(None, ["partition.num_parts=4"]), run)
    kept = read_wisdom(wisdom_path(cache, KEY), ["leo", "leo/no-replicas", "blocking"])
    assert kept is not None and (kept.winner, kept.measured_s["leo"]) == ("leo", 0.15)
    samples = read_samples(calibration_path(cache))
    # a variant has no prediction of its own; a stopped trial no median
    assert [(s.mode, s.predicted_s, s.measured_s) for s in samples] == [("leo", 0.1, 0.15)]
    assert samples[0].setting == {"workers": 4, "nodes": 1, "link": None, "model": "gcn"}
    keep_trials(load_config(None, ["partition.num_parts=4"]), run)  # another run's samples
    assert len({s.run for s in read_samples(calibration_path(cache))}) == 2 and samples[0].run


@pytest.mark.parametrize(
    "edit",
    [
        {"trials": ["leo", "blocking"], "rule": "to be measured by the workers"},  # never ran
        {"rule": f"measured fastest {FROM_WISDOM}"},  # an earlier run's
        {"wisdom": None},  # several machines: no cache
    ],
)
def test_nothing_is_kept_for_a_choice_not_measured_here(tmp_path: Path, edit: dict) -> None:
    cache, run = tmp_path / "cache", tmp_path / "run"
    run.mkdir()
    write_choice(run, replace(measured(cache), **edit))
    keep_trials(load_config(None, []), run)
    assert not (cache / "wisdom").exists()


def test_a_measured_spmm_is_kept_and_reused_without_trials(tmp_path: Path) -> None:
    cache, run = tmp_path / "cache", tmp_path / "run"
    run.mkdir()
    variants = ["leo", "torch", "torch-slabs"]
    one_worker = ModeChoice(
        "auto", "leo", "one worker: no rows move", wisdom=str(wisdom_path(cache, KEY)),
        spmm="torch", spmm_rule="measured fastest", notes={"spmm=torch-slabs": "not tried"},
        spmm_measured_s={"leo": 0.4, "torch": 0.3},
    )  # fmt: skip
    write_choice(run, one_worker)
    keep_trials(load_config(None, ["partition.num_parts=1"]), run)
    path = wisdom_path(cache, KEY)
    known = kept(path, [], variants, 100)
    assert known is not None and known.spmm == "torch"
    asked = ModeChoice("auto", "leo", "one worker: no rows move", spmm_trials=variants)
    again = from_wisdom(asked, known, path)
    assert (again.spmm, again.spmm_trials, again.mode) == ("torch", [], "leo")
    assert again.spmm_rule == f"measured fastest {FROM_WISDOM}" and not again.measured_here
    assert with_choice(load_config(None, []), again).pipeline.spmm == "torch"
    assert again.describe() == (
        "leo (auto: one worker: no rows move); "
        f"CPU SpMM torch (measured fastest {FROM_WISDOM}, 0.300 s vs leo 0.400 s)"
    )
    # an edited file is refused in one line (then measured again)
    path.write_text(path.read_text().replace('"torch"', '"leo"', 1))
    assert kept(path, [], variants, 100) is None


def test_a_resumed_run_keeps_the_spmm_it_started_with(tmp_path: Path) -> None:
    started = load_config(None, [f"run.out_dir={tmp_path}", "pipeline.spmm=torch-slabs"])
    write_resolved(started)
    asked = load_config(None, [f"run.out_dir={tmp_path}"])
    assert resumed_spmm(asked, tmp_path).pipeline.spmm == "torch-slabs"
    named = load_config(None, [f"run.out_dir={tmp_path}", "pipeline.spmm=leo"])
    assert resumed_spmm(named, tmp_path).pipeline.spmm == "leo"  # set by name: as set


def test_a_resumed_run_keeps_why_its_spmm_was_chosen(tmp_path: Path) -> None:
    """Whatever the mode (set by name here): the variant's rule, medians, notes and times."""
    started = ModeChoice(
        "blocking", "blocking", spmm="torch", spmm_rule="measured fastest",
        spmm_measured_s={"torch": 0.3, "leo": 0.4}, notes={"spmm=torch-slabs": "not tried"},
        trial_s={"spmm=torch": {"steps_s": 1.0}},
    )  # fmt: skip
    write_choice(tmp_path, started)
    # What the mode stage makes of a resumed config (`resumed_spmm`: spmm=torch, untried).
    again = ModeChoice("blocking", "blocking", spmm="torch")
    asked = load_config(None, ["pipeline.mode=blocking"])
    kept_again = kept_spmm(again, asked, tmp_path)
    assert kept_again == started
    # A variant set by name on resume is the user's, not the trials'.
    named = load_config(None, ["pipeline.mode=blocking", "pipeline.spmm=torch"])
    assert kept_spmm(again, named, tmp_path) == again
    # Trials that never finished (no epoch ran) are tried again, not taken as chosen.
    write_choice(tmp_path, replace(started, spmm="auto", spmm_rule=None, spmm_trials=["torch"]))
    assert kept_spmm(again, asked, tmp_path) == again
    assert read_choice(tmp_path) is not None


def test_several_machines_keep_wisdom_in_node_0s_cache(tmp_path: Path) -> None:
    """Node 0 alone chooses: its own cache keeps what the trials measured, as on one
    machine (the partitions and plan stay in the shared run folder)."""
    cache = tmp_path / "cache"
    cfg = load_config(None, ["launch.nnodes=2", "pipeline.mode=blocking", f"run.cache_dir={cache}"])
    choice = choose_mode(cfg, tmp_path / "run", {"num_parts": 2}, None)
    assert {"torch", "torch-slabs"} <= set(choice.spmm_trials)  # (leo where loaded)
    assert choice.wisdom is not None and Path(choice.wisdom).parent == cache / "wisdom"
    default = load_config(None, ["launch.nnodes=2", "pipeline.mode=blocking"])
    run = tmp_path / "runs" / "r"
    unset = choose_mode(default, run, {"num_parts": 2}, None)
    assert unset.wisdom is not None
    assert Path(unset.wisdom).parent == run.parent / "leo-cache" / "wisdom"
    # Without a plan, nothing in the key names the links between the machines: kept nowhere.
    bare = load_config(None, ["launch.nnodes=2", "pipeline.mode=blocking", "cache.policy=none"])
    planless = choose_mode(bare, tmp_path / "run", {"num_parts": 2}, None)
    assert planless.spmm_trials and planless.wisdom is None


def test_a_trial_stopped_after_its_first_step_calibrates_by_that_step(tmp_path: Path) -> None:
    """A candidate stopped after one timed step has no median, but that step (the slowest
    rank's, `first_step_s`) is a measurement of the mode: it is a calibration sample, so a
    mode that always stops early gets a factor too (and can be left out by it later)."""
    cache, run = tmp_path / "cache", tmp_path / "run"
    run.mkdir()
    spent = {"blocking": {"warmup_s": 0.3, FIRST_STEP: 0.25}}
    write_choice(run, replace(measured(cache), trial_s=spent))
    keep_trials(load_config(None, ["partition.num_parts=4"]), run)
    samples = read_samples(calibration_path(cache))
    assert [(s.mode, s.predicted_s, s.measured_s) for s in samples] == [
        ("leo", 0.1, 0.15),
        ("blocking", 0.2, 0.25),
    ]
    # it stopped for being past the best: no sample of its ratio to the run's other modes
    assert samples[0].run and not samples[1].run


def test_trials_cut_short_for_their_payback_are_kept_for_runs_as_short_only(
    tmp_path: Path,
) -> None:
    """A run whose trials left a candidate out because its trial would not repay itself over
    the run (auto_mode `payback`) keeps its wisdom with that length: a run as short or shorter
    trains its winner untried, a longer one measures again (it may repay what was left out);
    wisdom of trials not cut short serves a run of any length, also one whose own payback
    would try nothing."""
    from leo_cli.planner.auto_mode import NOT_REPAID

    cache, run = tmp_path / "cache", tmp_path / "run"
    run.mkdir()
    cut = {"blocking": f"{NOT_REPAID} 0.39 s over 8 epochs, its trial costs about 0.41 s"}
    write_choice(run, replace(measured(cache), notes=cut))
    keep_trials(load_config(None, ["train.num_epochs=8"]), run)
    path, names = wisdom_path(cache, KEY), ["leo", "leo/no-replicas", "blocking"]
    known = read_wisdom(path, names)
    assert known is not None and known.cut_to_epochs == 8
    assert kept(path, names, [], 8) is not None and kept(path, names, [], 5) is not None
    assert kept(path, names, [], 9) is None
    assert kept(path, names, [], None) is None  # a run with payback off tries every one
    write_choice(run, measured(cache))  # nothing left out for its payback
    keep_trials(load_config(None, ["train.num_epochs=8"]), run)
    full = kept(path, names, [], 10**6)
    assert full is not None and full.cut_to_epochs == 0
    # a short run that would try nothing itself still trains the full wisdom's winner
    short = ModeChoice("auto", "blocking", "expected fastest, untried", levels="planned",
                       notes={"leo": cut["blocking"]})  # fmt: skip
    assert short.unrepaid == ["leo"]
    again = from_wisdom(short, full, path)
    assert (again.mode, again.rule) == ("leo", f"measured fastest {FROM_WISDOM}")


def test_trials_cut_short_are_kept_for_the_payback_epochs_they_repaid_over(
    tmp_path: Path,
) -> None:
    """With `pipeline.payback_epochs` the wisdom of trials cut short records that length,
    not the run's: a run repaying over as many epochs trusts it, one over more does not."""
    from leo_cli.planner.auto_mode import NOT_REPAID

    cache, run = tmp_path / "cache", tmp_path / "run"
    run.mkdir()
    cut = {"blocking": f"{NOT_REPAID} 0.39 s over 40 epochs, its trial costs about 0.41 s"}
    write_choice(run, replace(measured(cache), notes=cut))
    keep_trials(load_config(None, ["train.num_epochs=5", "pipeline.payback_epochs=40"]), run)
    path, names = wisdom_path(cache, KEY), ["leo", "leo/no-replicas", "blocking"]
    known = read_wisdom(path, names)
    assert known is not None and known.cut_to_epochs == 40
    assert kept(path, names, [], 40) is not None and kept(path, names, [], 41) is None
