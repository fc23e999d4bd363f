"""What every rank process does around its work, training and probe workers alike.

A rank dies with its launcher (no orphans), pins itself to its cores (`launch.cpu_affinity`),
beats a heartbeat the launcher watches, turns a user error into one sentence the launcher
shows (and a non-zero exit that makes the elastic agent stop the other ranks, which may wait
for this one in a collective), and leaves without tearing gloo down (`leave`). `Harness`
wraps the rank's work where it is written (`with Harness(...) as rank:`), so the work is
called by its own entry point, not passed in as a callback.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import forkserver
from pathlib import Path
from typing import Any, NoReturn

import torch

from leo_cli.comm.dist import DistEnv
from leo_cli.errors import LeoError
from leo_cli.harness.placement import pin_rank
from leo_cli.run_dir import RunDir
from leo_cli.util import files

USER_ERROR_EXIT = 3
LINK_ENV = "LEO_EMULATED_LINK"  # an emulated node's uplink rate, for probe ranks to record
LINKS_ENV = "LEO_EMULATED_LINKS"  # every emulated node's uplink, comma-separated
ALLOCATOR_ENV = "LEO_ALLOCATOR"  # the allocator the launcher preloaded, for probe ranks to record
BEAT_S = 1.0  # how often a rank touches its heartbeat file (launch/heartbeat.py watches)
HEARTBEATS = RunDir.HEARTBEATS  # in the folder the launcher watches (launch/heartbeat.py)

# This process's environment as it imported this module: in a worker forked from the launcher's
# server (launch/preload.py), the server's, before torch elastic added the worker's variables.
_IMPORT_ENV = dict(os.environ)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this worker when its parent dies (no orphans): its launcher, or
    the server it was forked from (which ends with the launcher)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def start_heartbeat(run_dir: Path, rank: int) -> None:
    """Touch `.heartbeat/rank_<r>` every second from a daemon thread."""
    path = run_dir / HEARTBEATS / f"rank_{rank}"
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_text(path, f"{os.getpid()}\n")  # lets the launcher, tests and operators find it

    def beat() -> None:
        while True:
            path.touch()
            time.sleep(BEAT_S)

    threading.Thread(target=beat, daemon=True, name="leo-heartbeat").start()


class Harness:
    """The rank around the work done inside `with Harness(heartbeat_dir, errors_dir) as rank`:
    dying with the launcher, pinned, beating into `heartbeat_dir`; a `LeoError` raised
    inside is written to `errors_dir/rank_<r>` (read by the launcher), printed, and leaves
    the block with `rank.code` 3 (`USER_ERROR_EXIT`). `rank.env` is this rank's place."""

    def __init__(self, heartbeat_dir: Path | None, errors_dir: Path | None) -> None:
        self.heartbeat_dir = heartbeat_dir
        self.errors_dir = errors_dir
        self.code = 0

    def __enter__(self) -> Harness:
        die_with_parent()
        self.env = DistEnv.from_env()
        pin_rank(self.env.local_rank)  # before any thread of ours starts (launch.cpu_affinity)
        if self.heartbeat_dir is not None:
            start_heartbeat(self.heartbeat_dir, self.env.rank)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> bool:
        if not isinstance(exc, LeoError):
            return False
        if self.errors_dir is not None:
            self.errors_dir.mkdir(parents=True, exist_ok=True)
            files.write_text(self.errors_dir / f"rank_{self.env.rank}", str(exc))
        print(f"leo worker rank {self.env.rank}: {exc}", file=sys.stderr)
        self.code = USER_ERROR_EXIT
        return True


def run_rank(
    body: Callable[[DistEnv], int], heartbeat_dir: Path | None, errors_dir: Path | None
) -> int:
    """Run `body` as this rank, inside a `Harness`; its code, or 3 on a user error."""
    with Harness(heartbeat_dir, errors_dir) as rank:
        rank.code = body(rank.env)
    return rank.code


def run_started(module: str, args: list[str], launch_env: dict[str, str], server: int) -> None:
    """A worker forked from the launcher's server (launch/preload.py, pid `server`): run
    `module`'s `main(args)` as `python -m module args` would, in the launch's environment
    (plus the variables torch elastic set for this worker; multiprocessing has set the
    launch's working directory), in a session of its own (a terminal's signals reach the
    launcher, which stops its workers), with the threads OMP_NUM_THREADS gives. A non-zero
    code leaves by SystemExit (the agent reads exit codes), an error with its traceback in the
    worker's log; multiprocessing ends the process without interpreter teardown."""
    die_with_parent()
    if os.getppid() != server:  # the server died before this worker could follow it
        os._exit(1)
    # The server's objects (torch's and LEO's imports) are kept for good: a collection then
    # neither walks them nor writes to their pages, each of which a write copies from the
    # server (set-up's full collection would copy them all).
    gc.freeze()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the server ignores it
    try:
        # multiprocessing hands every child the server's "alive" pipe, which keeps the server
        # up while a child lives: closed, the server ends with the launcher, and this worker
        # with the server (`die_with_parent`).
        forked: Any = forkserver._forkserver
        if forked._forkserver_alive_fd is not None:
            os.close(forked._forkserver_alive_fd)
            forked._forkserver_alive_fd = None
        os.setsid()
        worker_vars = {k: v for k, v in os.environ.items() if _IMPORT_ENV.get(k) != v}
        os.environ.clear()
        os.environ.update({**launch_env, **worker_vars})
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))
        sys.argv = [module, *args]
        code = importlib.import_module(module).main(args)
    except KeyboardInterrupt:
        code = 130
    except Exception:
        traceback.print_exc()  # into the worker's stderr log, as an interpreter would
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    if code:
        raise SystemExit(code)


def leave(code: int) -> NoReturn:
    """Leave with `code`, skipping destroy_process_group and interpreter teardown: gloo's
    threads sometimes abort a process there ("terminate called without an active
    exception") after a clean finish. The kernel closes the sockets; every rank has passed
    its final barrier."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def rank_entry(main: Callable[[], int]) -> NoReturn:
    """Run `main` and `leave` with its code."""
    leave(main())
