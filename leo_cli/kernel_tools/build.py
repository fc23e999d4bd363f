"""`leo compile`: build the CUDA extension leo_cli._C from cuda/, and find sources and nvcc.

`build_extension` runs a setuptools build (torch's `CUDAExtension`, in a subprocess) and copies
the shared library into the package as `leo_cli/_C*.so`. It is skipped when a fingerprint of the
sources, the torch and CUDA versions and the architecture list matches the last build. The
compile-only check (`leo compile --check`, no GPU needed) lives in `check.py`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from leo_cli.errors import KernelError
from leo_cli.kernels.stamp import (
    installed_extensions,
    is_recorded_library,
    package_dir,
    read_stamp,
    source_fingerprint,
    stamp_path,
)
from leo_cli.util import files
from leo_cli.util.files import sha256_file


@dataclass(frozen=True)
class BuildResult:
    """Outcome of `build_extension`: where the library is and whether it was rebuilt."""

    path: Path
    fingerprint: str
    cached: bool
    seconds: float
    arch_list: str


def kernel_sources(cuda_dir: Path) -> list[Path]:
    """cuda/kernels/*.cu, sorted. Raises KernelError when there are none."""
    sources = sorted((cuda_dir / "kernels").glob("*.cu"))
    if not sources:
        raise KernelError(f"no .cu files in {cuda_dir / 'kernels'}")
    return sources


def binding_sources(cuda_dir: Path) -> list[Path]:
    """cuda/binding/*.cpp and *.cu, sorted."""
    folder = cuda_dir / "binding"
    return sorted([*folder.glob("*.cpp"), *folder.glob("*.cu")])


def _nvcc_candidates() -> list[Path]:
    """Where nvcc may be, in order: $CUDA_HOME/bin, $CUDA_PATH/bin, PATH, /usr/local/cuda/bin."""
    candidates = [
        Path(os.environ[var]) / "bin" / "nvcc"
        for var in ("CUDA_HOME", "CUDA_PATH")
        if os.environ.get(var)
    ]
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    return candidates


def find_nvcc() -> Path:
    """The first executable nvcc of `_nvcc_candidates`. Raises KernelError when there is none."""
    for candidate in _nvcc_candidates():
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise KernelError(
        "nvcc not found (looked in $CUDA_HOME/bin, $CUDA_PATH/bin, PATH and /usr/local/cuda/bin); "
        "install the CUDA toolkit or put nvcc on PATH"
    )


def cuda_include_dir(nvcc: Path) -> Path:
    """The toolkit's include folder (cuda_runtime_api.h).

    nvcc on PATH may be a wrapper script, so when the folder beside its real location lacks the
    headers, nvcc's own dry run says where its include folder is.
    """
    beside = nvcc.resolve().parent.parent / "include"
    if (beside / "cuda_runtime_api.h").is_file():
        return beside
    dry = [str(nvcc), "-dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull]
    proc = subprocess.run(dry, capture_output=True, text=True, check=False)
    for folder in re.findall(r'-I"?([^"\s]+)', proc.stdout + proc.stderr):
        if (Path(folder) / "cuda_runtime_api.h").is_file():
            return Path(folder).resolve()
    return beside


def toolkit_root(nvcc: Path) -> Path:
    """The CUDA toolkit folder that `nvcc` belongs to (the parent of its include/ folder).

    torch's extension build guesses the toolkit as the folder above the first nvcc on PATH,
    which for a wrapper script such as /usr/local/bin/nvcc is /usr/local: no cuda_runtime.h
    there. The build is given this folder as CUDA_HOME instead (when none is set).
    """
    return cuda_include_dir(nvcc).parent


def nvcc_version(nvcc: Path) -> str | None:
    """The CUDA release `nvcc --version` reports ("13.0"), or None when it says none."""
    proc = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"release (\d+)\.(\d+)", proc.stdout)
    return f"{found[1]}.{found[2]}" if found else None


def _major(version: str) -> str:
    return version.split(".")[0]


def torch_cuda_problem() -> str | None:
    """None when this torch can build CUDA extensions with the nvcc found here, else why not.

    torch's extension build refuses a toolkit whose CUDA major version differs from the one
    torch was built with; this says so before anything compiles.

    Raises:
        KernelError: no nvcc is found (torch has CUDA).
    """
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU-only build"
    nvcc = find_nvcc()
    found = nvcc_version(nvcc)
    if found is None:
        return f"`{nvcc} --version` names no CUDA release"
    wanted = torch.version.cuda
    if _major(found) != _major(wanted):
        return (
            f"torch {torch.__version__} was built with CUDA {wanted} but {nvcc} is CUDA {found}, "
            f"and extensions need the same major version: put a CUDA {_major(wanted)} nvcc "
            f"first (CUDA_HOME or PATH) or install a torch built for CUDA {_major(found)}"
        )
    return None


def arch_list() -> str:
    """$TORCH_CUDA_ARCH_LIST, else the capabilities of the visible GPUs, e.g. "8.0;9.0".

    Raises:
        KernelError: neither is available.
    """
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if env and env != "native":
        return env
    caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    if not caps:
        raise KernelError(
            "no GPU visible to pick the CUDA architectures; set TORCH_CUDA_ARCH_LIST "
            "(e.g. TORCH_CUDA_ARCH_LIST='8.0;9.0')"
        )
    return ";".join(f"{major}.{minor}" for major, minor in sorted(caps))


# What a build compiles: editor swap files or objects left by a manual nvcc in these folders
# change nothing, so they must not make a library look stale.
def _tail(log: str, lines: int = 25) -> str:
    return "\n".join(log.splitlines()[-lines:])


def stamp_record(lib: Path, fingerprint: str, archs: str) -> dict[str, object]:
    stat = lib.stat()
    return {
        "fingerprint": fingerprint,
        "archs": archs,
        "library": lib.name,
        "library_sha256": sha256_file(lib),
        "library_size": stat.st_size,
        "library_mtime_ns": stat.st_mtime_ns,
    }


def _up_to_date(stamp: Path, fingerprint: str, pkg: Path) -> Path | None:
    """The installed library when the stamp says it was built from `fingerprint`, else None."""
    recorded = read_stamp(stamp)
    if recorded is None or recorded.get("fingerprint") != fingerprint:
        return None
    for lib in installed_extensions(pkg):
        if is_recorded_library(lib, recorded):
            return lib
    return None


def _setup_spec(cuda_dir: Path, build_root: Path) -> dict[str, object]:
    """What the setuptools subprocess builds (absolute paths)."""
    sources = [*kernel_sources(cuda_dir), *binding_sources(cuda_dir)]
    return {
        "sources": [str(s.resolve()) for s in sources],
        "include": str((cuda_dir / "include").resolve()),
        "build_lib": str((build_root / "lib").resolve()),
        "build_temp": str((build_root / "temp").resolve()),
    }


def _run_setup(cuda_dir: Path, build_root: Path, archs: str, verbose: bool) -> None:
    """Run the setuptools build in a subprocess (setuptools keeps global state); log to file."""
    spec = json.dumps(_setup_spec(cuda_dir, build_root))
    # The subprocess runs in build_root so setuptools does not read the project's pyproject.toml;
    # PYTHONPATH keeps leo_cli importable there without an install.
    python_path = os.pathsep.join(
        filter(None, [str(package_dir().parent), os.environ.get("PYTHONPATH")])
    )
    env = {**os.environ, "TORCH_CUDA_ARCH_LIST": archs, "PYTHONPATH": python_path}
    # The subprocess imports leo_cli but never runs a kernel: no extension to load there.
    env["LEO_KERNELS"] = "ref"
    if not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")):
        env["CUDA_HOME"] = str(toolkit_root(find_nvcc()))
    cmd = [sys.executable, "-m", "leo_cli.kernel_tools.build", "--setup", spec]
    log_path = build_root / "build.log"
    with log_path.open("w") as log:
        out = None if verbose else log
        proc = subprocess.run(
            cmd, cwd=build_root, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    if proc.returncode != 0:
        detail = (
            "" if verbose else f"; compiler output in {log_path}:\n{_tail(log_path.read_text())}"
        )
        raise KernelError(f"building leo_cli._C failed (exit {proc.returncode}){detail}")


def _install(build_root: Path, pkg: Path) -> Path:
    """Copy the built library into the package (atomically) and drop stale copies."""
    built = sorted((build_root / "lib" / "leo_cli").glob("_C*.so"))
    if not built:
        raise KernelError(f"the build produced no _C*.so under {build_root / 'lib'}")
    target = pkg / built[0].name
    with files.atomic_file(target) as f, built[0].open("rb") as src:  # a fresh temporary
        shutil.copyfileobj(src, f)
        os.fchmod(f.fileno(), built[0].stat().st_mode & 0o777)
    for stale in installed_extensions(pkg):
        if stale != target:
            stale.unlink()
    return target


def build_extension(
    cuda_dir: Path,
    *,
    force: bool = False,
    verbose: bool = False,
    build_root: Path | None = None,
) -> BuildResult:
    """Build leo_cli._C unless an identical build is installed.

    Args:
        cuda_dir: the cuda/ source folder.
        force: rebuild even when the fingerprint matches.
        verbose: stream compiler output instead of logging it to build_root/build.log.
        build_root: intermediate files (default: build/leo_ext beside cuda/; git-ignored).

    Raises:
        KernelError: torch has no CUDA, nvcc is missing or of another CUDA major version
            than torch's, no architecture is known, or the build fails.
    """
    problem = torch_cuda_problem()
    if problem is not None:
        raise KernelError(
            f"cannot build the CUDA extension: {problem}. Build it where torch has CUDA; here, "
            "`leo compile --check` compiles the kernels with nvcc alone"
        )
    t0 = time.perf_counter()
    archs = arch_list()
    fingerprint = source_fingerprint(cuda_dir, archs)
    root = build_root or cuda_dir.parent / "build" / "leo_ext"
    pkg = package_dir()
    stamp = stamp_path(pkg)
    current = None if force else _up_to_date(stamp, fingerprint, pkg)
    if current is not None:
        return BuildResult(current, fingerprint, True, time.perf_counter() - t0, archs)
    root.mkdir(parents=True, exist_ok=True)
    _run_setup(cuda_dir, root, archs, verbose)
    lib = _install(root, pkg)
    stamp.write_text(json.dumps(stamp_record(lib, fingerprint, archs), indent=2))
    return BuildResult(lib, fingerprint, False, time.perf_counter() - t0, archs)


def _setup_main(spec_json: str) -> None:
    """Body of the build subprocess: setuptools + torch's CUDAExtension/BuildExtension."""
    from setuptools import setup  # type: ignore[import-untyped]
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    spec = json.loads(spec_json)
    extension = CUDAExtension(  # type: ignore[no-untyped-call]
        name="leo_cli._C",
        sources=spec["sources"],
        include_dirs=[spec["include"]],
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "-lineinfo"]},
    )
    setup(
        name="leo-cuda-kernels",
        ext_modules=[extension],
        cmdclass={"build_ext": BuildExtension},
        script_args=[
            "build_ext",
            "--build-lib",
            spec["build_lib"],
            "--build-temp",
            spec["build_temp"],
        ],
    )


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="leo_cli._C build subprocess (internal)")
    parser.add_argument("--setup", required=True, help="JSON build spec")
    _setup_main(parser.parse_args().setup)
