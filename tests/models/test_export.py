"""`leo export`: each convolution's record names the PyG model its state dict loads into, and
the best-validation model of a run loads into PyG's GCN, GraphSAGE, GIN and
GAT with strict=True and reproduces the test accuracy LEO reported for it."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import TrainedRun, random_graph
from helpers.cli import leo, leo_here

from leo_cli.config import load_config
from leo_cli.graph.datasets import load_dataset
from leo_cli.graph.layout import build_parts
from leo_cli.graph.types import DatasetInfo
from leo_cli.models.export import to_pyg
from leo_cli.registry import CONVS
from leo_cli.run_dir import RunDir
from leo_cli.worker.assemble import assemble

pyg_models = pytest.importorskip("torch_geometric.nn.models")

SMALL = ["--set", "data.synthetic.num_nodes=800", "--set", "data.synthetic.num_features=16",
         "--set", "model.hidden_channels=16", "--set", "train.num_epochs=8",
         "--set", "partition.num_parts=2"]  # fmt: skip


@pytest.mark.parametrize("model", list(CONVS))
def test_each_conv_exports_to_its_records_pyg_model(model: str) -> None:
    """The state dict of an untrained model, renamed by its `Conv.pyg_model`, loads into that
    PyG class with strict=True and gives LEO's float64 logits."""
    g = random_graph(num_nodes=60, num_edges=240, num_features=6, num_classes=3, seed=2)
    sets = ["train.dtype=float64", f"model.name={model}", "model.hidden_channels=4"]
    sets += ["model.num_layers=3", "pipeline.mode=leo"]
    if CONVS[model].attention:  # PyG's GAT: as many heads at the output as in hidden layers
        sets += ["model.heads=2", "model.output_heads=2"]
    cfg = load_config(None, sets)
    part = build_parts(g, np.zeros(g.num_nodes, dtype=np.int64), 1)[0]
    job = assemble(cfg, part, DatasetInfo.of(g), 1, torch.device("cpu"))
    exported = to_pyg(cfg.model, job.model.state_dict())
    pyg_model = CONVS[model].pyg_model
    assert pyg_model is not None and exported.cls == pyg_model.cls
    theirs = getattr(pyg_models, exported.cls)(**exported.kwargs).double()
    theirs.load_state_dict(exported.state, strict=True)
    job.model.eval()
    theirs.eval()
    x = torch.from_numpy(g.x_NF).double()
    edge_index = torch.from_numpy(g.edge_index_2E).long()
    with torch.no_grad():
        expected = job.model(x, job.graph)
        torch.testing.assert_close(theirs(x, edge_index), expected, rtol=1e-10, atol=1e-10)


def pyg_test_acc(run: Path, model_file: Path, call: str) -> float:
    """The exported model in PyG, evaluated on the run's graph as LEO loads it."""
    cfg = load_config(RunDir(run).config)
    graph = load_dataset(cfg.data, cfg.run.seed)
    m = re.fullmatch(r"torch_geometric\.nn\.models\.(\w+)\((.*)\)", call)
    assert m is not None, call
    kwargs: dict[str, Any] = eval(f"dict({m.group(2)})")  # the printed call, as a user pastes it
    model = getattr(pyg_models, m.group(1))(**kwargs)
    model.load_state_dict(torch.load(model_file), strict=True)
    model.eval()
    x = torch.from_numpy(graph.x_NF)
    edges = torch.from_numpy(graph.edge_index_2E).long()
    with torch.no_grad():
        pred = model(x, edges).argmax(1)
    test = torch.from_numpy(graph.test_mask_N)
    y = torch.from_numpy(graph.y_N)
    return float((pred[test] == y[test]).float().mean())


def export_reproduces(run: Path, out: Path) -> None:
    """`leo export` of `run` into `out`: the best model's epoch and accuracy are the summary's,
    and PyG gives the test accuracy LEO reported for it."""
    best = RunDir(run).read_best()
    summary = RunDir(run).read_summary()
    assert best["epoch"] == summary["best_epoch"] and best["test_acc"] == summary["test_acc"]
    res = leo("export", str(run), "--out", str(out), env={**os.environ, "COLUMNS": "400"})
    assert res.returncode == 0, res.stderr
    call = next(line.split("= ", 1)[1] for line in res.stdout.splitlines() if "model = " in line)
    acc = pyg_test_acc(run, out, call.strip())
    assert acc == pytest.approx(summary["test_acc"], abs=1.5 / 160)  # a node's tie at most


@pytest.mark.integration
def test_exported_gcn_gives_leos_test_accuracy_in_pyg(
    trained_run: TrainedRun, tmp_path: Path
) -> None:
    """GCN, the default model: the session's trained run (600 nodes, about 120 test nodes)."""
    assert load_config(RunDir(trained_run.folder).config).model.name == "gcn"
    export_reproduces(trained_run.folder, tmp_path / "m.pt")


@pytest.mark.integration
@pytest.mark.parametrize(
    ("model", "extra"),
    [("sage", []), ("gin", []), ("gat", ["model.heads=2", "model.output_heads=2"])],
)
def test_exported_model_gives_leos_test_accuracy_in_pyg(
    tmp_path: Path, model: str, extra: list[str]
) -> None:
    run = tmp_path / "run"
    sets = [a for item in [f"model.name={model}", *extra] for a in ("--set", item)]
    res = leo("train", *SMALL, *sets, "--set", f"run.out_dir={run}", timeout=300)
    assert res.returncode == 0, res.stderr
    export_reproduces(run, tmp_path / "m.pt")


def test_export_refuses_a_folder_without_a_best_model(tmp_path: Path) -> None:
    res = leo_here("export", str(tmp_path), "--out", str(tmp_path / "m.pt"))
    assert res.returncode == 2 and "not a run folder" in res.stderr
    RunDir(tmp_path).config.write_text("run: {name: x}\n")
    res = leo_here("export", str(tmp_path), "--out", str(tmp_path / "m.pt"))
    assert res.returncode == 2 and "no best-validation model" in res.stderr
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.integration
def test_cora_gcn_exported_to_pyg_reproduces_leos_test_accuracy(
    tmp_path: Path, planetoid_root: Path
) -> None:
    run = tmp_path / "run"
    config = Path(__file__).resolve().parents[2] / "configs" / "cora_gcn.yaml"
    sets = [f"data.root={planetoid_root}", "train.num_epochs=60", f"run.out_dir={run}"]
    res = leo("train", "--config", str(config), *[a for s in sets for a in ("--set", s)])
    assert res.returncode == 0, res.stderr
    res = leo(
        "export", str(run), "--out", str(tmp_path / "m.pt"), env={**os.environ, "COLUMNS": "400"}
    )
    assert res.returncode == 0, res.stderr
    call = next(line.split("= ", 1)[1] for line in res.stdout.splitlines() if "model = " in line)
    summary = RunDir(run).read_summary()
    assert summary["test_acc"] > 0.7
    acc = pyg_test_acc(run, tmp_path / "m.pt", call.strip())
    assert acc == pytest.approx(summary["test_acc"], abs=1.5 / 1000)  # 1000 test nodes
