"""`pipeline.mode=auto`: the fastest exact runnable mode of the plan's predictions, chosen
once by the parent, recorded in the run folder, kept on resume (planner/auto_mode.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import hardware_dict

from leo_cli.config import LeoConfig, load_config, write_resolved
from leo_cli.errors import CacheError, ConfigError
from leo_cli.planner import auto_mode
from leo_cli.planner.auto_mode import ModeChoice, candidates, choose, fastest, leanest
from leo_cli.planner.plan import CachePlan
from leo_cli.registry import auto_candidates, mode_of, pipeline_modes
from leo_cli.run_dir import RunDir

# Hand-made predictions: blocking fastest of the exact modes, the inexact floor and the
# benchmark variant faster still (never chosen).
PREDICTED = {
    "leo": 0.062,
    "blocking": 0.053,
    "fine-grained": 0.100,
    "shared-memory": 0.070,
    "compute-only": 0.001,
    "leo-no-cache": 0.002,
}


def plan_with(
    predicted_run: dict[str, float | None], buffers: dict[str, int] | None = None
) -> CachePlan:
    """A plan holding only what `choose` reads."""
    return CachePlan(
        "k", "i", "g", "leo", [], [1], {}, {}, [], [], 0.0, predicted_run=predicted_run,
        buffer_bytes=buffers or {},
    )  # fmt: skip


def cfg(*overrides: str) -> LeoConfig:
    return load_config(None, list(overrides))


# A run long enough that every trial repays itself (auto_mode.repaid): the rules a test is
# about, alone.
LONG = "train.num_epochs=1000000"
# The payback rule off: a calibrated candidate that cannot beat the first even at its fastest
# is left out by it at any length; the rules a test is about, alone.
ALONE = "pipeline.trial_payback=false"


def test_auto_is_the_default_and_not_a_mode_that_runs() -> None:
    assert cfg().pipeline.mode == "auto"
    assert "auto" not in pipeline_modes()
    assert all(mode_of(m).exact for m in auto_candidates())
    assert auto_candidates()[0] == "leo"  # the planned mode wins ties


def test_fastest_ignores_unpredicted_modes_and_breaks_ties_by_order() -> None:
    assert fastest({"a": 2.0, "b": None, "c": 1.0}, ["a", "b", "c"]) == "c"
    assert fastest({"a": 1.0, "c": 1.0}, ["c", "a"]) == "c"
    assert fastest({"a": None}, ["a"]) is None
    assert fastest({"z": 0.1, "a": 1.0}, ["a"]) == "a"  # only the names given


def test_auto_picks_the_fastest_exact_runnable_mode() -> None:
    choice = choose(cfg(), plan_with(PREDICTED), world_size=2)
    assert (choice.requested, choice.mode, choice.rule) == ("auto", "blocking", "predicted fastest")
    assert set(choice.predicted_s) == set(auto_candidates())  # what it chose from
    assert choice.describe() == "blocking (auto: predicted fastest, 0.053 s vs leo 0.062 s)"


# blocking fastest; shared-memory 3.8% slower with a third of its buffers; leo 17% slower
CLOSE = {**PREDICTED, "shared-memory": 0.055}
BUFFERS = {"leo": 1_000, "blocking": 3_000_000_000, "fine-grained": 10, "shared-memory": 10**9}


def test_auto_takes_the_smallest_buffers_among_modes_predicted_within_the_margin() -> None:
    choice = choose(cfg(), plan_with(CLOSE, BUFFERS), world_size=2)
    assert choice.mode == "shared-memory", choice
    assert choice.rule == "within 10% of the fastest, 2.0 GB less in buffers moving rows"
    assert choice.describe() == (
        "shared-memory (auto: within 10% of the fastest, 2.0 GB less in buffers moving rows, "
        "0.055 s vs blocking 0.053 s)"
    )  # fmt: skip
    assert choice.buffer_bytes == BUFFERS  # recorded with the predictions
    # leo (17% slower) and fine-grained (89%) stay out at 10%; in at 20%, leo the smallest
    assert choose(cfg("pipeline.auto_margin=0.2"), plan_with(CLOSE, BUFFERS), 2).mode == "leo"
    # 0: the fastest, whatever memory; and without buffers in the plan (nothing to weigh)
    zero = choose(cfg("pipeline.auto_margin=0"), plan_with(CLOSE, BUFFERS), world_size=2)
    assert (zero.mode, zero.rule) == ("blocking", "predicted fastest")
    assert choose(cfg(), plan_with(CLOSE), world_size=2).mode == "blocking"


def test_leanest_needs_a_saving_beyond_the_margin() -> None:
    predicted = {"a": 1.0, "b": 1.05, "c": None}
    assert leanest(predicted, {"a": 100, "b": 89, "c": 1}, "a", 0.1) == "b"
    assert leanest(predicted, {"a": 100, "b": 90, "c": 1}, "a", 0.1) == "a"  # 10%: not more
    assert leanest(predicted, {"a": 100, "b": 89}, "a", 0.04) == "a"  # b 5% slower: too slow
    assert leanest(predicted, {"b": 1}, "a", 0.1) == "a"  # the fastest's own is unknown
    assert leanest({"a": 1.0, "b": 1.08, "c": 1.02}, {"a": 100, "b": 5, "c": 5}, "a", 0.1) == "c"
    assert leanest({"a": 1.0, "b": 1.0}, {"a": 100, "b": 5}, "a", 0.0) == "a"  # 0: the fastest


def test_auto_never_weighs_a_mode_it_cannot_run() -> None:
    """A leaner mode the config cannot run (one host only, across machines) stays out."""
    two_nodes = cfg("launch.nnodes=2", "launch.master_port=29511")
    lean_shm = plan_with(CLOSE, BUFFERS)  # shared-memory: within 10%, a third of the bytes
    assert choose(two_nodes, lean_shm, world_size=2).mode == "blocking"


@pytest.mark.parametrize(
    ("overrides", "allowed", "expected"),
    [
        # one-host modes are not candidates across machines
        (["launch.nnodes=2"], {"leo", "blocking", "fine-grained"}, "blocking"),
        # a chunk count: the modes that chunk
        (["pipeline.num_chunks=4"], {"leo"}, "leo"),
        # every row read in place: the modes that read in place
        (["pipeline.transport=shared-memory"], {"leo", "fine-grained"}, "leo"),
    ],
)
def test_auto_chooses_among_what_the_config_can_run(
    overrides: list[str], allowed: set[str], expected: str
) -> None:
    fast_shm = plan_with({**PREDICTED, "shared-memory": 0.01})
    assert choose(cfg(), fast_shm, world_size=2).mode == "shared-memory"
    config = cfg(*overrides)
    assert set(candidates(config)) == allowed
    assert choose(config, fast_shm, world_size=2).mode == expected


def test_without_predictions_auto_runs_the_planned_mode_and_says_why() -> None:
    one = choose(cfg(), plan_with(PREDICTED), world_size=1)
    assert (one.mode, one.rule) == ("leo", "one worker: no rows move, every mode runs alike")
    none = choose(cfg("cache.policy=none"), None, world_size=2)
    assert (none.mode, none.rule) == ("leo", "no cache plan with cache.policy=none")
    assert none.describe() == "leo (auto: no cache plan with cache.policy=none)"
    empty = choose(cfg(), plan_with({}), world_size=2)  # e.g. a profile lacking every link
    assert (empty.mode, empty.rule) == ("leo", "the plan predicts none of them")


def test_a_mode_set_by_name_is_run_as_it_is() -> None:
    choice = choose(cfg("pipeline.mode=shared-memory"), plan_with(PREDICTED), world_size=2)
    assert (choice.mode, choice.rule, choice.describe()) == ("shared-memory", None, "shared-memory")


def test_with_mode_keeps_validation() -> None:
    chunked = cfg("pipeline.num_chunks=4")
    assert auto_mode.with_mode(chunked, "leo").pipeline.mode == "leo"
    with pytest.raises(ValueError, match="pipeline.num_chunks"):
        auto_mode.with_mode(chunked, "blocking")


def test_resumed_auto_run_keeps_the_mode_it_started_with(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_resolved(cfg(f"run.out_dir={run}", "pipeline.mode=blocking"))
    started = ModeChoice("auto", "blocking", "predicted fastest", {"leo": 0.2, "blocking": 0.1})
    auto_mode.write_choice(run, started)
    assert auto_mode.resumed(cfg(), run) == started  # a new plan is not asked on resume
    leo_faster = plan_with({"leo": 0.01, "blocking": 0.1})
    assert auto_mode.choose(cfg(), leo_faster, 2).mode == "leo"  # a fresh start asks it
    (run / auto_mode.CHOICE).unlink()  # an interrupted first start, or a mode set by name
    again = auto_mode.resumed(cfg(), run)
    assert again is not None
    assert (again.mode, again.rule) == ("blocking", "resumed: the mode the run started with")
    write_resolved(cfg(f"run.out_dir={run}", "pipeline.mode=shared-memory"))
    two_nodes = cfg("launch.nnodes=2", "launch.master_port=29511")  # shared-memory: one host
    with pytest.raises(ConfigError, match="the run started in shared-memory"):
        auto_mode.resumed(two_nodes, run)
    write_resolved(cfg(f"run.out_dir={run}"))  # as leo partition writes it: no mode chosen yet
    assert auto_mode.resumed(cfg(), run) is None


def test_summary_fields_name_the_request_only_for_the_mode_that_ran(tmp_path: Path) -> None:
    made = ModeChoice("auto", "leo", "predicted fastest", {"leo": 0.1}, {"leo": 5})
    auto_mode.write_choice(tmp_path, made)
    assert auto_mode.read_choice(tmp_path) == made
    fields = auto_mode.summary_fields(tmp_path, "leo")
    assert fields["mode_requested"] == "auto" and fields["mode_predicted_s"] == {"leo": 0.1}
    assert fields["mode_buffer_bytes"] == {"leo": 5}
    other = auto_mode.summary_fields(tmp_path, "blocking")  # a stale record: not this run's
    assert other["mode_requested"] == "blocking" and other["mode_rule"] is None
    (tmp_path / auto_mode.CHOICE).write_text("{not json")
    assert auto_mode.summary_fields(tmp_path, "leo")["mode_requested"] == "leo"


def test_workers_refuse_an_unresolved_config() -> None:
    with pytest.raises(ConfigError, match="pipeline.mode=auto is resolved by leo train"):
        auto_mode.refuse_unresolved(cfg())
    auto_mode.refuse_unresolved(cfg("pipeline.mode=leo"))


@pytest.mark.parametrize("choose_by", ["estimate", "measure"])
def test_prepare_records_the_no_plan_rule(tmp_path: Path, choose_by: str) -> None:
    from leo_cli.launch.setup import prepare

    run = tmp_path / "run"
    hardware = tmp_path / "hardware.json"  # a given profile: no probe in a unit test
    hardware.write_text(json.dumps(hardware_dict()))
    config = cfg(
        "data.synthetic.num_nodes=300",
        "data.synthetic.num_features=8",
        "cache.policy=none",
        f"cache.hardware={hardware}",
        f"run.out_dir={run}",
        f"run.cache_dir={tmp_path / 'cache'}",
        f"pipeline.choose={choose_by}",
    )
    prepare(config, resume=False, progress=None)
    recorded = json.loads((run / auto_mode.CHOICE).read_text())
    assert recorded["mode_requested"] == "auto" and recorded["mode"] == "leo"
    resolved = load_config(run / "resolved_config.yaml")
    assert resolved.pipeline.mode == "leo"  # every rank, on every node, reads this one
    assert resolved.pipeline.levels == "own"  # no plan to take levels from
    if choose_by == "estimate":
        assert recorded["mode_rule"] == "no cache plan with cache.policy=none"
        assert recorded["mode_trials"] == []
    else:  # nothing predicted: every candidate is tried, the workers keep their result
        assert recorded["mode_rule"] == "to be measured by the workers"
        # each named with the levels it runs with (another mode's own are not the planned)
        own = [auto_mode.candidate_name(m, "own") for m in auto_candidates()]
        assert recorded["mode_trials"] == own and own[1:] == [
            f"{m}/own" for m in auto_candidates()[1:]
        ]
        assert Path(recorded["mode_wisdom"]).parent == tmp_path / "cache" / "wisdom"


@pytest.mark.slow
def test_the_summary_prices_the_mode_auto_chose(tmp_path: Path) -> None:
    """summary.json's predicted step of a cached run is the one auto chose from, for every
    mode it can choose (the plan made for the planned mode prices the others with its levels;
    through the process group every mode reads nothing in place, so it serves them all)."""
    from leo_cli.launch.setup import prepare
    from leo_cli.planner.plan import load_plan, predicted_busy, predicted_time, read_plan

    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(hardware_dict(2)))
    run = tmp_path / "run"
    config = cfg(
        "data.synthetic.num_nodes=300",
        "data.synthetic.num_features=8",
        "partition.num_parts=2",
        "cache.policy=degree",
        "cache.replica_budget_mb=30%",
        "pipeline.transport=process-group",
        f"cache.hardware={hw}",
        f"run.out_dir={run}",
    )
    prepare(config, resume=False, progress=None)
    plan = read_plan(run)
    assert plan is not None
    others = [m for m in candidates(config) if not mode_of(m).planned]
    assert any(plan.predicted_run.get(m) is not None for m in others)
    for mode in candidates(config):
        ran = auto_mode.with_mode(config, mode)
        found = load_plan(ran, run)  # the plan each mode's workers find for it
        assert predicted_time(found, ran) == plan.predicted_run[mode]
        busy = predicted_busy(found, ran)  # kept per rank for the planned mode only
        assert (busy is not None) == mode_of(mode).planned


@pytest.mark.slow
def test_load_plan_finds_only_a_plan_made_for_this_run(tmp_path: Path) -> None:
    """One `load_plan`: the plan made for these settings; None for other settings or with no
    plan; a bad file refused with a cache, and only a missing prediction without one."""
    from leo_cli.launch.setup import prepare
    from leo_cli.planner.plan import load_plan

    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(hardware_dict(2)))
    run = tmp_path / "run"
    config = cfg(
        "data.synthetic.num_nodes=300", "data.synthetic.num_features=8",
        "partition.num_parts=2", "cache.policy=degree", "pipeline.mode=leo",
        "pipeline.transport=process-group", f"cache.hardware={hw}", f"run.out_dir={run}",
    )  # fmt: skip
    prepare(config, resume=False, progress=None)
    found = load_plan(config, run)
    assert found is not None and len(found.caches) == 2
    other = auto_mode.with_mode(config, "blocking")  # priced from the graph alone: kept
    bigger = config.model_copy(
        update={"cache": config.cache.model_copy(update={"replica_budget_mb": 1.0})}
    )
    assert load_plan(bigger, run) is None  # made for other cache settings: stale
    assert load_plan(other, run) is not None  # the same levels serve another exact mode
    no_cache = cfg(
        "data.synthetic.num_nodes=300", "data.synthetic.num_features=8",
        "partition.num_parts=2", "cache.policy=none", "pipeline.transport=process-group",
        f"run.out_dir={run}",
    )  # fmt: skip
    assert load_plan(no_cache, run) is not None  # its predictions price the graph alone
    # Edited to the other static aggregate, digests untouched: refused, naming the file.
    data = json.loads(RunDir(run).plan.read_text())
    assert {r["static_aggregate"] for r in data["ranks"]} == {False}  # input dropout 0.5
    for r in data["ranks"]:
        r["static_aggregate"] = True  # layer 0 would skip its input dropout
    RunDir(run).plan.write_text(json.dumps(data))
    with pytest.raises(CacheError, match=r"cache-plan.json: ranks.\*.static_aggregate is True"):
        load_plan(config, run)
    RunDir(run).plan.write_text('{"format_version": 99}')
    with pytest.raises(CacheError, match="not a cache plan LEO can use"):
        load_plan(config, run)
    assert load_plan(no_cache, run) is None  # no cache: a bad file is only no prediction
    RunDir(run).plan.unlink()
    assert load_plan(config, run) is None


# --- pipeline.choose=measure: the candidates the workers try (auto_mode.to_try) ---


def plan_with_levels(replicas: bool, l3: bool, predicted: dict[str, float | None]) -> CachePlan:
    from leo_cli.planner.plan import RankCache

    rows = np.arange(3, dtype=np.int64)
    none = np.zeros(0, dtype=np.int64)
    cache = RankCache(False, rows if replicas else none, rows if l3 else none)
    plan = plan_with(predicted, BUFFERS)
    plan.caches = [cache, RankCache()]
    return plan


def test_measure_tries_the_close_candidates_fastest_first_and_leos_variants() -> None:
    predicted = {**PREDICTED, "fine-grained": 0.5}  # over 3x blocking's 0.053: not tried
    plan = plan_with_levels(True, True, predicted)
    estimate = choose(cfg(), plan, 2)
    trial = auto_mode.to_try(cfg(), plan, estimate, free_bytes=None)
    assert trial.trials == [
        "blocking",
        "leo",
        "leo/no-replicas",
        "leo/no-in-place",
        "shared-memory",
    ]
    assert (trial.mode, trial.levels) == ("blocking", "planned")  # what a restart would run
    assert trial.notes == {"fine-grained": "not tried: predicted 0.500 s, over 3x the fastest"}
    assert auto_mode.measures(cfg(), 2) and not auto_mode.measures(cfg(), 1)
    assert not auto_mode.measures(cfg("pipeline.choose=estimate"), 2)
    assert not auto_mode.measures(cfg("pipeline.mode=leo"), 2)


def test_measure_skips_what_would_not_fit_and_variants_the_plan_lacks() -> None:
    plan = plan_with_levels(False, False, PREDICTED)
    estimate = choose(cfg(), plan, 2)
    trial = auto_mode.to_try(cfg(), plan, estimate, free_bytes=1_000_000_000)
    # blocking's 3 GB and shared-memory's 1 GB exceed 80% of 1 GB free
    assert trial.trials == ["leo", "fine-grained"]
    assert trial.notes["blocking"].startswith("not tried: its buffers moving rows (3.0 GB)")
    assert "80% of the 1.0 GB of memory free" in trial.notes["shared-memory"]


def test_variants_are_checked_against_free_memory_by_their_own_buffers() -> None:
    # without replicas leo moves those rows too: buffers larger than leo's own 1 kB
    plan = plan_with_levels(True, True, PREDICTED)
    plan.buffer_bytes = {**BUFFERS, "leo/no-replicas": 900_000_000, "leo/no-in-place": 2_000}
    estimate = choose(cfg(), plan, 2)
    assert estimate.buffer_bytes["leo/no-replicas"] == 900_000_000  # for the tie-break too
    trial = auto_mode.to_try(cfg(), plan, estimate, free_bytes=1_000_000_000)
    assert "leo/no-replicas" not in trial.trials and "leo/no-in-place" in trial.trials
    assert trial.notes["leo/no-replicas"].startswith("not tried: its buffers moving rows (0.9 GB)")


def test_candidate_names_tell_own_levels_from_planned() -> None:
    name = auto_mode.candidate_name
    assert name("blocking", "planned") == "blocking" != name("blocking", "own") == "blocking/own"
    assert name("leo", "own") == name("leo", "planned") == "leo"  # the plan is leo's own
    for mode, levels in [("blocking", "own"), ("blocking", "planned"), ("leo", "no-replicas")]:
        assert auto_mode.parse_candidate(name(mode, levels)) == (mode, levels)
    by_name = ModeChoice("blocking", "blocking")  # set by name: shown as the user set it
    assert by_name.name == "blocking/own" and by_name.describe() == "blocking"


def test_a_resume_keeps_no_recorded_choice_of_other_levels(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ran = ModeChoice("auto", "blocking", "measured fastest", levels="own",
                     measured_s={"blocking/own": 0.1})  # fmt: skip
    write_resolved(auto_mode.with_choice(cfg(f"run.out_dir={run}"), ran))
    auto_mode.write_choice(run, replace(ran, levels="planned", measured_s={"blocking": 0.1}))
    again = auto_mode.resumed(cfg(), run)
    assert again is not None and (again.mode, again.levels) == ("blocking", "own")
    assert again.rule == "resumed: the mode the run started with"


def test_a_single_candidate_is_the_choice_untried() -> None:
    plan = plan_with_levels(True, False, PREDICTED)
    choice = auto_mode.to_try(cfg("pipeline.num_chunks=2"), plan, choose(cfg(), plan, 2), None)
    # only leo chunks; its replicas make a variant worth trying
    assert choice.trials == ["leo", "leo/no-replicas"]
    alone = auto_mode.to_try(cfg("pipeline.num_chunks=2"), plan_with_levels(False, False,
                             PREDICTED), choose(cfg(), plan, 2), None)  # fmt: skip
    assert alone.trials == [] and alone.rule == "the only candidate the cost model keeps"


def test_levels_other_than_own_plan_for_the_planned_mode() -> None:
    assert auto_mode.planning_config(cfg("pipeline.mode=blocking")).pipeline.mode == "blocking"
    planned = cfg("pipeline.mode=blocking", "pipeline.levels=planned")
    assert auto_mode.planning_config(planned).pipeline.mode == "leo"


def test_a_measured_choice_round_trips_and_resumes_with_its_levels(tmp_path: Path) -> None:
    chosen = ModeChoice("auto", "leo", "measured fastest", {"leo": 0.1}, {"leo": 5},
                        "no-replicas", [], {"leo/no-replicas": 0.2, "blocking": None},
                        {"blocking": "stopped"}, "/w.json")  # fmt: skip
    assert auto_mode.from_json(json.loads(json.dumps(chosen.to_json()))) == chosen
    run = tmp_path / "run"
    write_resolved(auto_mode.with_choice(cfg(f"run.out_dir={run}"), chosen))
    auto_mode.write_choice(run, chosen)
    again = auto_mode.resumed(cfg(), run)
    assert again is not None and again.name == "leo/no-replicas" and again.trials == []
    # trials that never finished (no epoch ran): the resumed run's workers try them again
    auto_mode.write_choice(run, replace(chosen, rule="to be measured", trials=["leo", "x"]))
    pending = auto_mode.resumed(cfg(), run)
    assert pending is not None and pending.trials == ["leo", "x"]
    assert not pending.measured_here and chosen.measured_here


def test_levels_set_by_name_are_kept() -> None:
    named = cfg("pipeline.mode=leo", "pipeline.levels=no-replicas")
    assert choose(named, None, 2).levels == "no-replicas"
    assert auto_mode.with_choice(named, choose(named, None, 2)).pipeline.levels == "no-replicas"
    estimate = cfg("pipeline.choose=estimate", "pipeline.levels=no-in-place")
    assert choose(estimate, plan_with(PREDICTED), 2).levels == "no-in-place"
    assert choose(cfg(), plan_with(PREDICTED), 2).levels == "own"  # the default


def test_rows_read_in_place_asked_for_are_not_tried_without() -> None:
    plan = plan_with_levels(True, True, PREDICTED)
    every = cfg("pipeline.transport=shared-memory")
    trial = auto_mode.to_try(every, plan, choose(every, plan, 2), free_bytes=None)
    assert "leo/no-in-place" not in trial.trials and "leo/no-replicas" in trial.trials
    with pytest.raises(ConfigError, match="pipeline.levels=no-in-place reads no row in place"):
        cfg("pipeline.transport=shared-memory", "pipeline.levels=no-in-place")


def test_modes_whose_segments_do_not_fit_dev_shm_are_left_out_or_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A container's 64 MB /dev/shm: `auto` chooses and tries only the modes that fit it (and
    says so), a mode set by name that does not fit is refused before any worker starts."""
    from leo_cli.comm import segments

    monkeypatch.setattr(segments, "free_bytes", lambda root=None: 64 * 2**20)
    fast_shm = plan_with({**PREDICTED, "shared-memory": 0.01})
    fast_shm.shm_bytes = {"shared-memory": [40 * 2**20, 40 * 2**20], "leo": [0, 0]}
    choice = choose(cfg(), fast_shm, world_size=2)
    assert choice.mode == "blocking"
    assert choice.rule == "predicted fastest; shared-memory left out: too little room in /dev/shm"
    trial = auto_mode.to_try(cfg(), fast_shm, choice, free_bytes=None)
    assert "shared-memory" not in trial.trials
    assert trial.notes["shared-memory"] == (
        "not tried: 83.9 MB of /dev/shm, left out: too little room in /dev/shm"
    )
    with pytest.raises(ConfigError, match=r"mode=shared-memory needs 83\.9 MB of /dev/shm on"):
        choose(cfg("pipeline.mode=shared-memory"), fast_shm, world_size=2)
    assert choose(cfg("pipeline.mode=leo"), fast_shm, world_size=2).mode == "leo"
    two = cfg("launch.nnodes=2", "launch.master_port=29511", "pipeline.mode=shared-memory")
    assert auto_mode.host_shm_bytes(two, fast_shm, "shared-memory") == 40 * 2**20


