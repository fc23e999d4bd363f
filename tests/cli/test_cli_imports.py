"""The CLI answers --help, `leo config` and refused inputs without importing torch: its
modules import the launcher, planner, bench and kernels where the commands act."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, check=False, timeout=120
    )


@pytest.mark.parametrize("module", ["leo_cli.cli.app", "leo_cli.launch.early"])
def test_importing_imports_no_torch(module: str) -> None:
    """The CLI; the workers' server started before `leo train` imports torch."""
    res = python("-c", f"import sys, {module}; print('torch' in sys.modules)")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_the_launchers_set_up_imports_no_scipy() -> None:
    """`leo train` on cached partitions reads no dataset file: the readers import scipy
    where they read one."""
    modules = "leo_cli.cli.app, leo_cli.api, leo_cli.launch.setup, leo_cli.launch.stages"
    res = python("-c", f"import sys, {modules}; print('scipy' in sys.modules)")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"]], ids=" ".join)
def test_help_imports_no_torch(args: list[str]) -> None:
    """`leo ... --help` as users run it (the console script is `python -m leo_cli`), with
    -X importtime naming every module it imports."""
    res = python("-X", "importtime", "-m", "leo_cli", *args)
    assert res.returncode == 0, res.stderr
    assert "Usage:" in res.stdout
    imported = [line.rpartition("|")[2].strip() for line in res.stderr.splitlines()]
    assert "leo_cli.cli.app" in imported  # importtime did list the imports
    torch = [m for m in imported if m == "torch" or m.startswith("torch.")]
    assert not torch, torch[:5]


# Run in turn in one interpreter: after each, its exit code and whether torch was imported.
CASES_SCRIPT = """
import json, sys
from leo_cli.cli.app import app

for args in json.loads(sys.argv[1]):
    try:
        app(args, prog_name="leo")
        code = 0
    except SystemExit as exc:
        code = exc.code
    print(json.dumps([args, code, "torch" in sys.modules]), file=sys.stderr)
"""


def test_config_commands_and_refused_inputs_import_no_torch(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.yaml")
    cases = {
        ("bench", "--help"): 0,
        ("config", "keys", "train"): 0,
        ("config", "show"): 0,
        ("train", "--set", "train.no_such_key=1"): 2,
        ("train", "--config", missing): 2,
        ("bench", "--set", "bench.no_such_key=1"): 2,
        ("partition", "--config", missing): 2,
        ("profile-cache", "--config", missing): 2,
        ("export", str(tmp_path)): 2,  # not a run folder
    }
    res = python("-c", CASES_SCRIPT, json.dumps([list(c) for c in cases]))
    assert res.returncode == 0, res.stderr
    reports = [json.loads(line) for line in res.stderr.splitlines() if line.startswith("[[")]
    assert [tuple(args) for args, _, _ in reports] == list(cases), res.stderr
    for args, code, torch in reports:
        assert code == cases[tuple(args)], (args, res.stderr)
        assert not torch, f"leo {' '.join(args)} imported torch"


def test_the_bench_environment_names_pyg_without_importing_it() -> None:
    """Its version is read from the installed package's metadata (an import costs seconds)."""
    code = (
        "import importlib.metadata as m, sys\n"
        "from leo_cli.bench import report\n"
        "v = report.environment('x')['versions'].get('torch_geometric')\n"
        "try:\n    want = m.version('torch_geometric')\nexcept m.PackageNotFoundError:\n"
        "    want = None\n"
        "print(v == want, 'torch_geometric' in sys.modules)"
    )
    res = python("-c", code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["True", "False"]
