"""The hardware profile store: where a profile is kept between runs and when one may be
reused (measured here, with this torch and kernels, as many workers, threads, placement and
allocator),
and the load rule that keeps a profile measured on a busy machine out of the store: such a
profile is kept beside it (`busy_cache`) and serves later runs only while the machine is
busy too (`busy_now`), so runs on a machine that stays shared plan alike (and reuse their
trials' wisdom) instead of probing, and so planning, anew each time.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import torch

from leo_cli.config import LeoConfig
from leo_cli.errors import CacheError
from leo_cli.harness.placement import affinity_tag
from leo_cli.harness.process import LINKS_ENV
from leo_cli.kernels import backend_name
from leo_cli.planner.profile.hardware import HIGH_LOAD_SHARE, HardwareProfile, ProbeLoad
from leo_cli.planner.profile.machine_load import LoadMeter
from leo_cli.run_dir import RunDir


def machine_cache(num_workers: int, threads: str, cache_dir: Path | None = None) -> Path:
    """Where this machine's profile for a worker count and placement is kept between runs.

    `threads` is launch/stages.py `placement`. The folder: `LEO_HARDWARE_CACHE`, else `hardware/` in
    `cache_dir` (`run.cache_dir`, when set), else ~/.cache/leo/hardware.
    """
    home = Path.home() / ".cache" / "leo" / "hardware"
    given = os.environ.get("LEO_HARDWARE_CACHE")
    root = given or (Path(cache_dir) / "hardware" if cache_dir is not None else home)
    quick = "-quick" if quick_probe() else ""  # never in place of a full profile
    kernels = "-cpu" if cpu_kernels(backend_name()) else ""  # other aggregation rates
    name = (
        f"{socket.gethostname()}-p{num_workers}-t{threads}-torch{torch.__version__}{kernels}"
        f"{quick}.json"
    )
    return Path(root) / name


def busy_cache(store: Path) -> Path:
    """Where the profile of a probe taken under load is kept beside `store`'s."""
    return store.with_name(f"{store.stem}-busy{store.suffix}")


BUSY_SAMPLE_S = 0.5  # how long `busy_now` watches the machine


def busy_now(seconds: float = BUSY_SAMPLE_S) -> ProbeLoad | None:
    """The other processes' load over the next `seconds` where it is over `load_limit` (as a
    probe's would be judged), else None."""
    with LoadMeter() as meter:
        time.sleep(seconds)
    load = meter.result()
    return load if load.high(load_limit()) else None


def placement_of(hw: HardwareProfile) -> str:
    """`placement` of the launch that measured a profile."""
    return f"{hw.threads_per_worker}{affinity_tag(hw.cpu_affinity)}{allocator_tag(hw.allocator)}"


def allocator_tag(name: str) -> str:
    """The allocator's part of a placement tag (none for the system's: older names stand)."""
    return "" if name == "system" else f"-{name}"


def matches(hw: HardwareProfile, num_workers: int, threads: str) -> bool:
    """Measured here, with this torch and CPU kernels (`cpu_kernels`), as many workers,
    threads and the same placement, at the probe sizes asked for (`LEO_PROBE_QUICK`)."""
    return (
        hw.world_size == num_workers
        and placement_of(hw) == threads
        and hw.hostname == socket.gethostname()
        and hw.torch_version == torch.__version__
        and cpu_kernels(hw.kernels_backend) == cpu_kernels(backend_name())
        and hw.quick == quick_probe()
    )


def cpu_kernels(kernels_backend: str) -> bool:
    """Whether a `kernels.backend_name()` includes LEO's CPU SpMM: it aggregates at other rates
    than the reference, so a profile measured with one is not reused with the other (the CUDA
    kernels do not matter here: the probe measures the CPU)."""
    return "cpu" in kernels_backend.split("+")


def quick_probe() -> bool:
    """`LEO_PROBE_QUICK=1`: probe with the tiny sizes (a few seconds, rough rates; the test
    suite's setting: its plans need rates, not good ones). Profiles say `quick`. On several
    machines the probe's rank 0 (node 0's, but under `launch.nnodes: MIN:MAX` whichever node
    the rendezvous ranks first) decides for every rank (`probe.agreed_quick`):
    nodes reading their own environments could disagree on the sizes and wait for each
    other's probe collectives."""
    raw = os.environ.get("LEO_PROBE_QUICK", "0")
    if raw not in ("0", "1"):
        raise CacheError(f"LEO_PROBE_QUICK={raw!r} must be 1 (tiny probe sizes) or 0.")
    return raw == "1"


