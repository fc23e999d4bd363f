"""Running a command on every emulated node (`launch.emulate`): one `leo <command>` per node,
each started in its node's namespaces with the settings a node of a real cluster is given
(`launch.nnodes`, its `node_rank`, node 0's address and port, its workers) and its interface
for gloo and NCCL. Node 0 writes to this terminal, the others to `<run>/emulate/node_<k>.log`.

Emulation runs as root in folders others may write: the nodes read their configs from the
cluster's private folder (the run folder gets a copy), logs are made afresh and never opened
through a link, and Python starts without the current folder on its path (a `leo_cli/`
planted there would run as root); this package's own folder is put there instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from leo_cli.config import LeoConfig, dump_config
from leo_cli.errors import ConfigError, TrainError
from leo_cli.harness.process import LINK_ENV, LINKS_ENV
from leo_cli.launch.elastic import USER_THREADS
from leo_cli.launch.emulate import IFNAME, MASTER_PORT, Cluster, check_split, cluster
from leo_cli.run_dir import RunDir
from leo_cli.util import files
from leo_cli.util.interrupt import Interrupted

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding this leo_cli/
STOP_GRACE_S = 20.0  # what a node's launcher gets to stop its workers before SIGKILL


def node_config(cfg: LeoConfig, c: Cluster, rank: int, run_dir: Path) -> LeoConfig:
    """The config node `rank` of the cluster runs with: a node of a real cluster's."""
    assert cfg.launch.emulate is not None
    nproc = check_split(cfg.partition.num_parts, cfg.launch.emulate.nodes)
    affinity = cfg.launch.cpu_affinity
    if affinity is not None:  # one core list per worker of the cluster: each node its own
        if len(affinity) != cfg.partition.num_parts:
            raise ConfigError(
                f"launch.cpu_affinity lists {len(affinity)} core sets; with launch.emulate give "
                f"one per worker of the cluster ({cfg.partition.num_parts}), node 0's first."
            )
        affinity = affinity[rank * nproc : (rank + 1) * nproc]
    launch = cfg.launch.model_copy(
        update={
            "emulate": None,
            "nnodes": len(c.nodes),
            "node_rank": rank,
            "nproc": nproc,
            "master_addr": c.master_addr,
            "master_port": MASTER_PORT,
            "cpu_affinity": affinity,
        }
    )
    run = cfg.run.model_copy(update={"out_dir": run_dir})
    bench = cfg.bench.model_copy(update={"links": []})  # a node has no links of its own
    return cfg.model_copy(update={"launch": launch, "run": run, "bench": bench})


