"""`auto`'s trials on the workers: every candidate the parent kept (mode-choice.json `trials`)
is assembled on this run's part, timed for a few forward and backward steps and freed, and
the fastest trains (planner/auto_mode.py chooses the candidates, docs/design/planning.md
says why).

A trial changes nothing the run computes: no optimizer step, gradients dropped, the torch
random state restored, and dropout masks keyed by (seed, epoch, layer, node) draw the same
masks whenever they are drawn. Every rank times the same steps and takes the slowest rank's
time, so every rank picks the same winner without another message.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist

from leo_cli.comm.dist import all_gather_, all_reduce_
from leo_cli.config import LeoConfig, write_resolved
from leo_cli.errors import KernelError, LeoError
from leo_cli.kernels import spmm_calls, variants
from leo_cli.planner.auto_mode import (
    BUILD_STEPS,
    FIRST_STEP,
    MEASURED,
    SPMM_NOTE,
    TIE,
    UNCERTAIN,
    ModeChoice,
    fewest_timed,
    parse_candidate,
    payback,
    scaled_step,
    trial_cost_s,
    with_choice,
    with_mode,
    write_choice,
)
from leo_cli.run_dir import RunDir
from leo_cli.util.timing import Laps
from leo_cli.worker.step import Job, train_step

# A candidate whose first timed step takes this many times the best median so far stops there
# at the most (a judgement: repeated steps of one candidate spread by up to 15% on a busy
# 2-core host); where the best's own slowest step is closer to its median, it stops sooner
# (`stop_at`).
STOP = 1.3
# The warm-up or the first timed step past its stop line (`warmup_stop_at`, `stop_at`) stops a
# candidate alone only where it is this many times past the line; a step past it by less stops
# the candidate only with the step after it also past (two in a row: the warm-up and the first
# timed step, or the first two timed steps), so one slow step of a candidate as fast as the
# best (another process's time slice on a shared host: 1.3x a candidate's median seen) does
# not drop it. A judgement: a candidate this far past the best is slower than the best by more
# than one step's noise.
FAR = 1.5
# Short steps are timed for at least this long (more steps, up to MAX_TRIAL_STEPS), unless
# they are `settled`: one step of a small graph is milliseconds, where another process's time
# slice is noise (and would keep two steps from agreeing).
MIN_TRIAL_S = 0.5
MAX_TRIAL_STEPS = 20
# The SpMM variants' passes (each call's fastest counts, so a time slice lost to another
# process spoils one call of one pass, not the sum) need less: a step's SpMMs can be
# milliseconds of it.
MIN_SPMM_S = 0.1
TRIAL_EPOCH = 1  # the masks of the first epoch (any epoch draws alike; no state is kept)
NO_SLABS = "no x of this run is wider than the cache share (it would run as torch)"
NO_LIBRARY = "LEO's CPU library is not loaded on every rank"
NO_SPMM = "no CPU SpMM in this run's step (every variant runs alike)"
# What a candidate's assembly may raise and be skipped for (the others are still tried):
# a user-facing refusal (/dev/shm too small, ...) or memory running out.
SKIPPED = (LeoError, MemoryError)


@dataclass(frozen=True)
class Trial:
    """One candidate's timed steps (the slowest rank's seconds), and whether it stopped after
    its first one or two (or after its warm-up step: no timed step) for being slower than the
    best so far (`try_candidate`)."""

    name: str
    steps_s: list[float]
    stopped: bool = False
    failed: str | None = None  # why it could not be built (on which rank), then skipped
    warmup_s: float | None = None  # its warm-up step, the slowest rank's seconds
    build_s: float | None = None  # its assembly, the slowest rank's seconds
    not_tried: str | None = None  # why it was not built: its trial would not repay itself
    # Seconds this rank spent on it: freeing the one before, building, warming up, steps.
    phases: dict[str, float] = field(default_factory=dict, compare=False)

    @property
    def median_s(self) -> float | None:
        if self.stopped or self.failed is not None or self.not_tried is not None:
            return None
        return statistics.median(self.steps_s)

    @property
    def stop_at(self) -> float | None:
        """The first step past which a later candidate stops: this trial's slowest step (a
        candidate as fast as this one steps within this one's range), as a multiple of its
        median at least one plus twice `TIE` and at most `STOP`."""
        median = self.median_s
        if median is None:
            return None
        over = max(self.steps_s) / median - 1 if median > 0 else 0.0
        return median * min(STOP, 1 + max(2 * TIE, over))

    @property
    def warmup_over(self) -> float | None:
        """How many times its median step its warm-up step took (None: not known)."""
        median = self.median_s
        if median is None or self.warmup_s is None or median <= 0:
            return None
        return self.warmup_s / median


def warmup_stop_at(done: list[Trial]) -> float | None:
    """The stop line of a later candidate's warm-up step (`try_candidate`: `FAR` past it
    stops the candidate before any timed step; past it, with its first timed step past
    `stop_at`, after that step): the best trial's `stop_at` times the most any finished
    trial's warm-up took over its own median (at least 1): a candidate as fast as the best,
    warmed up as slowly as any so far, would stay under it. None before a finished trial with
    a timed warm-up."""
    timed = [t for t in done if t.median_s is not None]
    overs = [o for t in timed if (o := t.warmup_over) is not None]
    if not overs:
        return None
    best = min(timed, key=lambda t: t.median_s or 0.0)
    stop = best.stop_at
    return None if stop is None else stop * max(1.0, *overs)


def settled(times: list[float]) -> bool:
    """Whether a candidate's timed steps already agree within `TIE` of each other (two at
    least): its median cannot move by more than the tie the winner is chosen within, so
    further steps are not taken."""
    return len(times) >= 2 and max(times) <= min(times) * (1 + TIE)


def past(step_s: float, line_s: float | None) -> bool:
    """Whether `step_s` is past the stop line `line_s` (None: no line yet)."""
    return line_s is not None and step_s > line_s


def far_past(step_s: float, line_s: float | None) -> bool:
    """Whether `step_s` is `FAR` times past the stop line `line_s`: it stops a candidate
    alone."""
    return line_s is not None and step_s > line_s * FAR


def trial_step(job: Job, seed: int) -> float:
    """A forward and backward step without the optimizer's update, its gradients dropped;
    the slowest rank's seconds."""
    job.graph.aggregator.stats.reset()
    _, times = train_step(
        job.model, job.optimizer, job.reducer, job.graph, job.data, seed, TRIAL_EPOCH, False
    )
    job.optimizer.zero_grad(set_to_none=True)
    step = torch.tensor([times["step_s"]], dtype=torch.float64)
    return float(all_reduce_(step, op="max").item())


