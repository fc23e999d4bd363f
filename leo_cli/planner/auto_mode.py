"""`pipeline.mode=auto`: the fastest exact mode of this run, measured or predicted.

Under `pipeline.choose=estimate`, `choose` takes the fastest of the modes this run can use
(`candidates`) by the plan's predicted step of every exact mode, unless one predicted within
`pipeline.auto_margin` of it moves rows through buffers smaller by more than that margin
(`leanest`); without predictions it runs the planned mode and says why. Under `measure`,
`to_try` keeps the candidates worth trying (with the planned mode's plan variants,
`pipeline.levels`), those whose trial may repay itself over the run (`payback`), and
the workers measure them (worker/trials.py).
Before either, the modes whose /dev/shm segments (the plan's `shm_bytes`, summed over the
workers of each host) do not fit this host's free /dev/shm are left out (neither chosen nor
tried), and a mode set by name that does not fit is refused in one sentence.
The choice lands in the run folder: `resolved_config.yaml` holds the mode (and levels) that
runs, `mode-choice.json` what was asked for and why.

Specification: docs/design/planning.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leo_cli.comm import segments
from leo_cli.config import LeoConfig, load_config
from leo_cli.errors import ConfigError
from leo_cli.registry import auto_candidates, is_auto, mode_of, planned_mode, row_transport
from leo_cli.run_dir import RunDir
from leo_cli.util import files

if TYPE_CHECKING:  # planner/plan.py imports this module (through planner/reach.py)
    from leo_cli.planner.plan import CachePlan

CHOICE = RunDir.MODE_CHOICE
OWN_LEVELS = "own"  # pipeline.levels: the plan made for the mode
PLANNED_LEVELS = "planned"  # the plan made for the planned mode, as the mode can use it
# `choose=measure` does not try a mode predicted this many times the fastest (a judgement:
# predictions have missed measured steps by 2-75%, and modes predicted within 10% of each
# other have run 2.3x apart, docs/results.md).
HOPELESS = 3.0
MEASURED = "measured"  # how the rule of a measured choice starts
FROM_WISDOM = "by an earlier run with the same inputs (wisdom)"  # ... and ends, when kept
# ... nor one whose predicted buffers moving rows exceed this share of the free memory.
FREE_SHARE = 0.8
AUTO_SPMM = "auto"  # pipeline.spmm: the variant by rule, or tried under choose=measure

# Payback: under `choose=measure` a candidate (a mode, a variant of the planned mode's
# levels, a CPU SpMM variant) is tried only where the most it could save over the run's
# epochs exceeds what its trial costs; `repaid` applies it to the predictions before any
# candidate runs, worker/trials.py to what the candidates tried so far measured, every rank
# alike. A full-graph epoch is one step, so a step saved is saved once per epoch.
# Specification: docs/design/planning.md, "Payback".

# How much faster than expected a step not yet measured may turn out where no calibration on
# this host bounds it (its calibration's error does where there is one). A judgement: the
# cost model's predictions have missed measured steps by more than half.
UNCERTAIN = 0.5
# A candidate's assembly, in its own steps, before this run measured one (a judgement: builds
# take about one to a few of their candidate's steps).
BUILD_STEPS = 1.0
# How a note of a candidate left out by `payback` starts (a wisdom record of a run with
# such notes was cut to its length: launch/choice.py).
NOT_REPAID = "not tried: could save at most"


def payback(
    best_s: float, optimistic_s: float, cost_s: float, epochs: int, bounded: bool = True
) -> str | None:
    """Why a candidate is not tried, or None where its trial may repay itself: stepping in
    `optimistic_s` (the fastest it may turn out) against the best step `best_s`, over the
    run's `epochs` it saves at most (best - optimistic) * epochs, which must exceed its
    trial's `cost_s`. The note says both in one sentence. Where `optimistic_s` is not
    `bounded` by a calibration's error (the default `UNCERTAIN`), a candidate that could not
    be faster at all is not left out here: that would hold at any length, so it would never
    be measured to correct its estimate (`HOPELESS` decides such candidates)."""
    if not bounded and optimistic_s >= best_s:
        return None
    could = max(best_s - optimistic_s, 0.0) * epochs
    if could > cost_s:
        return None
    return f"{NOT_REPAID} {could:.2f} s over {epochs} epochs, its trial costs about {cost_s:.2f} s"


def epochs_to_repay(cfg: LeoConfig, done: int = 0) -> int | None:
    """The epochs a trial must repay itself over (`payback`, in the parent and the workers)
    in a run with `done` epochs behind it: `pipeline.payback_epochs` where set, else the
    epochs left to run; None where `pipeline.trial_payback=false` (every candidate is
    tried). Wisdom of trials cut short is kept for this length (launch/choice.py)."""
    if not cfg.pipeline.trial_payback:
        return None
    if cfg.pipeline.payback_epochs is not None:
        return cfg.pipeline.payback_epochs
    return cfg.train.num_epochs - done


def trial_cost_s(step_s: float, build_steps: float, timed_steps: int) -> float:
    """What one candidate's trial costs, stepping in `step_s`: its assembly (`build_steps`
    of its steps), a warm-up step and `timed_steps` timed ones."""
    return step_s * (build_steps + 1 + timed_steps)


def fewest_timed(trial_steps: int) -> int:
    """The fewest timed steps a trial takes (worker/trials.py `try_candidate`): two that
    agree within the tie stop it, fewer where `pipeline.trial_steps` asks for fewer."""
    return min(trial_steps, 2)


# Candidates measured within this fraction of the fastest median count as tied: the one with
# the smaller predicted buffers moving rows wins (worker/trials.py; memory is the tie-break,
# never the reason).
TIE = 0.03
FIRST_STEP = "first_step_s"  # in `ModeChoice.trial_s`: a stopped trial's first timed step


def versus(rule: str, steps: Mapping[str, float | None], mine: str) -> str:
    """`rule, 0.123 s vs other 0.234 s`: why `mine` was chosen, its time, the fastest other's."""
    own = steps.get(mine)
    if own is None:
        return rule
    others = [(t, n) for n, t in steps.items() if n != mine and t is not None]
    if not others:
        return f"{rule}, {seconds(own)}"
    t, name = min(others)
    return f"{rule}, {seconds(own)} vs {name} {seconds(t)}"


