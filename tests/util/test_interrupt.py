"""SIGINT / SIGTERM end every long command with one line and 130 / 143, cleanup included."""

from __future__ import annotations

import os
import signal
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from leo_cli.bench import suite
from leo_cli.cli.app import app
from leo_cli.graph.partition_cache import PartitionResult
from leo_cli.launch import setup
from leo_cli.util import files
from leo_cli.util.interrupt import Interrupted, raise_on_signals


@pytest.fixture
def restore_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_sigterm_raises_and_cleanup_runs(tmp_path: Path, restore_handlers: None) -> None:
    """Without a handler SIGTERM kills Python on the spot: the temporary file would stay."""
    raise_on_signals()
    with pytest.raises(Interrupted) as info, files.atomic_file(tmp_path / "out", "w") as f:
        f.write("half")
        os.kill(os.getpid(), signal.SIGTERM)
    assert info.value.exit_code == 143 and info.value.name == "SIGTERM"
    assert os.listdir(tmp_path) == []
    with pytest.raises(Interrupted) as info:
        os.kill(os.getpid(), signal.SIGINT)
    assert info.value.exit_code == 130 and isinstance(info.value, KeyboardInterrupt)


def fake_interrupt(signum: int) -> object:
    def stop(*args: object, **kwargs: object) -> None:
        raise Interrupted(signum)

    return stop


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_profile_cache_interrupted_is_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    restore_handlers: None,
    signum: int,
    code: int,
) -> None:
    # (the command imports the set-up where it acts: its stages' calls patched there)
    reused = PartitionResult(tmp_path, {}, reused=True)
    monkeypatch.setattr(setup, "ensure_partitions", lambda *a, **k: reused)
    monkeypatch.setattr(setup, "given_profile", lambda *a: types.SimpleNamespace(probe_s=1.0))
    monkeypatch.setattr(setup, "PlanInputs", types.SimpleNamespace(of=lambda *a: None))
    monkeypatch.setattr(setup, "plan_for", fake_interrupt(signum))
    res = CliRunner().invoke(app, ["profile-cache", "--set", f"run.out_dir={tmp_path}"])
    assert res.exit_code == code
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "interrupted by SIG" in lines[0] and "no plan" in lines[0]
    assert "Traceback" not in res.output


def test_bench_interrupted_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_handlers: None
) -> None:
    monkeypatch.setattr(suite, "run_suite", fake_interrupt(signal.SIGTERM))
    res = CliRunner().invoke(app, ["bench", "--set", f"run.out_dir={tmp_path}"])
    assert res.exit_code == 143
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "interrupted by SIGTERM" in lines[0] and "bench.md" in lines[0]