def try_candidate(
    name: str,
    job: Job,
    seed: int,
    steps: int,
    stop_s: float | None,
    warm_stop_s: float | None = None,
) -> Trial:
    """A warm-up step, then `steps` timed ones, more while they add up to less than
    `MIN_TRIAL_S` (at most `MAX_TRIAL_STEPS`), fewer once they are `settled`. It stops early
    for being slower than the best so far: after its warm-up step where that is `FAR` past
    `warm_stop_s` (`warmup_stop_at`); after its first timed step `FAR` past `stop_s` (the
    best trial's `stop_at`); after one of its first two timed steps past `stop_s` with the
    step before also past its line (the warm-up past
    `warm_stop_s`, a timed step past `stop_s`). A candidate slower than the best by less than
    `FAR` past its lines thus takes one step more to stop than a single step would (two
    timed steps at most). Every rank sees the same times, so every rank stops alike."""
    start = time.perf_counter()
    warm_s = trial_step(job, seed)
    warm = time.perf_counter()
    phases = {"warmup_s": warm - start}
    times: list[float] = []
    if far_past(warm_s, warm_stop_s):
        return Trial(name, [], stopped=True, warmup_s=warm_s, phases=phases)
    behind = past(warm_s, warm_stop_s)  # the step before the next one was past its line
    stopped = False
    while (
        len(times) < steps
        or (sum(times) < MIN_TRIAL_S and len(times) < MAX_TRIAL_STEPS)
        or behind  # one step past its line: the next one decides
    ):
        times.append(trial_step(job, seed))
        if len(times) <= 2:  # the first two timed steps may stop it, no later one
            now = past(times[-1], stop_s)
            alone = len(times) == 1 and far_past(times[-1], stop_s)
            stopped = now and (behind or alone)
            behind = now and not stopped and len(times) == 1
        if stopped or settled(times):
            break
    phases["steps_s"] = time.perf_counter() - warm
    return Trial(name, times, stopped=stopped, warmup_s=warm_s, phases=phases)


