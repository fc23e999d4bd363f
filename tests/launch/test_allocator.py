"""`launch.allocator`: which allocator the workers get, what the run says, and a refusal
where jemalloc is asked for and missing; the environment is the workers', not the
launcher's."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import hardware_dict

from leo_cli.comm.segments import JOB_ENV
from leo_cli.config import LeoConfig, load_config
from leo_cli.errors import CacheError, ConfigError, TrainError
from leo_cli.harness.placement import AFFINITY_ENV
from leo_cli.harness.process import ALLOCATOR_ENV
from leo_cli.launch import allocator as allocator_module
from leo_cli.launch import elastic, preload
from leo_cli.launch import probe as probe_module
from leo_cli.launch import stages as plan_stage
from leo_cli.launch.allocator import (
    HUGE_PAGES_ENV,
    RETAIN,
    allocator_env,
    choose,
    fallback_note,
    find_jemalloc,
    kernel_huge_pages,
    with_huge_pages,
    workers_allocator,
)
from leo_cli.launch.elastic import worker_threads
from leo_cli.planner.profile import store
from leo_cli.planner.profile.hardware import HardwareProfile

LIB = Path("/somewhere/libjemalloc.so.2")


def test_auto_takes_jemalloc_where_the_machine_has_it() -> None:
    got = choose("auto", {}, LIB, keep=True)
    assert got.name == "jemalloc" and str(LIB) in got.described
    assert got.env == {"LD_PRELOAD": str(LIB), "MALLOC_CONF": RETAIN, ALLOCATOR_ENV: "jemalloc"}
    assert choose("jemalloc", {}, LIB, keep=True) == got


def test_auto_says_so_where_it_falls_back_to_the_system_malloc() -> None:
    got = choose("auto", {}, None)
    assert got.name == "system" and "no jemalloc found" in got.described
    assert got.env == {ALLOCATOR_ENV: "system"}  # nothing preloaded
    assert choose("system", {}, LIB).env == {ALLOCATOR_ENV: "system"}  # asked for: not preloaded
    # leo train says it before the workers start, only where auto fell back.
    note = fallback_note(got)
    assert note is not None and "apt install libjemalloc2" in note
    assert fallback_note(choose("auto", {}, LIB)) is None
    assert fallback_note(choose("auto", {"LD_PRELOAD": "/x/libtcmalloc.so"}, None)) is None


@pytest.mark.parametrize("setting", ["auto", "jemalloc", "system"])
def test_an_allocator_the_user_preloads_is_theirs(setting: str) -> None:
    got = choose(setting, {"LD_PRELOAD": "/opt/libtcmalloc.so.4"}, LIB)
    assert got.name == "user" and "tcmalloc" in got.described and got.env == {ALLOCATOR_ENV: "user"}


def test_other_preloads_and_settings_of_the_user_are_kept() -> None:
    """A profiler the user preloads stays, after jemalloc; the user's MALLOC_CONF stands."""
    got = choose(
        "auto", {"LD_PRELOAD": "/opt/libprof.so", "MALLOC_CONF": "narenas:2"}, LIB, keep=True
    )
    assert got.name == "jemalloc" and "freed memory kept" not in got.described
    assert got.env["LD_PRELOAD"] == f"{LIB}:/opt/libprof.so"
    assert got.env["MALLOC_CONF"] == "narenas:2"


def test_freed_memory_handed_back_leaves_jemalloc_its_decays() -> None:
    """`launch.keep_freed_memory=false` (the default): jemalloc without the keeping
    MALLOC_CONF (its own decays), a user's MALLOC_CONF still theirs; glibc's side is the
    worker's (test_memory). The phrase says which, for either allocator."""
    got = choose("auto", {}, LIB, keep=False)
    assert got.name == "jemalloc" and "MALLOC_CONF" not in got.env
    assert "freed memory kept" not in got.described and choose("auto", {}, LIB) == got
    assert choose("auto", {}, LIB, keep=True).env["MALLOC_CONF"] == RETAIN
    assert "freed memory kept" in choose("system", {}, None, keep=True).described
    assert "freed memory kept" not in choose("system", {}, None).described
    theirs = choose("auto", {"MALLOC_CONF": "narenas:2"}, LIB, keep=False)
    assert theirs.env["MALLOC_CONF"] == "narenas:2"


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
    monkeypatch.setenv("LEO_JEMALLOC", str(tmp_path / "libjemalloc.so.2"))
    assert find_jemalloc(()) == tmp_path / "libjemalloc.so.2"  # named: that one
    monkeypatch.setenv("LEO_JEMALLOC", str(tmp_path / "missing.so"))
    with pytest.raises(TrainError, match="LEO_JEMALLOC"):  # named, not there: refused
        find_jemalloc((str(tmp_path),))


