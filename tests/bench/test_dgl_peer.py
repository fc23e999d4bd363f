"""The dgl peer of `leo bench`: the script under another interpreter (a stand-in `dgl` package
on PYTHONPATH, or a real DGL where one imports), its row beside LEO's, and the sentence where
DGL does not import."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from helpers.cli import leo, leo_here

from leo_cli.bench.dgl_peer import DglNet
from leo_cli.bench.peers import peer_command, peer_spec, script_path, write_peer_files
from leo_cli.bench.suite import variants
from leo_cli.config import load_config
from leo_cli.registry import CONVS, peer_of

STAND_IN = Path(__file__).with_name("stand_in")  # a `dgl` package with the APIs the peer uses
TINY = ["data.synthetic.num_nodes=300", "data.synthetic.num_features=8", "model.hidden_channels=8"]
REPORTED = {
    "epoch_times",
    "test_acc",
    "final_loss",
    "setup_s",
    "run_setup_s",
    "wall_s",
    "peak_rss_bytes",
    "peak_rss_total_bytes",
}  # fmt: skip  (the PyG peers' keys)


def stand_in_nn() -> ModuleType:
    """The stand-in's layers, loaded under a name of their own (no `dgl` in this process)."""
    spec = importlib.util.spec_from_file_location(
        "stand_in_dgl_nn", STAND_IN / "dgl/nn/__init__.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def settings(model: str) -> list[str]:
    return [*TINY, f"model.name={model}", *(["model.heads=2"] * (model == "gat"))]


@pytest.mark.parametrize("model", sorted(CONVS))
def test_each_model_gets_its_dgl_layer_with_leo_widths(model: str) -> None:
    cfg = load_config(None, settings(model))
    spec = peer_spec(cfg, peer_of("dgl"))
    assert spec["layer"] == CONVS[model].dgl_peer and spec["device"] == "cpu"
    net = DglNet(stand_in_nn(), spec, 8, 3)
    assert len(net.convs) == cfg.model.num_layers
    width = 8 * (2 if model == "gat" else 1)  # GAT's hidden heads are concatenated
    second = [p.shape for p in net.convs[1].parameters() if p.dim() == 2]
    assert any(shape[1] == width for shape in second), (model, second)


def test_the_script_imports_only_torch_numpy_and_dgl() -> None:
    """It runs under interpreters without LEO: no import of leo_cli or of another package."""
    tree = ast.parse(script_path(peer_of("dgl")).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    roots = {name.split(".")[0] for name in names}
    assert roots - set(sys.stdlib_module_names) == {"torch", "numpy", "dgl"}, roots


def run_script(args: list[str], python: str = sys.executable, **env: str) -> Any:
    return subprocess.run(
        [python, str(script_path(peer_of("dgl"))), *args], capture_output=True, text=True,
        timeout=300, env={**os.environ, "PYTHONNOUSERSITE": "1", **env}, check=False,
    )  # fmt: skip


@pytest.mark.integration
@pytest.mark.parametrize("model", ["sage", "gin", "gat"])
def test_the_script_trains_under_an_interpreter_without_leo(tmp_path: Path, model: str) -> None:
    """The script, run by its path with the stand-in on PYTHONPATH, reads the graph file and
    its spec and prints the PyG peers' JSON line."""
    cfg = load_config(None, settings(model))
    write_peer_files(cfg, tmp_path, [peer_of("dgl")])
    cmd = peer_command(cfg, peer_of("dgl"), tmp_path, 3)
    assert cmd[1].endswith("dgl_peer.py") and "-m" not in cmd
    res = run_script(cmd[2:], PYTHONPATH=str(STAND_IN))
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout.splitlines()[-1])
    assert set(result) >= REPORTED and len(result["epoch_times"]) == 3
    assert 0 <= result["test_acc"] <= 1 and result["setup_s"] < result["wall_s"]
    assert result["framework_version"] == "0.0-stand-in"


@pytest.mark.integration
def test_a_python_without_dgl_skips_the_row_in_one_sentence(tmp_path: Path) -> None:
    res = run_script(["--check"])
    if res.returncode == 0:
        pytest.skip("DGL imports here")
    assert res.returncode == 3 and res.stdout.strip().endswith("(No module named 'dgl').")
    said: list[str] = []
    cfg = load_config(None, [*TINY, "bench.world_sizes=[1]", "bench.peers=[dgl]"])
    rows = variants(cfg, said.append)
    assert {r.system for r in rows} == {"leo"} and len(said) == 1  # LEO's rows only
    assert said[0].startswith(f"DGL does not import under {sys.executable}")
    assert said[0].endswith("bench.peer_python names an interpreter that has it: the dgl row is "
                            "skipped.")  # fmt: skip


def test_an_interpreter_that_does_not_run_is_one_sentence(tmp_path: Path) -> None:
    res = leo_here("bench", "--set", f"run.out_dir={tmp_path}", "--set", "bench.peers=[dgl]",
                   "--set", f"bench.peer_python={tmp_path / 'nothing'}")  # fmt: skip
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"bench.peer_python={tmp_path / 'nothing'} cannot be run" in res.stderr


def python_with_stand_in(folder: Path) -> Path:
    """An interpreter where the stand-in `dgl` imports, as `bench.peer_python` names a DGL
    environment's: this one, the stand-in first on its PYTHONPATH."""
    wrapper = folder / "python-with-dgl"
    stand_in, python = shlex.quote(str(STAND_IN)), shlex.quote(sys.executable)
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH={stand_in}"${{PYTHONPATH:+:$PYTHONPATH}}" exec {python} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


@pytest.mark.integration
def test_bench_prints_the_dgl_row_beside_leo_as_json_lines(tmp_path: Path) -> None:
    """`leo bench --format json` with bench.peers=[dgl] (the stand-in, under the interpreter
    bench.peer_python names): every stdout line is a row (LEO's one worker with and without
    the static aggregate, then dgl's); the dgl row has its epoch time and accuracy."""
    out = tmp_path / "bench"
    python = python_with_stand_in(tmp_path)
    sets = [*TINY, "bench.world_sizes=[1]", "bench.peers=[dgl]", "bench.repeats=1",
            "bench.num_epochs=2", f"bench.peer_python={python}", f"run.out_dir={out}"]  # fmt: skip
    args = ("bench", "--format", "json", *(a for s in sets for a in ("--set", s)))
    res = leo(*args)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [(r["table"], r["system"]) for r in rows] == [("bench", "leo")] * 2 + [("bench", "dgl")]
    dgl = rows[-1]
    assert dgl["epoch_time_s"] > 0 and 0 <= dgl["test_acc"] <= 1 and dgl["exact"] is True
    assert "Wrote" in res.stderr and "| dgl | dgl | 1 |" in (out / "bench.md").read_text()


def dgl_python() -> str | None:
    """An interpreter where DGL imports: LEO_DGL_PYTHON, else this one; None where none does."""
    python = os.environ.get("LEO_DGL_PYTHON", sys.executable)
    return python if run_script(["--check"], python).returncode == 0 else None


@pytest.mark.integration
def test_real_dgl_trains_the_gcn(tmp_path: Path) -> None:
    """Where DGL imports (LEO_DGL_PYTHON names its interpreter), its GraphConv trains."""
    python = dgl_python()
    if python is None:
        pytest.skip("DGL does not import here (set LEO_DGL_PYTHON to an interpreter with DGL)")
    cfg = load_config(None, settings("gcn"))
    write_peer_files(cfg, tmp_path, [peer_of("dgl")])
    cmd = peer_command(cfg, peer_of("dgl"), tmp_path, 3)
    res = run_script(cmd[2:], python)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout.splitlines()[-1])
    assert set(result) >= REPORTED and 0 <= result["test_acc"] <= 1
    assert result["framework_version"] != "0.0-stand-in"
