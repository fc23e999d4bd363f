"""`leo compile`: --check with nvcc, the host emulation of the kernels, caching and errors.

The nvcc tests run where nvcc exists (no GPU needed) and skip elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import typer
from typer.testing import CliRunner

from leo_cli.cli.compile import compile_cmd
from leo_cli.errors import KernelError
from leo_cli.kernel_tools import build, check
from leo_cli.kernel_tools.check import TORCH_NVCC_FLAGS
from leo_cli.kernels.backend import stale_build

CUDA_DIR = Path(__file__).resolve().parents[2] / "cuda"
runner = CliRunner()


def nvcc_or_skip() -> Path:
    try:
        return build.find_nvcc()
    except KernelError as exc:
        pytest.skip(f"needs nvcc to compile CUDA sources: {exc}")


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    app = typer.Typer()
    app.command()(compile_cmd)
    result = runner.invoke(app, list(args), env=env)
    return result.exit_code, result.stdout + result.stderr


def copy_cuda_tree(tmp_path: Path) -> Path:
    target = tmp_path / "cuda"
    shutil.copytree(CUDA_DIR, target)
    return target


@pytest.mark.integration
def test_check_compiles_for_sm80_sm90_and_fails_on_a_warning(tmp_path: Path) -> None:
    """One real kernel beside a broken one, and the binding's line (every kernel and the
    binding are compiled by `make test`'s `leo compile --check` step already; compiling them
    all again here took minutes, the binding alone 8 s of CPU: a stand-in of its name here)."""
    nvcc_or_skip()
    cuda_dir = copy_cuda_tree(tmp_path)
    kept = "row_ops.cu"
    for other in (cuda_dir / "kernels").glob("*.cu"):
        if other.name != kept:
            other.unlink()
    (cuda_dir / "binding" / "leo_binding.cpp").write_text("int leo_binding() { return 0; }\n")
    # An unused variable is only a warning; -Werror all-warnings must turn it into a FAIL.
    broken = "__global__ void zz_broken(float* x) { int unused = 3; x[0] = 1.0f; }\n"
    (cuda_dir / "kernels" / "zz_broken.cu").write_text(broken)
    code, out = invoke("--check", env={"LEO_CUDA_DIR": str(cuda_dir)})
    assert code == 2, out
    for source in [kept]:
        for arch in ("sm_80", "sm_90"):
            assert any(
                source in line and arch in line and "OK" in line for line in out.splitlines()
            ), (source, arch, out)
    assert any("zz_broken.cu" in line and "FAIL" in line for line in out.splitlines()), out
    assert "unused" in out  # the nvcc diagnostic is shown
    last = " ".join(out.split())  # the closing sentence names each failed source and target
    assert "compilations failed: kernels/zz_broken.cu (sm_80, sm_90)" in last, out
    assert any("leo_binding.cpp" in line and "OK" in line for line in out.splitlines()), out
    assert not list(cuda_dir.rglob("*.o")), "check must not write objects into the tree"


@pytest.mark.integration
def test_check_passes_on_a_clean_tree(tmp_path: Path) -> None:
    nvcc_or_skip()
    cuda_dir = tmp_path / "cuda"
    (cuda_dir / "include").mkdir(parents=True)
    (cuda_dir / "kernels").mkdir()
    (cuda_dir / "kernels" / "ok.cu").write_text("__global__ void ok(float* x) { x[0] = 1.0f; }\n")
    code, out = invoke("--check", "--arch", "sm_90", env={"LEO_CUDA_DIR": str(cuda_dir)})
    assert code == 0, out
    assert "All 1 compilations passed" in out


def build_host_emulation(
    nvcc: Path, cuda_dir: Path, exe: Path, level: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    """Build cuda_dir/tests/host_emulation.cu against cuda_dir/include into `exe`, optimised at
    `level` ("-O1")."""
    cmd = [
        str(nvcc),
        "-std=c++17",
        level,
        *TORCH_NVCC_FLAGS,
        *flags,
        "-I",
        str(cuda_dir / "include"),
        str(cuda_dir / "tests" / "host_emulation.cu"),
        "-o",
        str(exe),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


# Each needed atomic of the kernels, and the plain add a careless edit could put there.
ATOMIC_MUTANTS = {
    "fused_accumulate": (
        "fused_aggregate.cuh",
        "for (int v = 0; v < VEC; ++v) atomic_add(dst + v, part[v]);",
        "for (int v = 0; v < VEC; ++v) dst[v] += part[v];",
    ),
    "hub_accumulate": (
        "spmm_csr.cuh",
        "for (int v = 0; v < VEC; ++v) atomic_add(dst + v, part[v]);",
        "for (int v = 0; v < VEC; ++v) dst[v] += part[v];",
    ),
    "scatter_add": (
        "row_ops.cuh",
        "atomic_add(dst + f, NumTraits<T>::load(load_ro(src + f)));",
        "dst[f] += NumTraits<T>::load(load_ro(src + f));",
    ),
}


# Appended to the mutants' copy of leo_common.cuh: which atomic a run of the mutant build turns
# into its plain add (LEO_MUTANT names it; none where unset, and never in device code).
MUTANT_SWITCH = """
#include <cstdlib>
#include <cstring>
__host__ __device__ inline bool leo_mutant(const char* name) {
#ifdef __CUDA_ARCH__
  return false;
#else
  static const char* chosen = std::getenv("LEO_MUTANT");
  return chosen != nullptr && std::strcmp(chosen, name) == 0;
#endif
}
"""


def switched(name: str, atomic: str, plain: str) -> str:
    """`atomic`'s line with its statement chosen at run time: the plain add where LEO_MUTANT is
    `name`, else the atomic (the loop both lines share stays around it)."""
    prefix = os.path.commonprefix([atomic, plain])
    return f'{prefix}if (leo_mutant("{name}")) {plain[len(prefix) :]} else {atomic[len(prefix) :]}'


@pytest.fixture(scope="module")
def emulations(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The host emulation of the kernels as they are (`reference`) and the build of every
    atomic mutant (race mode), compiled at once: each build is one single-threaded gcc of
    seconds to tens of seconds. The mutants share one build, each atomic beside its plain add
    and the plain add taken where LEO_MUTANT names it (`run_emulation(exe, mutant)`); their
    few race cases run in a second unoptimised: -O0 compiles them in 3.5 s of CPU against 5.5
    s at -O1. A mutant whose atomic is no longer in its header is left out, and its test fails
    by name."""
    nvcc = nvcc_or_skip()
    root = tmp_path_factory.mktemp("emulation")
    builds: dict[str, tuple[Path, Path, tuple[str, ...]]] = {
        "reference": (CUDA_DIR, root / "emulate", ("-O1",))
    }
    cuda_dir = copy_cuda_tree(root / "mutants")
    with (cuda_dir / "include" / "leo_common.cuh").open("a") as f:
        f.write(MUTANT_SWITCH)
    mutants = []
    for mutant, (header, atomic, plain) in ATOMIC_MUTANTS.items():
        path = cuda_dir / "include" / header
        source = path.read_text()
        if source.count(atomic) != 1:
            continue  # test_host_emulation_catches_a_missing_atomic says so
        path.write_text(source.replace(atomic, switched(mutant, atomic, plain)))
        mutants.append(mutant)
    if mutants:
        builds["mutants"] = (
            cuda_dir,
            root / "mutants" / "emulate",
            ("-O0", "-DLEO_RACE_CHECK_ONLY"),
        )
    with ThreadPoolExecutor(max_workers=len(builds)) as pool:
        done = {
            name: pool.submit(build_host_emulation, nvcc, cuda_dir, exe, level, *flags)
            for name, (cuda_dir, exe, (level, *flags)) in builds.items()
        }
    for name, future in done.items():
        result = future.result()
        assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"
    exes = {name: exe for name, (_, exe, _) in builds.items()}
    return {"reference": exes["reference"], **{m: exes["mutants"] for m in mutants}}