def fits_nodes(hw: HardwareProfile, cfg: LeoConfig, num_workers: int) -> bool:
    """A profile of a multi-node run that every node agrees to reuse: as many machines and
    workers, the same placement, and the allocator `launch.allocator` names (each node's
    threads may differ, and under `auto` so may its allocator, as may one the user preloads
    (launch/allocator.py); the config may not)."""
    setting = cfg.launch.allocator
    return (
        hw.world_size == num_workers
        and hw.nnodes == cfg.launch.nnodes
        and hw.cpu_affinity == cfg.launch.cpu_affinity
        and (setting == "auto" or hw.allocator in (setting, "user"))
        and [r.link for r in hw.ranks] == rank_links(num_workers, cfg.launch.nnodes)
    )


def same_rank(hw: HardwareProfile, rank: int) -> bool:
    """Whether `rank`'s entry of a profile was measured where this process runs as that rank
    now: on this host, with this torch and as many threads. Each rank of a several-machine run
    asks it of its own entry (only it knows its host), and the ranks reuse a profile only when
    every one says yes (`probe.py --keep-if-same`): which node is which counts too."""
    if rank >= len(hw.ranks) or hw.ranks[rank].rank != rank:
        return False
    mine = hw.ranks[rank]
    return (
        mine.hostname == socket.gethostname()
        and hw.torch_version == torch.__version__
        and mine.threads == torch.get_num_threads()
        and cpu_kernels(hw.kernels_backend) == cpu_kernels(backend_name())
    )


def rank_links(num_workers: int, nnodes: int) -> list[str | None]:
    """Each rank's node uplink as the probe would record it now: emulated nodes' rates
    (`launch.emulate`, from the environment every node gets alike), None on real machines."""
    rates = os.environ.get(LINKS_ENV)
    if not rates:
        return [None] * num_workers
    per_node = rates.split(",")
    per = max(num_workers // max(nnodes, 1), 1)
    return [per_node[min(r // per, len(per_node) - 1)] for r in range(num_workers)]


def saved_profile(path: Path) -> HardwareProfile | None:
    """A saved copy, or None when it is missing or unreadable (a cache: probe again)."""
    if not path.is_file():
        return None
    try:
        return HardwareProfile.read(path)
    except CacheError:
        return None


def load_limit() -> float:
    """Share of the cores other processes may keep busy during a probe that is saved for the
    whole machine (`LEO_PROBE_LOAD_LIMIT`, default 0.25; a machine that is always shared may
    raise it)."""
    raw = os.environ.get("LEO_PROBE_LOAD_LIMIT")
    try:
        limit = float(raw) if raw else HIGH_LOAD_SHARE
    except ValueError:
        raise CacheError(
            f"LEO_PROBE_LOAD_LIMIT={raw!r} is not a number; give a share of the cores such as 0.5."
        ) from None
    if not limit >= 0:  # also NaN
        raise CacheError(f"LEO_PROBE_LOAD_LIMIT={raw!r} must be a share of the cores >= 0.")
    return limit


def busy_note(load: ProbeLoad, run_dir: Path) -> str:
    """The sentence for a probe measured while other processes kept the machine busy."""
    what = (
        f"other processes kept {load.other_cpu:.1f} of {load.num_cpus} cores busy"
        if load.other_cpu is not None
        else f"the load average was {load.load_avg_1m:.1f} on {load.num_cpus} cores"
    )
    return (
        f"note: {what} while the hardware probe ran, so its rates are this machine's under "
        f"load: kept in {RunDir(run_dir).hardware}, and for later runs only while the machine "
        "is busy too; probe again on a quiet machine with `leo profile-cache --force`."
    )


def busy_reuse_note(load: ProbeLoad, path: Path) -> str:
    """The sentence for a later run that reuses a profile measured under load."""
    return (
        f"note: other processes keep {load.other_cpu or load.load_avg_1m:.1f} of "
        f"{load.num_cpus} cores busy, so this run reuses {path}, measured under load too "
        "(probe again on a quiet machine with `leo profile-cache --force`)."
    )
