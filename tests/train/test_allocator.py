"""`launch.allocator`: which allocator the workers get, what the run says, and a refusal
where jemalloc is asked for and missing; the environment is the workers', not the
launcher's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from leo_cli.config import load_config
from leo_cli.errors import ConfigError, TrainError
from leo_cli.train.allocator import (
    NAME_ENV,
    RETAIN,
    allocator_env,
    choose,
    find_jemalloc,
)

LIB = Path("/somewhere/libjemalloc.so.2")


def test_auto_takes_jemalloc_where_the_machine_has_it() -> None:
    got = choose("auto", {}, LIB)
    assert got.name == "jemalloc" and str(LIB) in got.described
    assert got.env == {"LD_PRELOAD": str(LIB), "MALLOC_CONF": RETAIN, NAME_ENV: "jemalloc"}
    assert choose("jemalloc", {}, LIB) == got


def test_auto_says_so_where_it_falls_back_to_the_system_malloc() -> None:
    got = choose("auto", {}, None)
    assert got.name == "system" and "no jemalloc found" in got.described
    assert got.env == {NAME_ENV: "system"}  # nothing preloaded
    assert choose("system", {}, LIB).env == {NAME_ENV: "system"}  # asked for: not preloaded


@pytest.mark.parametrize("key", ["LD_PRELOAD", "MALLOC_CONF"])
def test_a_users_own_setting_is_left_alone(key: str) -> None:
    got = choose("auto", {key: "/opt/libtcmalloc.so"}, LIB)
    assert got.name == "user" and key in got.described and got.env == {NAME_ENV: "user"}


def test_jemalloc_asked_for_and_missing_is_refused_in_one_sentence() -> None:
    with pytest.raises(TrainError, match="launch.allocator=jemalloc") as info:
        choose("jemalloc", {}, None)
    assert "apt install libjemalloc2" in str(info.value) and "\n" not in str(info.value)


def test_the_library_is_found_in_the_folders_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LEO_JEMALLOC", raising=False)
    assert find_jemalloc((str(tmp_path),)) is None
    (tmp_path / "libjemalloc.so.2").write_bytes(b"")
    assert find_jemalloc((str(tmp_path),)) == tmp_path / "libjemalloc.so.2"
    monkeypatch.setenv("LEO_JEMALLOC", str(tmp_path / "missing.so"))
    assert find_jemalloc((str(tmp_path),)) is None  # named, not there: none, not another


def test_the_environment_is_the_childrens_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_CONF", "before")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    with allocator_env(choose("auto", {}, LIB)):
        assert os.environ["LD_PRELOAD"] == str(LIB) and os.environ["MALLOC_CONF"] == RETAIN
    assert os.environ["MALLOC_CONF"] == "before" and "LD_PRELOAD" not in os.environ


def test_a_child_process_runs_on_jemalloc() -> None:
    found = find_jemalloc()
    if found is None:
        pytest.skip("no jemalloc on this machine (apt install libjemalloc2)")
    code = "print('libjemalloc' in open('/proc/self/maps').read())"
    with allocator_env(choose("auto", {}, found)):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr


def test_the_setting_is_checked() -> None:
    assert load_config(None, ["launch.allocator=system"]).launch.allocator == "system"
    with pytest.raises(ConfigError, match="launch.allocator"):
        load_config(None, ["launch.allocator=tcmalloc"])