def test_a_choice_says_small_times_in_milliseconds() -> None:
    from leo_cli.planner.auto_mode import versus

    steps = {"leo": 0.00042, "torch": 0.0031}
    assert versus("measured fastest", steps, "leo") == "measured fastest, 0.42 ms vs torch 3.10 ms"
    assert versus("r", {"leo": 0.25}, "leo") == "r, 0.250 s"


def test_measure_leaves_out_what_calibration_says_is_slower_beyond_its_error() -> None:
    """A candidate whose calibrated prediction, less its calibration's error, is past the
    best one's plus its error and a measured tie is not tried (noted why); one without an
    error (too few samples) or within the errors is; the planned mode's variants have no
    calibration of their own and are tried even where the planned mode is not."""
    plan = plan_with_levels(True, True, PREDICTED)
    # fine-grained: no error, so neither this rule nor payback's (its default uncertainty
    # could not make 0.2 s beat leo, but that would hold at any length) leaves it out
    calibrated = {"leo": 0.05, "blocking": 0.09, "shared-memory": 0.056, "fine-grained": 0.2}
    estimate = replace(choose(cfg(), plan, 2), calibrated_s=calibrated)
    missed = {"leo": 0.05, "blocking": 0.1, "shared-memory": 0.1}
    trial = auto_mode.to_try(cfg(ALONE), plan, estimate, None, missed)
    names = ["leo", "leo/no-replicas", "leo/no-in-place", "shared-memory", "fine-grained"]
    assert trial.trials == names
    assert trial.notes == {
        "blocking": "not tried: calibrated 0.090 s (error 10%), slower than leo's 0.050 s "
        "(error 5%) beyond both errors"
    }
    assert "blocking" in auto_mode.to_try(cfg(ALONE), plan, estimate, None).trials  # no errors
    # within both errors and a tie: 0.09 * 0.9 = 0.081 is not past 0.05 * 1.6 * 1.03
    wide = {**missed, "leo": 0.6, "shared-memory": 0.6}
    assert auto_mode.surely_slower(calibrated, wide) == {}
    # the planned mode left out, its variants still tried
    slow_leo = replace(estimate, calibrated_s={**calibrated, "leo": 0.2})
    trial = auto_mode.to_try(cfg(ALONE), plan, slow_leo, None, missed)
    assert "leo" not in trial.trials and "leo/no-in-place" in trial.trials
    assert trial.notes["leo"].startswith("not tried: calibrated 0.200 s")
    assert auto_mode.surely_slower({"leo": 0.05, "blocking": 0.5}, {"blocking": 0.0}) == {}


