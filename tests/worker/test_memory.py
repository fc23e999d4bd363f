"""The worker's allocator settings: on glibc, large blocks stay mappings during set-up and
freed memory is handed back once set-up is done, or, with `launch.keep_freed_memory`, kept
(no page faults when a step allocates again); a
harmless no-op elsewhere; called by the worker before set-up and before its first step."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import random_graph
from helpers.ranks import dataset_info

from leo_cli.config import load_config
from leo_cli.graph.layout import build_parts
from leo_cli.graph.partitioners import assign_parts
from leo_cli.harness import process as rank
from leo_cli.util import rss
from leo_cli.worker import assemble, memory
from leo_cli.worker import entry as worker

# Free a 16 MiB block (glibc would raise its mmap threshold to 16 MiB), then allocate 8 MiB
# and print how many MiB malloc holds in mappings (mallinfo2().hblkhd).
PROBE = """
import ctypes, sys
import numpy as np
from leo_cli.worker.memory import fix_mmap_threshold
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
applied = fix_mmap_threshold() if sys.argv[1] == "fix" else None
big = np.ones(16 << 20, dtype=np.uint8)
del big
kept = np.ones(8 << 20, dtype=np.uint8)
print(applied, libc.mallinfo2().hblkhd >> 20)
"""


def run_probe(arg: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, arg], check=True, capture_output=True, text=True, env=env
    ).stdout.split()
    return out[0], int(out[1])


def has_mallinfo2() -> bool:
    if not sys.platform.startswith("linux") or rss.platform.libc_ver()[0] != "glibc":
        return False
    return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")


@pytest.mark.skipif(not has_mallinfo2(), reason="glibc 2.33 or later (mallinfo2) only")
@pytest.mark.integration
def test_fixed_threshold_keeps_large_blocks_mapped_after_a_bigger_free() -> None:
    applied, mapped_mib = run_probe("fix")
    assert applied == "True" and mapped_mib >= 8
    # Without it glibc's dynamic threshold puts the 8 MiB block on the heap: the probe can
    # tell the two apart.
    _, default_mib = run_probe("none")
    assert default_mib < 8


# Allocate and free a 64 MiB block a few times after set-up, then print the minor page faults
# five more rounds cost (kept: the pages are reused; fixed threshold: mapped afresh each time).
REUSE = """
import resource, sys
import numpy as np
from leo_cli.worker.memory import fix_mmap_threshold, keep_freed_memory
fix_mmap_threshold()
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
def churn(n):
    for _ in range(n):
        block = np.ones(64 << 20, dtype=np.uint8)
        del block
churn(2)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
churn(5)
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.integration
@pytest.mark.skipif(not has_mallinfo2(), reason="glibc only")
def test_kept_memory_is_reused_without_page_faults() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}

    def faults(arg: str) -> tuple[str, int]:
        out = subprocess.run(
            [sys.executable, "-c", REUSE, arg], check=True, capture_output=True, text=True,
            env=env,
        ).stdout.split()  # fmt: skip
        return out[0], int(out[1])

    applied, kept = faults("keep")
    _, mapped = faults("fixed")
    huge_pages = (64 << 20) // (2 << 20)  # numpy asks for 2 MiB pages: fewest faults a block
    assert applied == "True" and kept < huge_pages
    assert mapped >= 5 * huge_pages  # the test tells the two apart


