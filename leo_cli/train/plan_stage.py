"""The cache-plan stage of a run: part profiles + hardware profile + policy -> cache-plan.json.

`leo profile-cache` runs it on its own; `leo train` runs it before starting workers when the
plan is missing or stale. The hardware profile comes from `--hardware FILE` or
`cache.hardware`, else from the run folder's hardware.json when it was measured with as many
workers, else from a short probe through the same launcher as training.
"""

from __future__ import annotations

import json
from pathlib import Path

from leo_cli.cache.hardware import HardwareProfile
from leo_cli.cache.plan import CachePlan, make_plan, model_shape, plan_key, read_plan, write_plan
from leo_cli.cache.profile import PartProfile
from leo_cli.config import LeoConfig
from leo_cli.graph.stage import partition_dir
from leo_cli.graph.storage import read_meta, read_part
from leo_cli.train.probe import run_probe

HARDWARE = "hardware.json"
DTYPE_BYTES = {"float32": 4, "float64": 8}


def part_profiles(run_dir: Path) -> tuple[dict[str, object], list[PartProfile]]:
    """META.json and the profile of every part (memory-mapped: features stay on disk)."""
    root = partition_dir(run_dir)
    meta = read_meta(root)
    num_parts = int(meta["num_parts"])
    profiles = [
        PartProfile.from_part(read_part(root, r, verify=False, mmap=True)) for r in range(num_parts)
    ]
    return meta, profiles


def hardware_profile(
    cfg: LeoConfig, run_dir: Path, given: Path | None, num_workers: int
) -> HardwareProfile:
    """The given profile, the run folder's (if measured with as many workers), or a probe."""
    path = given or cfg.cache.hardware
    if path is not None:
        return HardwareProfile.read(Path(path))
    saved = run_dir / HARDWARE
    if saved.is_file():
        hw = HardwareProfile.read(saved)
        if hw.world_size == num_workers:
            return hw
    return run_probe(cfg, run_dir)


def ensure_plan(
    cfg: LeoConfig,
    run_dir: Path,
    hardware: Path | None = None,
    force: bool = False,
    always: bool = False,
) -> CachePlan | None:
    """The run's cache plan, made when missing or stale.

    Training needs none with `cache.policy=none` (None is returned); `always` makes one
    anyway (`leo profile-cache` shows the predictions of every mode).
    """
    if cfg.cache.policy == "none" and not always:
        return None
    meta, profiles = part_profiles(run_dir)
    dataset = meta["dataset"]
    assert isinstance(dataset, dict)
    hw = hardware_profile(cfg, run_dir, hardware, len(profiles))
    key = plan_key(meta, cfg.model, cfg.cache, cfg.train.dtype, hw)
    existing = read_plan(run_dir)
    if existing is not None and existing.key == key and not force:
        return existing
    shape = model_shape(
        cfg.model,
        int(dataset["num_features"]),
        int(dataset["num_classes"]),
        DTYPE_BYTES[cfg.train.dtype],
    )
    plan = make_plan(cfg.cache, profiles, shape, hw, key)
    write_plan(run_dir, plan)
    return plan


def predicted_time(run_dir: Path, mode: str, policy: str) -> float | None:
    """The plan's predicted step time of `mode` (`leo-no-cache` for the pipeline without a
    cache), if the run folder has a plan."""
    if mode == "leo" and policy == "none":
        mode = "leo-no-cache"
    path = run_dir / "cache-plan.json"
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())["predicted_epoch_time_s"].get(mode)
    except (OSError, ValueError, KeyError, AttributeError):
        return None
    return float(value) if value is not None else None
