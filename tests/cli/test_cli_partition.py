"""`leo partition` end to end, and every bad input rejected with one clear sentence."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.cli import leo_here

SMALL = ["--set", "data.synthetic.num_nodes=400", "--set", "data.synthetic.num_features=8"]


def assert_clean_error(res: subprocess.CompletedProcess[str], *needles: str) -> None:
    code, out, err = res.returncode, res.stdout, res.stderr
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    text = " ".join(err.split())
    for needle in needles:
        assert needle in text, (needle, err)


def test_partition_writes_and_reuses(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = leo_here("partition", *SMALL, "--set", f"run.out_dir={out}", "-p", "4")
    assert res.returncode == 0, res.stderr
    meta = json.loads((out / "partitions" / "META.json").read_text())
    assert meta["num_parts"] == 4 and len(meta["stats"]["halo_nodes"]) == 4
    for key in ("edge_cut", "edge_cut_fraction", "balance", "replication_factor"):
        assert key in meta["stats"]
    assert (out / "resolved_config.yaml").is_file()
    assert "edge cut" in res.stdout
    res = leo_here("partition", *SMALL, "--set", f"run.out_dir={out}", "-p", "4")
    assert res.returncode == 0 and "Up to date" in res.stdout
    res = leo_here("partition", *SMALL, "--set", f"run.out_dir={out}", "-p", "4", "--force")
    assert res.returncode == 0 and "Wrote" in res.stdout


def test_memory_limit_note_and_row(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = leo_here(
        "partition",
        *SMALL,
        "--set",
        f"run.out_dir={out}",
        "--set",
        "partition.metis_memory_gb=0.0002",
    )
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "METIS edges seen" in text and "limit 0.0002 GB" in text
    assert "Note: METIS saw" in text and "partition.metis_memory_gb=null" in text
    res = leo_here("partition", *SMALL, "--set", f"run.out_dir={out}", "--force")
    assert res.returncode == 0, res.stderr
    assert "100% (projected" in " ".join(res.stdout.split()) and "Note:" not in res.stdout
    res = leo_here(
        "partition",
        *SMALL,
        "--set",
        f"run.out_dir={out}",
        "--set",
        "partition.metis_memory_gb=1e-6",
    )
    assert_clean_error(res, "partition.metis_memory_gb=1e-06 is too small")


def test_checksum_mismatch_names_file(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert leo_here("partition", *SMALL, "--set", f"run.out_dir={out}").returncode == 0
    victim = out / "partitions" / "part_0" / "x.npy"
    victim.write_bytes(victim.read_bytes()[:-4] + b"\0\0\0\1")
    res = leo_here("partition", *SMALL, "--set", f"run.out_dir={out}")
    assert_clean_error(res, "part_0/x.npy", "checksum", "leo partition --force")
    assert leo_here("partition", *SMALL, "--set", f"run.out_dir={out}", "--force").returncode == 0


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--config", "missing.yaml"], ["missing.yaml", "does not exist"]),
        (["--set", "train.lr=abc"], ["train.lr"]),
        (["--set", "trian.lr=0.1"], ["trian", "Unknown config key"]),
        (["--set", "partition.num_parts=-1"], ["partition.num_parts"]),
        (["--set", "partition.num_parts=1000"], ["partition.num_parts=1000", "400 nodes"]),
        (["--set", "data.name=imagenet"], ["data.name", "imagenet"]),
        (["--set", "model.name=transformer"], ["model.name"]),
        (["--set", "data.name=cora", "--set", "data.root=/nonexistent"], ["/nonexistent", "cora"]),
        (["--set", "data.name=a[/b]"], ["'a[/b]'", "not a known dataset"]),
        (["--set", "pipeline.num_chunks=x"], ["pipeline.num_chunks", "--set"]),
    ],
)
def test_bad_input_is_one_clear_sentence(
    tmp_path: Path, args: list[str], needles: list[str]
) -> None:
    out = tmp_path / "run"
    res = leo_here("partition", *SMALL, "--set", f"run.out_dir={out}", *args)
    assert_clean_error(res, *needles)
    assert not (out / "partitions").exists()
    assert not list(tmp_path.rglob("*.tmp-*"))


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--set", "run.seed=18446744073709551616"], ["'run.seed'", "less than"]),
        (["--set", "run.seed=-1", "--set", "partition.method=random"], ["'run.seed'"]),
    ],
)
def test_seed_out_of_range_is_one_sentence(
    tmp_path: Path, args: list[str], needles: list[str]
) -> None:
    # Before the bound, METIS and numpy's SeedSequence raised tracebacks mid-partitioning.
    res = leo_here("partition", *SMALL, "--set", f"run.out_dir={tmp_path / 'run'}", *args)
    assert_clean_error(res, *needles)


def test_unparsable_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: {name: x\n")
    assert_clean_error(leo_here("partition", "--config", str(bad)), str(bad), "YAML")


def test_help_explains_options() -> None:
    res = leo_here("partition", "--help")
    assert res.returncode == 0
    for opt in ("--config", "--set", "--num-parts", "--force"):
        assert opt in res.stdout


def test_unwritable_out_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    res = leo_here("partition", *SMALL, "--set", f"run.out_dir={blocker / 'run'}")
    assert_clean_error(res, str(blocker), "writable")


def test_graph_without_training_nodes(tmp_path: Path) -> None:
    import numpy as np

    path = tmp_path / "g.npz"
    n = 20
    np.savez(
        path,
        edge_index=np.array([[0, 1], [1, 2]]),
        x=np.ones((n, 3), np.float32),
        y=np.zeros(n, np.int64),
        train_mask=np.zeros(n, bool),
        val_mask=np.ones(n, bool),
        test_mask=np.zeros(n, bool),
    )
    res = leo_here(
        "partition", "--set", f"data.name={path}", "--set", f"run.out_dir={tmp_path / 'run'}"
    )
    assert_clean_error(res, "no training nodes")


def test_ogb_cache_pickles_never_run(tmp_path: Path) -> None:
    """A crafted ogb cache in data.root is ignored: `leo partition` reads the raw files only."""
    import numpy as np
    import torch
    from conftest import Payload, write_ogb

    folder = write_ogb(tmp_path / "data", "ogbn-arxiv", "time", np.arange(30) % 40)
    (folder / "RELEASE_v1.txt").touch()
    (folder / "processed").mkdir()
    torch.save({"graph": Payload(tmp_path / "ran-1")}, folder / "processed" / "data_processed")
    torch.save(Payload(tmp_path / "ran-2"), folder / "split" / "time" / "split_dict.pt")
    res = leo_here(
        "partition",
        *("--set", "data.name=ogbn-arxiv", "--set", f"data.root={tmp_path / 'data'}"),
        *("--set", f"run.out_dir={tmp_path / 'run'}"),
    )
    assert not list(tmp_path.glob("ran-*")), "a pickled cache file ran its payload"
    assert res.returncode == 0, res.stdout + res.stderr
    meta = json.loads((tmp_path / "run" / "partitions" / "META.json").read_text())
    assert meta["dataset"]["num_nodes"] == 30
