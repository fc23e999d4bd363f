"""`pipeline.mode=auto`: the exact mode the cache plan predicts fastest (or one nearly as fast
that moves rows through smaller buffers), chosen once by the parent (`leo train`) before any
worker starts.

`choose` takes the fastest of the modes this run can use (`candidates`) by the plan's
predicted step of every exact mode, unless one predicted within `pipeline.auto_margin` of it
moves rows through buffers smaller by more than that margin (`leanest`); without predictions
it runs the planned mode and says why.
The choice lands in the run folder: `resolved_config.yaml` holds the mode that runs,
`mode-choice.json` what was asked for and why.

Specification: docs/design/planning.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leo_cli.config import LeoConfig, load_config
from leo_cli.errors import ConfigError
from leo_cli.registry import auto_candidates, is_auto, mode_of, planned_mode, row_transport
from leo_cli.run_dir import RunDir
from leo_cli.util import files

if TYPE_CHECKING:  # planner/plan.py imports this module (through planner/reach.py)
    from leo_cli.planner.plan import CachePlan

CHOICE = RunDir.MODE_CHOICE


@dataclass(frozen=True)
class ModeChoice:
    """The mode a run uses and why.

    Attributes:
        requested: the `pipeline.mode` setting (`auto` or a mode).
        mode: the mode that runs.
        rule: for `auto`, why this mode (`predicted fastest`, within the margin with less
            memory, or the rule used without predictions); None for a mode set by name.
        predicted_s: the candidates' predicted steps it chose from (empty without a plan).
        buffer_bytes: the candidates' predicted bytes of buffers that move rows, all ranks
            together (empty without a plan).
    """

    requested: str
    mode: str
    rule: str | None = None
    predicted_s: dict[str, float | None] = field(default_factory=dict)
    buffer_bytes: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        """`leo (auto: predicted fastest, 0.053 s vs blocking 0.062 s)`: the rule, the mode's
        predicted step and the next fastest candidate's; the mode alone when it was set by
        name."""
        if self.rule is None:
            return self.mode
        others = [(t, n) for n, t in self.predicted_s.items() if n != self.mode and t is not None]
        own = self.predicted_s.get(self.mode)
        detail = self.rule
        if own is not None:
            detail += f", {own:.3f} s"
            if others:
                t, name = min(others)
                detail += f" vs {name} {t:.3f} s"
        return f"{self.mode} ({self.requested}: {detail})"

    def to_json(self) -> dict[str, Any]:
        return {
            "mode_requested": self.requested,
            "mode": self.mode,
            "mode_rule": self.rule,
            "mode_predicted_s": self.predicted_s,
            "mode_buffer_bytes": self.buffer_bytes,
        }


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


def choose(cfg: LeoConfig, plan: CachePlan | None, world_size: int) -> ModeChoice:
    """The mode this run uses (see the module docstring); a mode set by name is itself."""
    requested = cfg.pipeline.mode
    if not is_auto(requested):
        return ModeChoice(requested, requested)
    names = candidates(cfg)
    assert names and names[0] == planned_mode(), f"auto candidates {names}"
    if world_size == 1:
        return ModeChoice(requested, names[0], "one worker: no rows move, every mode runs alike")
    if plan is None:
        return ModeChoice(requested, names[0], "no cache plan with cache.policy=none")
    predicted = {n: plan.predicted_run.get(n) for n in names}
    buffers = {n: plan.buffer_bytes[n] for n in names if n in plan.buffer_bytes}
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


def with_mode(cfg: LeoConfig, mode: str) -> LeoConfig:
    """The config with `pipeline.mode` set to `mode` (validated: a chunk count stays
    allowed, since `auto` chose among the modes that chunk)."""
    pipeline = type(cfg.pipeline).model_validate({**cfg.pipeline.model_dump(), "mode": mode})
    return cfg.model_copy(update={"pipeline": pipeline})


def planning_config(cfg: LeoConfig) -> LeoConfig:
    """The config the cache plan is made for: under `auto`, the planned mode's (its levels
    are decided for it; the other modes are priced with what they can use of them)."""
    return with_mode(cfg, planned_mode()) if is_auto(cfg.pipeline.mode) else cfg


def resumed(cfg: LeoConfig, run_dir: Path) -> ModeChoice | None:
    """Under `auto` on resume: the mode the run started with (its resolved config), with the
    reasons recorded when it was chosen, if they name that mode; None when the resolved
    config names no mode yet (written by `leo partition`: no worker ever started).

    Raises:
        ConfigError: that mode is not one this config can run (another placement).
    """
    mode = load_config(RunDir(run_dir).config).pipeline.mode
    if is_auto(mode):
        return None
    if mode not in candidates(cfg):  # e.g. shared-memory, resumed across several machines
        raise ConfigError(
            f"Cannot resume {run_dir} with pipeline.mode=auto: the run started in "
            f"{mode}, which this config cannot run; resume with that run's launch settings "
            "or start a new run.out_dir."
        )
    saved = read_choice(run_dir)
    if saved is not None and saved.mode == mode and saved.rule is not None:
        return saved
    return ModeChoice(cfg.pipeline.mode, mode, "resumed: the mode the run started with")


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
        predicted = {str(k): None if v is None else float(v)
                     for k, v in dict(data.get("mode_predicted_s") or {}).items()}  # fmt: skip
        buffers = {str(k): int(v) for k, v in dict(data.get("mode_buffer_bytes") or {}).items()}
        rule = data.get("mode_rule")
        requested, mode = str(data["mode_requested"]), str(data["mode"])
    except (AttributeError, KeyError, TypeError, OverflowError) as exc:
        raise ValueError(f"not a mode choice ({exc})") from None
    return ModeChoice(requested, mode, None if rule is None else str(rule), predicted, buffers)


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
