"""Workers forked from a server that imported torch and LEO's worker once (a CPU-only torch).

Started as `python -m leo_cli.worker.entry`, every worker pays the interpreter's start and its
imports (torch; torch._dynamo, which torch.optim imports; LEO: seconds of a core) before its
first collective. torch elastic starts a callable entry point through multiprocessing; under
the `forkserver` start method one server per launching process imports those modules once, and
the workers of every launch from that process (the probe's, training's, restarts) are forked
from it. A worker then runs as `python -m` would have run it (`comm/process.py run_started`):
in the launch's environment and working directory, in a session of its own, with its threads
set from the launch's OMP_NUM_THREADS, and without running the launching script again
(`launching`).

What a process reads as it starts or imports torch (the allocator's LD_PRELOAD and malloc
settings, LEO_KERNELS) is the server's: a launch whose environment differs from the one the
server started in starts a new server. With a CUDA build of torch, workers start by spawn as
before: the server's imports may touch a GPU (the kernels' first use), which a forked child
cannot inherit.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import sys
from collections.abc import Iterator
from multiprocessing import forkserver
from typing import Any

import torch

from leo_cli.comm.placement import AFFINITY_ENV
from leo_cli.comm.process import run_started
from leo_cli.comm.segments import JOB_ENV

# Imported by the server: torch.optim imports torch._dynamo at its first use.
PRELOAD = ("torch._dynamo", "leo_cli.worker.entry", "leo_cli.planner.profile.probe")
# Read after a worker started: by the worker itself (comm/segments.py, comm/placement.py,
# comm/process.py sets its threads) or by torch elastic, which sets its own per worker and launch.
AFTER_START = (JOB_ENV, AFFINITY_ENV, "OMP_NUM_THREADS")
AFTER_START_PREFIX = "TORCHELASTIC_"

# The server this process started: (its environment, its preload, its pid).
_server: tuple[dict[str, str], tuple[str, ...], int | None] | None = None


def forks_workers() -> bool:
    """Whether workers are forked from the server: torch here is a CPU-only build."""
    return torch.version.cuda is None and torch.version.hip is None


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
    return None if _server is None else forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]


@contextlib.contextmanager
def launching() -> Iterator[None]:
    """multiprocessing runs the launching script (`__main__`) again in every child it starts,
    unless the script is a package's `__main__` module (`python -m leo_cli`): a worker runs
    its own module, so while workers start, the script says it is `leo_cli`'s."""
    script = sys.modules["__main__"]
    saved = script.__dict__.get("__spec__")
    script.__spec__ = importlib.util.find_spec("leo_cli.__main__")
    try:
        yield
    finally:
        script.__spec__ = saved


def entry_point(module: str, args: list[str]) -> tuple[Any, list[Any], str]:
    """The elastic launch's entry point, its arguments and its start method: `run_started` in
    workers forked from the server (run under `launching`), else `python -m module args` by
    spawn."""
    if forks_workers():
        ensure_server(module)
        return run_started, [module, args, dict(os.environ), os.getcwd()], "forkserver"
    return sys.executable, ["-m", module, *args], "spawn"