Worth = Callable[[str, list[Trial]], str | None]  # why a candidate is not tried after these


def measure(
    names: list[str],
    build: Callable[[str], Job],
    seed: int,
    steps: int,
    worth: Worth | None = None,
) -> tuple[list[Trial], Job | None]:
    """Try every candidate in turn, each freed before the next is built, but those `worth`
    says would not repay their trial after the trials so far (`not_repaid`; noted, not
    built); returns the trials and the last built candidate's job (kept: it may be the winner;
    None where it failed). A candidate whose assembly fails on any rank (`SKIPPED`) is skipped
    with the reason, unless every one fails: then the first failure ends the run."""
    rng = torch.get_rng_state()
    trials: list[Trial] = []
    job: Job | None = None
    first_error: BaseException | None = None
    with frozen_heap():
        for name in names:
            if worth is not None and (why := worth(name, trials)) is not None:
                trials.append(Trial(name, [], not_tried=why))
                continue
            start = time.perf_counter()
            job = None
            gc.collect()  # the previous candidate's buffers and segments go before the next's
            freed = {"free_s": time.perf_counter() - start}
            job, trial, error = one_trial(name, build, seed, steps, trials)
            trials.append(replace(trial, phases=freed | trial.phases))
            first_error = first_error or error
    torch.set_rng_state(rng)
    assert trials, "no candidate to try"
    if all(t.failed is not None or t.not_tried is not None for t in trials):
        if first_error is not None:
            raise first_error
        raise LeoError(f"no candidate of pipeline.mode=auto could be built: {trials[0].failed}")
    return trials, job


def one_trial(
    name: str, build: Callable[[str], Job], seed: int, steps: int, trials: list[Trial]
) -> tuple[Job | None, Trial, BaseException | None]:
    """`name` built and tried after `trials`: its job (None where it failed), its trial and
    the error that kept it from being built."""
    start = time.perf_counter()
    job, error = built(build, name)
    failed = failures(error)
    phases = {"build_s": time.perf_counter() - start}
    if failed is not None:
        return None, Trial(name, [], failed=failed, phases=phases), error
    assert job is not None
    build_s = float(all_reduce_(torch.tensor([phases["build_s"]], dtype=torch.float64), op="max"))
    done = [t for t in trials if t.median_s is not None]
    best = min(done, key=lambda t: t.median_s or 0.0, default=None)
    stop_s = None if best is None else best.stop_at
    trial = try_candidate(name, job, seed, steps, stop_s, warmup_stop_at(done))
    return job, replace(trial, build_s=build_s, phases=phases | trial.phases), None


def not_repaid(
    name: str, done: list[Trial], choice: ModeChoice, epochs: int, trial_steps: int
) -> str | None:
    """Why candidate `name` is not tried after the trials `done`, or None (the payback rule,
    planner/auto_mode.py `payback`): against the best median so far, its expected step on this
    run's scale (`scaled_step`: the best's median times the ratio of their expected steps, a
    plan variant expected at its mode's, as the parent's `repaid` expects it), less its
    uncertainty; its trial's cost at that step with its assembly in steps as the finished
    trials' took (their median). Every time read is the slowest rank's, so every rank decides
    alike."""
    timed = [t for t in done if t.median_s is not None]
    if not timed:
        return None
    best = min(timed, key=lambda t: t.median_s or 0.0)
    best_s = best.median_s or 0.0
    step = scaled_step(choice, name, best.name, best_s)
    optimistic = choice.optimistic_s(name, step)
    builds = [t.build_s / (t.median_s or 1.0) for t in timed if t.build_s is not None]
    build_steps = statistics.median(builds) if builds else BUILD_STEPS
    cost = trial_cost_s(step, build_steps, fewest_timed(trial_steps))
    return payback(best_s, optimistic, cost, epochs, name in choice.uncertainty)


