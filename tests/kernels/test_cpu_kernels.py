"""LEO's CPU kernels (cuda/cpu/, `leo compile --cpu`): build, stamp, selection, parity.

The library is built once (about 20 s), as on first use: into a temporary cache by two
processes at once. The parity run loads it in a subprocess (cpu_kernel_check.py), because
loading registers its kernels for the rest of a process and the parity run needs a process
whose reference computed first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from leo_cli import kernels
from leo_cli.cli.app import app
from leo_cli.errors import KernelError
from leo_cli.kernel_tools.build_cpu import build_cpu_kernels
from leo_cli.kernel_tools.synthetic import random_csr
from leo_cli.kernels import backend, cpu, stamp
from leo_cli.kernels.backend import Backend, select_backend

CHECK_SCRIPT = Path(__file__).with_name("cpu_kernel_check.py")
BUILD_SCRIPT = """
import json, sys
from pathlib import Path
from leo_cli.kernel_tools.build_cpu import cached_cpu_kernels
from leo_cli.kernels import stamp
built = cached_cpu_kernels(Path(sys.argv[1]), stamp.cuda_source_dir())
print(json.dumps({"path": str(built.path), "cached": built.cached}))
"""


def _toolchain_missing() -> str | None:
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "no C++ compiler"
    if shutil.which("ninja", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"):
        return None
    return "no ninja"


@dataclass(frozen=True)
class Built:
    """The library as two runs starting together built it on first use into one cache."""

    cache: Path
    folder: Path
    outcomes: list[dict[str, Any]]


@pytest.fixture(scope="module")
def first_use(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Two processes asking the cache for the library at once (`cached_cpu_kernels`)."""
    missing = _toolchain_missing()
    if missing:
        pytest.skip(f"{missing}: the CPU kernels cannot be built here")
    cache = tmp_path_factory.mktemp("cache")
    cmd = [sys.executable, "-c", BUILD_SCRIPT, str(cache)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate()[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    outcomes = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    return Built(cache, Path(outcomes[0]["path"]).parent, outcomes)


@pytest.fixture(scope="module")
def built(first_use: Built) -> Path:
    """A folder holding a fresh build of the library and its stamp."""
    return first_use.folder


@pytest.mark.integration
def test_kernel_matches_the_reference_and_serves_both_ops(built: Path) -> None:
    env = {**os.environ, "LEO_KERNELS": "ref"}
    proc = subprocess.run(
        [sys.executable, str(CHECK_SCRIPT), str(cpu.library_path(built))],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for line in ("parity: ", "gradcheck: ok", "opcheck: ok", "dispatch: ok", "variants: ok",
                 "dropout: ", "epilogue: "):  # fmt: skip
        assert line in proc.stdout


@pytest.mark.integration
def test_build_is_stamped_cached_and_stale_when_sources_change(built: Path, tmp_path: Path) -> None:
    cuda_dir = stamp.cuda_source_dir()
    again = build_cpu_kernels(cuda_dir, pkg=built, build_root=built / "build")
    assert again.cached and cpu.stale_library(built, cuda_dir) is None
    edited = tmp_path / "cuda"
    shutil.copytree(cpu.source_dir(cuda_dir), edited / "cpu")
    with (edited / "cpu" / "spmm_csr_cpu.h").open("a") as f:
        f.write("// edited\n")
    assert "other sources" in (cpu.stale_library(built, edited) or "")
    no_stamp = tmp_path / "pkg"
    no_stamp.mkdir()
    shutil.copy(cpu.library_path(built), cpu.library_path(no_stamp))
    assert "no readable build stamp" in (cpu.stale_library(no_stamp, cuda_dir) or "")


def _select(monkeypatch: pytest.MonkeyPatch, lib: Path, env: dict[str, str]) -> Backend:
    monkeypatch.setattr(cpu, "library_path", lambda pkg=None: lib)
    return select_backend(env)


def test_unbuilt_cpu_kernels_leave_the_reference_or_fail_when_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    chosen = _select(monkeypatch, tmp_path / cpu.LIBRARY, {})
    assert chosen.cpu == "reference" and "leo compile --cpu" in chosen.cpu_reason
    with pytest.raises(KernelError, match="LEO_KERNELS=cpu but .*leo compile --cpu"):
        _select(monkeypatch, tmp_path / cpu.LIBRARY, {"LEO_KERNELS": "cpu"})
    ref = _select(monkeypatch, tmp_path / cpu.LIBRARY, {"LEO_KERNELS": "ref"})
    assert ref.cpu == "reference" and "LEO_KERNELS=ref" in ref.cpu_reason


def test_a_stale_library_is_never_loaded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    lib = tmp_path / cpu.LIBRARY
    lib.write_bytes(b"not a library")  # loading it would fail: it must not get that far

    def refuse(path: Path) -> None:
        raise AssertionError(f"{path} was loaded")

    monkeypatch.setattr(cpu, "load", refuse)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = _select(monkeypatch, lib, {})
    assert chosen.cpu == "reference" and "no readable build stamp" in chosen.cpu_reason
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1


def test_a_stale_package_library_does_not_hide_the_cache_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pkg, cache = tmp_path / "pkg", tmp_path / "cache"
    for folder in (pkg, cache):
        folder.mkdir()
        (folder / cpu.LIBRARY).write_bytes(b"not a library")
    monkeypatch.setattr(stamp, "package_dir", lambda: pkg)  # no cuda/ beside it either
    unset(monkeypatch, cpu.DIR_ENV)
    assert cpu.library_to_load() == pkg / cpu.LIBRARY  # stale, but nothing else: said so
    monkeypatch.setenv(cpu.DIR_ENV, str(cache))
    assert cpu.library_to_load() == cache / cpu.LIBRARY  # no stamp: stale
    cpu.stamp_path(pkg).write_text(json.dumps({"torch": "0.0.1"}))
    assert cpu.library_to_load() == cache / cpu.LIBRARY  # built for another torch: stale
    cpu.stamp_path(pkg).write_text(json.dumps({"torch": torch.__version__}))
    assert cpu.library_to_load() == pkg / cpu.LIBRARY  # current: the package's first


def test_unhonoured_cpu_choice_does_not_fail_the_import(monkeypatch: pytest.MonkeyPatch) -> None:
    reason = KernelError("LEO_KERNELS=cpu but _leo_cpu.so is not built")
    monkeypatch.setenv("LEO_KERNELS", "cpu")
    monkeypatch.setattr(backend, "_ACTIVE", None)
    monkeypatch.setattr(backend, "_FAILURE", None)
    monkeypatch.setattr(backend, "_FAILED_CHOICE", None)

    def fail(env: object = None) -> Backend:
        raise reason

    monkeypatch.setattr(backend, "select_backend", fail)
    backend.load_at_import()  # `leo compile --cpu` imports the package to build the library
    with pytest.raises(KernelError, match="not built"):
        backend.active_backend()
    # The ops LEO's CPU SpMM would serve refuse CPU tensors with the reason (their reference
    # asks; where this process did load a library, its kernel serves them instead); CUDA
    # tensors and the other ops are not concerned.
    with pytest.raises(KernelError, match="not built"):
        backend.require_cpu_kernels(torch.device("cpu"))
    if cpu.loaded() is None:
        with pytest.raises(KernelError, match="not built"):
            kernels.spmm(random_csr(4, 3, 6, seed=0), torch.ones(3, 2))
    backend.require_cuda_kernels(torch.device("cuda", 0))
    x = torch.ones(3, 2)
    assert torch.equal(kernels.gather_rows(x, torch.tensor([2, 0])), x[[2, 0]])


@pytest.mark.parametrize(
    ("cuda", "cpu_kernels", "name"),
    [
        ("reference", "reference", "reference"),
        ("cuda", "reference", "cuda"),
        ("reference", "leo", "cpu"),
        ("cuda", "leo", "cuda+cpu"),
    ],
)
def test_backend_name_says_which_kernels_serve(
    monkeypatch: pytest.MonkeyPatch, cuda: str, cpu_kernels: str, name: str
) -> None:
    monkeypatch.setattr(backend, "_ACTIVE", Backend(cuda, "", cpu_kernels, ""))
    assert kernels.backend_name() == name


def test_cpu_flag_refuses_cuda_only_options() -> None:
    result = CliRunner().invoke(app, ["compile", "--cpu", "--check"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "--check, --arch and --jobs apply to CUDA only" in result.output


@pytest.mark.parametrize(
    ("missing", "message"), [("c++", r"no C\+\+ compiler"), ("ninja", "ninja not found")]
)
def test_a_missing_tool_is_one_sentence_before_anything_builds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, missing: str, message: str
) -> None:
    real_which = shutil.which
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(
        shutil, "which", lambda name, path=None: None if name == missing else real_which(name)
    )
    with pytest.raises(KernelError, match=message):
        build_cpu_kernels(stamp.cuda_source_dir(), pkg=tmp_path, build_root=tmp_path / "b")
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.integration
def test_first_use_build_is_cached_and_built_once_by_runs_starting_together(
    first_use: Built,
) -> None:
    outs, lib = first_use.outcomes, cpu.library_path(first_use.folder)
    assert sorted(o["cached"] for o in outs) == [False, True]  # one built, one waited
    assert {o["path"] for o in outs} == {str(lib)}
    assert lib.parent.parent == first_use.cache / "kernels"
    assert cpu.stale_library(lib.parent, stamp.cuda_source_dir()) is None
    # Nothing half-built is left beside it: the folder, its lock, no scratch or build folder.
    assert sorted(p.name for p in lib.parent.parent.iterdir()) == [
        lib.parent.name,
        f"{lib.parent.name}.lock",
    ]
    cmd = [sys.executable, "-c", BUILD_SCRIPT, str(first_use.cache)]
    again = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert json.loads(again.stdout.strip().splitlines()[-1])["cached"] is True


def unset(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Unset `names` for the test, restored after it even where the code under test sets
    them (`delenv(..., raising=False)` of an absent variable records nothing to undo)."""
    for name in names:
        monkeypatch.setenv(name, "unset by the test")
        monkeypatch.delenv(name)


def test_without_a_compiler_the_reference_is_named_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from leo_cli.launch import cpu_kernels

    monkeypatch.setattr(backend, "_ACTIVE", Backend("reference", "", "reference", "not built"))
    monkeypatch.setenv("LEO_CPU_BUILD", "auto")
    monkeypatch.delenv("LEO_KERNELS", raising=False)
    unset(monkeypatch, cpu.UNBUILT_ENV, cpu.DIR_ENV)  # ensure_cpu_kernels sets them
    monkeypatch.delenv("CXX", raising=False)
    real_which = shutil.which
    monkeypatch.setattr(
        shutil, "which", lambda name, path=None: None if name == "c++" else real_which(name)
    )
    said = cpu_kernels.ensure_cpu_kernels(tmp_path)
    assert said is not None and "the reference kernels serve CPU tensors" in said
    assert "no C++ compiler" in said and capsys.readouterr().err.strip() == said
    assert not (tmp_path / "kernels").exists() and cpu.DIR_ENV not in os.environ
    # A worker that finds no library says why in its backend (summary.json kernels_cpu_reason).
    monkeypatch.setattr(cpu, "library_path", lambda pkg=None: tmp_path / cpu.LIBRARY)
    chosen = select_backend({})
    assert chosen.cpu == "reference" and "no C++ compiler" in chosen.cpu_reason


def test_the_suite_and_ref_skip_the_first_use_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from leo_cli.launch import cpu_kernels

    monkeypatch.setattr(backend, "_ACTIVE", Backend("reference", "", "reference", "not built"))
    monkeypatch.setattr(cpu_kernels, "cached_cpu_kernels", lambda *a, **k: pytest.fail("built"))
    monkeypatch.setenv("LEO_CPU_BUILD", "never")
    assert cpu_kernels.ensure_cpu_kernels(tmp_path) is None
    monkeypatch.setenv("LEO_CPU_BUILD", "auto")
    monkeypatch.setenv("LEO_KERNELS", "ref")
    assert cpu_kernels.ensure_cpu_kernels(tmp_path) is None


def test_a_second_launch_names_the_loaded_library_to_its_workers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An earlier launch in this process loaded the cache's build: a later one returns early
    but still tells its workers where it is, or they would run the reference."""
    from leo_cli.launch import cpu_kernels

    folder = tmp_path / "kernels" / "build"
    monkeypatch.setattr(backend, "_ACTIVE", Backend("reference", "", "leo", "loaded"))
    monkeypatch.setattr(cpu, "_LOADED", folder / cpu.LIBRARY)
    monkeypatch.setattr(cpu_kernels, "cached_cpu_kernels", lambda *a, **k: pytest.fail("built"))
    monkeypatch.setenv("LEO_CPU_BUILD", "auto")
    monkeypatch.delenv("LEO_KERNELS", raising=False)
    unset(monkeypatch, cpu.DIR_ENV)
    monkeypatch.setenv(cpu.UNBUILT_ENV, "an earlier reason")
    assert cpu_kernels.ensure_cpu_kernels(tmp_path) is None
    assert os.environ[cpu.DIR_ENV] == str(folder) and cpu.UNBUILT_ENV not in os.environ
    # The package's own library: the workers find it without being told.
    unset(monkeypatch, cpu.DIR_ENV)
    monkeypatch.setattr(cpu, "_LOADED", cpu.library_path())
    assert cpu_kernels.ensure_cpu_kernels(tmp_path) is None
    assert cpu.DIR_ENV not in os.environ


def _failing_build(calls: list[Path], error: str | None = None) -> Any:
    """A build that fails as the compiler does on an error in LEO's own sources, or with
    `error` as the compiler's line."""

    def build(cuda_dir: Path, **kwargs: Any) -> None:
        calls.append(kwargs["build_root"])
        ours = cpu.source_dir(cuda_dir).resolve() / "leo_cpu.cpp"
        raise KernelError(
            f"building {cpu.LIBRARY} failed (exit 1; compiler output in "
            f"{kwargs['build_root'] / 'build.log'})\n{error or f'{ours}:1:2: error: boom'}"
        )

    return build


@pytest.mark.parametrize(
    "error",
    [
        "c++: fatal error: Killed signal terminated program cc1plus",
        "/usr/include/x.h:1:2: error: no space left on device",
        "leo_cpu.cpp:3:10: fatal error: torch/extension.h: No such file or directory",
    ],
)
def test_a_failure_outside_leos_sources_is_tried_again_later(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: str
) -> None:
    """A compiler killed, a full disk or a missing header may not hold later: the failure
    is remembered for `RETRY_AFTER_S` (said in the message), then built again."""
    from leo_cli.kernel_tools import build_cpu

    calls: list[Path] = []
    monkeypatch.setattr(build_cpu, "check_toolchain", lambda: None)
    monkeypatch.setattr(build_cpu, "compiler_identity", lambda: "g++ 1")
    monkeypatch.setattr(build_cpu, "build_cpu_kernels", _failing_build(calls, error))
    cuda_dir = stamp.cuda_source_dir()
    now = 1_000_000.0
    monkeypatch.setattr(build_cpu.time, "time", lambda: now)
    with pytest.raises(KernelError):
        build_cpu.cached_cpu_kernels(tmp_path, cuda_dir)
    with pytest.raises(KernelError, match="tried again after") as again:
        build_cpu.cached_cpu_kernels(tmp_path, cuda_dir)
    assert len(calls) == 1 and "to try now" in str(again.value)
    now += build_cpu.RETRY_AFTER_S
    with pytest.raises(KernelError, match="exit 1"):
        build_cpu.cached_cpu_kernels(tmp_path, cuda_dir)
    assert len(calls) == 2


TORCH_HEADER_ERROR = "{}/ATen/core/TensorBody.h:9:1: error: no matching function for call"


@pytest.mark.parametrize("error", [None, TORCH_HEADER_ERROR], ids=["ours", "torch_header"])
def test_a_failed_build_is_remembered_for_its_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: str | None
) -> None:
    """An error in LEO's sources, or in a torch header they include (LEO's call made it)."""
    from leo_cli.kernel_tools import build_cpu

    calls: list[Path] = []
    monkeypatch.setattr(build_cpu, "check_toolchain", lambda: None)
    monkeypatch.setattr(build_cpu, "compiler_identity", lambda: "g++ 1")
    said = error and error.format(build_cpu.torch_headers())
    monkeypatch.setattr(build_cpu, "build_cpu_kernels", _failing_build(calls, said))
    cuda_dir = stamp.cuda_source_dir()
    with pytest.raises(KernelError) as first:
        build_cpu.cached_cpu_kernels(tmp_path, cuda_dir)
    target = build_cpu.cache_entry(tmp_path, cuda_dir)
    log = target.with_name(f"{target.name}.build") / "build.log"
    assert str(first.value).splitlines()[0].endswith(f"compiler output in {log})")
    # The next run with the same key says so without building again, naming what to do.
    with pytest.raises(KernelError) as again:
        build_cpu.cached_cpu_kernels(tmp_path, cuda_dir)
    assert len(calls) == 1 and len(str(again.value).splitlines()) == 1
    assert str(again.value).startswith(str(first.value).splitlines()[0])
    assert f"delete {build_cpu.failure_path(target)} to try now" in str(again.value)
    assert "not tried again until the sources, torch, the compiler or its" in str(again.value)
    # Another key (here: another compiler) builds again.
    monkeypatch.setattr(build_cpu, "compiler_identity", lambda: "g++ 2")
    with pytest.raises(KernelError):
        build_cpu.cached_cpu_kernels(tmp_path, cuda_dir)
    assert len(calls) == 2
    # The launcher's line names the log whole (no dangling "build.log:").
    from leo_cli.launch import cpu_kernels

    monkeypatch.setattr(backend, "_ACTIVE", Backend("reference", "", "reference", "not built"))
    monkeypatch.setenv("LEO_CPU_BUILD", "auto")
    monkeypatch.delenv("LEO_KERNELS", raising=False)
    unset(monkeypatch, cpu.UNBUILT_ENV, cpu.DIR_ENV)
    said = cpu_kernels.ensure_cpu_kernels(tmp_path)
    other = build_cpu.cache_entry(tmp_path, cuda_dir)
    log = other.with_name(f"{other.name}.build") / "build.log"
    assert said is not None and f"compiler output in {log}); not tried again" in said
    assert len(calls) == 2
    # An include path set for the compiler is another key: a header found there may be why.
    monkeypatch.setenv("CPATH", str(tmp_path / "include"))
    assert build_cpu.cache_entry(tmp_path, cuda_dir) != other
    with pytest.raises(KernelError):
        build_cpu.cached_cpu_kernels(tmp_path, cuda_dir)
    assert len(calls) == 3


def test_the_build_error_names_its_log_in_a_whole_first_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from leo_cli.kernel_tools import build_cpu

    def compiler_fails(cmd: Any, stdout: Any = None, **kwargs: Any) -> Any:
        stdout.write("x.cpp:3:1: error: expected ';'\nTraceback (most recent call last)\n")
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(build_cpu.subprocess, "run", compiler_fails)
    with pytest.raises(KernelError) as failed:
        build_cpu._run_build(stamp.cuda_source_dir(), tmp_path, verbose=False)
    lines = str(failed.value).splitlines()
    assert lines == [
        f"building {cpu.LIBRARY} failed (exit 1; compiler output in {tmp_path / 'build.log'})",
        "x.cpp:3:1: error: expected ';'",
    ]


def test_killed_builds_leave_no_scratch_folder_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from leo_cli.kernel_tools import build_cpu

    monkeypatch.setattr(build_cpu, "check_toolchain", lambda: None)
    monkeypatch.setattr(build_cpu, "compiler_identity", lambda: "g++ 1")
    monkeypatch.setattr(build_cpu, "build_cpu_kernels", _failing_build([]))
    cuda_dir = stamp.cuda_source_dir()
    target = build_cpu.cache_entry(tmp_path, cuda_dir)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        kernels_dir = target.parent
        kernels_dir.mkdir(parents=True)
        dead_own = kernels_dir / f"{target.name}.tmp-{gone.pid}"
        dead_other = kernels_dir / f"cpu-0123456789abcdef.tmp-{gone.pid}"
        busy_other = kernels_dir / f"cpu-fedcba9876543210.tmp-{gone.pid}"
        live = kernels_dir / f"{target.name}.tmp-{alive.pid}"
        for folder in (dead_own, dead_other, busy_other, live):
            (folder / "build").mkdir(parents=True)
        # Another process builds that key (flock: another open file conflicts alike); the
        # build itself fails here, which is not the point.
        with build_cpu._locked(kernels_dir / "cpu-fedcba9876543210"), pytest.raises(KernelError):
            build_cpu.cached_cpu_kernels(tmp_path, cuda_dir)
        assert not dead_own.exists() and not dead_other.exists()
        assert busy_other.exists() and live.exists()
    finally:
        alive.kill()
        alive.wait()


def _cpu_asked_but_unbuilt(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's selection under LEO_KERNELS=cpu found no library (as at import)."""
    monkeypatch.setenv("LEO_KERNELS", "cpu")
    monkeypatch.setattr(backend, "_ACTIVE", None)
    monkeypatch.setattr(backend, "_FAILURE", KernelError("LEO_KERNELS=cpu but not built"))
    monkeypatch.setattr(backend, "_FAILED_CHOICE", "cpu")
    unset(monkeypatch, cpu.UNBUILT_ENV, cpu.DIR_ENV)


def test_leo_kernels_cpu_builds_on_first_use_then_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from leo_cli.config import load_config
    from leo_cli.kernel_tools.build import BuildResult
    from leo_cli.launch import cpu_kernels

    _cpu_asked_but_unbuilt(monkeypatch)
    monkeypatch.setenv("LEO_CPU_BUILD", "auto")
    monkeypatch.setattr(cpu_kernels, "not_built_here", lambda toolchain=True: None)
    cfg = load_config(None, ["pipeline.spmm=leo"])
    cpu_kernels.check_cpu_kernels(cfg)  # not refused: the launch builds it next
    lib = tmp_path / "kernels" / "cpu-k" / cpu.LIBRARY
    built = BuildResult(lib, "fp", False, 21.0, "cpu")
    monkeypatch.setattr(cpu_kernels, "cached_cpu_kernels", lambda *a, **k: built)
    monkeypatch.setattr(backend, "_load_cpu_kernels", lambda: None)  # the build loads
    monkeypatch.setattr(backend, "_import_extension", lambda: "no CUDA extension")
    monkeypatch.setattr(cpu, "_LOADED", lib)
    said = cpu_kernels.ensure_cpu_kernels(tmp_path)
    assert said == f"LEO's CPU kernels built in 21 s: {lib}"
    assert backend.active_backend().cpu == "leo" and os.environ[cpu.DIR_ENV] == str(lib.parent)
    cpu_kernels.check_cpu_spmm(cfg, backend.active_backend().cpu == "leo")


@pytest.mark.parametrize("why", ["never", "fails"])
def test_leo_kernels_cpu_refuses_exactly_where_none_is_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, why: str
) -> None:
    from leo_cli.config import load_config
    from leo_cli.launch import cpu_kernels

    _cpu_asked_but_unbuilt(monkeypatch)
    monkeypatch.setenv("LEO_CPU_BUILD", "never" if why == "never" else "auto")
    monkeypatch.setattr(cpu_kernels, "check_toolchain", lambda: None)

    def fails(*args: Any, **kwargs: Any) -> None:
        raise KernelError("building _leo_cpu.so failed (exit 1; compiler output in x.log)\ne")

    monkeypatch.setattr(cpu_kernels, "cached_cpu_kernels", fails)
    cause = "LEO_CPU_BUILD=never" if why == "never" else "compiler output in x.log)"
    refusals = [lambda: cpu_kernels.ensure_cpu_kernels(tmp_path)]
    if why == "never":  # known before any work
        refusals.append(lambda: cpu_kernels.check_cpu_kernels(load_config(None, [])))
    for refused in refusals:
        with pytest.raises(KernelError) as exc:
            refused()
        message = str(exc.value)
        assert message.startswith("LEO_KERNELS=cpu but LEO's CPU kernels are not built and were")
        assert cause in message and "`leo train` builds" not in message
        assert "\n" not in message


@pytest.mark.parametrize(
    ("env", "device", "refused"),
    [
        ({"LEO_KERNELS": "ref"}, "cpu", "LEO_KERNELS=ref"),
        ({"LEO_CPU_BUILD": "never"}, "cpu", "LEO_CPU_BUILD=never"),
        ({"LEO_CPU_BUILD": "auto"}, "cpu", None),  # built next, checked again after
        ({"LEO_KERNELS": "ref"}, "cuda", None),  # CUDA workers: the CUDA kernels serve
    ],
)
def test_spmm_leo_is_refused_before_any_work_where_it_cannot_load(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], device: str, refused: str | None
) -> None:
    import leo_cli.comm.dist as dist_module
    from leo_cli.config import load_config
    from leo_cli.errors import ConfigError
    from leo_cli.launch import cpu_kernels, setup

    monkeypatch.delenv("LEO_KERNELS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(cpu_kernels, "check_toolchain", lambda: None)
    monkeypatch.setattr(backend, "_ACTIVE", Backend("reference", "", "reference", "not built"))
    monkeypatch.setattr(setup, "check_device", lambda launch, nproc, cuda: None)
    on_cuda = lambda launch: device == "cuda"  # noqa: E731
    monkeypatch.setattr(setup, "uses_cuda", on_cuda)
    monkeypatch.setattr(dist_module, "uses_cuda", on_cuda)  # (read where it is called)
    cfg = load_config(None, ["pipeline.spmm=leo", f"launch.device={device}"])
    if refused is None:
        setup.check_supported(cfg)
        return
    with pytest.raises(ConfigError) as exc:
        setup.check_supported(cfg)
    assert str(exc.value) == (
        f"pipeline.spmm=leo needs LEO's CPU kernels, which are not loaded ({refused}); set "
        "pipeline.spmm=auto (or torch), or build them with `leo compile --cpu`."
    )


@pytest.mark.integration
def test_leo_train_under_leo_kernels_cpu_builds_instead_of_refusing(
    first_use: Built, tmp_path: Path
) -> None:
    """A package without its own library: `LEO_KERNELS=cpu leo train` takes the cache's build
    (the one `first_use` made; an empty cache builds it the same way) instead of refusing."""
    from helpers.cli import TINY, leo

    if cpu.library_path().is_file():
        pytest.skip("the package holds its own library: nothing to build on first use")
    env = {**os.environ, "LEO_KERNELS": "cpu", "LEO_CPU_BUILD": "auto"}
    env.pop(cpu.DIR_ENV, None)
    run = tmp_path / "run"
    res = leo(
        "train", *TINY, "--set", "partition.num_parts=1", "--set", "train.num_epochs=1",
        "--set", "pipeline.spmm=leo", "--set", f"run.out_dir={run}",
        "--set", f"run.cache_dir={first_use.cache}", fresh=True, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["kernels"] == "cpu" and str(first_use.folder) in summary["kernels_cpu_reason"]