def run_emulation(exe: Path, mutant: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run an emulation build; in the mutants' build, `mutant`'s atomic is a plain add (None:
    every atomic kept, whatever LEO_MUTANT this process has)."""
    env = {key: value for key, value in os.environ.items() if key != "LEO_MUTANT"}
    env.update({"LEO_MUTANT": mutant} if mutant else {})
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.integration
def test_host_emulation_of_kernels_matches_reference(emulations: dict[str, Path]) -> None:
    """Runs the per-thread kernel bodies on the CPU against a float64 reference."""
    result = run_emulation(emulations["reference"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout


@pytest.mark.parametrize("mutant", sorted(ATOMIC_MUTANTS))
@pytest.mark.integration
def test_host_emulation_catches_a_missing_atomic(mutant: str, emulations: dict[str, Path]) -> None:
    """The race mode must fail a kernel whose needed atomic became a plain add.

    Threads run one at a time in the emulation, so without the race mode (private copies
    merged at each barrier) such a mutant passed every check.
    """
    header, atomic, _ = ATOMIC_MUTANTS[mutant]
    assert mutant in emulations, f"{header} no longer holds the atomic this test removes"
    result = run_emulation(emulations[mutant], mutant)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "races (plain stores by two threads)" in result.stdout, result.stdout


@pytest.mark.integration
def test_the_mutant_build_passes_where_no_mutant_is_chosen(emulations: dict[str, Path]) -> None:
    """Every atomic of the mutants' build stays an atomic unless LEO_MUTANT names it, so each
    mutant's run above has its own atomic removed and no other."""
    builds = {exe for name, exe in emulations.items() if name != "reference"}
    assert len(builds) == 1, emulations
    result = run_emulation(builds.pop())
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 failed" in result.stdout


@pytest.mark.skipif(torch.version.cuda is not None, reason="torch here has CUDA")
def test_build_without_cuda_torch_points_to_check() -> None:
    code, out = invoke()
    assert code == 2
    assert "CPU-only" in out and "--check" in out


def test_missing_cuda_sources_are_reported(tmp_path: Path) -> None:
    code, out = invoke("--check", env={"LEO_CUDA_DIR": str(tmp_path / "nowhere")})
    assert code == 2
    assert "CUDA sources not found" in out


def test_missing_nvcc_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "_nvcc_candidates", lambda: [])
    code, out = invoke("--check")
    assert code == 2
    assert "nvcc not found" in out