_FROZEN = [0, 0]  # `frozen_heap` blocks open (the outermost freezes), and whether it froze


@contextmanager
def frozen_heap() -> Iterator[None]:
    """The objects alive before the trials left out of the collections between them
    (`gc.freeze`): a full collection walks every object of the process (torch's imports
    included, before each candidate), while what a candidate leaves behind is its own. Nested,
    the outermost block alone freezes (a second freeze would take in what the trials made).
    In a process whose imports are frozen for good (a worker forked from the server,
    harness/process.py) it does nothing: unfreezing would hand those back to the collector."""
    if _FROZEN[0] == 0 and gc.get_freeze_count() == 0:
        gc.freeze()
        _FROZEN[1] = 1
    _FROZEN[0] += 1
    try:
        yield
    finally:
        _FROZEN[0] -= 1
        if _FROZEN[0] == 0 and _FROZEN[1]:
            gc.unfreeze()
            _FROZEN[1] = 0


def built(build: Callable[[str], Job], name: str) -> tuple[Job | None, BaseException | None]:
    """A candidate's job, or the error its assembly raised here (`SKIPPED` kinds only)."""
    try:
        return build(name), None
    except SKIPPED as exc:
        return None, exc


def failures(error: BaseException | None) -> str | None:
    """Whether any rank failed to build the candidate (every rank learns it here, so every
    rank skips it alike) and why: the first failing rank's sentence. A rank that fails
    between two of the assembly's collectives leaves the others waiting in it (until
    `launch.timeout_s`); a failure that every rank meets alike (a refusal agreed on, as the
    /dev/shm segments' are) or at the end is skipped."""
    mine = torch.tensor([0 if error is None else 1], dtype=torch.int64)
    ranks = [r for r, f in enumerate(all_gather_(mine)[:, 0].tolist()) if f]
    if not ranks:
        return None
    reason = "" if error is None else (str(error).strip().splitlines() or [""])[0]
    reason = reason or ("" if error is None else type(error).__name__)
    if dist.is_initialized() and dist.get_world_size() > 1:
        every: list[str] = [""] * dist.get_world_size()
        dist.all_gather_object(every, reason)
        reason = every[ranks[0]]
    return f"rank {ranks[0]}: {reason}"


def winner(trials: list[Trial], buffers: dict[str, int]) -> tuple[Trial, str]:
    """The trial that wins and the rule it won by: the fastest median, or of those within
    `TIE` of it the one with the smallest predicted buffers moving rows (a variant counts its
    mode's), where every tied one has a prediction; the only one measured where the others
    were not tried for their payback."""
    done = [t for t in trials if t.median_s is not None]
    fastest = min(done, key=lambda t: t.median_s or 0.0)
    others = [t for t in trials if t is not fastest]
    if len(done) == 1 and others and all(t.not_tried is not None for t in others):
        return fastest, f"{MEASURED} alone: no other trial would repay itself"
    top = fastest.median_s or 0.0
    tied = [t for t in done if (t.median_s or 0.0) <= top * (1 + TIE)]
    sizes = {t.name: buffers.get(t.name, buffers.get(parse_candidate(t.name)[0])) for t in tied}
    known = {n: b for n, b in sizes.items() if b is not None}
    if len(tied) == 1 or len(known) < len(tied):
        return fastest, f"{MEASURED} fastest"
    lean = min(tied, key=lambda t: (known[t.name], t.median_s or 0.0))
    own = known[fastest.name]
    if lean is fastest or known[lean.name] >= own:
        return fastest, f"{MEASURED} fastest"
    saved = (own - known[lean.name]) / 1e6
    return lean, f"{MEASURED} within {TIE:.0%} of the fastest, {saved:.1f} MB less in buffers"