def node_env(c: Cluster, rank: int, num_parts: int) -> dict[str, str]:
    """A node's environment: its interface for the process group, every node's uplink rate
    (its own for the probe to record, all of them to tell a profile of other links), and the
    user's threads (or this machine's cores shared by every worker of the cluster, not only
    the node's)."""
    env = dict(os.environ)
    env.update(GLOO_SOCKET_IFNAME=IFNAME, NCCL_SOCKET_IFNAME=IFNAME, TP_SOCKET_IFNAME=IFNAME)
    env[LINK_ENV] = c.rates[rank] or "unlimited"
    env[LINKS_ENV] = ",".join(r or "unlimited" for r in c.rates)
    env["OMP_NUM_THREADS"] = USER_THREADS or str(max(1, (os.cpu_count() or 1) // num_parts))
    return own_package_env(env)


SAFE_PATH_PYTHON = (3, 11)  # the first Python that reads PYTHONSAFEPATH


def own_package_env(env: dict[str, str]) -> dict[str, str]:
    """`env` for Python processes started as root in a folder someone else may write: the
    current folder is not put on `sys.path` (PYTHONSAFEPATH; Python 3.11 and later), this
    package's own folder is (first on PYTHONPATH)."""
    paths = [str(PACKAGE_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, "PYTHONSAFEPATH": "1", "PYTHONPATH": os.pathsep.join(paths)}


@dataclass
class NodeFolder:
    """`<run>/emulate`, opened once as a real folder: every file root makes there is made
    through this handle (`dir_fd`), so a link swapped in for the folder (or planted under a
    file's name) afterwards redirects nothing."""

    path: Path
    fd: int

    def new_file(self, name: str) -> IO[str]:
        """A new text file `name` here (an old one, or a link under its name, removed first).

        Raises:
            TrainError: something took the name between the removal and the opening.
        """
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)  # the name only: a link's target stays as it is
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, 0o644, dir_fd=self.fd)
        except OSError as exc:
            raise TrainError(
                f"cannot create {self.path / name} for an emulated node ({exc.strerror}); "
                "check who else writes the run folder."
            ) from None
        return os.fdopen(fd, "w", encoding="utf-8")

    def close(self) -> None:
        os.close(self.fd)


def node_folder(run_dir: Path) -> NodeFolder:
    """`<run>/emulate`, a real folder, opened (a link planted under its name is removed
    first, and one swapped in while it opens is refused).

    Raises:
        TrainError: the folder cannot be opened as a folder of its own.
    """
    folder = RunDir(run_dir).emulate
    if folder.is_symlink():
        folder.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return NodeFolder(folder, os.open(folder, flags))
    except OSError as exc:
        raise TrainError(
            f"cannot open {folder} for the emulated nodes' logs ({exc.strerror}); check who "
            "else writes the run folder."
        ) from None


def stop_with_parent() -> None:
    """In a node's process: SIGTERM when the emulating launcher dies (its launcher then stops
    its workers), so a killed launcher leaves no node running."""
    if LIBC is not None:
        LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# Loaded once, here: a forked child must not load a library (another thread may hold a lock).
LIBC = ctypes.CDLL("libc.so.6", use_errno=True) if sys.platform.startswith("linux") else None


def run_nodes(cfg: LeoConfig, command: str, flags: list[str], quiet: bool = False) -> None:
    """`leo <command> <flags>` on every node of the emulated cluster; returns when all have
    finished. `quiet`: node 0 logs to a file too (`leo bench` runs many).

    Raises:
        TrainError: a node failed (its log named).
        Interrupted: SIGINT / SIGTERM (every node is stopped first).
    """
    assert cfg.launch.emulate is not None
    if sys.version_info < SAFE_PATH_PYTHON:  # nothing keeps the current folder off the path
        raise ConfigError(
            "launch.emulate starts its nodes as root and needs Python 3.11 or later (which can "
            "keep the current folder off their module path); run it with a newer Python."
        )
    run_dir = cfg.run.folder.resolve()
    parts = cfg.partition.num_parts
    check_split(parts, cfg.launch.emulate.nodes)
    with cluster(cfg.launch.emulate) as c:
        folder = node_folder(run_dir)
        procs: list[subprocess.Popen[bytes]] = []
        logs = []
        try:
            for node in c.nodes:
                text = dump_config(node_config(cfg, c, node.rank, run_dir))
                path = c.folder / f"node_{node.rank}.yaml"  # what the node reads: root's alone
                files.write_text(path, text)
                with folder.new_file(path.name) as record:  # the run's record of it
                    record.write(text)
                argv = [sys.executable, "-m", "leo_cli", command, "--config", str(path), *flags]
                log: IO[str] | None = None
                if node.rank > 0 or quiet:
                    log = folder.new_file(f"node_{node.rank}.log")
                    logs.append(log)
                procs.append(
                    subprocess.Popen(
                        c.command(node, argv), env=node_env(c, node.rank, parts), stdout=log,
                        stderr=subprocess.STDOUT if log else None, preexec_fn=stop_with_parent,
                        start_new_session=True,  # a terminal's Ctrl-C reaches the launcher only
                    )
                )  # fmt: skip
            wait_all(procs, folder.path, quiet)
        finally:
            stop_all(procs)
            for log in logs:
                log.close()
            folder.close()


def wait_all(procs: list[subprocess.Popen[bytes]], folder: Path, quiet: bool = False) -> None:
    """Wait for every node; the first to fail stops the others."""
    try:
        while any(p.poll() is None for p in procs):
            failed = [k for k, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                break
            time.sleep(0.2)
    except Interrupted:
        raise
    except KeyboardInterrupt:  # no handler of ours installed (the Python API)
        raise Interrupted(signal.SIGINT) from None
    failed = [k for k, p in enumerate(procs) if p.returncode not in (None, 0)]
    if failed:
        k = failed[0]
        shown = k == 0 and not quiet
        where = "its messages are above" if shown else f"its log is {folder / f'node_{k}.log'}"
        raise TrainError(f"emulated node {k} failed (exit code {procs[k].returncode}); {where}.")


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every node still running (its launcher stops its workers), then SIGKILL."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
