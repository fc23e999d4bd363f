"""Workers forked from a server that imported torch and LEO's worker once (CPU workers).

Started as `python -m leo_cli.worker.entry`, every worker pays the interpreter's start and its
imports (torch; torch._dynamo, which torch.optim imports; LEO: seconds of a core) before its
first collective. torch elastic starts a callable entry point through multiprocessing; under
the `forkserver` start method one server per launching process imports those modules once, and
the workers of every launch from that process (the probe's, training's, restarts) are forked
from it. A worker then runs as `python -m` would have run it (`comm/process.py run_started`):
the launch's environment, a process of its own, nothing of the launcher's.

What a process reads as it starts or imports torch (the allocator's LD_PRELOAD and malloc
settings, OMP_NUM_THREADS, LEO_KERNELS) is the server's: a launch whose environment differs
from the one the server started in starts a new server. Workers that may use a GPU start by
spawn, as before: the server's imports may touch CUDA (the kernels' first use), which a forked
child cannot inherit.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from multiprocessing import forkserver
from typing import Any

import torch

from leo_cli.comm.placement import AFFINITY_ENV
from leo_cli.comm.process import run_started
from leo_cli.comm.segments import JOB_ENV
from leo_cli.config import LeoConfig

# Imported by the server: torch.optim imports torch._dynamo at its first use.
PRELOAD = ("torch._dynamo", "leo_cli.worker.entry", "leo_cli.planner.profile.probe")
# Read after a worker started: by the worker itself (comm/segments.py, comm/placement.py) or by
# torch elastic, which sets its own per worker and per launch.
AFTER_START = (JOB_ENV, AFFINITY_ENV)
AFTER_START_PREFIX = "TORCHELASTIC_"

# The server this process started: (its environment, its preload, its pid).
_server: tuple[dict[str, str], tuple[str, ...], int | None] | None = None


def forks_workers(cfg: LeoConfig) -> bool:
    """Whether this launch's workers are forked from the server (they run on the CPU)."""
    device = cfg.launch.device
    return device == "cpu" or (device == "auto" and not torch.cuda.is_available())


def ensure_server(module: str) -> None:
    """Have a server running that this process started in its present environment, with
    `module` among its imports (which run beside whatever this process does next). Another
    one (a server of another environment, or one that something else in this process
    started) is stopped first."""
    global _server
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in AFTER_START and not k.startswith(AFTER_START_PREFIX)
    }
    preload = tuple(dict.fromkeys((*PRELOAD, module)))
    server: Any = forkserver._forkserver
    if _server != (env, preload, server._forkserver_pid):
        server._stop()  # none running: nothing to stop
        multiprocessing.set_forkserver_preload(list(preload))
        server.ensure_running()
        _server = (env, preload, server._forkserver_pid)


def server_pid() -> int | None:
    """The pid of the server this process started (the parent of its forked workers)."""
    return None if _server is None else _server[2]


def entry_point(cfg: LeoConfig, module: str, args: list[str]) -> tuple[Any, list[Any], str]:
    """The elastic launch's entry point, its arguments and its start method: `run_started` in
    workers forked from the server, else `python -m module args` by spawn."""
    if forks_workers(cfg):
        ensure_server(module)
        return run_started, [module, args, dict(os.environ)], "forkserver"
    return sys.executable, ["-m", module, *args], "spawn"