def test_measure_leaves_out_what_the_ratio_measured_in_the_same_runs_says_is_slower() -> None:
    """A candidate whose predicted step over a candidate tried before it, times that pair's
    factor measured in the same runs, less the pair's error, is past one plus the tie is not
    tried (noted why); within the error, without a pair, or against a candidate not tried, it
    is; `estimate` tries nothing."""
    plan = plan_with_levels(False, False, PREDICTED)
    estimate = choose(cfg(), plan, 2)  # blocking 0.053 first, then leo 0.062, ...
    # leo's step over blocking's ran 1.5x the predicted 1.17 in earlier runs, within 10%:
    # 1.75 * 0.9 is past 1.03
    pairs = {("leo", "blocking"): (1.5, 0.1)}
    trial = auto_mode.to_try(cfg(), plan, estimate, None, None, pairs)
    assert "leo" not in trial.trials and "blocking" in trial.trials
    assert trial.notes["leo"] == (
        "not tried: calibrated 1.75x blocking's step (measured in the same runs, error 10%), "
        "slower beyond the ratio's error"
    )
    assert "leo" in auto_mode.to_try(cfg(), plan, estimate, None).trials  # no pairs
    wide = {("leo", "blocking"): (1.5, 0.45)}  # 1.75 * 0.55 = 0.96: within the error
    assert "leo" in auto_mode.to_try(cfg(), plan, estimate, None, None, wide).trials
    # the pair the other way round says nothing of leo against blocking
    back = {("blocking", "leo"): (0.5, 0.0)}
    assert "leo" in auto_mode.to_try(cfg(), plan, estimate, None, None, back).trials
    # blocking is tried before leo only where it is ranked first; not against a mode not tried
    assert auto_mode.slower_than_tried("leo", [], PREDICTED, pairs) is None
    assert auto_mode.slower_than_tried("leo", ["shared-memory"], PREDICTED, pairs) is None


