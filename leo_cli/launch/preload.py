"""Workers forked from a server that imported torch and LEO's worker once (a CPU-only torch).

Started as `python -m leo_cli.worker.entry`, every worker pays the interpreter's start and its
imports (torch and LEO: seconds of a core) before its first collective. torch elastic starts a
callable entry point through multiprocessing; under the `forkserver` start method one server
per launching process imports those modules once, and the workers of every launch from that
process (the probe's, training's, restarts) are forked from it. A worker then runs as `python
-m` would have run it (`harness/process.py run_started`): in the launch's environment and
working directory, in a session of its own, with its threads set from the launch's
OMP_NUM_THREADS, and without running the launching script again (`launching`).

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
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from multiprocessing import forkserver
from typing import Any

from leo_cli.comm.segments import JOB_ENV
from leo_cli.harness.placement import AFFINITY_ENV
from leo_cli.util.procs import descendants

# Imported by the server. Not torch._dynamo: a worker's custom ops and optimizer leave it
# unimported (util/dynamo.py), and the launch waits for the server's imports. matplotlib's
# figure and Agg canvas (util/figure_imports.py): rank 0 draws curves.png at the end of every
# run while the other ranks wait at the last barrier, and importing them there cost every
# run 0.6 s of a core or more.
PRELOAD = (
    "leo_cli.worker.entry",
    "leo_cli.planner.profile.probe",
    "leo_cli.util.figure_imports",
)
# Read after a worker started: by the worker itself (comm/segments.py, harness/placement.py;
# harness/process.py sets its threads) or by torch elastic, which sets its own per worker and
# launch.
AFTER_START = (JOB_ENV, AFFINITY_ENV, "OMP_NUM_THREADS")
AFTER_START_PREFIX = "TORCHELASTIC_"

# What the server this process started holds: (its environment, its imports, its pid).
_server: tuple[dict[str, str], tuple[str, ...], int] | None = None


def forks_workers() -> bool:
    """Whether workers are forked from the server: torch here is a CPU-only build."""
    import torch  # this module starts the server without it (launch/early.py)

    return torch.version.cuda is None and torch.version.hip is None


def server_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What of `environ` a server's workers get from the server (the rest they get as they
    start)."""
    return {
        k: v
        for k, v in environ.items()
        if k not in AFTER_START and not k.startswith(AFTER_START_PREFIX)
    }


def held_environment() -> tuple[dict[str, str], tuple[str, ...]] | None:
    """The environment and imports of the server this process started (None: none)."""
    return None if _server is None else (dict(_server[0]), _server[1])


def ensure_server(*modules: str) -> bool:
    """Have a server running that this process started in its present environment, with
    `modules` among its imports (which run beside whatever this process does next); one of
    another environment, or one something else started, is stopped first. False, and nothing
    done, where a server something else in this process started still has children
    (stopping it waits for them)."""
    global _server
    env = server_environment(os.environ)
    needed = tuple(dict.fromkeys((*PRELOAD, *modules)))
    server: Any = forkserver._forkserver
    running = server._forkserver_pid
    # Ours: the one it started (running or dead), or none (stopped since); one something else
    # started in its place (multiprocessing keeps one forkserver a process) holds that one's
    # environment and imports.
    mine = _server is not None and running in (None, _server[2])
    if not mine and running is not None and len(descendants(running)) > 1:
        return False
    restart = _server is None or not mine or _server[0] != env or not set(needed) <= set(_server[1])
    held = needed if restart or _server is None else _server[1]
    with sigint_ignored():  # a Ctrl-C is the launcher's to handle, not the server's
        if restart:
            stop(server)
        multiprocessing.set_forkserver_preload(list(held))  # whichever start comes next
        server.ensure_running()  # started, or again where it died
        _server = (env, held, server._forkserver_pid)
    return True


def stop_idle() -> None:
    """Stop the server this process started where no worker of it runs (a run that failed
    before its workers started): not left importing for nobody."""
    global _server
    server: Any = forkserver._forkserver
    pid = server_pid()
    if pid is not None and len(descendants(pid)) == 1:
        stop(server)
        _server = None


def stop(server: Any) -> None:
    """Stop this process's server (none running: nothing to do). One without workers is
    killed rather than asked, so stopping it never waits for its imports to finish."""
    pid = server._forkserver_pid
    if pid is not None and len(descendants(pid)) == 1:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    server._stop()


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored by processes started inside (an ignored signal stays ignored across
    exec; forked workers handle it again, harness/process.py run_started)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved)


def server_pid() -> int | None:
    """The pid of the server this process started (the parent of its forked workers), while
    it is the process's forkserver."""
    running = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    return running if _server is not None and running == _server[2] else None


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
    spawn (a CUDA build of torch, or a server of someone else's still busy)."""
    if forks_workers() and ensure_server(module):
        from leo_cli.harness.process import run_started

        return run_started, [module, args, dict(os.environ), server_pid()], "forkserver"
    return sys.executable, ["-m", module, *args], "spawn"
