"""`leo compile --cpu`: build LEO's CPU kernels (cuda/cpu/) into leo_cli/_leo_cpu.so.

torch's JIT extension build (`torch.utils.cpp_extension.load`, ninja and the host C++ compiler)
runs in a subprocess, because it also loads the library and a process can load one library per
op namespace; the library is then copied into the package with a stamp (the fingerprint of the
sources, torch, Python and the flags). Skipped when the stamp matches.

`cached_cpu_kernels` is the same build on first use (`leo train`, launch/cpu_kernels.py): into
a folder of the cache named by the fingerprint and the compiler, built once under a file lock
in a temporary folder renamed into place, so several runs starting at once build it once. A
build that fails is remembered beside it (`cpu-<key>.failed`): later runs with the same key
say so without building again; temporary folders of builds killed midway are removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from leo_cli.errors import KernelError
from leo_cli.kernel_tools.build import BuildResult, stamp_record
from leo_cli.kernels import cpu
from leo_cli.kernels.stamp import is_recorded_library, package_dir, read_stamp
from leo_cli.util import files

_NAME = "leo_cpu"


def cpu_sources(cuda_dir: Path) -> list[Path]:
    """cuda/cpu/*.cpp, sorted. Raises KernelError when there are none."""
    sources = sorted(cpu.source_dir(cuda_dir).glob("*.cpp"))
    if not sources:
        raise KernelError(f"no .cpp files in {cpu.source_dir(cuda_dir)}")
    return sources


def _up_to_date(pkg: Path, fingerprint: str) -> bool:
    recorded = read_stamp(cpu.stamp_path(pkg))
    lib = cpu.library_path(pkg)
    return (
        recorded is not None
        and recorded.get("fingerprint") == fingerprint
        and lib.is_file()
        and is_recorded_library(lib, recorded)
    )


def _tool_path() -> str:
    """PATH for the build: this interpreter's folder first (a virtual environment's ninja)."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def _run_build(cuda_dir: Path, root: Path, verbose: bool) -> Path:
    """Compile in a subprocess into `root`; the built library's path."""
    spec = json.dumps(
        {
            "sources": [str(s.resolve()) for s in cpu_sources(cuda_dir)],
            "include": str(cpu.source_dir(cuda_dir).resolve()),
            "build_dir": str(root.resolve()),
            "verbose": verbose,
        }
    )
    python_path = os.pathsep.join(
        filter(None, [str(package_dir().parent), os.environ.get("PYTHONPATH")])
    )
    # The subprocess must not load an installed copy of the library before building its own.
    env = {**os.environ, "PYTHONPATH": python_path, "LEO_KERNELS": "ref", "PATH": _tool_path()}
    cmd = [sys.executable, "-m", "leo_cli.kernel_tools.build_cpu", "--build", spec]
    # torch's build waits on this lock while another build holds it: one killed mid-build
    # (Ctrl-C) leaves it behind, and `leo compile --cpu` builds one library at a time anyway.
    (root / "lock").unlink(missing_ok=True)
    log_path = root / "build.log"
    with log_path.open("w") as log:
        out = None if verbose else log
        proc = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        # The first line is whole on its own (the launcher says it alone); the compiler's
        # error lines follow it.
        where = "its output above" if verbose else f"compiler output in {log_path}"
        errors = [] if verbose else _error_lines(log_path.read_text())
        raise KernelError(
            "\n".join([f"building {cpu.LIBRARY} failed (exit {proc.returncode}; {where})", *errors])
        )
    built = root / f"{_NAME}.so"
    if not built.is_file():
        raise KernelError(f"the build produced no {built}")
    return built


def _error_lines(log: str, limit: int = 10) -> list[str]:
    """The compiler's error lines of a build log (not the Python traceback around them)."""
    found = [
        line for line in log.splitlines() if "error" in line.lower() and "Traceback" not in line
    ]
    return found[:limit] or log.splitlines()[-limit:]


def build_cpu_kernels(
    cuda_dir: Path,
    *,
    force: bool = False,
    verbose: bool = False,
    build_root: Path | None = None,
    pkg: Path | None = None,
) -> BuildResult:
    """Build leo_cli/_leo_cpu.so unless the stamp says the installed one is this build.

    Args:
        cuda_dir: the cuda/ source folder (its cpu/ subfolder is compiled).
        force: rebuild even when the fingerprint matches.
        verbose: stream compiler output instead of logging it to build_root/build.log.
        build_root: intermediate files (default: build/leo_cpu beside cuda/; git-ignored).
        pkg: where the library and its stamp go (default: the leo_cli package).

    Raises:
        KernelError: no C++ compiler or ninja, no sources, or the build fails.
    """
    t0 = time.perf_counter()
    check_toolchain()
    pkg = pkg or package_dir()
    fingerprint = cpu.source_fingerprint(cuda_dir)
    lib = cpu.library_path(pkg)
    if not force and _up_to_date(pkg, fingerprint):
        return BuildResult(lib, fingerprint, True, time.perf_counter() - t0, "cpu")
    root = build_root or cuda_dir.parent / "build" / "leo_cpu"
    root.mkdir(parents=True, exist_ok=True)
    built = _run_build(cuda_dir, root, verbose)
    with files.atomic_file(lib) as f, built.open("rb") as src:
        shutil.copyfileobj(src, f)
        os.fchmod(f.fileno(), 0o755)
    record = {**stamp_record(lib, fingerprint, "cpu"), "torch": torch.__version__}
    with files.atomic_file(cpu.stamp_path(pkg), "w") as f:
        f.write(json.dumps(record, indent=2))
    return BuildResult(lib, fingerprint, False, time.perf_counter() - t0, "cpu")


def _compiler() -> str:
    return (shlex.split(os.environ.get("CXX", "")) or ["c++"])[0]  # e.g. CXX="ccache g++"


def check_toolchain() -> None:
    """Raises KernelError (one sentence) where the build's C++ compiler or ninja is missing."""
    if shutil.which(_compiler()) is None:
        raise KernelError(
            "no C++ compiler found (c++ on PATH, or $CXX): install one (g++ or clang++)"
        )
    if shutil.which("ninja", path=_tool_path()) is None:
        raise KernelError("ninja not found (torch builds extensions with it): pip install ninja")


def compiler_identity() -> str:
    """The compiler's resolved path and the first line of its `--version` (a new compiler or
    another one on PATH is another build)."""
    path = shutil.which(_compiler()) or _compiler()
    try:
        proc = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
        version = (proc.stdout.splitlines() or [""])[0]
    except (OSError, subprocess.SubprocessError):
        version = ""
    return f"{os.path.realpath(path)} {version}".strip()


CACHE_FOLDER = "kernels"


# Where the compiler driver looks besides its arguments (GCC's environment variables; torch's
# extension build passes no CFLAGS-like variable on): a build, or its failure remembered for
# good when in a header, holds for these values only.
COMPILER_ENV = ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH", "LIBRARY_PATH",
                "COMPILER_PATH", "GCC_EXEC_PREFIX")  # fmt: skip


def cache_entry(cache_dir: Path, cuda_dir: Path) -> Path:
    """`<cache_dir>/kernels/cpu-<key>`: the cached build for these sources, torch, Python,
    flags (`cpu.source_fingerprint`), compiler and the compiler's environment
    (`COMPILER_ENV`)."""
    env = "\0".join(f"{k}={os.environ[k]}" for k in COMPILER_ENV if os.environ.get(k))
    material = f"{cpu.source_fingerprint(cuda_dir)}\0{compiler_identity()}\0{env}"
    key = hashlib.sha256(material.encode()).hexdigest()[:16]
    return Path(cache_dir) / CACHE_FOLDER / f"cpu-{key}"


@contextlib.contextmanager
def _locked(target: Path, wait: bool = True) -> Iterator[bool]:
    """Hold `<target>.lock` (advisory, beside the folder) while checking and building it;
    yields whether it is held (always, unless `wait` is False and another process holds it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True


FAILED = ".failed"  # beside a build's folder: the failure of its key
# A failure the compiler reported in LEO's own sources (`path:line:col: error:`) holds for its
# key; any other (a compiler killed for memory, a full disk, a missing header or tool, and an
# error inside a header, even where LEO's code caused it) may not hold later, so it is tried
# again after this long.
RETRY_AFTER_S = 3600
_SOURCE_ERROR = re.compile(r"\.(?:cpp|h):\d+:(?:\d+:)? error:")
_RETRY = "retry-after "
_SCRATCH = re.compile(r"^(cpu-[0-9a-f]+)\.tmp-([0-9]+)$")


def torch_headers() -> Path:
    """The folder of the torch headers a build includes."""
    return (Path(torch.__file__).parent / "include").resolve()


def failure_path(target: Path) -> Path:
    """Where a failed build of `target`'s key is remembered (`cpu-<key>.failed`)."""
    return target.with_name(target.name + FAILED)


def _remember_failure(target: Path, exc: KernelError, cuda_dir: Path) -> None:
    """Record the failure: for good where the compiler reported an error in a file of
    `cuda_dir`'s CPU sources or of torch's headers they include (the key names both: the
    same inputs fail the same way), else with the time after which it is tried again."""
    lines = str(exc).splitlines()
    ours = (str(cpu.source_dir(cuda_dir).resolve()), str(torch_headers()))
    lasting = any(
        _SOURCE_ERROR.search(line) and any(folder in line for folder in ours) for line in lines[1:]
    )
    until = "" if lasting else f"{_RETRY}{int(time.time() + RETRY_AFTER_S)}\n"
    with contextlib.suppress(OSError), files.atomic_file(failure_path(target), "w") as f:
        f.write(lines[0] + "\n" + until)


def _remembered_failure(target: Path) -> KernelError | None:
    """The failure an earlier build of this key recorded, or None (none, or one whose time to
    try again has come: its record is removed)."""
    path = failure_path(target)
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    retry = [line for line in lines if line.startswith(_RETRY)]
    first = lines[0].strip() if lines and not lines[0].startswith(_RETRY) else ""
    first = first or f"building {cpu.LIBRARY} failed"
    if retry:
        try:
            at = int(retry[0][len(_RETRY) :].strip())
        except ValueError:  # an unreadable time: try now
            at = 0
        if time.time() >= at:
            path.unlink(missing_ok=True)
            return None
        when = time.strftime("%H:%M", time.localtime(at))
        return KernelError(f"{first}; tried again after {when} (delete {path} to try now)")
    return KernelError(
        f"{first}; not tried again until the sources, torch, the compiler "
        f"or its environment (include paths, flags) change (delete {path} to try now)"
    )


def clean_stale_scratch(kernels_dir: Path, held: Path) -> list[Path]:
    """Remove the temporary folders (`cpu-<key>.tmp-<pid>`) that builds killed midway left
    in `kernels_dir`: those whose process is gone, of the key whose lock (`held`) this process
    holds, or of another key whose lock is free. The folders removed."""
    removed = []
    for path in sorted(kernels_dir.glob("cpu-*.tmp-*")):
        found = _SCRATCH.match(path.name)
        if found is None or not path.is_dir() or files.pid_alive(int(found[2])):
            continue
        target = kernels_dir / found[1]
        with contextlib.ExitStack() as stack:
            if target != held and not stack.enter_context(_locked(target, wait=False)):
                continue  # its key is being built right now
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def cached_cpu_kernels(
    cache_dir: Path, cuda_dir: Path, on_build: Callable[[Path], None] | None = None
) -> BuildResult:
    """The library built for this checkout, torch and compiler in `cache_dir`
    (`cache_entry`): reused where its stamp matches, else built (`on_build(folder)` is told
    first) into a temporary folder beside it that is renamed into place; one process builds
    while the others wait on the lock.

    Raises:
        KernelError: no C++ compiler or ninja, or the build fails (nothing is left in place).
    """
    t0 = time.perf_counter()
    check_toolchain()
    target = cache_entry(cache_dir, cuda_dir)
    fingerprint = cpu.source_fingerprint(cuda_dir)
    with _locked(target):
        clean_stale_scratch(target.parent, target)
        if _up_to_date(target, fingerprint):
            return BuildResult(
                cpu.library_path(target), fingerprint, True, time.perf_counter() - t0, "cpu"
            )
        remembered = _remembered_failure(target)
        if remembered is not None:
            raise remembered
        if on_build is not None:
            on_build(target)
        scratch = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        build_root = target.with_name(f"{target.name}.build")  # kept on failure: its log
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        try:
            build_cpu_kernels(cuda_dir, force=True, build_root=build_root, pkg=scratch)
            shutil.rmtree(target, ignore_errors=True)  # a stale build of the same key
            os.rename(scratch, target)
            shutil.rmtree(build_root, ignore_errors=True)
        except KernelError as exc:  # remembered: the next run does not pay it again
            _remember_failure(target, exc, cuda_dir)
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    lib = cpu.library_path(target)
    return BuildResult(lib, fingerprint, False, time.perf_counter() - t0, "cpu")


def _build_main(spec_json: str) -> None:
    """Body of the build subprocess: torch's JIT extension build of a plain op library."""
    from torch.utils.cpp_extension import load

    spec = json.loads(spec_json)
    try:
        load(
            name=_NAME,
            sources=spec["sources"],
            extra_cflags=list(cpu.CFLAGS),
            extra_ldflags=["-fopenmp"],
            extra_include_paths=[spec["include"]],
            build_directory=spec["build_dir"],
            is_python_module=False,
            verbose=spec["verbose"],
        )
    except (RuntimeError, OSError) as exc:
        print(exc, file=sys.stderr)  # the compiler's output, without the traceback
        raise SystemExit(1) from None


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="leo_cli/_leo_cpu.so build subprocess (internal)")
    parser.add_argument("--build", required=True, help="JSON build spec")
    _build_main(parser.parse_args().build)
