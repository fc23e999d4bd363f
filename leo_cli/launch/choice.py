"""The steps of `leo train`'s mode-choice stage (launch/setup.py `choose_mode` calls them in
turn): which mode a run of `pipeline.mode=auto` uses, or which candidates its workers try first
(planner/auto_mode.py decides, worker/trials.py tries), and the wisdom of an earlier run with
the same inputs (planner/wisdom.py); after the workers, what their trials measured, kept.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from leo_cli.config import LeoConfig
from leo_cli.errors import CacheError
from leo_cli.launch.run_folder import machine_cache_dir
from leo_cli.planner.auto_mode import (
    FIRST_STEP,
    FROM_WISDOM,
    NOT_REPAID,
    SPMM_NOTE,
    ModeChoice,
    epochs_to_repay,
    parse_candidate,
    read_choice,
)
from leo_cli.planner.wisdom import (
    Sample,
    Wisdom,
    add_samples,
    calibration_path,
    errors,
    factors,
    pair_factors,
    read_samples,
    read_wisdom,
    write_wisdom,
)

SPMM_PREFIX = SPMM_NOTE  # how a variant is named among the wisdom key's candidates


def wisdom_dir(cfg: LeoConfig, run_dir: Path) -> Path:
    """The cache that keeps the trials' wisdom and calibration: this machine's, on several
    machines too: node 0 alone chooses the mode and keeps what its workers measured (the key
    names the machines' link profile), while the partitions and plan stay in the run folder
    the nodes share."""
    return machine_cache_dir(cfg, run_dir)


def from_wisdom(trial: ModeChoice, known: Wisdom, path: Path) -> ModeChoice:
    """The choice an earlier run's trials made (`known`), for what this run would try."""
    chosen = replace(trial, wisdom=str(path))
    if trial.trials or trial.unrepaid:
        mode, levels = parse_candidate(known.winner, trial.levels)
        chosen = replace(
            chosen, mode=mode, levels=levels, rule=f"{known.rule} {FROM_WISDOM}", trials=[],
            measured_s=known.measured_s, notes=known.notes,
        )  # fmt: skip
    if trial.spmm_trials:
        chosen = replace(
            chosen, spmm=known.spmm, spmm_rule=f"{known.spmm_rule} {FROM_WISDOM}",
            spmm_trials=[], spmm_measured_s=known.spmm_measured_s,
            notes={**chosen.notes, **known.notes},
        )  # fmt: skip
    return chosen


def scale(cache: Path, setting: dict[str, Any] | None = None) -> dict[str, float]:
    """Per mode, what trials on this host measured over what was predicted, in the closest
    setting to `setting` that has any (none where nothing was measured; a file that is not
    calibration is said in one line and left out)."""
    try:
        return factors(read_samples(calibration_path(cache)), setting)
    except CacheError as exc:
        print(f"warning: {exc}; predictions are not calibrated.", file=sys.stderr)
        return {}


def calibration_errors(cache: Path, setting: dict[str, Any]) -> dict[str, float]:
    """Per mode, how far its calibrated prediction missed its own samples on this host
    (planner/wisdom.py `errors`; none where the file is not calibration: `scale` says so)."""
    try:
        return errors(read_samples(calibration_path(cache)), setting)
    except CacheError:
        return {}


def calibration_pairs(
    cache: Path, setting: dict[str, Any]
) -> dict[tuple[str, str], tuple[float, float]]:
    """Per pair of modes measured in the same runs on this host, the calibrated factor of
    their ratio and its error (planner/wisdom.py `pair_factors`; none where the file is not
    calibration: `scale` says so)."""
    try:
        return pair_factors(read_samples(calibration_path(cache)), setting)
    except CacheError:
        return {}


def kept(path: Path, names: list[str], variants: list[str], epochs: int | None) -> Wisdom | None:
    """The wisdom at `path` for a run whose trials repay over `epochs` (auto_mode
    `epochs_to_repay`; None: a run that tries every candidate), or None where there is none,
    it is refused (said in one line: the run then measures again and replaces it), or its
    trials were cut short for a shorter run (said too: this run may repay what they left
    out)."""
    try:
        known = read_wisdom(path, names, variants)
    except CacheError as exc:
        print(f"warning: {exc}; measuring the candidates again.", file=sys.stderr)
        return None
    if known is not None and not known.trusted_for(sys.maxsize if epochs is None else epochs):
        this = "this run, which tries every candidate" if epochs is None else f"{epochs}"
        print(
            f"note: {path} holds trials cut short for a run of {known.cut_to_epochs} epochs; "
            f"measuring the candidates again for {this}.",
            file=sys.stderr,
        )
        return None
    return known


def keep_trials(cfg: LeoConfig, run_dir: Path) -> None:
    """After the workers: what their trials measured (mode-choice.json, rank 0's) kept as
    wisdom for the next run with the same inputs and as calibration samples of this host; a
    write that fails only costs the next run its trials."""
    choice = read_choice(run_dir)
    if choice is None or choice.wisdom is None or not choice.measured_here:
        return
    path = Path(choice.wisdom)
    # Trials cut short serve runs as long as the one they were to repay over, no longer.
    cut = any(n.startswith(NOT_REPAID) for n in choice.notes.values())
    cut_to = epochs_to_repay(cfg) if cut else None
    wisdom = Wisdom(
        path.stem, choice.name, choice.rule or "", choice.measured_s, choice.notes,
        choice.spmm, choice.spmm_rule or "", choice.spmm_measured_s,
        cut_to or 0,
    )  # fmt: skip
    with contextlib.suppress(OSError):
        write_wisdom(path, wisdom)
        add_samples(calibration_path(path.parent.parent), samples(cfg, choice))


def samples(cfg: LeoConfig, chosen: ModeChoice) -> list[Sample]:
    """A calibration sample of every mode tried as the cost model predicted it (a variant of
    the planned mode's levels has no prediction of its own): its median step, with one new
    run id for the run's samples; or where it stopped after one or two timed steps, the
    first, with no run id (it stopped for being past the best: its ratio to the best would be over
    one by how it was chosen, so it makes no pair sample, planner/wisdom.py `pair_samples`)."""
    setting = setting_of(cfg)
    run = uuid.uuid4().hex[:16]
    out = []
    for name, median in chosen.measured_s.items():
        predicted = chosen.predicted_s.get(name)
        first = chosen.trial_s.get(name, {}).get(FIRST_STEP)
        measured, of_run = (median, run) if median is not None else (first, "")
        if measured is not None and predicted is not None and predicted > 0:
            out.append(Sample(name, predicted, measured, setting, of_run))
    return out


def setting_of(cfg: LeoConfig) -> dict[str, Any]:
    """What a calibration sample records of the run it came from (planner/wisdom.py
    `factors` compares on it)."""
    return {
        "workers": cfg.partition.num_parts,
        "nodes": cfg.launch.nnodes if cfg.launch.emulate is None else cfg.launch.emulate.nodes,
        "link": None if cfg.launch.emulate is None else cfg.launch.emulate.link,
        "model": cfg.model.name,
    }
