"""The hardware probe, launched: the same launcher as `leo train` (one worker per part) runs
`python -m leo_cli.planner.profile.probe`, whose rank 0 writes `<run_dir>/hardware.json`; the
probe's own logs and heartbeats go to `<run_dir>/probe/`, apart from training's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from leo_cli.config import LeoConfig
from leo_cli.config.schema import LaunchConfig
from leo_cli.errors import CacheError, TrainError
from leo_cli.launch.elastic import launch_module
from leo_cli.planner.profile.hardware import HARDWARE_FILE, HardwareProfile
from leo_cli.planner.profile.machine_load import LoadMeter
from leo_cli.planner.profile.store import saved_profile
from leo_cli.run_dir import RunDir

# The memory settings a probe launches with: the defaults, whatever the run's `launch` says.
MEMORY_SETTINGS = ("keep_freed_memory", "huge_pages")

PROBE_FOLDER = RunDir.PROBE


def run_probe(
    cfg: LeoConfig, run_dir: Path, quick: bool = False, keep: bool = False
) -> HardwareProfile:
    """Measure this machine (every node, on several) with `partition.num_parts` workers;
    returns the written profile.

    Args:
        cfg: the run's config (its `launch` and `partition` sections shape the launch).
        run_dir: the run folder; receives `hardware.json` and `probe/logs`.
        quick: tiny sizes (a few seconds; rough rates, for tests).
        keep: the run folder's profile stays when every probe rank finds its own entry
            measured where it runs now (several machines: which host is which node counts;
            planner/profile/store.py `same_rank`); measured again otherwise.

    Raises:
        CacheError: a probe worker failed (the message says where its log is).
    """
    run_dir = run_dir.resolve()
    work_dir = run_dir / PROBE_FOLDER
    if cfg.launch.node_rank == 0:  # before any node's probe workers start (they rendezvous)
        shutil.rmtree(work_dir, ignore_errors=True)  # logs and heartbeats of an earlier probe
    out = run_dir / HARDWARE_FILE
    args = [str(out), "--timeout-s", str(cfg.launch.timeout_s), "--heartbeat-dir", str(work_dir)]
    args += ["--keep-if-same"] if keep else []
    before = saved_profile(out) if keep else None
    try:
        # Launched with the defaults' memory settings, whatever `launch` says: a profile is
        # keyed by the allocator's name alone (docs/design/memory.md).
        fixed = {key: LaunchConfig.model_fields[key].default for key in MEMORY_SETTINGS}
        probed = cfg.model_copy(update={"launch": cfg.launch.model_copy(update=fixed)})
        with LoadMeter() as load:
            launch_module(
                probed, work_dir, "leo_cli.planner.profile.probe", args + ["--quick"] * quick
            )
    except TrainError as exc:
        raise CacheError(f"The hardware probe failed: {exc}") from None
    hw = HardwareProfile.read(out)
    if cfg.launch.node_rank > 0 or hw == before:  # rank 0, on node 0, wrote a new one
        return hw
    hw = hw.model_copy(update={"load": load.result()})  # node 0 records the load
    hw.write(out)  # what else ran is part of what was measured
    return hw
