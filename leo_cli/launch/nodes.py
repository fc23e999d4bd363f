"""Running a command on every emulated node (`launch.emulate`): one `leo <command>` per node,
each started in its node's namespaces with the settings a node of a real cluster is given
(`launch.nnodes`, its `node_rank`, node 0's address and port, its workers) and its interface
for gloo and NCCL. Node 0 writes to this terminal, the others to `<run>/emulate/node_<k>.log`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from leo_cli.comm.process import LINK_ENV
from leo_cli.config import LeoConfig, dump_config
from leo_cli.errors import TrainError
from leo_cli.launch.emulate import IFNAME, MASTER_PORT, Cluster, check_split, cluster
from leo_cli.run_dir import RunDir
from leo_cli.util import files
from leo_cli.util.interrupt import Interrupted

STOP_GRACE_S = 20.0  # what a node's launcher gets to stop its workers before SIGKILL


def node_config(cfg: LeoConfig, c: Cluster, rank: int, run_dir: Path) -> LeoConfig:
    """The config node `rank` of the cluster runs with: a node of a real cluster's."""
    assert cfg.launch.emulate is not None
    nproc = check_split(cfg.partition.num_parts, cfg.launch.emulate.nodes)
    launch = cfg.launch.model_copy(
        update={
            "emulate": None,
            "nnodes": len(c.nodes),
            "node_rank": rank,
            "nproc": nproc,
            "master_addr": c.master_addr,
            "master_port": MASTER_PORT,
        }
    )
    run = cfg.run.model_copy(update={"out_dir": run_dir})
    bench = cfg.bench.model_copy(update={"links": []})  # a node has no links of its own
    return cfg.model_copy(update={"launch": launch, "run": run, "bench": bench})


def node_env(c: Cluster, rank: int) -> dict[str, str]:
    """A node's environment: its interface for the process group, its uplink rate."""
    env = dict(os.environ)
    env.update(GLOO_SOCKET_IFNAME=IFNAME, NCCL_SOCKET_IFNAME=IFNAME, TP_SOCKET_IFNAME=IFNAME)
    env[LINK_ENV] = c.rates[rank] or "unlimited"
    return env


def stop_with_parent() -> None:
    """In a node's process: SIGTERM when the emulating launcher dies (its launcher then stops
    its workers), so a killed launcher leaves no node running."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def run_nodes(cfg: LeoConfig, command: str, flags: list[str]) -> None:
    """`leo <command> <flags>` on every node of the emulated cluster; returns when all have
    finished.

    Raises:
        TrainError: a node failed (its log named).
        Interrupted: SIGINT / SIGTERM (every node is stopped first).
    """
    assert cfg.launch.emulate is not None
    run_dir = Path(cfg.run.out_dir).resolve()
    folder = RunDir(run_dir).emulate
    check_split(cfg.partition.num_parts, cfg.launch.emulate.nodes)
    with cluster(cfg.launch.emulate) as c:
        folder.mkdir(parents=True, exist_ok=True)
        procs: list[subprocess.Popen[bytes]] = []
        logs = []
        try:
            for node in c.nodes:
                path = folder / f"node_{node.rank}.yaml"
                files.write_text(path, dump_config(node_config(cfg, c, node.rank, run_dir)))
                argv = [sys.executable, "-m", "leo_cli", command, "--config", str(path), *flags]
                log: IO[str] | None = None
                if node.rank > 0:
                    log = open(folder / f"node_{node.rank}.log", "w")  # noqa: SIM115
                    logs.append(log)
                procs.append(
                    subprocess.Popen(
                        c.command(node, argv), env=node_env(c, node.rank), stdout=log,
                        stderr=subprocess.STDOUT if log else None, preexec_fn=stop_with_parent,
                    )
                )  # fmt: skip
            wait_all(procs, folder)
        finally:
            stop_all(procs)
            for log in logs:
                log.close()


def wait_all(procs: list[subprocess.Popen[bytes]], folder: Path) -> None:
    """Wait for every node; the first to fail stops the others."""
    try:
        while any(p.poll() is None for p in procs):
            failed = [k for k, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        raise Interrupted(signal.SIGINT) from None
    failed = [k for k, p in enumerate(procs) if p.returncode not in (None, 0)]
    if failed:
        k = failed[0]
        where = "its messages are above" if k == 0 else f"its log is {folder / f'node_{k}.log'}"
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
