"""Emulated nodes (`launch.emulate`): a cluster of N machines on this one, to measure LEO where
moving rows costs something.

Each node is a network namespace with its own address on a veth pair to a bridge in a switch
namespace, its uplink rate-limited by `tbf` in both directions; each node's processes run in
their own UTS and mount namespaces (own hostname, private /dev/shm). Every node runs `leo
train` as a node of a real cluster would (`launch.nnodes=N`, its `node_rank`, rendezvous at node
0's address, `GLOO_SOCKET_IFNAME` its interface); the run folder is shared, as a cluster's file
system. Names carry the launcher's pid and start time: `sweep` removes what a killed launcher
left, at the start of any later run.
Specification: docs/design/emulation.md.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from leo_cli.comm.segments import start_time
from leo_cli.config.schema import EmulateConfig
from leo_cli.errors import ConfigError, TrainError

TOOLS = ("ip", "tc", "unshare", "mount", "hostname")
CAP_SYS_ADMIN, CAP_NET_ADMIN = 21, 12
PREFIX = "leoemu"  # namespace names: leoemu-<pid>-<start>-<node | sw>
SUBNET = "10.77.0"  # node k is SUBNET.(k+1); every cluster has its own namespaces
IFNAME = "eth0"  # each node's interface (GLOO_SOCKET_IFNAME)
MASTER_PORT = 29500  # node 0's rendezvous port, free in its fresh namespace
QUEUE = "5ms"  # a switch port's buffer (deep queues hold up the other direction's ACKs)
_NAME = re.compile(rf"^{PREFIX}-(?P<pid>\d+)-(?P<start>\d+)-(?P<what>n\d+|sw)$")


def check_host() -> None:
    """Refuse, in one sentence, a machine where namespaces cannot be made.

    Raises:
        ConfigError: no CAP_NET_ADMIN / CAP_SYS_ADMIN, or a tool missing.
    """
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise ConfigError(
            f"launch.emulate needs {', '.join(missing)} on PATH (Debian: apt install iproute2 "
            "util-linux); install them or remove launch.emulate."
        )
    caps = effective_caps()
    if not (caps >> CAP_NET_ADMIN) & 1 or not (caps >> CAP_SYS_ADMIN) & 1:
        raise ConfigError(
            "launch.emulate creates network and mount namespaces, which needs root "
            "(CAP_NET_ADMIN and CAP_SYS_ADMIN); run as root or remove launch.emulate."
        )


def effective_caps() -> int:
    """This process's effective capability bits (0 where /proc says nothing)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def check_split(num_parts: int, nodes: int) -> int:
    """Workers per node; every node gets as many.

    Raises:
        ConfigError: the parts do not spread evenly.
    """
    if num_parts % nodes:
        raise ConfigError(
            f"launch.emulate.nodes={nodes} does not divide partition.num_parts={num_parts}; "
            "every emulated node runs as many workers: choose a multiple of the nodes."
        )
    return num_parts // nodes


def run(*argv: str) -> None:
    """Run one set-up command; a failure becomes one sentence naming it."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise TrainError(f"launch.emulate could not run `{' '.join(argv)}` ({why}).")


def namespaces() -> list[str]:
    """Every network namespace on this machine, by name (none where `ip` is missing)."""
    if shutil.which("ip") is None:
        return []
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def delete_namespace(name: str) -> bool:
    """Remove a network namespace; whether it went."""
    done = subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
    return done.returncode == 0


def sweep() -> int:
    """Remove the namespaces and folders of emulated clusters whose launcher is gone (killed
    with -9, or the machine restarted); how many namespaces went. Run at the start of every
    `leo train` and `leo bench`, emulated or not."""
    removed = sum(delete_namespace(name) for name in namespaces() if _gone(name))
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}-*-sw*"):
        if _gone(switch_of(folder.name)):
            shutil.rmtree(folder, ignore_errors=True)
    return removed


def switch_of(folder_name: str) -> str:
    """The switch namespace a cluster's folder is named after (`<switch>-<random>`)."""
    return folder_name if folder_name.endswith("-sw") else folder_name.rsplit("-", 1)[0]


def _gone(name: str) -> bool:
    """Whether `name` belongs to an emulated cluster whose launcher no longer runs."""
    m = _NAME.match(name)
    return m is not None and start_time(int(m["pid"])) != int(m["start"])


def private_folder(switch: str) -> Path:
    """A new folder of this cluster's, named after its switch namespace plus a random part
    (never one left behind or planted under a predictable name), readable by root alone: the
    nodes' /etc/hosts and configs."""
    return Path(tempfile.mkdtemp(prefix=f"{switch}-"))


@dataclass(frozen=True)
class Node:
    """One emulated node: its namespace, address and hostname."""

    rank: int
    netns: str
    address: str
    hostname: str