def test_the_pair_rule_never_leaves_fewer_than_two_to_try() -> None:
    """A mode the pair rule leaves out adds no sample, and one candidate is not measured: were
    it to leave one candidate, its factors would never age out; so then it is not applied."""
    plan = plan_with_levels(False, False, PREDICTED)  # no variants of leo's plan
    estimate = choose(cfg(), plan, 2)
    everyone = auto_mode.to_try(cfg(LONG), plan, estimate, None).trials
    beaten = {(m, "blocking"): (3.0, 0.0) for m in everyone if m != "blocking"}
    trial = auto_mode.to_try(cfg(LONG), plan, estimate, None, None, beaten)
    assert trial.trials == everyone and not trial.notes
    one_left = {k: v for k, v in beaten.items() if k[0] != "leo"}  # leo and blocking stay
    trial = auto_mode.to_try(cfg(LONG), plan, estimate, None, None, one_left)
    assert sorted(trial.trials) == ["blocking", "leo"] and len(trial.notes) == len(one_left)


def test_payback_tries_only_what_may_save_more_than_its_trial_costs() -> None:
    """The rule itself (planner/auto_mode.py `payback`): the most a candidate may save over the run
    must exceed its trial's cost; equal is not enough."""
    from leo_cli.planner.auto_mode import payback

    assert payback(0.5, 0.25, 2.0, 8) == (
        "not tried: could save at most 2.00 s over 8 epochs, its trial costs about 2.00 s"
    )
    assert payback(0.5, 0.25, 2.0, 9) is None
    assert payback(0.5, 0.75, 0.0, 10**6) is not None  # never faster: nothing to save
    # ... unless only the default uncertainty says so: left to HOPELESS, at any length
    assert payback(0.5, 0.75, 1.0, 8, bounded=False) is None
    assert payback(0.5, 0.3, 2.0, 8, bounded=False) is not None  # short runs still count