def test_help_explains_every_option() -> None:
    code, out = invoke("--help")
    assert code == 0
    for option in ("--check", "--arch", "--force", "--jobs", "--verbose", "--config", "--set"):
        assert option in out


@pytest.mark.parametrize(
    ("given", "expected"), [("80", "80"), ("sm_90", "90"), ("9.0", "90"), ("90a", "90a")]
)
def test_normalize_arch(given: str, expected: str) -> None:
    assert check.normalize_arch(given) == expected


def test_normalize_arch_rejects_nonsense() -> None:
    with pytest.raises(KernelError, match="not a CUDA architecture"):
        check.normalize_arch("hopper")


def test_fingerprint_follows_sources_and_arch_list(tmp_path: Path) -> None:
    cuda_dir = copy_cuda_tree(tmp_path)
    base = build.source_fingerprint(cuda_dir, "8.0;9.0")
    assert build.source_fingerprint(cuda_dir, "8.0;9.0") == base
    assert build.source_fingerprint(cuda_dir, "9.0") != base
    with (cuda_dir / "kernels" / "spmm_csr.cu").open("a") as f:
        f.write("// changed\n")
    assert build.source_fingerprint(cuda_dir, "8.0;9.0") != base


def test_up_to_date_needs_matching_fingerprint_and_library(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    lib = pkg / "_C.cpython-311-x86_64-linux-gnu.so"
    lib.write_bytes(b"library")
    stamp = build.stamp_path(pkg)
    stamp.write_text(json.dumps(build.stamp_record(lib, "abc", "9.0")))
    assert build._up_to_date(stamp, "abc", pkg) == lib
    assert build._up_to_date(stamp, "other", pkg) is None
    lib.write_bytes(b"replaced by hand")
    assert build._up_to_date(stamp, "abc", pkg) is None


def test_recorded_library_is_known_by_size_and_time_else_by_hash(tmp_path: Path) -> None:
    lib = tmp_path / "_C.so"
    lib.write_bytes(b"library")
    record = build.stamp_record(lib, "abc", "9.0")
    assert build.is_recorded_library(lib, record)
    os.utime(lib, ns=(1, 1))  # touched (e.g. copied): same bytes, so still the library
    assert build.is_recorded_library(lib, record)
    lib.write_bytes(b"LIBRARY")  # same size, other bytes, new time
    assert not build.is_recorded_library(lib, record)


def test_stale_build_names_what_differs(tmp_path: Path) -> None:
    cuda_dir = copy_cuda_tree(tmp_path)
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    assert stale_build(pkg, cuda_dir) is None  # no library: nothing to check
    lib = pkg / "_C.cpython-311-x86_64-linux-gnu.so"
    lib.write_bytes(b"library")
    assert "no readable build stamp" in (stale_build(pkg, cuda_dir) or "")
    archs = "8.0;9.0"
    record = build.stamp_record(lib, build.source_fingerprint(cuda_dir, archs), archs)
    build.stamp_path(pkg).write_text(json.dumps(record))
    assert stale_build(pkg, cuda_dir) is None
    assert stale_build(pkg, None) is None  # installed without sources: trusted
    (cuda_dir / "kernels" / ".spmm_csr.cu.swp").write_bytes(b"editor state")
    (cuda_dir / "kernels" / "spmm_csr.o").write_bytes(b"manual nvcc -c")
    assert stale_build(pkg, cuda_dir) is None  # files no build compiles change nothing
    with (cuda_dir / "include" / "spmm_csr.cuh").open("a") as f:
        f.write("// edited after the build\n")
    assert "other CUDA sources" in (stale_build(pkg, cuda_dir) or "")
    record = build.stamp_record(lib, build.source_fingerprint(cuda_dir, archs), archs)
    build.stamp_path(pkg).write_text(json.dumps(record))
    lib.write_bytes(b"copied in by hand")
    assert "not the library" in (stale_build(pkg, cuda_dir) or "")


def test_arch_list_respects_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0+PTX")
    assert build.arch_list() == "8.0;9.0+PTX"
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    if torch.cuda.device_count() == 0:
        with pytest.raises(KernelError, match="TORCH_CUDA_ARCH_LIST"):
            build.arch_list()


def test_cuda_include_dir_has_runtime_headers() -> None:
    nvcc = nvcc_or_skip()
    assert (build.cuda_include_dir(nvcc) / "cuda_runtime_api.h").is_file()
    assert os.access(nvcc, os.X_OK)


def test_build_installs_into_the_package_and_then_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build flow around setuptools: install, stamp, cache hit, --force (no compiler)."""
    pkg = tmp_path / "leo_cli"
    pkg.mkdir()
    (pkg / "_C.old-abi.so").write_bytes(b"stale")
    runs: list[Path] = []

    def fake_setup(cuda_dir: Path, build_root: Path, archs: str, verbose: bool) -> None:
        out = build_root / "lib" / "leo_cli"
        out.mkdir(parents=True, exist_ok=True)
        (out / "_C.cpython-311-x86_64-linux-gnu.so").write_bytes(b"built for " + archs.encode())
        runs.append(build_root)

    monkeypatch.setattr(build, "torch_cuda_problem", lambda: None)
    monkeypatch.setattr(build, "package_dir", lambda: pkg)
    monkeypatch.setattr(build, "_run_setup", fake_setup)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    root = tmp_path / "build"
    first = build.build_extension(CUDA_DIR, build_root=root)
    assert not first.cached and first.path.parent == pkg and first.arch_list == "9.0"
    assert [p.name for p in build.installed_extensions(pkg)] == [first.path.name]
    assert build.build_extension(CUDA_DIR, build_root=root).cached
    assert not build.build_extension(CUDA_DIR, build_root=root, force=True).cached
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    assert not build.build_extension(CUDA_DIR, build_root=root).cached
    assert len(runs) == 3
    # The stamp sits beside the library, wherever the intermediate files went.
    assert build.read_stamp(build.stamp_path(pkg)) is not None
    assert stale_build(pkg, CUDA_DIR) is None


def test_make_test_runs_the_cuda_compile_check() -> None:
    # The README promises that `make test` includes it (it skips itself without nvcc).
    if shutil.which("make") is None:
        pytest.skip("make not found")
    root = CUDA_DIR.parent
    dry = subprocess.run(["make", "-n", "test"], cwd=root, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert "leo compile --check" in dry.stdout and "pytest -q" in dry.stdout


@pytest.mark.skipif(torch.version.cuda is not None, reason="torch here has CUDA")
@pytest.mark.integration
def test_leo_compile_runs_under_leo_kernels_cuda_on_an_unbuilt_tree() -> None:
    # The import of leo_cli.kernels used to raise before `leo compile` could build anything.
    env = {**os.environ, "LEO_KERNELS": "cuda"}
    proc = subprocess.run(
        [sys.executable, "-m", "leo_cli", "compile"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "CPU-only" in proc.stdout + proc.stderr


def test_nvcc_of_another_cuda_major_is_refused_before_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvcc = tmp_path / "bin" / "nvcc"
    fake_nvcc.parent.mkdir()
    fake_nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    fake_nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    problem = build.torch_cuda_problem()
    assert problem is not None and "CUDA 12.8" in problem and "CUDA 13.0" in problem
    assert "same major version" in problem and str(fake_nvcc) in problem

    def no_setup(*args: object) -> None:
        raise AssertionError("compiled despite the mismatch")

    monkeypatch.setattr(build, "_run_setup", no_setup)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    with pytest.raises(KernelError, match="same major version"):
        build.build_extension(CUDA_DIR, build_root=tmp_path / "build")
    monkeypatch.setattr(torch.version, "cuda", "13.1")  # minor versions may differ
    assert build.torch_cuda_problem() is None


def test_the_build_gets_the_toolkit_of_nvcc_not_the_folder_of_a_wrapper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # /usr/local/bin/nvcc as a wrapper script made torch guess CUDA_HOME=/usr/local, which has
    # no cuda_runtime.h: the first real build here failed on it.
    nvcc = nvcc_or_skip()
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {nvcc.resolve()} "$@"\n')
    wrapper.chmod(0o755)
    root = build.toolkit_root(wrapper)
    assert root != tmp_path and (root / "include" / "cuda_runtime_api.h").is_file()
    seen: dict[str, str] = {}
    real_run = subprocess.run

    def record(cmd: list[str], **kwargs: Any) -> Any:
        if "--setup" not in cmd:  # nvcc's own dry run, asked where its headers are
            return real_run(cmd, **kwargs)
        seen.update(kwargs["env"])
        return subprocess.CompletedProcess(cmd, 0)

    for var in ("CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(build, "find_nvcc", lambda: wrapper)
    monkeypatch.setattr(build.subprocess, "run", record)
    build._run_setup(CUDA_DIR, tmp_path, "9.0", verbose=True)
    assert seen["CUDA_HOME"] == str(root) and seen["LEO_KERNELS"] == "ref"