class Cluster:
    """The namespaces and links of one emulated cluster, made by `up` and removed by `down`."""

    def __init__(self, emulate: EmulateConfig) -> None:
        pid = os.getpid()
        tag = f"{PREFIX}-{pid}-{start_time(pid) or 0}"
        self.rates = emulate.rates()
        self.switch = f"{tag}-sw"
        self.nodes = [
            Node(k, f"{tag}-n{k}", f"{SUBNET}.{k + 1}", f"leo-node{k}")
            for k in range(emulate.nodes)
        ]
        self._veth = f"le{pid % 10**7}"  # + n<k>a/b: at most 15 characters while in the root ns
        self._folder: Path | None = None  # the nodes' /etc/hosts and configs, while it is up

    def up(self) -> None:
        """Make the switch, the nodes and their links (partial set-up is removed on failure)."""
        try:
            for name in set(namespaces()) & {self.switch, *(n.netns for n in self.nodes)}:
                delete_namespace(name)  # ours by name: left by an earlier process of this pid
            self._folder = private_folder(self.switch)
            names = "".join(f"{n.address} {n.hostname}\n" for n in self.nodes)
            (self._folder / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
            run("ip", "netns", "add", self.switch)
            sw = ("ip", "-n", self.switch)
            run(*sw, "link", "add", "br0", "type", "bridge")
            run(*sw, "link", "set", "br0", "up")
            for node, rate in zip(self.nodes, self.rates, strict=True):
                self._add_node(node, rate)
        except BaseException:
            self.down()
            raise

    def _add_node(self, node: Node, rate: str | None) -> None:
        """A node's namespace and its cable to the switch, rate-limited at both ends."""
        a, b = f"{self._veth}n{node.rank}a", f"{self._veth}n{node.rank}b"
        run("ip", "netns", "add", node.netns)
        # Both ends made inside their namespaces: nothing is left in the root namespace.
        run("ip", "link", "add", a, "netns", node.netns, "type", "veth",
            "peer", "name", b, "netns", self.switch)  # fmt: skip
        ns, sw = ("ip", "-n", node.netns), ("ip", "-n", self.switch)
        run(*ns, "link", "set", a, "name", IFNAME)
        run(*ns, "addr", "add", f"{node.address}/24", "dev", IFNAME)
        run(*ns, "link", "set", IFNAME, "up")
        run(*ns, "link", "set", "lo", "up")
        run(*sw, "link", "set", b, "master", "br0")
        run(*sw, "link", "set", b, "up")
        if rate is not None:  # the node's uplink: its sends, and what the switch sends it
            limit(node.netns, IFNAME, rate)
            limit(self.switch, b, rate)

    def down(self) -> None:
        """Remove every namespace of this cluster (their links go with them)."""
        for name in [self.switch, *(n.netns for n in self.nodes)]:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def command(self, node: Node, argv: list[str]) -> list[str]:
        """`argv` as a process of `node`: in its network namespace, with its own hostname, a
        private /dev/shm, and an /etc/hosts naming every node (torch looks peers up by name)."""
        script = (
            f"hostname {node.hostname} && mount -t tmpfs -o mode=1777 leo-shm /dev/shm && "
            f'mount --bind {shlex.quote(str(self.folder / "hosts"))} /etc/hosts && exec "$@"'
        )
        return ["ip", "netns", "exec", node.netns, "unshare", "--uts", "--mount",
                "sh", "-c", script, "sh", *argv]  # fmt: skip

    @property
    def folder(self) -> Path:
        """The cluster's private folder (root's alone), while it is up."""
        assert self._folder is not None, "the cluster is not up"
        return self._folder

    @property
    def master_addr(self) -> str:
        return self.nodes[0].address


def limit(netns: str, device: str, rate: str) -> None:
    """`tbf` at `rate` on a device's egress; bursts of about 10 ms of the rate (at least 64
    KiB: a kernel timer tick's worth must fit, or the rate is not reached)."""
    burst = max(64 * 1024, int(bits_per_second(rate) / 8 / 100))
    run("ip", "netns", "exec", netns, "tc", "qdisc", "add", "dev", device, "root", "tbf",
        "rate", rate, "burst", str(burst), "latency", QUEUE)  # fmt: skip


def bits_per_second(rate: str) -> float:
    """A `tc` rate in bits per second (`1gbit` -> 1e9)."""
    m = re.fullmatch(r"([0-9.]+)(k|m|g)bit", rate)
    assert m, f"rate {rate!r} passed the schema's pattern"
    return float(m[1]) * {"k": 1e3, "m": 1e6, "g": 1e9}[m[2]]


@contextlib.contextmanager
def cluster(emulate: EmulateConfig) -> Iterator[Cluster]:
    """An emulated cluster for the duration of the block (checked, swept, made, removed)."""
    check_host()
    sweep()
    made = Cluster(emulate)
    made.up()
    try:
        yield made
    finally:
        made.down()