def test_measure_tries_on_predictions_only_what_may_repay_over_the_run() -> None:
    """Before any trial (`auto_mode.repaid`): each candidate at its predicted step less the
    default uncertainty against the first's (blocking's) predicted step, as the workers will
    weigh it on the first's measured step (worker/trials.py `not_repaid`); the first one
    kept also pays blocking's warm-up and two timed steps. Too short a run tries none and
    trains the cost model's pick, noting what it would have tried."""
    plan = plan_with_levels(False, False, PREDICTED)  # blocking 0.053, leo 0.062, ...
    estimate = choose(cfg(), plan, 2)
    # leo may step in 0.031 s against 0.053: 0.022 s an epoch; its trial 4 * 0.062 s and
    # blocking's 3 * 0.053 s: 0.407 s, repaid after 18.5 epochs
    short = auto_mode.to_try(cfg("train.num_epochs=18"), plan, estimate, None)
    assert short.trials == [] and (short.mode, short.levels) == ("blocking", "planned")
    assert short.rule == "expected fastest, untried: no trial would repay itself over 18 epochs"
    assert short.notes["leo"] == (
        "not tried: could save at most 0.40 s over 18 epochs, its trial costs about 0.41 s"
    )
    assert short.unrepaid == ["leo", "shared-memory", "fine-grained"]
    enough = auto_mode.to_try(cfg("train.num_epochs=19"), plan, estimate, None)
    assert enough.trials == ["blocking", "leo", "shared-memory"]  # blocking's trial paid by leo
    assert enough.unrepaid == ["fine-grained"] and "leo" not in enough.uncertainty  # default
    assert auto_mode.to_try(cfg(LONG), plan, estimate, None).unrepaid == []
    off = cfg("train.num_epochs=8", "pipeline.trial_payback=false")  # every candidate kept
    assert auto_mode.to_try(off, plan, estimate, None).trials == [
        "blocking",
        "leo",
        "shared-memory",
        "fine-grained",
    ]
    # a calibration's error bounds a prediction closer than the default
    close = replace(estimate, calibrated_s={"blocking": 0.053, "leo": 0.062})
    sure = auto_mode.to_try(cfg("train.num_epochs=19"), plan, close, None, {"leo": 0.1})
    assert "leo" in sure.unrepaid and sure.uncertainty["leo"] == 0.1


