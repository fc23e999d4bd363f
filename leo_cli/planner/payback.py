"""Whether a trial of `auto` can pay for itself: under `pipeline.choose=measure` a candidate
(a mode, a variant of the planned mode's levels, a CPU SpMM variant) is tried only where the
most it could save over the run's epochs exceeds what its trial costs. The parent applies
it to the predictions before any candidate runs (planner/auto_mode.py `to_try`), the workers
to what the candidates tried so far measured (worker/trials.py), every rank alike.

A full-graph epoch is one step, so a step saved is saved once per epoch.

Specification: docs/design/planning.md.
"""

from __future__ import annotations

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
    be measured to correct its estimate (auto_mode's `HOPELESS` decides such candidates)."""
    if not bounded and optimistic_s >= best_s:
        return None
    could = max(best_s - optimistic_s, 0.0) * epochs
    if could > cost_s:
        return None
    return f"{NOT_REPAID} {could:.2f} s over {epochs} epochs, its trial costs about {cost_s:.2f} s"


def trial_cost_s(step_s: float, build_steps: float, timed_steps: int) -> float:
    """What one candidate's trial costs, stepping in `step_s`: its assembly (`build_steps`
    of its steps), a warm-up step and `timed_steps` timed ones."""
    return step_s * (build_steps + 1 + timed_steps)


def fewest_timed(trial_steps: int) -> int:
    """The fewest timed steps a trial takes (worker/trials.py `try_candidate`): two that
    agree within the tie stop it, fewer where `pipeline.trial_steps` asks for fewer."""
    return min(trial_steps, 2)