def test_the_environment_is_the_childrens_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_CONF", "before")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    with allocator_env(choose("auto", {}, LIB, keep=True)):
        assert os.environ["LD_PRELOAD"] == str(LIB) and os.environ["MALLOC_CONF"] == RETAIN
    assert os.environ["MALLOC_CONF"] == "before" and "LD_PRELOAD" not in os.environ


@pytest.mark.integration
def test_a_child_process_runs_on_jemalloc() -> None:
    found = find_jemalloc()
    if found is None:
        pytest.skip("no jemalloc on this machine (apt install libjemalloc2)")
    code = "print('libjemalloc' in open('/proc/self/maps').read())"
    with allocator_env(choose("auto", {}, found)):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "True", out.stderr


def test_huge_pages_are_asked_of_pytorch_and_the_run_says_whether_the_kernel_gives_them() -> None:
    system = choose("system", {}, None)
    given = with_huge_pages(system, {}, "madvise")
    assert given.env == {**system.env, HUGE_PAGES_ENV: "1"}
    assert given.described.endswith("huge pages advised for tensors of 2 MiB or more")
    refused = with_huge_pages(system, {}, "never")
    assert refused.env[HUGE_PAGES_ENV] == "1" and "transparent huge pages are never" in (
        refused.described
    )
    absent = with_huge_pages(system, {}, "absent")  # not asked: PyTorch would warn
    assert absent.env == system.env and "setting was not found" in absent.described
    theirs = with_huge_pages(system, {HUGE_PAGES_ENV: "0"}, "madvise")
    assert theirs.env == system.env and "THP_MEM_ALLOC_ENABLE=0 set by the user" in (
        theirs.described
    )


def test_huge_pages_follow_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HUGE_PAGES_ENV, raising=False)
    monkeypatch.setattr(allocator_module, "kernel_huge_pages", lambda: "madvise")
    on = load_config(None, ["launch.allocator=system"]).launch
    assert workers_allocator(on).env[HUGE_PAGES_ENV] == "1"
    off = on.model_copy(update={"huge_pages": False})
    assert HUGE_PAGES_ENV not in workers_allocator(off).env
    assert "huge pages" not in workers_allocator(off).described
    monkeypatch.setenv(HUGE_PAGES_ENV, "1")  # the user's, inherited: said either way
    assert "set by the user" in workers_allocator(off).described


def test_the_kernels_huge_page_mode_is_read(tmp_path: Path) -> None:
    mode = tmp_path / "enabled"
    mode.write_text("always [madvise] never\n")
    assert kernel_huge_pages(mode) == "madvise"
    mode.write_text("[never]\n")
    assert kernel_huge_pages(mode) == "never"
    assert kernel_huge_pages(tmp_path / "missing") == "absent"