def test_a_variant_tried_first_is_expected_at_its_modes_step() -> None:
    """Where a mode's variant comes first (the planned mode itself left out), the others are
    weighed against its mode's expected step, so a short run still leaves them out."""
    estimate = choose(cfg(), plan_with_levels(False, False, PREDICTED), 2)
    first = auto_mode.repaid(estimate, ["leo/no-replicas", "leo", "blocking"], 1, 2)
    assert first[0] == ["leo/no-replicas"] and sorted(first[1]) == ["blocking", "leo"]


def test_the_epochs_to_repay_are_the_runs_own_unless_payback_epochs_is_set() -> None:
    """`epochs_to_repay`, what the workers' trials repay over (worker/trainer.py, after
    `done` epochs on resume) as the parent's do: the epochs left, else the key's."""
    assert auto_mode.epochs_to_repay(cfg("train.num_epochs=30"), 10) == 20
    set_ = cfg("train.num_epochs=30", "pipeline.payback_epochs=500")
    assert auto_mode.epochs_to_repay(set_) == 500 and auto_mode.epochs_to_repay(set_, 10) == 500
    off = cfg("pipeline.payback_epochs=500", "pipeline.trial_payback=false")
    assert auto_mode.epochs_to_repay(off) is None  # every candidate tried


def test_payback_epochs_sets_the_run_the_trials_repay_over() -> None:
    """`pipeline.payback_epochs` replaces the run's own epochs in the parent's payback: a run
    of 18 epochs tries what a run of 19 would (the numbers of the test above)."""
    plan = plan_with_levels(False, False, PREDICTED)
    estimate = choose(cfg(), plan, 2)
    long = cfg("train.num_epochs=18", "pipeline.payback_epochs=19")
    assert auto_mode.to_try(long, plan, estimate, None).trials == [
        "blocking",
        "leo",
        "shared-memory",
    ]
    short = auto_mode.to_try(cfg(LONG, "pipeline.payback_epochs=18"), plan, estimate, None)
    assert short.trials == [] and "over 18 epochs" in short.rule


