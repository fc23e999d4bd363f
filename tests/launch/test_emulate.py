"""Emulated nodes (`launch.emulate`): refusals, the same numbers as one process across emulated
nodes, separate hostnames and /dev/shm per node, rate-limited links, and nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import leo, leo_here

from leo_cli.config import load_config
from leo_cli.errors import ConfigError
from leo_cli.launch import emulate
from leo_cli.launch.emulate import PREFIX, Cluster, check_split, namespaces
from leo_cli.run_dir import RunDir


def can_emulate() -> bool:
    """Whether a small cluster can really be made here (privileges, tools, and a kernel with
    veth, bridges and tbf)."""
    from leo_cli.config.schema import EmulateConfig
    from leo_cli.errors import TrainError

    try:
        with emulate.cluster(EmulateConfig(nodes=2, link="100mbit")):
            return True
    except (ConfigError, TrainError):
        return False


needs_root = pytest.mark.skipif(
    not can_emulate(), reason="needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), ip, tc and unshare"
)
TINY = [
    "--set", "data.synthetic.num_nodes=600", "--set", "data.synthetic.num_features=16",
    "--set", "model.hidden_channels=16", "--set", "train.num_epochs=4",
]  # fmt: skip


def test_settings_that_cannot_be_emulated_are_refused() -> None:
    with pytest.raises(ConfigError, match="launch.emulate.link lists 1 rates for 2 nodes"):
        load_config(None, ["launch.emulate={nodes: 2, link: [1gbit]}"])
    with pytest.raises(ConfigError, match="launch.emulate sets launch.nnodes"):
        load_config(None, ["launch.emulate={nodes: 2}", "launch.nnodes=2"])
    with pytest.raises(ConfigError, match="must be a rate such as 100mbit"):
        load_config(None, ["launch.emulate={nodes: 2, link: fast}"])
    with pytest.raises(ConfigError, match="does not divide partition.num_parts=3"):
        check_split(3, 2)
    three = load_config(None, ["launch.emulate={nodes: 3, link: 1gbit}"]).launch.emulate
    assert three is not None and three.rates() == ["1gbit"] * 3
    assert emulate.bits_per_second("100mbit") == 1e8


def test_no_privileges_or_tools_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emulate, "effective_caps", lambda: 0)
    res = leo_here("train", "--set", "launch.emulate={nodes: 2}")
    assert res.returncode != 0 and "needs root" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    monkeypatch.setattr(emulate.shutil, "which", lambda tool: None if tool == "tc" else tool)
    res = leo_here("train", "--set", "launch.emulate={nodes: 2}")
    assert res.returncode != 0 and "needs tc on PATH" in res.stderr, res.stderr


def ours() -> list[str]:
    """Namespaces of emulated clusters, any launcher's."""
    return [n for n in namespaces() if n.startswith(PREFIX + "-")]


def left_behind(before: set[str]) -> list[str]:
    """Clusters made since `before` by this process (a launch run in it) or by a launcher that
    has ended: what a finished launch in this test could have left; other jobs on the machine
    may be running emulated clusters of their own meanwhile."""

    def by_us_or_dead(name: str) -> bool:
        pid = int(name.split("-")[1])
        return pid == os.getpid() or not Path(f"/proc/{pid}").exists()

    return [n for n in ours() if n not in before and by_us_or_dead(n)]


