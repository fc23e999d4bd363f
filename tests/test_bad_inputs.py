"""A corpus of bad and edited inputs for `leo convert`, run files and cache entries: each case
builds one input in a fresh folder, runs the code the command runs on it, and names what the
user sees (one sentence, a LeoError, which the CLI prints without a traceback and with exit
code 2) or that nothing is refused (`None`: the input is read as missing or made again).
Every sentence's fixed part is listed in docs/troubleshooting.md (checked here too).

In-process and without workers: the end-to-end resume corpus is tests/run_dir/
test_edited_files.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from leo_cli.config import load_config
from leo_cli.config.schema import DataConfig, PartitionConfig, SyntheticConfig
from leo_cli.errors import LeoError
from leo_cli.graph.convert import convert, parse_split, read_source
from leo_cli.graph.datasets.npz import load_npz
from leo_cli.graph.partition_cache import ensure_partitions
from leo_cli.graph.storage import META, read_meta, verify_files
from leo_cli.launch.run_folder import for_command, for_train, newest
from leo_cli.planner.plan import read_plan
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.run_dir import RunDir, check_rows

ROOT = Path(__file__).resolve().parents[1]
EDGES = "0 1\n1 2\n2 3\n3 0\n"  # 4 nodes
OUT = "out.npz"  # what a conversion writes (nothing, when refused)
ROW = '{"epoch": 1, "loss": 1.0, "epoch_time_s": 0.1, "comm_bytes": 0}\n'  # a row LEO wrote
LABELS = "0\n1\n0\n1\n"


@dataclass(frozen=True)
class Case:
    """One bad or edited input: `run(folder)` does what the command does with it; `shows`
    the fixed part of the sentence the user sees (None: nothing is refused)."""

    name: str
    run: Callable[[Path], Any]
    shows: str | None


def write(folder: Path, **texts: str) -> None:
    for name, text in texts.items():
        (folder / name.replace("_dot_", ".")).write_text(text)


def converting(
    edges: str | None = EDGES, name: str = "e.txt", **options: Any
) -> Callable[[Path], Any]:
    """`leo convert NAME [options]` on an edge list (or graph file) holding `edges`; options
    name files in the folder (`labels="y.csv"`) or give the split."""

    def run(folder: Path) -> Any:
        if edges is not None:
            (folder / name).write_text(edges)
        paths = {k: folder / v for k, v in options.items() if k in ("features", "labels", "masks")}
        out = folder / options.get("out", OUT)
        split = parse_split(options.get("split", "0.6,0.2,0.2"))
        return convert(read_source(folder / name, None), out, split=split, **paths)

    return run


def with_files(make: Callable[[Path], None], then: Callable[[Path], Any]) -> Callable[[Path], Any]:
    def run(folder: Path) -> Any:
        make(folder)
        return then(folder)

    return run


def pyg(**tensors: Any) -> Callable[[Path], Any]:
    """`leo convert --from-pyg` on a dict of tensors (4 nodes unless given)."""

    def run(folder: Path) -> Any:
        base: dict[str, Any] = {"edge_index": torch.tensor([[0, 1, 2], [1, 2, 3]])}
        base["y"] = torch.tensor([0, 1, 0, 1])
        given = {k: v for k, v in {**base, **tensors}.items() if v is not None}  # None: left out
        torch.save(given, folder / "d.pt")
        return convert(read_source(None, folder / "d.pt"), folder / OUT)

    return run


def gml(nodes: str) -> Callable[[Path], Any]:
    return converting(f"graph [ {nodes} edge [ source 0 target 1 ] ]", "g.gml")


def npz(**arrays: Any) -> Callable[[Path], Any]:
    """`data.name=g.npz` on a 4-node graph with `arrays` changed."""

    def run(folder: Path) -> Any:
        train = np.array([True, True, False, False])
        base = {"edge_index": np.array([[0, 1], [1, 2]]), "x": np.ones((4, 2), np.float32),
                "y": np.array([0, 1, 0, 1]), "train_mask": train, "val_mask": ~train,
                "test_mask": ~train}  # fmt: skip
        np.savez(folder / "g.npz", **{**base, **arrays})
        return load_npz(folder / "g.npz")

    return run


# --- run files --------------------------------------------------------------------------------


def a_run(folder: Path, metrics: str = '{"epoch": 1, "loss": 1.0}\n') -> Path:
    run = folder / "run"
    run.mkdir()
    RunDir(run).config.write_text("run: {}\n")
    RunDir(run).metrics.write_text(metrics)
    return run


def config_file(text: str) -> Callable[[Path], Any]:
    def run(folder: Path) -> Any:
        (folder / "c.yaml").write_text(text)
        return load_config(folder / "c.yaml")

    return run


def metrics(text: str) -> Callable[[Path], Any]:
    def run(folder: Path) -> Any:
        run_dir = RunDir(a_run(folder, text))
        return check_rows(run_dir.read_metrics(), run_dir.metrics)

    return run


def checkpoints(*contents: bytes) -> Callable[[Path], Any]:
    def run(folder: Path) -> Any:
        run_dir = RunDir(a_run(folder))
        run_dir.checkpoints.mkdir()
        for epoch, data in enumerate(contents, start=1):
            (run_dir.checkpoints / f"epoch_{epoch:06d}.pt").write_bytes(data)
        return run_dir.read_latest()

    return run


def best(data: bytes | None) -> Callable[[Path], Any]:
    def run(folder: Path) -> Any:
        run_dir = RunDir(a_run(folder))
        run_dir.checkpoints.mkdir()
        if data is not None:
            run_dir.best.write_bytes(data)
        return run_dir.read_best()

    return run


def folder_command(named: bool, train: bool, resume: bool = False) -> Callable[[Path], Any]:
    def run(folder: Path) -> Any:
        run_dir = a_run(folder)
        cfg = load_config(None, [f"run.out_dir={run_dir}" if named else f"run.name={folder.name}"])
        if not train:
            return for_command(cfg)
        if not named:
            return newest(folder / "nothing")
        return for_train(cfg, resume=resume, overwrite=False)

    return run


# --- cache entries ----------------------------------------------------------------------------

DATA = DataConfig(synthetic=SyntheticConfig(num_nodes=200, num_features=4))


def partitions(edit: Callable[[Path], None], verify: bool = False) -> Callable[[Path], Any]:
    """Partitions made in a cache, the entry edited, then read as a run reads them."""

    def run(folder: Path) -> Any:
        made = ensure_partitions(DATA, PartitionConfig(num_parts=2), 0, folder / "run",
                                 cache_dir=folder / "cache")  # fmt: skip
        edit(made.path)
        meta = read_meta(made.path)
        if verify:
            verify_files(made.path, meta)
        return meta

    return run


def edit_meta(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        meta = json.loads((root / META).read_text())
        change(meta)
        (root / META).write_text(json.dumps(meta))

    return edit


def rebuilt_after(edit: Callable[[Path], None]) -> Callable[[Path], Any]:
    """Partitions made in a cache, `edit`ed, then asked for again (the stage: rebuild or
    reuse)."""

    def run(folder: Path) -> Any:
        args = (DATA, PartitionConfig(num_parts=2), 0, folder / "run")
        made = ensure_partitions(*args, cache_dir=folder / "cache")
        edit(folder)
        again = ensure_partitions(*args, cache_dir=folder / "cache")
        assert again.meta["dataset"] == made.meta["dataset"]
        return again

    return run


def plan_file(text: str) -> Callable[[Path], Any]:
    def run(folder: Path) -> Any:
        (folder / RunDir.PLAN).write_text(text)
        return read_plan(folder)

    return run


def hardware_file(text: str) -> Callable[[Path], Any]:
    def run(folder: Path) -> Any:
        (folder / "hw.json").write_text(text)
        return HardwareProfile.read(folder / "hw.json")

    return run


def _dangle(root: Path) -> None:
    target = root.resolve()
    for path in sorted(target.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    target.rmdir()


def _truncate_a_part(root: Path) -> None:
    part = next((root / "part_0").glob("*.npy"))
    part.write_bytes(part.read_bytes()[:-8])


def _garbage_digests(folder: Path) -> None:
    (folder / "cache" / "partitions" / RunDir.SOURCE_DIGESTS).write_text("[nonsense")


BIG = "0 1000000000000\n"
NODE_RANGE = "N at most 3,037,000,499"

CONVERT = [
    Case("empty edge list", converting("# nothing\n"), "is empty; it needs one row per line"),
    Case("words in an edge list", converting("a b\n1 2\n3 x\n"), "holds something other than"),
    Case("one column", converting("0\n1\n"), "has fewer than 2 columns"),
    Case("negative id", converting("0 -1\n"), "holds negative node ids; ids must be 0..N-1"),
    Case("id 10^12", converting(BIG), NODE_RANGE),
    Case("id int64 max", converting("0 9223372036854775807\n"), NODE_RANGE),
    Case("id beyond int64", converting("0 99999999999999999999\n"), "holds something other"),
    Case("missing edge list", converting(None), "does not exist; pass an existing file"),
    Case("no labels", converting(), "no labels: pass --labels FILE"),
    Case(
        "too few labels",
        with_files(lambda f: write(f, y_dot_csv="0\n1\n"), converting(labels="y.csv")),
        "the labels cover",
    ),
    Case(
        "label 10^12",
        with_files(
            lambda f: write(f, y_dot_csv="0\n1\n0\n1000000000000\n"), converting(labels="y.csv")
        ),
        "classes are numbered 0..C-1",
    ),
    Case(
        "three label columns",
        with_files(lambda f: write(f, y_dot_csv="0,1,2\n"), converting(labels="y.csv")),
        "give 1 or 2 (node,label)",
    ),
    Case(
        "label of node 9",
        with_files(lambda f: write(f, y_dot_csv="node,label\n9,1\n"), converting(labels="y.csv")),
        "names nodes outside 0..",
    ),
    Case(
        "features of 3 nodes",
        with_files(
            lambda f: (write(f, y_dot_csv=LABELS), np.save(f / "x.npy", np.ones((3, 2)))),
            converting(labels="y.csv", features="x.npy"),
        ),
        "give one feature row per node",
    ),
    Case(
        "1-D features",
        with_files(
            lambda f: (write(f, y_dot_csv=LABELS), np.save(f / "x.npy", np.ones(4))),
            converting(labels="y.csv", features="x.npy"),
        ),
        "must hold a numeric array of shape",
    ),
    Case(
        "features not .npy",
        with_files(
            lambda f: write(f, y_dot_csv=LABELS, x_dot_npy="1,2\n"),
            converting(labels="y.csv", features="x.npy"),
        ),
        "is not a readable .npy array",
    ),
    Case(
        "masks lacking one",
        with_files(
            lambda f: (
                write(f, y_dot_csv=LABELS),
                np.savez(f / "m.npz", train_mask=np.ones(4, bool)),
            ),
            converting(labels="y.csv", masks="m.npz"),
        ),
        "lacks val_mask, test_mask; save all three",
    ),
    Case(
        "masks of 3 nodes",
        with_files(
            lambda f: (
                write(f, y_dot_csv=LABELS),
                np.savez(
                    f / "m.npz",
                    **{k: np.ones(3, bool) for k in ("train_mask", "val_mask", "test_mask")},
                ),
            ),
            converting(labels="y.csv", masks="m.npz"),
        ),
        "entries but the graph has",
    ),
    Case(
        "masks not .npz",
        with_files(
            lambda f: write(f, y_dot_csv=LABELS, m_dot_npz="x"),
            converting(labels="y.csv", masks="m.npz"),
        ),
        "is not a readable .npz file",
    ),
    Case(
        "out not .npz",
        with_files(lambda f: write(f, y_dot_csv=LABELS), converting(labels="y.csv", out="g.txt")),
        "must end in .npz",
    ),
    Case("bad split", converting(split="0.7,0.3,0.2"), "is not three fractions summing to"),
    Case(
        "GML number and string",
        gml('node [ id 0 y 1 w 3 ] node [ id 1 y 0 w "abc" ]'),
        "is a number on some nodes and",
    ),
    Case(
        "GML label past int64",
        gml("node [ id 0 y 99999999999999999999999 ] node [ id 1 y 0 ]"),
        "classes are numbered 0..C-1",
    ),
    Case(
        "GML string features", gml('node [ id 0 y 0 x "a" ] node [ id 1 y 1 x "b" ]'), None
    ),  # one string each: not a list, not a number: no features, the constant 1
    Case(
        "GML feature lists of words",
        gml('node [ id 0 y 0 x "a" x "b" ] node [ id 1 y 1 x "c" x "d" ]'),
        "holds values that are not numbers",
    ),
    Case(
        "GML feature lists of two lengths",
        gml("node [ id 0 y 0 x 1 x 2 ] node [ id 1 y 1 x 1 x 2 x 3 ]"),
        "has rows of different lengths",
    ),
    Case(
        "GML feature on one node only",
        gml("node [ id 0 y 0 w 1 ] node [ id 1 y 1 ]"),
        "is missing on some nodes",
    ),
    Case("malformed GraphML", converting("<graphml><graph>", "g.graphml"), "networkx cannot read"),
    Case(
        "not a torch file",
        with_files(lambda f: write(f, d_dot_pt="hello"), lambda f: read_source(None, f / "d.pt")),
        "is not a dict of tensors torch.load reads",
    ),
    Case("no edge_index", pyg(edge_index=None), "holds no dict with an `edge_index` tensor"),
    Case("edge_index a list", pyg(edge_index=[[0, 1], [1, 2]]), "is a list, not a tensor"),
    Case("sparse features", pyg(x=torch.ones(4, 2).to_sparse()), "is a sparse tensor; save"),
    Case(
        "edge_index of 3 rows",
        pyg(edge_index=torch.zeros(3, 2, dtype=torch.long)),
        "`edge_index` must be an integer tensor of shape [2, E]",
    ),
    Case("fractional labels", pyg(y=torch.tensor([0.5, 1, 0, 1])), "not whole numbers"),
    Case("3-D features", pyg(x=torch.ones(4, 2, 2)), "give numbers of shape [N, F]"),
    Case(
        "labels needing grad, bfloat16 features",
        pyg(
            x=torch.ones(4, 2, dtype=torch.bfloat16, requires_grad=True),
            y=torch.tensor([0.0, 1, 0, 1], requires_grad=True),
        ),
        None,
    ),
    Case("two sources", lambda f: read_source(f / "e.txt", f / "d.pt"), "give one source"),
    Case("npz of 10^12 classes", npz(num_classes=np.array(10**12)), "classes; LEO trains at most"),
    Case(
        "npz not an archive",
        with_files(lambda f: write(f, g_dot_npz="a,b\n"), lambda f: load_npz(f / "g.npz")),
        "is not an .npz archive",
    ),
    Case("npz missing y", npz(y=np.zeros(0, np.int64)), "entries but `x` has"),
]

RUN_FILES = [
    Case("unknown key in a config", config_file("modle: {name: gcn}\n"), "Unknown config key"),
    Case("metrics line not JSON", metrics(f"{ROW}not json\n"), "is not a metrics row LEO wrote"),
    Case(
        "metrics epochs out of order",
        metrics(ROW.replace("1,", "2,", 1) + ROW),
        "is not a metrics row LEO wrote",
    ),
    Case(
        "metrics row lacking a field",
        metrics('{"epoch": 1, "loss": 1.0}\n'),
        "is not a metrics row LEO wrote",
    ),
    Case("metrics line cut short", metrics(f'{ROW}{{"epo'), None),  # being appended: left out
    Case("no checkpoint readable", checkpoints(b"garbage"), "can be read"),
    Case("no best model", best(None), "has no best-validation model"),
    Case("best model unreadable", best(b"garbage"), "cannot be read"),
    Case("partition into a trained run", folder_command(True, False), "holds a trained run"),
    Case("train into a trained run", folder_command(True, True), "already holds a run"),
    Case("resume with nothing", folder_command(False, True), "--resume found no run under"),
]

CACHE = [
    Case(
        "META.json gone",
        partitions(lambda r: (r / META).unlink()),
        "is missing; run `leo partition`",
    ),
    Case(
        "META.json not JSON",
        partitions(lambda r: (r / META).write_text("{")),
        "is not valid JSON; rebuild with",
    ),
    Case(
        "META.json of another version",
        partitions(edit_meta(lambda m: m.update(format_version=0))),
        "has format version",
    ),
    Case(
        "META.json edited",
        partitions(edit_meta(lambda m: m.update(num_parts=-2))),
        "is not what LEO wrote",
    ),
    Case(
        "a part file cut short",
        partitions(_truncate_a_part, verify=True),
        "does not match its checksum",
    ),
    Case("the cache entry deleted", partitions(_dangle), "which is gone"),
    Case(
        "the cache entry deleted, then trained",
        rebuilt_after(lambda f: _dangle(RunDir(f / "run").partitions)),
        None,
    ),
    Case("the digests store garbage", rebuilt_after(_garbage_digests), None),
    Case("cache plan not JSON", plan_file("{"), "not UTF-8 JSON"),
    Case("cache plan edited", plan_file('{"format_version": 99}'), "is not a cache plan LEO"),
    Case("hardware profile not JSON", hardware_file("{"), "run `leo profile-cache` to probe again"),
    Case("hardware profile a list", hardware_file("[]"), "does not hold a JSON object"),
]

CASES = CONVERT + RUN_FILES + CACHE


def sentence(case: Case, folder: Path) -> str | None:
    """The sentence the user sees for `case` (None: none)."""
    try:
        case.run(folder)
    except LeoError as err:
        return str(err)
    return None


def test_the_corpus_is_at_least_forty_cases() -> None:
    assert len(CASES) >= 40 and len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_bad_input_is_the_sentence_it_names(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # `runs/` of an unnamed folder lands here
    shown = sentence(case, tmp_path)
    if case.shows is None:
        assert shown is None
        return
    assert shown is not None, f"{case.name}: nothing refused"
    assert case.shows in shown, shown
    assert "\n" not in shown and "Traceback" not in shown
    assert not (tmp_path / OUT).exists()  # a refused conversion leaves no output


def test_troubleshooting_lists_every_sentence_of_the_corpus() -> None:
    page = " ".join((ROOT / "docs" / "troubleshooting.md").read_text().split())
    missing = [c.shows for c in CASES if c.shows is not None and c.shows not in page]
    assert not missing, f"docs/troubleshooting.md lacks {missing}"