def test_a_candidate_the_default_uncertainty_keeps_slower_is_left_out_of_short_runs() -> None:
    """A candidate predicted over twice the first (`UNCERTAIN` 50%: not faster even at its
    fastest) would be kept by the workers at any length (auto_mode `payback`'s promise), so
    the parent weighs it against the first as slow as its own uncertainty allows: a short run
    leaves it out, saying what it could save; a long one tries it."""
    # leo and shared-memory over 3x blocking (HOPELESS): blocking and fine-grained alone
    predicted = {**PREDICTED, "leo": 0.2, "shared-memory": 0.2, "fine-grained": 0.12}
    plan = plan_with_levels(False, False, predicted)
    estimate = choose(cfg(), plan, 2)
    # fine-grained at best 0.06 s against blocking's 0.053 .. 0.0795: it may save 0.0195 s
    # an epoch; its trial 4 * 0.12 s and blocking's 3 * 0.053 s: 0.639 s
    short = auto_mode.to_try(cfg("train.num_epochs=32"), plan, estimate, None)
    assert short.trials == [] and short.notes["fine-grained"] == (
        "not tried: could save at most 0.62 s over 32 epochs, its trial costs about 0.64 s"
    )
    enough = auto_mode.to_try(cfg("train.num_epochs=33"), plan, estimate, None)
    assert enough.trials == ["blocking", "fine-grained"]