def seconds(t: float) -> str:
    """`0.123 s`, or `0.45 ms` under 10 ms (a small graph's SpMMs in one step)."""
    return f"{t:.3f} s" if t >= 0.01 else f"{t * 1e3:.2f} ms"


@dataclass(frozen=True)
class ModeChoice:
    """The mode a run uses and why.

    Attributes:
        requested: the `pipeline.mode` setting (`auto` or a mode).
        mode: the mode that runs.
        rule: for `auto`, why this mode (`predicted fastest`, `measured fastest`, within the
            margin with less memory, or the rule used without predictions); None for a mode
            set by name.
        predicted_s: the candidates' predicted steps it chose from (empty without a plan).
        buffer_bytes: the candidates' predicted bytes of buffers that move rows, all ranks
            together (empty without a plan).
        levels: the cache levels it runs with (`pipeline.levels`).
        trials: the candidates the workers are to try before the first epoch, fastest
            predicted first (`candidate_name`); empty once tried or where none is.
        measured_s: each candidate's median trial step, the slowest rank's (None: stopped
            after its first step, far slower than the best).
        notes: why a candidate was not tried or stopped early, by candidate.
        wisdom: where the trials' result is kept (planner/wisdom.py), or was read from.
        calibrated_s: the candidates' predicted steps scaled by what trials on this host
            measured before (planner/wisdom.py `factors`; modes without samples left out).
        trial_s: where each candidate's trial went, rank 0's seconds: freeing the candidate
            before it (`free_s`), its assembly (`build_s`), its warm-up step (`warmup_s`)
            and its timed steps (`steps_s`), by set-up step of its assembly (`build_graph_s`,
            `build_levels_s`, `build_aggregator_s`, `build_model_s`), and for a candidate
            stopped after its first one or two timed steps, the first (`first_step_s`, the
            slowest rank's seconds).
        spmm: the CPU SpMM variant that runs (`pipeline.spmm`; `auto`: as set, untried).
        spmm_rule: why that variant (measured fastest, or kept as wisdom); None: not chosen.
        spmm_trials: the variants the workers are to try on the winner (kernels/variants.py);
            empty once tried or where there is one or none.
        spmm_measured_s: each variant's seconds of SpMM in one step, the median pass over the
            step's recorded SpMMs (None: stopped early).
        uncertainty: per candidate to try whose calibration has an error, how much faster
            than `expected_s` its step may turn out (others: `payback`
            `UNCERTAIN`): what the workers' payback rule counts on.
    """

    requested: str
    mode: str
    rule: str | None = None
    predicted_s: dict[str, float | None] = field(default_factory=dict)
    buffer_bytes: dict[str, int] = field(default_factory=dict)
    levels: str = OWN_LEVELS
    trials: list[str] = field(default_factory=list)
    measured_s: dict[str, float | None] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    wisdom: str | None = None
    calibrated_s: dict[str, float | None] = field(default_factory=dict)
    trial_s: dict[str, dict[str, float]] = field(default_factory=dict)
    spmm: str = AUTO_SPMM
    spmm_rule: str | None = None
    spmm_trials: list[str] = field(default_factory=list)
    spmm_measured_s: dict[str, float | None] = field(default_factory=dict)
    uncertainty: dict[str, float] = field(default_factory=dict)

    def expected_s(self, name: str) -> float | None:
        """A candidate's step as the cost model expects it: calibrated where this host
        measured its mode before, else predicted (None: not predicted, as a variant of the
        planned mode's levels is not)."""
        return self.calibrated_s.get(name) or self.predicted_s.get(name)

    def optimistic_s(self, name: str, step_s: float) -> float:
        """The fastest a candidate's step may turn out: `step_s` (the step it is expected to
        take on the scale of what was measured) less its `uncertainty`."""
        return step_s * (1 - self.uncertainty.get(name, UNCERTAIN))

    @property
    def unrepaid(self) -> list[str]:
        """The candidates left out because their trial would not repay itself over the run
        (`payback`; SpMM variants apart): still the run's candidates, for its wisdom."""
        return [
            n for n, why in self.notes.items()
            if why.startswith(NOT_REPAID) and not n.startswith(SPMM_NOTE)
        ]  # fmt: skip

    @property
    def measured_here(self) -> bool:
        """Whether this run's workers measured the choice (not an earlier run's wisdom): its
        mode, its SpMM variant or both, and nothing is left to try."""
        if self.trials or self.spmm_trials:
            return False
        return any(
            r.startswith(MEASURED) and not r.endswith(FROM_WISDOM)
            for r in (self.rule or "", self.spmm_rule or "")
        )

    @property
    def name(self) -> str:
        """The candidate that runs (`candidate_name`)."""
        return candidate_name(self.mode, self.levels)

    def describe(self) -> str:
        """`leo (auto: measured fastest, 0.053 s vs blocking 0.062 s)`: the rule, the step it
        chose by (measured where measured, else predicted) and the next fastest candidate's;
        the mode alone when it was set by name."""
        label = self.mode if self.levels == OWN_LEVELS else self.name  # as the user sets it
        if self.spmm_rule is not None:  # `leo (...); CPU SpMM torch (measured fastest, ...)`
            return f"{self._describe_mode(label)}; CPU SpMM {self._describe_spmm()}"
        return self._describe_mode(label)

    def _describe_spmm(self) -> str:
        return f"{self.spmm} ({versus(self.spmm_rule or '', self.spmm_measured_s, self.spmm)})"

    def _describe_mode(self, label: str) -> str:
        if self.rule is None:
            return label
        steps = self.measured_s or self.predicted_s
        mine = self.name if self.name in steps else self.mode  # a prediction names the mode
        return f"{label} ({self.requested}: {versus(self.rule, steps, mine)})"

    def to_json(self) -> dict[str, Any]:
        return {
            "mode_requested": self.requested,
            "mode": self.mode,
            "mode_rule": self.rule,
            "mode_predicted_s": self.predicted_s,
            "mode_buffer_bytes": self.buffer_bytes,
            "mode_levels": self.levels,
            "mode_trials": self.trials,
            "mode_measured_s": self.measured_s,
            "mode_notes": self.notes,
            "mode_wisdom": self.wisdom,
            "mode_calibrated_s": self.calibrated_s,
            "mode_trial_s": self.trial_s,
            "spmm": self.spmm,
            "spmm_rule": self.spmm_rule,
            "spmm_trials": self.spmm_trials,
            "spmm_measured_s": self.spmm_measured_s,
            "mode_uncertainty": self.uncertainty,
        }