@pytest.mark.parametrize("huge", [True, False])
def test_the_workers_are_launched_with_the_huge_pages_setting(
    huge: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environment the elastic agent starts the workers in carries the variable (or not),
    and the launcher's own is as it was afterwards."""
    for key in (HUGE_PAGES_ENV, "OMP_NUM_THREADS", JOB_ENV, AFFINITY_ENV):  # what it sets
        monkeypatch.setenv(key, "")  # recorded, so restored (or removed) after the test
        monkeypatch.delenv(key)
    monkeypatch.setattr(allocator_module, "kernel_huge_pages", lambda: "madvise")
    seen: dict[str, str | None] = {}

    def agent(config: object, entrypoint: str) -> object:
        def run(*args: str) -> None:
            seen["value"] = os.environ.get(HUGE_PAGES_ENV)

        return run

    monkeypatch.setattr(elastic, "elastic_launch", agent)
    monkeypatch.setattr(preload, "ensure_server", lambda module: None)  # no agent, no workers
    cfg = load_config(None, [f"run.out_dir={tmp_path}", f"launch.huge_pages={str(huge).lower()}"])
    elastic.launch_module(cfg, tmp_path, "leo_cli.worker.entry", [])
    assert seen["value"] == ("1" if huge else None)
    assert HUGE_PAGES_ENV not in os.environ


def test_the_probe_runs_as_a_default_runs_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the run's memory settings, the probe measures under the defaults' (a profile
    is keyed by the allocator's name alone)."""
    launched = []

    def launch(cfg: LeoConfig, *args: object) -> None:
        launched.append(cfg.launch)
        raise TrainError("stop here")

    monkeypatch.setattr(probe_module, "launch_module", launch)
    cfg = load_config(None, ["launch.keep_freed_memory=true", "launch.huge_pages=false"])
    with pytest.raises(CacheError, match="hardware probe failed"):
        probe_module.run_probe(cfg, tmp_path)
    defaults = LeoConfig().launch
    assert launched[0].keep_freed_memory is defaults.keep_freed_memory
    assert launched[0].huge_pages is defaults.huge_pages


@pytest.mark.integration
@pytest.mark.parametrize("advised", [True, False])
def test_pytorch_advises_huge_pages_for_a_large_tensor_under_the_variable(advised: bool) -> None:
    """PyTorch honours the variable: the mapping of a 64 MiB tensor carries the kernel's
    `hg` flag (MADV_HUGEPAGE) with it and not without it."""
    if kernel_huge_pages() == "absent":
        pytest.skip("this kernel has no transparent huge pages")
    code = (
        "import torch\n"
        "x = torch.ones(1 << 24)\n"
        "at = x.data_ptr()\n"
        "flags = ''\n"
        "for line in open('/proc/self/smaps'):\n"
        "    head = line.split()[0]\n"
        "    if '-' in head and ':' not in head:\n"
        "        low, high = (int(v, 16) for v in head.split('-'))\n"
        "        inside = low <= at < high\n"
        "    elif head == 'VmFlags:' and inside:\n"
        "        flags = line\n"
        "print('hg' in flags.split())\n"
    )
    env = {key: value for key, value in os.environ.items() if key != HUGE_PAGES_ENV}
    if advised:
        env[HUGE_PAGES_ENV] = "1"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == str(advised), out.stderr


def test_the_setting_is_checked() -> None:
    assert load_config(None, ["launch.allocator=system"]).launch.allocator == "system"
    with pytest.raises(ConfigError, match="launch.allocator"):
        load_config(None, ["launch.allocator=tcmalloc"])


def test_profiles_are_kept_per_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile measured under one allocator is not reused for a run on another (the
    machine-wide cache name and the match both carry it); the system's leaves the tag and
    the profile's fingerprint as they were before the allocator was recorded."""
    monkeypatch.delenv("LEO_JEMALLOC", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setattr(allocator_module, "find_jemalloc", lambda: LIB)
    jemalloc = plan_stage.placement(load_config(None, []), 2)
    system = plan_stage.placement(load_config(None, ["launch.allocator=system"]), 2)
    assert jemalloc == system + "-jemalloc" and system == worker_threads(2)
    hw = HardwareProfile.model_validate(hardware_dict())
    assert store.placement_of(hw) == system
    on_jemalloc = hw.model_copy(update={"allocator": "jemalloc"})
    assert store.placement_of(on_jemalloc) == jemalloc
    assert on_jemalloc.fingerprint() != hw.fingerprint()
    before = hw.model_dump(mode="json")
    del before["allocator"]  # the content as LEO hashed it before the field existed
    canonical = json.dumps(before, sort_keys=True, separators=(",", ":"), allow_nan=False)
    assert hw.fingerprint() == hashlib.sha256(canonical.encode()).hexdigest()


def test_a_multi_node_profile_is_reused_only_under_the_allocator_named() -> None:
    """Every node decides alike from the config: an allocator named by `launch.allocator`
    must be the profile's; under `auto` each node resolves its own, so any is kept."""
    hw = HardwareProfile.model_validate(hardware_dict())
    hw = hw.model_copy(update={"nnodes": 2, "allocator": "jemalloc"})
    num = hw.world_size

    def cfg(setting: str) -> LeoConfig:
        return load_config(None, ["launch.nnodes=2", f"launch.allocator={setting}"])

    assert store.fits_nodes(hw, cfg("auto"), num)
    assert store.fits_nodes(hw, cfg("jemalloc"), num)
    assert not store.fits_nodes(hw, cfg("system"), num)
    users = hw.model_copy(update={"allocator": "user"})  # preloaded by the user: theirs
    assert store.fits_nodes(users, cfg("system"), num)
    assert not store.fits_nodes(hw, cfg("auto"), num + 1)