def spmm_winner(trials: list[Trial]) -> tuple[Trial, str]:
    """The SpMM variant that wins and why: the fastest (`winner`), but where that is
    `torch-slabs` and a variant that copies no slabs of x is within `TIE` of it, that one (the
    slabs' copies cost memory and bandwidth, and its sums differ in the last bits)."""
    won, rule = winner(trials, {})
    top = won.median_s or 0.0
    plain = [
        t for t in trials
        if t.name != variants.TORCH_SLABS and t.median_s is not None and not t.stopped
        and t.median_s <= top * (1 + TIE)
    ]  # fmt: skip
    if won.name != variants.TORCH_SLABS or not plain:
        return won, rule
    near = min(plain, key=lambda t: t.median_s or 0.0)
    return near, f"{MEASURED} within {TIE:.0%} of {won.name}, which copies x into slabs"


def measured_choice(choice: ModeChoice, trials: list[Trial], won: Trial, rule: str) -> ModeChoice:
    """The run's choice once tried: the winner, every trial's median, and a note for each
    that stopped early."""
    mode, levels = parse_candidate(won.name, choice.levels)
    notes = dict(choice.notes)
    for t in trials:
        if t.not_tried is not None:
            notes[t.name] = t.not_tried
        elif t.failed is not None:
            notes[t.name] = f"skipped: failed while being built ({t.failed})"
        elif t.stopped and not t.steps_s:
            notes[t.name] = f"stopped after its warm-up step: {t.warmup_s or 0.0:.3f} s"
        elif t.stopped and len(t.steps_s) == 1:
            notes[t.name] = f"stopped after its first step: {t.steps_s[0]:.3f} s"
        elif t.stopped:
            steps = ", ".join(f"{s:.3f}" for s in t.steps_s)
            notes[t.name] = f"stopped after its first {len(t.steps_s)} steps: {steps} s"
    ran = [t for t in trials if t.not_tried is None]
    measured = {t.name: t.median_s for t in ran}
    spent = {t.name: rounded(t.phases | first_step(t)) for t in ran}
    return replace(
        choice, mode=mode, rule=rule, levels=levels, trials=[], measured_s=measured, notes=notes,
        trial_s=spent,
    )  # fmt: skip


def first_step(trial: Trial) -> dict[str, float]:
    """A trial stopped after timed steps (one or two): its first, the slowest rank's seconds
    (`first_step_s`: the step calibration samples where there is no median)."""
    return {FIRST_STEP: trial.steps_s[0]} if trial.stopped and trial.steps_s else {}


def rounded(phases: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 4) for k, v in phases.items()}


def train_winner(
    run: RunDir,
    cfg: LeoConfig,
    choice: ModeChoice,
    build: Callable[[LeoConfig, Laps | None], Job],
    rank: int,
    laps: Laps,
    epochs: int | None = None,
) -> tuple[Job, LeoConfig, ModeChoice]:
    """Try `choice.trials` (`build` assembles a job of a config, with set-up laps or none)
    but those that would not repay their trial over the run's `epochs` to come, where given
    (`not_repaid`), then return the winner's job, fresh or the last one built, the config it
    trains with and the choice; rank 0 records the choice in the run folder (`record`).
    `laps` gets the trials as `choose_s`."""

    split: dict[str, dict[str, float]] = {}  # each candidate's build by set-up step

    def candidate(name: str) -> Job:
        parts = Laps()
        job = build(with_mode(cfg, *parse_candidate(name, choice.levels)), parts)
        split[name] = {f"build_{k}": v for k, v in parts.seconds.items()}
        return job

    def worth(name: str, done: list[Trial]) -> str | None:
        assert epochs is not None
        return not_repaid(name, done, choice, epochs, cfg.pipeline.trial_steps)

    steps = cfg.pipeline.trial_steps
    # One freeze over the trials and the last candidate's collection: what the candidates
    # made stays collectable (a freeze after them would keep the last one's cycles).
    with frozen_heap():
        trials, last = measure(
            choice.trials, candidate, cfg.run.seed, steps, None if epochs is None else worth
        )
        trials = [replace(t, phases=t.phases | split.get(t.name, {})) for t in trials]
        won, rule = winner(trials, choice.buffer_bytes)
        chosen = measured_choice(choice, trials, won, rule)
        run_cfg = with_choice(cfg, chosen)
        if rank == 0:
            record(run, run_cfg, chosen)
        built_last = [t for t in trials if t.not_tried is None][-1]
        if last is not None and won.name == built_last.name:
            laps.lap("choose_s")
            return last, run_cfg, chosen
        del last
        gc.collect()  # (the heap is handed back after set-up: worker/memory.py)
    laps.lap("choose_s")
    return build(run_cfg, laps), run_cfg, chosen