def candidate_name(mode: str, levels: str) -> str:
    """`leo`, `leo/no-replicas`, `blocking`, `blocking/own`: a mode and the levels it runs
    with, named as mode-choice.json and the tables name a candidate: the mode alone for the
    planned mode's plan as the mode can use it (`auto`'s candidates), which for the planned
    mode is its own plan too; another mode's own plan is named (it differs)."""
    if levels == PLANNED_LEVELS or (levels == OWN_LEVELS and mode == planned_mode()):
        return mode
    return f"{mode}/{levels}"


def parse_candidate(name: str, levels: str = PLANNED_LEVELS) -> tuple[str, str]:
    """(mode, levels) of a `candidate_name` (`levels` where the name has none)."""
    mode, _, variant = name.partition("/")
    return mode, variant or levels


def candidates(cfg: LeoConfig) -> list[str]:
    """The modes `auto` may run under this config (the planned mode first): exact modes whose
    needs the config checks (planner/checks.py) would not refuse, and that use what the config
    sets (a chunk count, reading every row in place)."""
    out = []
    for name in auto_candidates():
        mode = mode_of(name)
        if mode.one_host and cfg.launch.nnodes > 1:
            continue
        if cfg.pipeline.num_chunks != "auto" and not mode.chunks:
            continue
        if row_transport(cfg.pipeline.transport).every_row and not mode.reads_in_place:
            continue
        out.append(name)
    return out


def fastest(predicted: Mapping[str, float | None], names: list[str]) -> str | None:
    """The name with the smallest predicted step (the earliest on a tie), or None when none
    of them is predicted."""
    timed = [(t, i, n) for i, n in enumerate(names) if (t := predicted.get(n)) is not None]
    return min(timed)[2] if timed else None