@pytest.fixture
def collects(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """gc.collect recorded, not run: after a session's worth of objects a full collection
    takes seconds, and what it frees is not what these tests check."""
    calls: list[str] = []
    monkeypatch.setattr(rss.gc, "collect", lambda *args: calls.append("collect") or 0)
    return calls


def test_no_op_without_glibc(monkeypatch: pytest.MonkeyPatch, collects: list[str]) -> None:
    monkeypatch.setattr(rss.platform, "libc_ver", lambda: ("", ""))
    monkeypatch.setattr(rss.ctypes, "CDLL", lambda *a: pytest.fail("libc was loaded"))
    assert memory.fix_mmap_threshold() is False
    assert memory.keep_freed_memory() is False
    assert memory.after_setup(True) is False and memory.after_setup(False) is False
    assert rss.hand_back_freed_memory() is False
    assert rss.trim_heap() is False
    assert collects == ["collect"] * 3  # garbage is still collected


@pytest.mark.integration
@pytest.mark.skipif(not has_mallinfo2(), reason="glibc only")
def test_freed_heap_pages_are_handed_back() -> None:
    """What a process freed on its heap (small blocks below the mmap threshold, as a
    launcher's planning leaves) leaves its resident memory once it hands it back."""
    code = """
import sys
from leo_cli.util.rss import hand_back_freed_memory
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) << 10
blocks = [bytearray(64 << 10) for _ in range(3000)]  # 192 MiB of heap blocks
keep = blocks[-1]  # the top stays in use: only a trim of the holes below returns them
del blocks
before = anon()
print(hand_back_freed_memory(), before - anon())
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=env).stdout.split()  # fmt: skip
    assert out[0] == "True" and int(out[1]) > 100 << 20


def test_worker_fixes_the_threshold_before_set_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def stop() -> None:
        calls.append("env")
        raise RuntimeError("stop before set-up")

    monkeypatch.setattr(rank, "die_with_parent", lambda: None)
    monkeypatch.setattr(worker, "fix_mmap_threshold", lambda: calls.append("mallopt"))
    monkeypatch.setattr(rank.DistEnv, "from_env", staticmethod(stop))
    with pytest.raises(RuntimeError, match="stop before set-up"):
        worker.main([str(tmp_path)])
    assert calls == ["mallopt", "env"]


@pytest.mark.parametrize("keep", [True, False])
def test_after_setup_trims_then_keeps_or_not(
    keep: bool, monkeypatch: pytest.MonkeyPatch, collects: list[str]
) -> None:
    calls: list[tuple[str, int]] = []

    class FakeLibc:
        def malloc_trim(self, pad: int) -> int:
            calls.append(("trim", pad))
            return 1

        def mallopt(self, param: int, value: int) -> int:
            calls.append(("mallopt", param))
            return 1

    monkeypatch.setattr(rss, "glibc", FakeLibc)
    monkeypatch.setattr(memory, "glibc", FakeLibc)
    assert memory.after_setup(keep) is True
    kept = [("mallopt", memory.M_MMAP_MAX), ("mallopt", memory.M_TRIM_THRESHOLD)]
    assert calls == [("trim", 0)] + (kept if keep else [])
    assert collects == ["collect"]  # garbage collected once


def test_trim_heap_trims_without_collecting_garbage(
    monkeypatch: pytest.MonkeyPatch, collects: list[str]
) -> None:
    calls: list[int] = []

    class FakeLibc:
        def malloc_trim(self, pad: int) -> int:
            calls.append(pad)
            return 1

    monkeypatch.setattr(rss, "glibc", FakeLibc)
    assert rss.trim_heap() is True
    assert calls == [0] and collects == []


def test_the_parts_tensors_trim_the_heap_once_the_csr_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Set-up's peak (the static aggregate's fetch) comes after the part's CSR: the pages
    its build freed on the heap are handed back in between."""
    calls: list[str] = []
    made = assemble.part_adjacency

    def adjacency(*args: Any, **kwargs: Any) -> Any:
        out = made(*args, **kwargs)
        calls.append("csr")
        return out

    monkeypatch.setattr(assemble, "part_adjacency", adjacency)
    monkeypatch.setattr(assemble, "trim_heap", lambda: calls.append("trim") or True)
    g = random_graph(60, 240, 6, 3, seed=1)
    parts = build_parts(g, assign_parts(g, 2, "metis", seed=0), 2)
    cfg = load_config(None, [])
    adj, _ = assemble.part_tensors(cfg, parts[0], dataset_info(g), torch.device("cpu"))
    assert calls == ["csr", "trim"] and adj.num_rows == parts[0].num_inner