def spmm_trials(
    names: list[str],
    job: Job,
    seed: int,
    steps: int,
    epochs: int | None = None,
    step_s: float | None = None,
) -> tuple[list[Trial], dict[str, str]]:
    """Each CPU SpMM variant timed on `job`'s own SpMMs (kernels/spmm_calls.py): one step
    records them, forward and backward, then every variant runs them again (`steps` passes,
    more while under `MIN_SPMM_S`); a variant's time is the slowest rank's seconds of SpMM
    in one step. A `torch-slabs` that would cut no x into slabs on any rank is left out (it
    runs as `torch`), with a note; so is every variant whose trial would not repay itself
    over the run's `epochs` (`spmm_not_repaid`; `step_s`: the job's step, where known). The
    variant in use is left as it was."""
    before = variants.cpu_spmm()
    rng = torch.get_rng_state()
    trials: list[Trial] = []
    notes: dict[str, str] = {}
    if epochs is not None and (why := spmm_not_repaid(trials, steps, epochs, step_s)):
        return trials, {f"{SPMM_NOTE}{n}": why for n in names}
    start = time.perf_counter()
    try:
        with spmm_calls.recording() as calls:
            trial_step(job, seed)
        recorded = {"record_s": time.perf_counter() - start}
        if not agreed(bool(calls)):
            notes.update({f"{SPMM_NOTE}{n}": f"not tried: {NO_SPMM}" for n in names})
            return trials, notes
        slabbed = agreed(any(c.slabbed() for c in calls))
        replay = spmm_calls.Replay(calls)
        for name in names:
            if not usable(name):
                notes[f"{SPMM_NOTE}{name}"] = f"not tried: {NO_LIBRARY}"
                continue
            if name == variants.TORCH_SLABS and not slabbed:
                notes[f"{SPMM_NOTE}{name}"] = f"not tried: {NO_SLABS}"
                continue
            best = min((t.median_s for t in trials if t.median_s is not None), default=None)
            if epochs is not None and (why := spmm_not_repaid(trials, steps, epochs)):
                notes[f"{SPMM_NOTE}{name}"] = why
                continue
            phases = recorded if not trials else {}
            trials.append(spmm_trial(name, replay, steps, phases, best))
    finally:
        variants.set_cpu_spmm(before)
        torch.set_rng_state(rng)
    return trials, notes


def spmm_not_repaid(
    done: list[Trial], steps: int, epochs: int, step_s: float | None = None
) -> str | None:
    """Why the next SpMM variant is not tried after the variants `done`, or None (the payback
    rule, planner/auto_mode.py `payback`): it may take `UNCERTAIN` less than the best variant's SpMM
    seconds per step, and its passes last `MIN_SPMM_S` at least, or `steps` of the best's.
    Before any: the variants together may save `UNCERTAIN` of the job's whole step (`step_s`;
    unknown: tried), and cost a recording step and two variants' passes. Every time read is
    the slowest rank's, so every rank decides alike."""
    timed = [t.median_s for t in done if t.median_s is not None]
    if timed:
        best_s = min(timed)
        cost = max(MIN_SPMM_S, steps * best_s)
        return payback(best_s, best_s * (1 - UNCERTAIN), cost, epochs)
    if done or step_s is None:
        return None
    return payback(step_s, step_s * (1 - UNCERTAIN), step_s + 2 * MIN_SPMM_S, epochs)


