"""Wisdom: what `auto`'s trials measured, kept in the cache so that a later run with the same
inputs trains the winner at once (FFTW's wisdom, cuDNN's benchmark cache).

One file per key, `<cache>/wisdom/<key>.json`. The key (`wisdom_key`) covers what decides the
trials: the partitions and the plan (graph, parts, model, cache settings, hardware profile),
the model's shape and dtypes, the halo dtype and transport, the SpMM (`pipeline.spmm`), the
workers and their placement, this host, torch and the kernels, and the candidates. The
parent computes it and reads the file (`read_wisdom`); rank 0 of the workers writes it after
the trials (`write_wisdom`).

Calibration: every trial of a mode the cost model predicted adds a sample (predicted and
measured step, and the setting) to this host's file in the same folder; a mode's factor
(measured over predicted, the median of its newest samples of the closest setting: `factors`)
scales its later predictions on this host (`calibrated`): a factor per mode and setting, not a
refit of the probe's stage rates. How far those samples stray from their median is the
calibrated prediction's error (`errors`): under `measure` a candidate slower than another
beyond both errors is not tried (planner/auto_mode.py `surely_slower`). The samples of one
run's trials share a run id; between two modes measured in the same run, measured ratio over
predicted ratio is a sample of that pair (`pair_factors`): the host's load, which slows every mode
of a run alike, cancels there, while it moves each mode's own factor from run to run.

Specification: docs/design/planning.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from leo_cli.config import LeoConfig
from leo_cli.errors import CacheError
from leo_cli.util import files

FORMAT_VERSION = 2  # 2: with the CPU SpMM variant
FOLDER = "wisdom"
# Launch settings that change how fast a candidate runs (not where the run folder is).
PLACEMENT_KEYS = (
    "nproc", "nnodes", "device", "backend", "cpu_affinity", "allocator", "keep_freed_memory",
    "huge_pages", "emulate",
)  # fmt: skip


@dataclass(frozen=True)
class Wisdom:
    """What trials measured: the winning candidate, every candidate's median step (None:
    stopped early), why some were not tried or stopped, and the rule the winner won by;
    likewise the CPU SpMM variant (`spmm`; `auto` where none was tried). `cut_to_epochs`:
    the run length the trials were cut to (auto_mode `epochs_to_repay`), where some candidate
    was left out because its trial would not repay itself over it (auto_mode `payback`; 0:
    none was), so that a longer run measures again (`trusted_for`)."""

    key: str
    winner: str
    rule: str
    measured_s: dict[str, float | None]
    notes: dict[str, str]
    spmm: str = "auto"
    spmm_rule: str = ""
    spmm_measured_s: dict[str, float | None] = field(default_factory=dict)
    cut_to_epochs: int = 0

    def trusted_for(self, epochs: int) -> bool:
        """Whether a run of `epochs` may train this winner untried: the trials were not cut
        short, or cut for a run at least as long (a longer one may repay what they left out)."""
        return self.cut_to_epochs == 0 or epochs <= self.cut_to_epochs

    def to_json(self) -> dict[str, Any]:
        data = {
            "format_version": FORMAT_VERSION,
            "key": self.key,
            "winner": self.winner,
            "rule": self.rule,
            "measured_s": self.measured_s,
            "notes": self.notes,
            "spmm": self.spmm,
            "spmm_rule": self.spmm_rule,
            "spmm_measured_s": self.spmm_measured_s,
            "cut_to_epochs": self.cut_to_epochs,
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        return {**data, "digest": content_digest(data)}


def content_digest(data: dict[str, Any]) -> str:
    """The sha256 of a wisdom file's fields but its digest (an edit that keeps the JSON
    valid changes it)."""
    fields = {k: v for k, v in data.items() if k != "digest"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def wisdom_key(cfg: LeoConfig, inputs: list[str], kernels: str, names: list[str]) -> str:
    """The digest of what decides a run's trials (see the module docstring). `inputs`: the
    partitions' and plan's digests (graph, cache settings, hardware profile); `kernels`: the
    kernel backend's name; `names`: the candidates (their set: calibration may reorder
    them)."""
    launch = cfg.launch.model_dump(mode="json")
    material = {
        "format": FORMAT_VERSION,
        "inputs": inputs,
        "model": cfg.model.model_dump(mode="json"),
        "dtype": cfg.train.dtype,
        "pipeline": cfg.pipeline.model_dump(
            mode="json", include={"halo_dtype", "transport", "num_chunks", "trial_steps", "spmm"}
        ),
        "parts": cfg.partition.num_parts,
        "launch": {k: launch[k] for k in PLACEMENT_KEYS},
        "host": [platform.node(), platform.machine(), os.cpu_count()],
        "torch": torch.__version__,
        "kernels": kernels,
        "candidates": sorted(names),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def wisdom_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / FOLDER / f"{key}.json"


def _steps(data: Any) -> dict[str, float | None]:
    return {str(k): None if v is None else float(v) for k, v in dict(data).items()}


def read_wisdom(path: Path, names: list[str], variants: list[str] | None = None) -> Wisdom | None:
    """The wisdom kept at `path`, or None where there is none.

    Raises:
        CacheError: the file is there but is not wisdom for this key, these candidates and
            these SpMM `variants` (unreadable, edited, another LEO's): one sentence naming it.
    """
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        wisdom = Wisdom(
            key=str(data["key"]),
            winner=str(data["winner"]),
            rule=str(data["rule"]),
            measured_s=_steps(data["measured_s"]),
            notes={str(k): str(v) for k, v in dict(data.get("notes") or {}).items()},
            spmm=str(data["spmm"]),
            spmm_rule=str(data["spmm_rule"]),
            spmm_measured_s=_steps(data["spmm_measured_s"]),
            cut_to_epochs=int(data.get("cut_to_epochs") or 0),
        )
        version, digest = data["format_version"], data.get("digest")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
        raise CacheError(f"{path} is not readable wisdom ({type(exc).__name__})") from None
    if version != FORMAT_VERSION or wisdom.key != path.stem:
        raise CacheError(f"{path} was written for another key or by another LEO")
    if digest != content_digest(data):
        raise CacheError(f"{path} was edited after it was written (its digest differs)")
    every = [*wisdom.measured_s.values(), *wisdom.spmm_measured_s.values()]
    steps = [t for t in every if t is not None]
    # (no mode measured: the run trained the cost model's pick, its other trials unrepaid)
    unmeasured = wisdom.measured_s and wisdom.measured_s.get(wisdom.winner) is None
    if names and (wisdom.winner not in names or unmeasured):
        raise CacheError(f"{path} names a winner ({wisdom.winner!r}) that was not measured here")
    # (no variant measured: the step made no CPU SpMM, and the variant stayed as set)
    if (
        variants
        and wisdom.spmm_measured_s
        and (wisdom.spmm not in variants or wisdom.spmm_measured_s.get(wisdom.spmm) is None)
    ):
        raise CacheError(f"{path} names an SpMM ({wisdom.spmm!r}) that was not measured here")
    if not all(0 < t < math.inf for t in steps):
        raise CacheError(f"{path} holds a step that is not a positive number of seconds")
    return wisdom


def write_wisdom(path: Path, wisdom: Wisdom) -> None:
    """Keep `wisdom` at `path` (atomic: a reader sees the old file or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_json(path, wisdom.to_json())


# --- calibration: what trials measured against what the cost model predicted ---

CALIBRATION_FORMAT = 1  # the calibration file's own version (wisdom's moves alone)
CALIBRATION_KEEP = 200  # samples a host's file keeps (the newest)
CALIBRATION_RECENT = 10  # a mode's factor is the median over its newest samples


@dataclass(frozen=True)
class Sample:
    """One trial of a mode: its predicted and measured step, the setting it ran in, and the
    run whose trials measured it (shared by that run's samples; empty: not known)."""

    mode: str
    predicted_s: float
    measured_s: float
    setting: dict[str, Any]
    run: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "predicted_s": self.predicted_s,
            "measured_s": self.measured_s,
            "setting": self.setting,
            **({"run": self.run} if self.run else {}),
        }


def calibration_path(cache_dir: Path) -> Path:
    """This host's calibration file in the cache (one per host: a cache may be shared)."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", platform.node()) or "host"
    return cache_dir / FOLDER / f"calibration-{host}.json"


def read_samples(path: Path) -> list[Sample]:
    """The samples kept at `path`, oldest first; none where there is no file.

    Raises:
        CacheError: the file is there but does not hold samples (one sentence naming it).
    """
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
        if data["format_version"] != CALIBRATION_FORMAT:
            raise ValueError("another format")
        samples = [
            Sample(str(s["mode"]), float(s["predicted_s"]), float(s["measured_s"]),
                   dict(s.get("setting") or {}), str(s.get("run") or ""))
            for s in data["samples"]
        ]  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
        raise CacheError(
            f"{path} does not hold calibration samples ({type(exc).__name__})"
        ) from None
    if not all(0 < s.predicted_s < math.inf and 0 < s.measured_s < math.inf for s in samples):
        raise CacheError(f"{path} holds a step that is not a positive number of seconds")
    return samples


# What a setting is compared on, from the closest match down: the whole setting, then
# without the worker count (the same model across the same links), then the same model
# anywhere. Never another model's: how far the probe misses differs most with the model, so
# a factor borrowed across models is worse than none (docs/results/2026-12-07-regret-grid-more.md).
SETTING_TIERS: tuple[tuple[str, ...] | None, ...] = (
    None, ("model", "nodes", "link"), ("model",)
)  # fmt: skip


def factors(
    samples: list[Sample],
    setting: dict[str, Any] | None = None,
    tiers: tuple[tuple[str, ...] | None, ...] = SETTING_TIERS,
) -> dict[str, float]:
    """Per mode, measured over predicted step: the median over its newest samples (what the
    cost model's prediction of that mode is multiplied by on this host); with `setting`, over
    the samples of the closest setting the mode has any of (`SETTING_TIERS`): how far the
    cost model misses differs with the model, the links and the workers."""
    return {m: statistics.median(r) for m, r in _ratios(samples, setting, tiers).items()}


# The fewest samples whose spread is taken as a factor's error (`errors`): one sample has no
# spread, two deviate from their median by the same amount.
ERROR_SAMPLES = 3


def errors(
    samples: list[Sample],
    setting: dict[str, Any] | None = None,
    fewest: int = ERROR_SAMPLES,
    tiers: tuple[tuple[str, ...] | None, ...] = SETTING_TIERS,
) -> dict[str, float]:
    """Per mode with `fewest` samples at least among those its factor is the median of
    (`factors`), how far they stray from it: the largest |ratio / median - 1|. A prediction
    calibrated by that factor missed the measured step by as much."""
    out = {}
    for mode, ratios in _ratios(samples, setting, tiers).items():
        if len(ratios) >= fewest:
            median = statistics.median(ratios)
            out[mode] = max(abs(r / median - 1) for r in ratios)
    return out


# The fewest runs whose spread is taken as a pair's error (`pair_factors`): a judgement. A
# new run's ratio falls outside the range of n earlier ones about 2 / (n + 1) of the time (50%
# at 3); the runs behind it: docs/results/2026-12-07-trial-cost.md.
PAIR_SAMPLES = 5


def pair_factors(
    samples: list[Sample], setting: dict[str, Any] | None = None
) -> dict[tuple[str, str], tuple[float, float]]:
    """Per ordered pair of modes (x, y) measured in the same run `PAIR_SAMPLES` times at
    least, in `setting` itself (no closer setting stands in, as for `factors`: a mode left
    out at one worker count for runs at another would never be measured at this one): the
    factor by which x's measured step over y's differed from the cost model's predicted
    ratio (the median over those runs), and that factor's error (`errors`: how far its runs
    strayed from it)."""
    pairs = pair_samples(samples)
    exact = (None,)  # SETTING_TIERS' first: the same setting
    factor = factors(pairs, setting, exact)
    return {
        (x, y): (factor[name], error)
        for name, error in errors(pairs, setting, PAIR_SAMPLES, exact).items()
        for x, _, y in [name.partition(OVER)]
    }


OVER = " over "  # how a pair sample names its modes (`leo over blocking`)


def pair_samples(samples: list[Sample]) -> list[Sample]:
    """Of every two samples of different modes from the same run (their `run` id; none
    without), a sample of the pair: x's over y's measured step, against x's over y's
    predicted step, in that run's setting. Only the newest `CALIBRATION_RECENT` runs of each
    setting count, those that measured the pair or not: a mode left out for a pair's ratio
    adds no sample of it, so it is tried again once too few of the runs of its setting did."""
    by_run: dict[str, list[Sample]] = {}
    for s in samples:
        if s.run:
            by_run.setdefault(s.run, []).append(s)
    runs: dict[str, list[str]] = {}  # run ids per setting, oldest first
    for run, kept in by_run.items():
        runs.setdefault(json.dumps(kept[0].setting, sort_keys=True), []).append(run)
    recent = {r for ids in runs.values() for r in ids[-CALIBRATION_RECENT:]}
    by_run = {r: kept for r, kept in by_run.items() if r in recent}
    return [
        Sample(f"{x.mode}{OVER}{y.mode}", x.predicted_s / y.predicted_s,
               x.measured_s / y.measured_s, x.setting, run)
        for run, kept in by_run.items()
        for x in kept
        for y in kept
        if x.mode != y.mode
    ]  # fmt: skip


def _ratios(
    samples: list[Sample],
    setting: dict[str, Any] | None,
    tiers: tuple[tuple[str, ...] | None, ...] = SETTING_TIERS,
) -> dict[str, list[float]]:
    """Per mode, measured over predicted step of its newest samples of the closest setting
    it has any of (`tiers`; any setting without `setting`)."""
    by_mode: dict[str, list[Sample]] = {}
    for s in samples:
        by_mode.setdefault(s.mode, []).append(s)
    out = {}
    for mode, kept in by_mode.items():
        for keys in tiers if setting is not None else ((),):
            close = [s for s in kept if _matches(s.setting, setting or {}, keys)]
            if close:
                out[mode] = [s.measured_s / s.predicted_s for s in close][-CALIBRATION_RECENT:]
                break
    return out


def _matches(a: dict[str, Any], b: dict[str, Any], keys: tuple[str, ...] | None) -> bool:
    """Whether two settings agree on `keys` (None: on every key)."""
    if keys is None:
        return a == b
    return all(a.get(k) == b.get(k) for k in keys)


def calibrated(
    predicted: dict[str, float | None], scale: dict[str, float]
) -> dict[str, float | None]:
    """The predictions of the modes this host has a factor for, scaled by it."""
    return {m: t * scale[m] for m, t in predicted.items() if t is not None and m in scale}


def add_samples(path: Path, samples: list[Sample]) -> None:
    """Keep `samples` after those at `path` (the newest `CALIBRATION_KEEP`); a file that
    holds none is replaced."""
    try:
        kept = read_samples(path)
    except CacheError:
        kept = []
    every = [s.to_json() for s in [*kept, *samples][-CALIBRATION_KEEP:]]
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_json(path, {"format_version": CALIBRATION_FORMAT, "samples": every})
