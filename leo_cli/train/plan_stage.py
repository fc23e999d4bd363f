"""The cache-plan stage of a run: part profiles + hardware profile + policy -> cache-plan.json.

`leo profile-cache` runs it on its own; `leo train` runs it before starting workers when the
plan is missing or stale. The hardware profile comes from `--hardware FILE` or
`cache.hardware`, else from the run folder's hardware.json or this machine's saved profile
when measured with as many workers and threads, else from a short probe through the same
launcher as training (then saved in both places).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path

import torch

from leo_cli.cache.hardware import HardwareProfile
from leo_cli.cache.plan import CachePlan, make_plan, model_shape, plan_key, read_plan, write_plan
from leo_cli.cache.profile import PartProfile
from leo_cli.config import LeoConfig
from leo_cli.graph.stage import partition_dir
from leo_cli.graph.storage import read_meta, read_part
from leo_cli.train.launch import worker_threads, workers_per_node
from leo_cli.train.probe import run_probe

HARDWARE = "hardware.json"
DTYPE_BYTES = {"float32": 4, "float64": 8}


def part_profiles(run_dir: Path, num_parts: int) -> list[PartProfile]:
    """The profile of every part (checksums verified; memory-mapped: features stay on disk)."""
    root = partition_dir(run_dir)
    return [PartProfile.from_part(read_part(root, r, mmap=True)) for r in range(num_parts)]


def machine_cache(num_workers: int, threads: str) -> Path:
    """Where this machine's profile for a worker count is kept between runs.

    `LEO_HARDWARE_CACHE` names the folder (default ~/.cache/leo/hardware).
    """
    root = os.environ.get("LEO_HARDWARE_CACHE") or Path.home() / ".cache" / "leo" / "hardware"
    name = f"{socket.gethostname()}-p{num_workers}-t{threads}-torch{torch.__version__}.json"
    return Path(root) / name


def matches(hw: HardwareProfile, num_workers: int, threads: str) -> bool:
    return hw.world_size == num_workers and str(hw.threads_per_worker) == threads


def hardware_profile(
    cfg: LeoConfig, run_dir: Path, given: Path | None, num_workers: int, reprobe: bool = False
) -> HardwareProfile:
    """The given profile; else the run folder's or this machine's saved one when it was
    measured with as many workers and threads; else a probe (saved in both places)."""
    path = given or cfg.cache.hardware
    if path is not None:
        return HardwareProfile.read(Path(path))
    threads = worker_threads(workers_per_node(cfg))
    cached = machine_cache(num_workers, threads)
    for saved in (run_dir / HARDWARE, cached):
        if saved.is_file() and not reprobe:
            hw = HardwareProfile.read(saved)
            if matches(hw, num_workers, threads):
                if saved == cached:
                    hw.write(run_dir / HARDWARE)
                return hw
    hw = run_probe(cfg, run_dir)
    with contextlib.suppress(OSError):  # an unwritable home only costs a probe next time
        hw.write(cached)
    return hw


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
    meta = read_meta(partition_dir(run_dir))
    dataset = meta["dataset"]
    num_parts = int(meta["num_parts"])
    hw = hardware_profile(cfg, run_dir, hardware, num_parts, reprobe=force)
    key = plan_key(meta, cfg.model, cfg.cache, cfg.train.dtype, hw)
    existing = read_plan(run_dir)
    if existing is not None and existing.key == key and not force:
        return existing
    profiles = part_profiles(run_dir, num_parts)
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