def spmm_trial(
    name: str,
    replay: spmm_calls.Replay,
    steps: int,
    phases: dict[str, float],
    best_s: float | None = None,
) -> Trial:
    """The variant in use (`name`) timed on the recorded SpMMs: the slowest rank's seconds;
    stopped after its first passes (`spmm_calls.STOP_AFTER`) where they took over `STOP` times
    the best variant's seconds so far (`best_s`) on the slowest rank (every rank stops
    alike)."""
    said: list[bool] = []

    def far_off(so_far_s: float) -> bool:
        if best_s is None:
            return False
        slowest = all_reduce_(torch.tensor([so_far_s], dtype=torch.float64), op="max").item()
        said.append(bool(slowest > STOP * best_s))
        return said[-1]

    start = time.perf_counter()
    mine, passes = replay.time(steps, MIN_SPMM_S, MAX_TRIAL_STEPS, far_off)
    seconds = float(all_reduce_(torch.tensor([mine], dtype=torch.float64), op="max").item())
    spent = {"steps_s": time.perf_counter() - start, "passes": float(passes)}
    return Trial(name, [seconds], stopped=any(said), phases=phases | spent)


def agreed(mine: bool) -> bool:
    """Whether `mine` holds on some rank (every rank learns it alike)."""
    return bool(all_reduce_(torch.tensor([int(mine)], dtype=torch.int64), op="max").item())


def usable(name: str) -> bool:
    """Set the variant `name` where every rank can (`leo` needs the library loaded); whether
    it was (agreed by every rank, so every rank skips it alike)."""
    try:
        variants.set_cpu_spmm(name)
        failed = False
    except KernelError:
        failed = True
    return not agreed(failed)


def choose_spmm(
    run: RunDir,
    cfg: LeoConfig,
    choice: ModeChoice,
    job: Job,
    rank: int,
    laps: Laps,
    epochs: int | None = None,
) -> tuple[LeoConfig, ModeChoice]:
    """Try `choice.spmm_trials` on the job that trains (those that may repay their trial over
    the run's `epochs` to come, where given), keep the fastest variant (in use from here on)
    and return the config and the choice with it; rank 0 records them. `laps` gets the trials
    as `choose_s`."""
    step_s = choice.measured_s.get(choice.name) or choice.expected_s(choice.name)
    trials, notes = spmm_trials(
        choice.spmm_trials, job, cfg.run.seed, cfg.pipeline.trial_steps, epochs, step_s
    )
    for t in trials:
        if t.stopped:
            first = f"its first {spmm_calls.STOP_AFTER} passes"
            notes[f"{SPMM_NOTE}{t.name}"] = f"stopped after {first}: {t.steps_s[0]:.3f} s"
    chosen = replace(choice, spmm_trials=[], notes={**choice.notes, **notes})
    if trials:  # (none where a step makes no CPU SpMM: the variant stays as set)
        won, rule = spmm_winner(trials)
        variants.set_cpu_spmm(won.name)
        chosen = replace(
            chosen, spmm=won.name, spmm_rule=rule,
            spmm_measured_s={t.name: t.median_s for t in trials},
            trial_s={**choice.trial_s, **{f"{SPMM_NOTE}{t.name}": rounded(t.phases)
                                          for t in trials}},
        )  # fmt: skip
    run_cfg = with_choice(cfg, chosen)
    if rank == 0:
        record(run, run_cfg, chosen)
    laps.lap("choose_s")
    return run_cfg, chosen


def record(run: RunDir, cfg: LeoConfig, chosen: ModeChoice) -> None:
    """The measured choice in the run folder: mode-choice.json (the summary reads it, and the
    parent keeps it as wisdom: launch/choice.py) and resolved_config.yaml (what a restart and
    a resume train), in this folder as this rank sees it."""
    write_choice(run.root, chosen)
    here = cfg.run.model_copy(update={"out_dir": run.root})
    write_resolved(cfg.model_copy(update={"run": here}))
