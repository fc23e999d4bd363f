"""Follow `leo train`'s set-up call by call and count how often it climbs back up the layers.

Usage: python scripts/setup_trace.py [--nodes N] [--calls K] [--set KEY=VALUE ...]

Runs `launch.setup.prepare` (every stage up to `resolved`) twice on a synthetic graph in a
temporary folder: once to make the hardware profile and the plan, once traced, reusing them.
The trace (`sys.setprofile`, the main thread) keeps every *entry*: a call into a file of the
package from another file (or from outside it). An entry *climbs* when its file is of a higher
layer than the previous entry's (the layers of docs/architecture.md, as tests/test_layout.py
lists them); the entries launch/setup.py makes are left out of the count (the pipeline handing
over to its next stage, a stage calling its steps in turn): set-up that goes down the layers
in order climbs only there. Printed: the entries, the files they enter, the climbs in the
first K entries and in all (each with those of launch/setup.py too), those among the entries
the stages make, and the first K entries.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1] / "leo_cli"
SETUP = "launch/setup.py"
# tests/test_layout.py's table (a test checks they agree)
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


@dataclass(frozen=True)
class Entry:
    """A call into `file` from `caller` (both relative to the package)."""

    file: str
    caller: str
    function: str


def layer(file: str) -> int:
    """The layer of a file of the package (`launch/setup.py` -> launch's); the package's
    `__init__.py` (its lazy attributes) counts as the top layer."""
    name = file.split("/")[0].removesuffix(".py")
    return LAYERS.get(name, max(LAYERS.values()))


def _inside(path: str) -> str:
    """`path` relative to the package, or "" for a file outside it."""
    p = Path(path)
    return str(p.relative_to(PACKAGE)) if p.is_relative_to(PACKAGE) else ""


def trace(fn: Callable[[], Any]) -> list[Entry]:
    """The entries `fn()` makes, in order (the calling thread only)."""
    entries: list[Entry] = []
    names: dict[str, str] = {}

    def rel(path: str) -> str:
        if path not in names:
            names[path] = _inside(path)
        return names[path]

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        file = rel(frame.f_code.co_filename)
        caller = rel(frame.f_back.f_code.co_filename) if frame.f_back is not None else ""
        if file and caller and file != caller:
            entries.append(Entry(file, caller, frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return entries


def climbs(entries: Sequence[Entry], staged: bool = False) -> int:
    """How many entries go to a higher layer than the entry before them, leaving out those
    launch/setup.py makes (the pipeline handing over to its next stage, a stage's own calls)
    unless `staged`."""
    return sum(
        1
        for before, now in zip(entries, entries[1:], strict=False)
        if layer(now.file) > layer(before.file) and (staged or now.caller != SETUP)
    )


def by_stages(entries: Sequence[Entry]) -> list[Entry]:
    """The entries the stages make themselves (called from launch/setup.py)."""
    return [e for e in entries if e.caller == SETUP]


def traced_setup(root: Path, settings: Sequence[str]) -> list[Entry]:
    """The entries of `prepare` on the config `settings` give, run in `root` the second time
    (profile, partitions and plan reused)."""
    from leo_cli.config import load_config
    from leo_cli.launch import setup

    cfg = load_config(None, [f"run.out_dir={root / 'run'}", *settings])
    setup.prepare(cfg, resume=False, progress=None)
    return trace(lambda: setup.prepare(cfg, resume=False, progress=None))


def report(entries: Sequence[Entry], first: int) -> str:
    """The figures of a trace, as lines of text."""
    head = entries[:first]
    counts = Counter(e.file for e in entries)
    lines = [
        f"entries: {len(entries)} into {len(counts)} files",
        f"first {first}: {len({e.file for e in head})} files, climbs {climbs(head)} "
        f"({climbs(head, staged=True)} with those {SETUP} makes)",
        f"all: climbs {climbs(entries)} ({climbs(entries, staged=True)} with {SETUP}'s)",
        f"made by the stages: {len(by_stages(entries))} entries, climbs "
        f"{climbs(by_stages(entries), staged=True)}",
        "entered most: " + ", ".join(f"{f} {n}" for f, n in counts.most_common(8)),
        "",
        *(f"{layer(e.file):2d} {e.file:40s} {e.function:28s} <- {e.caller or '-'}" for e in head),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=600, help="the synthetic graph's nodes")
    parser.add_argument("--calls", type=int, default=77, help="the first entries counted apart")
    parser.add_argument("--set", action="append", default=[], help="a config override")
    parser.add_argument("--dump", type=Path, help="the entries written here too, as JSON")
    args = parser.parse_args(argv)
    settings = [f"data.synthetic.num_nodes={args.nodes}", *args.set]
    with tempfile.TemporaryDirectory() as tmp:
        entries = traced_setup(Path(tmp), settings)
    if args.dump is not None:
        args.dump.write_text(json.dumps([asdict(e) for e in entries], indent=0))
    print(report(entries, args.calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
