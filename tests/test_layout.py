"""The package layout holds (docs/architecture.md): imports flow one way, a worker process
loads no parent-side code (probe, partitioners, elastic launcher), and the docs point at
paths that exist."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "leo_cli"

# Lower imports nothing higher; packages of one layer do not import each other.
LAYERS = {
    "errors": 0, "util": 0, "registry": 0, "_C": 0,
    "run_dir": 1,
    "config": 2,
    "kernels": 3,
    "graph": 4, "kernel_tools": 4,
    "comm": 5,
    "models": 6, "harness": 6,
    "planner": 7,
    "worker": 8, "launch": 8,
    "bench": 9, "elastic": 9,
    "api": 10,
    "cli": 11,
    "__main__": 12,
}  # fmt: skip
# What only the parent process (and the planner's pricing side, for the profile) may import.
# `elastic` is the workers' entry that re-partitions when their count changes (its own
# process entry: a worker of a run of fixed size never loads it).
PARENT_ONLY = {
    "leo_cli.planner.profile": ("launch", "cli", "bench", "elastic", "planner.cost",
                                "planner.policy", "planner.make", "planner.weights",
                                "planner.plot", "planner.profile"),
    "leo_cli.graph.partitioners": ("launch", "cli", "bench", "graph.partition_cache"),
    "leo_cli.graph.partition_cache": ("launch", "cli", "bench", "elastic"),
    "leo_cli.launch": ("launch", "cli", "bench", "api", "elastic"),
}  # fmt: skip
# The read side of the planner, the only part of it a worker imports.
PLANNER_READ = ("plan", "plan_schema", "auto_mode", "checks", "reach")
WORKER_MAY_IMPORT = ("comm", "models", "graph", "config", "run_dir", "kernels", "registry",
                     "errors", "util", "worker", "harness")  # fmt: skip
# The rank harness wraps a rank's work and knows nothing of it: it reads where the rank sits
# (comm.dist) and writes into the run folder, nothing more.
HARNESS_MAY_IMPORT = ("leo_cli.comm.dist", "leo_cli.errors", "leo_cli.run_dir", "leo_cli.util",
                      "leo_cli.harness")  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every leo_cli module `path` imports, at any depth of its code (function-level too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("leo_cli"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if exists(sub) else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("leo_cli"))
    return found


def exists(module: str) -> bool:
    base = ROOT / module.replace(".", "/")
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


@functools.cache
def parsed() -> dict[str, frozenset[str]]:
    """Module -> the leo_cli modules it imports, parsed once (the sources do not change while
    the tests run)."""
    return {module_name(p): frozenset(imports_of(p)) for p in PACKAGE.rglob("*.py")}


@pytest.fixture(scope="module", autouse=True)
def parse_once() -> None:
    """Every test here reads the import graph: parsing the package is their shared set-up."""
    parsed()


def graph() -> dict[str, set[str]]:
    """The import graph, a copy each test may change."""
    return {module: set(imported) for module, imported in parsed().items()}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


# The one import up the layers: calling the `bench` package runs `leo_cli.api.bench` (the
# Python API's `bench` is that package, leo_cli/bench/__init__.py).
UPWARD = {("leo_cli.bench", "leo_cli.api")}


def test_imports_flow_one_way() -> None:
    wrong = []
    for module, imported in graph().items():
        mine = package_of(module)
        for other in imported:
            theirs = package_of(other)
            if not mine or not theirs or mine == theirs or (module, other) in UPWARD:
                continue
            if LAYERS[theirs] >= LAYERS[mine]:
                wrong.append(f"{module} imports {other}")
    assert not wrong, "\n".join(wrong)


def test_parent_side_modules_are_imported_by_the_parent_only() -> None:
    wrong = []
    for module, imported in graph().items():
        inside = module.removeprefix("leo_cli.")
        for other in imported:
            for guarded, allowed in PARENT_ONLY.items():
                hit = other == guarded or other.startswith(guarded + ".")
                if hit and not any(inside == a or inside.startswith(a + ".") for a in allowed):
                    wrong.append(f"{module} imports {other}")
    assert not wrong, "\n".join(wrong)


def test_the_worker_imports_its_layers_and_the_planner_read_side_only() -> None:
    wrong = []
    for module, imported in graph().items():
        if package_of(module) != "worker":
            continue
        for other in imported:
            pkg = package_of(other)
            if pkg == "planner":
                ok = other.removeprefix("leo_cli.planner.").split(".")[0] in PLANNER_READ
            else:
                ok = pkg in WORKER_MAY_IMPORT or not pkg  # `leo_cli` itself: its version
            if not ok:
                wrong.append(f"{module} imports {other}")
    assert not wrong, "\n".join(wrong)


def test_the_harness_imports_where_a_rank_sits_and_nothing_of_its_work() -> None:
    wrong = [
        f"{module} imports {other}"
        for module, imported in graph().items()
        if package_of(module) == "harness"
        for other in imported
        if not other.startswith(HARNESS_MAY_IMPORT)
    ]
    assert not wrong, "\n".join(wrong)


def test_no_rank_harness_in_comm() -> None:
    """Process lifecycle, heartbeats, error files and CPU pinning live in `harness/`."""
    comm = {p.stem for p in (PACKAGE / "comm").glob("*.py")}
    assert not comm & {"process", "placement"}, sorted(comm & {"process", "placement"})


def closure(start: str, edges: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(edges.get(module, ()))
        parent = module.rpartition(".")[0]
        if parent.startswith("leo_cli"):
            todo.append(parent)  # importing a module runs its package's __init__
    return seen


FORBIDDEN_IN_WORKER = (
    "leo_cli.launch",
    "leo_cli.planner.profile",
    "leo_cli.planner.cost",
    "leo_cli.planner.make",
    "leo_cli.graph.partitioners",
    "leo_cli.graph.partition_cache",
    "leo_cli.cli",
    "leo_cli.bench",
    "leo_cli.api",
)


def test_a_worker_reaches_no_parent_side_module_through_any_import() -> None:
    imports = graph()
    # The package root loads leo_cli.api on first use of `train` / `bench` only (a module
    # __getattr__): the run-time test below checks a worker never does.
    imports["leo_cli"] = set()
    reached = closure("leo_cli.worker.entry", imports)
    bad = sorted(m for m in reached if m.startswith(FORBIDDEN_IN_WORKER))
    assert not bad, bad


@pytest.mark.integration
def test_a_worker_process_loads_no_probe_partitioner_or_elastic_launcher() -> None:
    """What `python -m leo_cli.worker.entry` loads before it runs (its function-level
    imports are covered by the static closure above)."""
    code = "import sys, leo_cli.worker.entry; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    forbidden = (
        *FORBIDDEN_IN_WORKER,
        "pymetis",
        "torch.distributed.launcher",
        "torch.distributed.elastic.agent",
        "torch.distributed.elastic.rendezvous",
    )
    bad = [m for m in out if m.startswith(forbidden)]
    assert not bad, bad
    assert "leo_cli.worker.trainer" in out  # it did import the worker


DOC_PATH = re.compile(
    r"(?<![\w/.-])((?:leo_cli|tests|docs|configs|scripts|cuda|datasets)/[\w./-]*[\w])"
)
IN_PACKAGE = re.compile(
    r"(?<![\w/.-])((?:bench|cache|cli|comm|config|graph|harness|kernel_tools|kernels|launch|models|"
    r"planner|train|util|worker)/[\w/]+\.py)"
)


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_point_at_paths_that_exist(path: Path) -> None:
    text = path.read_text()
    missing = sorted(
        {p for p in DOC_PATH.findall(text) if not (ROOT / p.rstrip(".")).exists()}
        | {p for p in IN_PACKAGE.findall(text) if not (PACKAGE / p).exists()}
    )
    assert not missing, missing


def test_docstrings_and_comments_point_at_modules_that_exist() -> None:
    missing = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        missing |= {f"{path.name}: {p}" for p in IN_PACKAGE.findall(text)
                    if not (PACKAGE / p).exists()}  # fmt: skip
    assert not missing, sorted(missing)


def test_every_package_folder_is_a_regular_package() -> None:
    """A folder without `__init__.py` is left out of the wheel (setuptools finds packages)."""
    folders = {p.parent for p in PACKAGE.rglob("*.py")}
    assert not sorted(str(f) for f in folders if not (f / "__init__.py").is_file())
