"""Going on with fewer machines (`launch.nnodes: MIN:MAX`): a lost node's survivors re-form
the group, re-partition and resume with the numbers of the uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.cli import leo, leo_here, start_tied
from helpers.ports import free_port

from leo_cli.config import load_config
from leo_cli.config.load import load_yaml, with_overrides
from leo_cli.config.schema import LeoConfig
from leo_cli.errors import ConfigError
from leo_cli.graph.storage import read_meta
from leo_cli.launch.elastic import launch_config, workers_per_node
from leo_cli.run_dir import RunDir

# Enough epochs after the kill (once epoch 5 is done) that a node is killed mid-run, a few
# seconds of them at 2 workers (the test polls every 0.05 s, on a loaded machine too).
EPOCHS = 150
GRAPH = [
    "--set", "data.synthetic.num_nodes=6000", "--set", "data.synthetic.num_features=16",
    "--set", "model.hidden_channels=16", "--set", f"train.num_epochs={EPOCHS}",
    "--set", "train.checkpoint_every=3", "--set", "train.eval_every=50",
    "--set", "partition.num_parts=2",
]  # fmt: skip


def rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_node_range_parses_from_yaml_and_set(tmp_path: Path) -> None:
    assert load_yaml("nnodes: 1:2") == {"nnodes": "1:2"}  # not YAML 1.1's base-60 62
    assert load_yaml("a: 0x1f\nb: 017\nc: 12") == {"a": 31, "b": 15, "c": 12}
    cfg = with_overrides(LeoConfig(), ["launch.nnodes=1:2", "launch.master_port=29500"], "t")
    assert (cfg.launch.min_nodes, cfg.launch.nnodes, cfg.launch.elastic()) == (1, 2, True)
    path = tmp_path / "c.yaml"
    path.write_text("launch:\n  nnodes: 2:3\n  master_port: 29500\n")
    assert load_config(path).launch.model_dump(include={"min_nodes", "nnodes"}) == {
        "min_nodes": 2,
        "nnodes": 3,
    }
    with pytest.raises(ConfigError, match="min_nodes=3 is more than launch.nnodes=2"):
        with_overrides(LeoConfig(), ["launch.nnodes=3:2"], "t")


def test_a_node_range_with_an_owners_file_is_refused_at_start(tmp_path: Path) -> None:
    """The owners file gives owners for `num_parts` workers: a regroup could not use it."""
    np.save(tmp_path / "owners.npy", np.zeros(10, dtype=np.int64))
    sets = ["launch.nnodes=1:2", "launch.master_port=29500", "partition.method=file",
            f"partition.owners_path={tmp_path / 'owners.npy'}"]  # fmt: skip
    with pytest.raises(ConfigError, match=r"MIN:MAX re-partitions .* partition\.method=file holds"):
        with_overrides(LeoConfig(), sets, "t")
    res = leo_here("train", *(a for s in sets for a in ("--set", s)))
    assert res.returncode == 2 and "partition.method=file holds owners" in res.stderr


def test_an_elastic_launch_shrinks_through_c10d_hosted_by_node_0(tmp_path: Path) -> None:
    sets = ["launch.nnodes=1:2", "launch.master_port=29500", "launch.max_restarts=2"]
    sets += ["partition.num_parts=4"]
    cfg = with_overrides(LeoConfig(), sets, "t")
    lc = launch_config(cfg, tmp_path, elastic=True)
    assert (lc.min_nodes, lc.max_nodes, lc.nproc_per_node) == (1, 2, 2)
    assert lc.rdzv_backend == "c10d" and lc.rdzv_configs["is_host"] is True
    assert (lc.rdzv_configs["last_call_timeout"], lc.rdzv_configs["keep_alive_interval"]) == (30, 5)
    quick = with_overrides(cfg, ["launch.last_call_s=2", "launch.keep_alive_s=1"], "t")
    waits = launch_config(quick, tmp_path, elastic=True).rdzv_configs
    assert (waits["last_call_timeout"], waits["keep_alive_interval"]) == (2, 1)
    node1 = with_overrides(cfg, ["launch.node_rank=1"], "t")
    assert launch_config(node1, tmp_path, elastic=True).rdzv_configs["is_host"] is False
    probe = launch_config(cfg, tmp_path)  # a fixed membership, numbered as training's
    assert (probe.min_nodes, probe.rdzv_backend) == (2, "c10d")
    fixed = launch_config(with_overrides(cfg, ["launch.min_nodes=null"], "t"), tmp_path, True)
    assert (fixed.min_nodes, fixed.rdzv_backend, fixed.rdzv_configs["rank"]) == (2, "static", 0)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["launch.max_restarts=0"], "launch.max_restarts >= 1"),
        (["partition.part_weights=[1,1,1,2]"], "equal or measured weights"),
    ],
)
def test_an_elastic_launch_refuses_what_it_cannot_go_on_with(
    extra: list[str], says: str, tmp_path: Path
) -> None:
    sets = ["launch.nnodes=1:2", "launch.master_port=29500", "partition.num_parts=4"]
    cfg = with_overrides(LeoConfig(), ["launch.max_restarts=1", *sets, *extra], "t")
    with pytest.raises(ConfigError, match=says):
        workers_per_node(cfg)
    run = tmp_path / "run"
    flags = [*sets, "launch.max_restarts=1", *extra, f"run.out_dir={run}"]
    out = leo_here("train", *[f for s in flags for f in ("--set", s)])
    assert out.returncode != 0 and says in " ".join((out.stdout + out.stderr).split())
    assert not run.exists()  # refused before anything was written


@pytest.mark.integration
@pytest.mark.slow
def test_a_lost_node_leaves_the_survivor_training_with_the_same_numbers(tmp_path: Path) -> None:
    """Two nodes of one worker each; node 1 (its launcher and worker) is killed once epoch 5
    is done; node 0 re-forms the group alone, measures its own profile, re-partitions and
    finishes with the losses of an uninterrupted 2-worker run."""
    run = tmp_path / "elastic"
    common = [*GRAPH, "--set", "launch.nnodes=1:2", "--set", "launch.max_restarts=1"]
    # the survivor regroups after 3 missed beats of 1 s and 2 s of waiting for the lost node
    common += ["--set", "launch.keep_alive_s=1", "--set", "launch.last_call_s=2"]
    common += ["--set", f"launch.master_port={free_port()}", "--set", f"run.out_dir={run}"]
    nodes = [
        start_tied(
            [sys.executable, "-m", "leo_cli", "train", *common, "--set", f"launch.node_rank={r}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        for r in (0, 1)
    ]
    deadline = time.monotonic() + 400
    while not (RunDir(run).metrics.is_file() and len(RunDir(run).read_metrics()) >= 5):
        assert nodes[1].poll() is None and time.monotonic() < deadline, nodes[1].communicate()
        time.sleep(0.05)
    os.killpg(nodes[1].pid, signal.SIGKILL)  # the node's launcher and its worker, at once
    out, err = nodes[0].communicate(timeout=400)
    nodes[1].wait()
    assert nodes[0].returncode == 0, err
    assert "a machine was lost: going on with 1 workers (were 2)" in " ".join(out.split())

    ref = tmp_path / "ref"
    assert leo("train", *GRAPH, "--set", f"run.out_dir={ref}").returncode == 0
    got, want = rows(run), rows(ref)
    assert [r["epoch"] for r in got] == list(range(1, EPOCHS + 1))
    np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in want], rtol=1e-5)
    summary = json.loads((run / "summary.json").read_text())
    segments = summary["segments"]
    assert [s["workers"] for s in segments] == [2, 1] and segments[0]["last_epoch"] >= 3
    assert len(summary["restart_setup_s"]) == 1  # setup_s is the first attempt's
    assert read_meta(run / "partitions")["num_parts"] == 1
    resolved = load_config(run / "resolved_config.yaml")
    assert (resolved.partition.num_parts, resolved.launch.nnodes) == (1, 1)
    hw = json.loads((run / "hardware.json").read_text())
    assert hw["world_size"] == 1  # measured by the group that went on
    assert json.loads((run / "regrouped.json").read_text())["regroup_s"] > 0


@pytest.mark.integration  # spawns the partitioning child
def test_the_regroup_partitions_in_a_child_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pymetis holds the GIL: partitioned in the worker, its heartbeat would stop and the
    watch would end it on a large graph. The regroup's partitions come from a child."""
    from leo_cli.elastic import entry

    def in_the_worker(*args: object, **kwargs: object) -> None:
        raise AssertionError("partitioned in the worker's own process")

    monkeypatch.setattr(entry, "ensure_partitions", in_the_worker)
    cfg = load_config(None, ["data.synthetic.num_nodes=300", "partition.num_parts=2",
                             f"run.out_dir={tmp_path}"])  # fmt: skip
    entry.partition_apart(cfg, tmp_path, None)
    assert read_meta(RunDir(tmp_path).partitions)["num_parts"] == 2