@needs_root
@pytest.mark.integration
def test_nodes_have_their_own_hostname_and_shm_and_a_limited_link() -> None:
    from leo_cli.config.schema import EmulateConfig

    with emulate.cluster(EmulateConfig(nodes=2, link="100mbit")) as c:
        out = [
            subprocess.run(
                c.command(node, ["sh", "-c", "hostname; touch /dev/shm/leo-mark; ls /dev/shm"]),
                capture_output=True, text=True, check=True,
            ).stdout.split()
            for node in c.nodes
        ]  # fmt: skip
        assert out[0][0] != out[1][0]  # hostnames
        assert out[0][1:] == ["leo-mark"] and out[1][1:] == ["leo-mark"]  # each its own mark
        assert not Path("/dev/shm/leo-mark").exists()  # nor the machine's
        qdisc = subprocess.run(
            ["ip", "netns", "exec", c.nodes[0].netns, "tc", "qdisc", "show", "dev", "eth0"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "tbf" in qdisc and "100Mbit" in qdisc
        ping = subprocess.run(
            c.command(c.nodes[1], ["ping", "-c", "1", "-W", "2", c.master_addr]),
            capture_output=True, check=False,
        )  # fmt: skip
        if ping.returncode == 127:  # no ping on this machine: the train tests cover the link
            pass
        else:
            assert ping.returncode == 0
        names = [n.netns for n in c.nodes] + [c.switch]
        assert set(names) <= set(namespaces())
    assert not set(names) & set(namespaces())


def summary(run: Path) -> dict[str, Any]:
    return json.loads(RunDir(run).summary.read_text())


def losses(run: Path) -> list[float]:
    return [r["loss"] for r in RunDir(run).read_metrics()]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    run = tmp_path_factory.mktemp("single")
    res = leo("train", *TINY, "--set", "partition.num_parts=1", "--set", f"run.out_dir={run}")
    assert res.returncode == 0, res.stderr
    return losses(run)


@needs_root
@pytest.mark.integration
@pytest.mark.dist
@pytest.mark.parametrize(
    ("mode", "parts"), [("leo", 2), ("blocking", 2), ("fine-grained", 2), ("leo", 4)]
)
def test_emulated_nodes_train_the_numbers_of_one_process(
    tmp_path: Path, one_process: list[float], mode: str, parts: int
) -> None:
    """2 nodes x 1 and x 2 workers, through 1 Gbit/s links: one process's losses."""
    before = set(ours())
    res = leo(
        "train", *TINY, "--set", f"partition.num_parts={parts}", "--set", f"pipeline.mode={mode}",
        "--set", "cache.policy=none", "--set", "launch.emulate={nodes: 2, link: 1gbit}",
        "--set", f"run.out_dir={tmp_path}", timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr + res.stdout
    got = summary(tmp_path)
    assert got["world_size"] == parts and got["exact"]
    assert losses(tmp_path) == pytest.approx(one_process, rel=1e-5)
    assert (RunDir(tmp_path).emulate / "node_1.log").is_file()
    assert not left_behind(before)  # its cluster is gone


@needs_root
@pytest.mark.integration
@pytest.mark.dist
def test_in_place_reads_stay_within_a_node(tmp_path: Path, one_process: list[float]) -> None:
    """2 nodes x 2 workers reading same-node rows in place (`pipeline.transport=shared-memory`
    asks for every same-host row): rows move in place within a node and through the process
    group across nodes, and the numbers stay one process's."""
    res = leo(
        "train", *TINY, "--set", "partition.num_parts=4", "--set", "pipeline.mode=leo",
        "--set", "cache.policy=none", "--set", "pipeline.transport=shared-memory",
        "--set", "launch.emulate={nodes: 2}", "--set", f"run.out_dir={tmp_path}", timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr + res.stdout
    rows = RunDir(tmp_path).read_metrics()
    assert all(r["step_published_bytes"] > 0 for r in rows)  # same-node pairs: in place
    assert all(r["step_comm_bytes"] > r["step_published_bytes"] for r in rows)  # and across
    assert losses(tmp_path) == pytest.approx(one_process, rel=1e-5)


@needs_root
@pytest.mark.integration
def test_a_killed_launcher_leaves_nothing_after_the_next_start(tmp_path: Path) -> None:
    """kill -9 of the emulating launcher: its nodes stop (they die with it), its namespaces
    are removed by the next start's sweep."""
    args = [*TINY, "--set", "train.num_epochs=400", "--set", "cache.policy=none"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "leo_cli", "train", *args, "--set", f"run.out_dir={tmp_path}",
         "--set", "launch.emulate={nodes: 2, link: 100mbit}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    mine = f"{PREFIX}-{proc.pid}-"
    deadline = time.monotonic() + 120
    while not RunDir(tmp_path).metrics.is_file() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [n for n in namespaces() if n.startswith(mine)], "the cluster never came up"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while node_processes(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not node_processes(tmp_path)
    left = [n for n in namespaces() if n.startswith(mine)]
    assert left  # left for the sweep
    emulate.sweep()
    assert not [n for n in namespaces() if n.startswith(mine)]
    assert not list(Path(tempfile.gettempdir()).glob(f"{mine}*"))  # nor its /etc/hosts
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"le{proc.pid % 10**7}n" not in links  # no cable end in the root namespace


@needs_root
@pytest.mark.integration
def test_ctrl_c_stops_every_node_and_removes_the_cluster(tmp_path: Path) -> None:
    args = [*TINY, "--set", "train.num_epochs=400", "--set", "cache.policy=none"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "leo_cli", "train", *args, "--set", f"run.out_dir={tmp_path}",
         "--set", "launch.emulate={nodes: 2}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    mine = f"{PREFIX}-{proc.pid}-"
    deadline = time.monotonic() + 120
    while not RunDir(tmp_path).metrics.is_file() and time.monotonic() < deadline:
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert not [n for n in namespaces() if n.startswith(mine)]
    assert not node_processes(tmp_path)


def node_processes(run: Path) -> list[int]:
    """Pids of processes whose command line names the run folder (nodes and workers)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(run) in cmd:
                found.append(int(proc.name))
    return found


def test_cluster_names_fit_the_kernel_limits() -> None:
    """Interface names have at most 15 characters while they sit in the root namespace."""
    from leo_cli.config.schema import EmulateConfig

    c = Cluster(EmulateConfig(nodes=64))
    assert len(f"{c._veth}n63a") <= 15
    assert all(n.netns.startswith(PREFIX) for n in c.nodes)


@needs_root
@pytest.mark.integration
@pytest.mark.dist
def test_the_probe_measures_the_link_and_records_the_topology(tmp_path: Path) -> None:
    """`leo profile-cache` on 2 emulated nodes at 100 Mbit/s: every node joins the probe, the
    profile names each rank's node and uplink, and the cross-node rate is the link's (gloo
    reaches about half of it with both directions busy: measured 49 Mbit/s here)."""
    res = leo(
        "profile-cache", *TINY, "--set", "partition.num_parts=2",
        "--set", "launch.emulate={nodes: 2, link: 100mbit}", "--set", f"run.out_dir={tmp_path}",
        timeout=400,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr + res.stdout
    hw = json.loads(RunDir(tmp_path).hardware.read_text())
    assert hw["nnodes"] == 2
    assert [(r["hostname"], r["link"]) for r in hw["ranks"]] == [
        ("leo-node0", "100mbit"), ("leo-node1", "100mbit")
    ]  # fmt: skip
    (pair,) = hw["links"]["gloo"]["pairs"]
    rate = pair["bandwidth_bytes_per_s"] * 8
    assert 100e6 / 2.5 < rate < 100e6 * 1.2, rate
    assert RunDir(tmp_path).plan.is_file()


def test_a_profile_of_other_links_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """hardware.json records each rank's link; a node reuses it only for the same links."""
    from conftest import hardware_dict

    from leo_cli.harness.process import LINKS_ENV
    from leo_cli.planner.profile.hardware import HardwareProfile
    from leo_cli.planner.profile.store import fits_nodes, rank_links

    data = hardware_dict(2)
    data["nnodes"] = 2
    for r in data["ranks"]:
        r["link"] = "1gbit"
    hw = HardwareProfile.model_validate(data)
    cfg = load_config(None, ["partition.num_parts=2", "launch.nnodes=2", "launch.master_port=1"])
    monkeypatch.setenv(LINKS_ENV, "1gbit,1gbit")
    assert rank_links(2, 2) == ["1gbit", "1gbit"] and fits_nodes(hw, cfg, 2)
    monkeypatch.setenv(LINKS_ENV, "100mbit,100mbit")
    assert not fits_nodes(hw, cfg, 2)
    monkeypatch.delenv(LINKS_ENV)
    assert not fits_nodes(hw, cfg, 2)  # real machines: a profile of emulated links is not theirs


def test_bench_links_run_one_process_rows_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from leo_cli.bench.suite import leo_config, variants

    cfg = load_config(None, [
        "launch.emulate={nodes: 2}", "bench.links=[null, 1gbit]", "bench.world_sizes=[1, 2]",
        "bench.peers=[]", "bench.modes=[leo, blocking]",
    ])  # fmt: skip
    rows = variants(cfg, lambda _: None)
    one = [v for v in rows if v.world_size == 1]
    assert {v.variant for v in one} == {"link-unlimited"}
    assert {(v.mode, v.variant) for v in rows if v.world_size == 2} == {
        (m, f"link-{r}") for m in ("leo", "blocking") for r in ("unlimited", "1gbit")
    }
    single = leo_config(cfg, one[0], Path("/tmp/out"))
    assert single.launch.emulate is None and not single.bench.links
    two = leo_config(cfg, next(v for v in rows if v.variant == "link-1gbit"), Path("/tmp/out"))
    assert two.launch.emulate is not None and two.launch.emulate.rates() == ["1gbit", "1gbit"]