def leanest(
    predicted: Mapping[str, float | None],
    buffers: Mapping[str, int],
    best: str,
    margin: float,
) -> str:
    """Of the modes predicted within `margin` (a fraction) of `best`'s step whose buffers are
    smaller than `best`'s by more than `margin`, the one with the smallest buffers (the
    faster on a tie); `best` itself when there is none, when its buffers are not predicted,
    or with a margin of 0 (the fastest always: the planned mode wins ties)."""
    fast, own = predicted.get(best), buffers.get(best)
    if fast is None or own is None or margin <= 0:
        return best
    lean = [
        (b, t, n)
        for n, t in predicted.items()
        if t is not None and t <= fast * (1 + margin)
        and (b := buffers.get(n)) is not None and b < own * (1 - margin)
    ]  # fmt: skip
    return min(lean)[2] if lean else best


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 1e9:.1f} GB" if num_bytes >= 1e8 else f"{num_bytes / 1e6:.1f} MB"


def host_shm_bytes(cfg: LeoConfig, plan: CachePlan, mode: str) -> int:
    """The most bytes of /dev/shm `mode` maps on one host: its ranks' `shm_bytes` summed per
    node (each node's workers hold consecutive ranks); 0 where the plan does not say."""
    ranks = plan.shm_bytes.get(mode, [])
    per_node = cfg.launch.nproc or max(len(ranks) // cfg.launch.nnodes, 1)
    return max((sum(ranks[i : i + per_node]) for i in range(0, len(ranks), per_node)), default=0)


def shm_misfits(
    cfg: LeoConfig, plan: CachePlan | None, names: list[str], free: int | None
) -> dict[str, int]:
    """Of `names`, the modes whose /dev/shm segments do not fit the `free` bytes of /dev/shm
    here (comm/segments.py `free_bytes`; None: unknown, all fit), with the bytes each needs."""
    if plan is None or free is None:
        return {}
    need = {n: host_shm_bytes(cfg, plan, n) for n in names}
    return {n: b for n, b in need.items() if b > free}


def _shm_refusal(mode: str, need: int, requested: str, free: int | None) -> ConfigError:
    return ConfigError(
        f"pipeline.mode={requested} needs {_size(need)} of /dev/shm on this host for {mode}'s "
        f"segments, which has {_size(free or 0)} free; set pipeline.mode=blocking (or "
        "pipeline.transport=process-group), or give /dev/shm more room (docker: --shm-size)."
    )


SHM_LEFT_OUT = "left out: too little room in /dev/shm"


def choose(cfg: LeoConfig, plan: CachePlan | None, world_size: int) -> ModeChoice:
    """The mode this run uses (see the module docstring), with the levels the config sets
    (`pipeline.levels`); a mode set by name is itself.

    Raises:
        ConfigError: the mode set by name, or every mode `auto` may run, maps more /dev/shm
            than this host has free.
    """
    return replace(_choose(cfg, plan, world_size), levels=cfg.pipeline.levels)


def _choose(cfg: LeoConfig, plan: CachePlan | None, world_size: int) -> ModeChoice:
    free = segments.free_bytes()  # this host's, before the registry's records are read
    requested = cfg.pipeline.mode
    if not is_auto(requested):
        misfit = shm_misfits(cfg, plan, [requested], free)
        if misfit:
            raise _shm_refusal(requested, misfit[requested], requested, free)
        return ModeChoice(requested, requested)
    names = candidates(cfg)
    assert names and names[0] == planned_mode(), f"auto candidates {names}"
    if world_size == 1:
        return ModeChoice(requested, names[0], "one worker: no rows move, every mode runs alike")
    if plan is None:
        return ModeChoice(requested, names[0], "no cache plan with cache.policy=none")
    misfits = shm_misfits(cfg, plan, names, free)
    if len(misfits) == len(names):
        raise _shm_refusal(names[0], misfits[names[0]], requested, free)
    choice = by_prediction(cfg, plan, [n for n in names if n not in misfits])
    if not misfits:
        return choice
    return replace(choice, rule=f"{choice.rule}; {', '.join(misfits)} {SHM_LEFT_OUT}")


def by_prediction(cfg: LeoConfig, plan: CachePlan, names: list[str]) -> ModeChoice:
    """`auto`'s choice among `names` by the plan's predicted steps and buffers."""
    requested = cfg.pipeline.mode
    predicted = {n: plan.predicted_run.get(n) for n in names}
    # (with the planned mode's variants, `pipeline.levels`, where the plan prices them)
    buffers = {n: b for n, b in plan.buffer_bytes.items() if parse_candidate(n)[0] in names}
    best = fastest(predicted, names)
    if best is None:
        return ModeChoice(requested, names[0], "the plan predicts none of them", predicted)
    margin = cfg.pipeline.auto_margin
    lean = leanest(predicted, buffers, best, margin)
    if lean == best:
        return ModeChoice(requested, best, "predicted fastest", predicted, buffers)
    saved = _size(buffers[best] - buffers[lean])
    rule = f"within {margin:.0%} of the fastest, {saved} less in buffers moving rows"
    return ModeChoice(requested, lean, rule, predicted, buffers)


def measures(cfg: LeoConfig, world_size: int) -> bool:
    """Whether this run's workers try `auto`'s candidates before the first epoch
    (`pipeline.choose`): under `auto` with several workers, unless told to estimate."""
    return is_auto(cfg.pipeline.mode) and world_size > 1 and cfg.pipeline.choose != "estimate"


def to_try(
    cfg: LeoConfig,
    plan: CachePlan | None,
    estimate: ModeChoice,
    free_bytes: int | None,
    errors: Mapping[str, float] | None = None,
    pairs: Mapping[tuple[str, str], tuple[float, float]] | None = None,
) -> ModeChoice:
    """The candidates the workers try (`ModeChoice.trials`), fastest predicted first (by the
    calibrated prediction where `estimate` has one, else the cost model's): the modes `auto`
    may run but those the cost model predicts over `HOPELESS` times the fastest, whose
    predicted buffers would not fit `FREE_SHARE` of the `free_bytes` this machine has, whose
    calibrated prediction is slower than another candidate's beyond both calibrations'
    `errors` (`surely_slower`), or whose step over a candidate tried before it, calibrated by
    the `pairs` measured in the same runs (planner/wisdom.py `pair_factors`), is slower
    beyond that ratio's error (`slower_than_tried`); and after the planned mode (where it
    fits, tried or not) its plan without replicas and without rows read in place, where the
    plan has them. Of those, only the ones whose trial may repay itself over the run
    (`repaid`, where `pipeline.trial_payback`). A single candidate is the choice itself,
    untried."""
    shm_free = segments.free_bytes()  # this host's, then the config's, then the registry's
    # Without a plan the levels change nothing; with one, the planned mode's plan is tried.
    levels = PLANNED_LEVELS if cfg.cache.enabled else OWN_LEVELS
    order = {n: i for i, n in enumerate(candidates(cfg))}
    predicted = estimate.predicted_s
    ranked = {**predicted, **estimate.calibrated_s}
    timed = [t for t in predicted.values() if t is not None]
    best = min(timed) if timed else None
    notes: dict[str, str] = {}
    misfits = shm_misfits(cfg, plan, list(order), shm_free)
    for mode in order:
        t = predicted.get(mode)
        if mode in misfits:
            notes[mode] = f"not tried: {_size(misfits[mode])} of /dev/shm, {SHM_LEFT_OUT}"
        elif best is not None and t is not None and t > HOPELESS * best:
            notes[mode] = f"not tried: predicted {t:.3f} s, over {HOPELESS:g}x the fastest"
        elif (unfit := too_big(estimate.buffer_bytes.get(mode), free_bytes)) is not None:
            notes[mode] = unfit
    fits = {m: estimate.calibrated_s.get(m) for m in order if m not in notes}
    slower = surely_slower(fits, errors or {})

    def pick(
        pairs: Mapping[tuple[str, str], tuple[float, float]],
    ) -> tuple[list[str], dict[str, str]]:
        """The candidates to try, in order, and why each other was left out."""
        tried: list[str] = []
        why: dict[str, str] = {}
        for mode in sorted(fits, key=lambda n: (ranked.get(n) or float("inf"), order[n])):
            if mode in slower:
                why[mode] = slower[mode]
            elif (beaten := slower_than_tried(mode, tried, predicted, pairs)) is not None:
                why[mode] = beaten
            else:
                tried.append(candidate_name(mode, levels))
            if mode == planned_mode() and plan is not None:  # (no calibration of its variants)
                every_row = row_transport(cfg.pipeline.transport).every_row  # asked for
                variants = [v for v in plan_variants(plan) if v != "no-in-place" or not every_row]
                for v in variants:  # checked like the modes, by their own buffers
                    name = candidate_name(mode, v)
                    unfit = too_big(estimate.buffer_bytes.get(name), free_bytes)
                    if unfit is None:
                        tried.append(name)
                    else:
                        why[name] = unfit
        return tried, why

    tried, left_out = pick(pairs or {})
    if pairs and len(tried) <= 1:
        # A mode the pair rule leaves out adds no sample, and a run that tries one candidate
        # or none measures nothing: the pair's factor would never age out. So that rule never
        # leaves fewer than two to try.
        tried, left_out = pick({})
    notes.update(left_out)
    sure = {m: e for m, e in (errors or {}).items() if m in estimate.calibrated_s}
    known = replace(estimate, uncertainty={n: sure[n] for n in tried if n in sure})
    epochs = epochs_to_repay(cfg)
    unpaid: dict[str, str] = {}
    if epochs is not None:
        tried, unpaid = repaid(known, tried, epochs, cfg.pipeline.trial_steps)
    notes.update(unpaid)
    if len(tried) <= 1:
        if not tried:  # every candidate left out: the prediction's choice, untried
            return replace(estimate, rule=f"{estimate.rule}; none to try", notes=notes)
        if unpaid:  # named as the trials would have tried it
            mode, variant = parse_candidate(tried[0], levels)
            rule = f"expected fastest, untried: no trial would repay itself over {epochs} epochs"
            return replace(known, mode=mode, levels=variant, rule=rule, notes=notes)
        rule = "the only candidate the cost model keeps"
        mode, variant = parse_candidate(tried[0], estimate.levels)
        return replace(estimate, mode=mode, levels=variant, rule=rule, notes=notes)
    mode, levels = parse_candidate(tried[0], levels)
    rule = "to be measured by the workers"
    return replace(known, mode=mode, rule=rule, levels=levels, trials=tried, notes=notes)


def expected_step(choice: ModeChoice, name: str) -> float | None:
    """The expected step of candidate `name`: a variant's is its mode's."""
    return choice.expected_s(name) or choice.expected_s(parse_candidate(name)[0])


def scaled_step(choice: ModeChoice, name: str, reference: str, reference_s: float) -> float:
    """The step candidate `name` is expected to take where candidate `reference` steps in
    `reference_s`: that step times the ratio of their `expected_step`s (a variant expected at
    its mode's), or `reference_s` itself where either is not expected. The payback rule's
    one expectation of a candidate: the parent's (`repaid`, the reference at its own expected
    step) and the workers' (worker/trials.py `not_repaid`, the best trial at its median)."""
    mine, theirs = expected_step(choice, name), expected_step(choice, reference)
    return reference_s * mine / theirs if mine is not None and theirs else reference_s


def repaid(
    choice: ModeChoice, tried: list[str], epochs: int, trial_steps: int
) -> tuple[list[str], dict[str, str]]:
    """Of `tried` (the first expected fastest: the reference), those whose trial may repay
    itself over the run's `epochs` by the predictions alone (`payback`), and why each
    other is not tried: each as fast as its `optimistic_s` against the reference's expected
    step, as the workers will judge it once the reference is measured (worker/trials.py
    `not_repaid` scales the candidate by the reference's measured step, so whatever that
    measures, the same comparisons repay: both expect it by `scaled_step`); its trial at its
    expected step; the first one kept also pays the reference's own warm-up and timed steps
    (a run that tries nothing else does not try the reference either). A candidate that only
    the default uncertainty keeps from being faster (never left out by the workers) is
    weighed against the reference as slow as its own uncertainty allows: where even that
    cannot repay over the run, it is not tried. A variant of a mode (`leo/no-replicas`) is
    expected at its mode's step."""
    best = expected_step(choice, tried[0]) if tried else None
    if best is None:
        return tried, {}
    slowest = best * (1 + choice.uncertainty.get(tried[0], UNCERTAIN))
    timed = fewest_timed(trial_steps)
    owed = (1 + timed) * best
    kept, why = tried[:1], {}
    for name in tried[1:]:
        step = scaled_step(choice, name, tried[0], best)
        cost = trial_cost_s(step, BUILD_STEPS, timed) + owed
        fast = choice.optimistic_s(name, step)
        bounded = name in choice.uncertainty
        reference = best if bounded or fast < best else slowest
        note = payback(reference, fast, cost, epochs, bounded)
        if note is None:
            kept.append(name)
            owed = 0.0
        else:
            why[name] = note
    return kept, why


def surely_slower(
    calibrated: Mapping[str, float | None], errors: Mapping[str, float]
) -> dict[str, str]:
    """Of the candidates with a calibrated prediction and its error (planner/wisdom.py
    `errors`: how far that calibration missed its own samples), those slower than another
    beyond both errors and a measured tie (`TIE`): even missing by its whole error, each
    would lose to it. Why each is not tried, by candidate; none where fewer than two are
    known."""
    known = {m: (t, errors[m]) for m, t in calibrated.items() if t is not None and m in errors}
    if len(known) < 2:
        return {}
    best = min(known, key=lambda m: known[m][0] * (1 + known[m][1]))
    fast, fast_error = known[best]
    bound = fast * (1 + fast_error) * (1 + TIE)
    return {
        m: f"not tried: calibrated {t:.3f} s (error {e:.0%}), slower than {best}'s "
        f"{fast:.3f} s (error {fast_error:.0%}) beyond both errors"
        for m, (t, e) in known.items()
        if m != best and t * (1 - e) > bound
    }


def slower_than_tried(
    mode: str,
    tried: list[str],
    predicted: Mapping[str, float | None],
    pairs: Mapping[tuple[str, str], tuple[float, float]],
) -> str | None:
    """Why `mode` is not tried, or None: its predicted step over that of a candidate in
    `tried`, times the factor and less the error of that ratio measured in earlier runs
    (`pairs`: planner/wisdom.py `pair_factors`), is past one plus a measured tie (`TIE`):
    even where the ratio misses by its whole error, `mode` loses to that candidate."""
    mine = predicted.get(mode)
    for other in tried:
        theirs, known = predicted.get(other), pairs.get((mode, other))
        if mine is None or theirs is None or known is None or theirs <= 0:
            continue
        factor, error = known
        ratio = mine / theirs * factor
        if ratio * (1 - error) > 1 + TIE:
            return (
                f"not tried: calibrated {ratio:.2f}x {other}'s step (measured in the same "
                f"runs, error {error:.0%}), slower beyond the ratio's error"
            )
    return None


def too_big(size: int | None, free_bytes: int | None) -> str | None:
    """Why a candidate with `size` predicted bytes of buffers moving rows is not tried (over
    `FREE_SHARE` of the memory free), or None where it fits or either is unknown."""
    if free_bytes is None or size is None or size <= FREE_SHARE * free_bytes:
        return None
    return (
        f"not tried: its buffers moving rows ({_size(size)}) would not fit "
        f"{FREE_SHARE:.0%} of the {_size(free_bytes)} of memory free"
    )


def plan_variants(plan: CachePlan) -> list[str]:
    """The variants of the planned mode's levels worth trying on this plan (`pipeline.levels`):
    without replicas where some rank has them, without rows read in place where some rank
    reads some."""
    out = []
    if any(len(c.replica_rows) for c in plan.caches):
        out.append("no-replicas")
    if any(len(c.l3_rows) for c in plan.caches) or any(plan.every_row):
        out.append("no-in-place")
    return out


def with_mode(cfg: LeoConfig, mode: str, levels: str | None = None) -> LeoConfig:
    """The config with `pipeline.mode` set to `mode` (validated: a chunk count stays
    allowed, since `auto` chose among the modes that chunk), and `pipeline.levels` to
    `levels` where given."""
    update = {"mode": mode} | ({} if levels is None else {"levels": levels})
    pipeline = type(cfg.pipeline).model_validate({**cfg.pipeline.model_dump(), **update})
    return cfg.model_copy(update={"pipeline": pipeline})


def with_choice(cfg: LeoConfig, choice: ModeChoice) -> LeoConfig:
    """The config a run of `choice` trains with: its mode and levels, and its SpMM variant
    where one was chosen."""
    run_cfg = with_mode(cfg, choice.mode, choice.levels)
    if choice.spmm == AUTO_SPMM:
        return run_cfg
    pipeline = run_cfg.pipeline.model_copy(update={"spmm": choice.spmm})
    return run_cfg.model_copy(update={"pipeline": pipeline})


def spmm_candidates(cfg: LeoConfig, leo_loaded: bool) -> list[str]:
    """The CPU SpMM variants the workers try (kernels/variants.py), where `pipeline.spmm` is
    `auto` under `choose=measure` on CPU workers: LEO's where its library is loaded
    (`leo_loaded`), torch's, torch's in slabs (tried where some SpMM of the run slabs)."""
    from leo_cli.comm.dist import uses_cuda  # torch: not when the CLI imports this module

    if cfg.pipeline.spmm != AUTO_SPMM or cfg.pipeline.choose == "estimate":
        return []
    if uses_cuda(cfg.launch):
        return []
    return [*(["leo"] if leo_loaded else []), "torch", "torch-slabs"]


def planning_config(cfg: LeoConfig) -> LeoConfig:
    """The config the cache plan is made for: under `auto`, or with levels taken from the
    planned mode's plan (`pipeline.levels` other than `own`), the planned mode's (its levels
    are decided for it; the other modes are priced with what they can use of them)."""
    if is_auto(cfg.pipeline.mode) or cfg.pipeline.levels != OWN_LEVELS:
        return with_mode(cfg, planned_mode())
    return cfg


def resumed(cfg: LeoConfig, run_dir: Path) -> ModeChoice | None:
    """Under `auto` on resume: the mode the run started with (its resolved config), with the
    reasons recorded when it was chosen, if they name that mode; None when the resolved
    config names no mode yet (written by `leo partition`: no worker ever started).

    Raises:
        ConfigError: that mode is not one this config can run (another placement).
    """
    pipeline = load_config(RunDir(run_dir).config).pipeline
    mode, levels = pipeline.mode, pipeline.levels
    if is_auto(mode):
        return None
    if mode not in candidates(cfg):  # e.g. shared-memory, resumed across several machines
        raise ConfigError(
            f"Cannot resume {run_dir} with pipeline.mode=auto: the run started in "
            f"{mode}, which this config cannot run; resume with that run's launch settings "
            "or start a new run.out_dir."
        )
    saved = read_choice(run_dir)
    if saved is not None and saved.name == candidate_name(mode, levels) and saved.rule is not None:
        return saved  # with its trials where they never finished (no epoch ran then)
    rule = "resumed: the mode the run started with"
    return ModeChoice(cfg.pipeline.mode, mode, rule, levels=levels)


def resumed_spmm(cfg: LeoConfig, run_dir: Path) -> LeoConfig:
    """On resume under `pipeline.spmm=auto`: the config with the variant the run started
    with (its resolved config), so a resumed run tries none and runs the one it measured."""
    if cfg.pipeline.spmm != AUTO_SPMM:
        return cfg
    started = load_config(RunDir(run_dir).config).pipeline.spmm
    pipeline = cfg.pipeline.model_copy(update={"spmm": started})
    return cfg.model_copy(update={"pipeline": pipeline})


def kept_spmm(choice: ModeChoice, cfg: LeoConfig, run_dir: Path) -> ModeChoice:
    """On resume under `pipeline.spmm=auto` (`cfg` as asked, before `resumed_spmm`), whatever
    the mode: `choice` with the variant the run started with and why, its trials' medians,
    notes and times, as its recorded choice says (mode-choice.json), where that variant was
    chosen (not left to try)."""
    if cfg.pipeline.spmm != AUTO_SPMM:
        return choice
    saved = read_choice(run_dir)
    if saved is None or saved.spmm == AUTO_SPMM or saved.spmm_rule is None or saved.spmm_trials:
        return choice
    mine = {k: v for k, v in saved.notes.items() if k.startswith(SPMM_NOTE)}
    spent = {k: v for k, v in saved.trial_s.items() if k.startswith(SPMM_NOTE)}
    return replace(
        choice, spmm=saved.spmm, spmm_rule=saved.spmm_rule, spmm_trials=[],
        spmm_measured_s=saved.spmm_measured_s, notes={**choice.notes, **mine},
        trial_s={**choice.trial_s, **spent},
    )  # fmt: skip


SPMM_NOTE = "spmm="  # how notes and trial times name a variant (`spmm=torch`)


def write_choice(run_dir: Path, choice: ModeChoice) -> None:
    files.write_json(run_dir / CHOICE, choice.to_json())


def read_choice(run_dir: Path) -> ModeChoice | None:
    """The run folder's recorded choice, or None when there is none (a run folder prepared
    without `leo train`, or by an earlier LEO) or it cannot be read."""
    path = run_dir / CHOICE
    try:
        return from_json(json.loads(path.read_text())) if path.is_file() else None
    except (OSError, ValueError):  # JSONDecodeError is a ValueError
        return None


def from_json(data: Any) -> ModeChoice:
    """A choice from `ModeChoice.to_json`'s fields (mode-choice.json, summary.json).

    Raises:
        ValueError: the fields are missing or of the wrong kind.
    """
    try:
        predicted = _steps(data.get("mode_predicted_s"))
        measured = _steps(data.get("mode_measured_s"))
        buffers = {str(k): int(v) for k, v in dict(data.get("mode_buffer_bytes") or {}).items()}
        notes = {str(k): str(v) for k, v in dict(data.get("mode_notes") or {}).items()}
        trials = [str(n) for n in list(data.get("mode_trials") or [])]
        rule = data.get("mode_rule")
        requested, mode = str(data["mode_requested"]), str(data["mode"])
        levels = str(data.get("mode_levels") or OWN_LEVELS)
        wisdom = data.get("mode_wisdom")
        calibrated = _steps(data.get("mode_calibrated_s"))
        spent = {
            str(k): {str(p): float(t) for p, t in dict(v).items()}
            for k, v in dict(data.get("mode_trial_s") or {}).items()
        }
        spmm = str(data.get("spmm") or AUTO_SPMM)
        spmm_rule = data.get("spmm_rule")
        spmm_trials = [str(n) for n in list(data.get("spmm_trials") or [])]
        spmm_measured = _steps(data.get("spmm_measured_s"))
        uncertain = dict(data.get("mode_uncertainty") or {})
        uncertainty = {str(k): float(v) for k, v in uncertain.items()}
    except (AttributeError, KeyError, TypeError, OverflowError, ValueError) as exc:
        raise ValueError(f"not a mode choice ({exc})") from None
    rule = None if rule is None else str(rule)
    wisdom = None if wisdom is None else str(wisdom)
    spmm_rule = None if spmm_rule is None else str(spmm_rule)
    return ModeChoice(
        requested, mode, rule, predicted, buffers, levels, trials, measured, notes, wisdom,
        calibrated, spent, spmm, spmm_rule, spmm_trials, spmm_measured, uncertainty,
    )  # fmt: skip


def _steps(data: Any) -> dict[str, float | None]:
    return {str(k): None if v is None else float(v) for k, v in dict(data or {}).items()}


def summary_fields(run_dir: Path, mode: str) -> dict[str, Any]:
    """What summary.json says of the mode: the recorded choice when it names the mode that
    ran, else that mode as set by name (a run folder prepared without `leo train`)."""
    choice = read_choice(run_dir)
    if choice is None or choice.mode != mode:
        choice = ModeChoice(mode, mode)
    return choice.to_json()


def refuse_unresolved(cfg: LeoConfig) -> None:
    """Workers run a resolved config: `auto` there means the run folder was not prepared by
    `leo train` (plain torchrun on a hand-written config)."""
    if is_auto(cfg.pipeline.mode):
        raise ConfigError(
            "pipeline.mode=auto is resolved by leo train before workers start, but this run "
            "folder's resolved_config.yaml still says auto; run leo train on it once, or set "
            "pipeline.mode to a mode."
        )
