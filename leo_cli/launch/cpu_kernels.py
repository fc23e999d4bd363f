"""LEO's CPU SpMM for a run, built on first use: before its workers start, `leo train` builds
the library (cuda/cpu/) into the run's cache where a C++ compiler is present, once per
sources, torch and compiler (kernel_tools/build_cpu.py `cached_cpu_kernels`), and tells its
workers where it is (`$LEO_CPU_KERNELS_DIR`). Where none can be built, one line says so and
the reference kernels serve CPU tensors (summary.json `kernels`, `kernels_reason`).

`LEO_CPU_BUILD=never` skips the build (the test suite sets it: its runs use the kernels the
checkout has, and no test pays a compile it does not ask for); `LEO_KERNELS=ref` needs none;
a package that holds its own library (`leo compile --cpu`) uses that one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from leo_cli.errors import KernelError
from leo_cli.kernel_tools.build_cpu import cached_cpu_kernels
from leo_cli.kernels import backend, cpu, stamp

BUILD_ENV = "LEO_CPU_BUILD"  # "never": no build on first use
REFERENCE = "the reference kernels serve CPU tensors"


def ensure_cpu_kernels(cache_dir: Path) -> str | None:
    """Have LEO's CPU SpMM loaded in this process and named to the workers it starts, built
    into `cache_dir` where needed; the one line said (None where nothing was to do).

    Raises:
        KernelError: as `kernels.active_backend` (`LEO_KERNELS` asks for what did not load).
    """
    active = backend.active_backend()
    if backend.requested_backend() == "ref":
        return None
    if active.cpu == "leo":
        # Loaded already (an earlier launch in this process): name it to these workers too,
        # or they would serve CPU tensors with the reference under a run keyed on `leo`.
        _name_to_workers(cpu.loaded())
        return None
    if os.environ.get(BUILD_ENV, "").strip().lower() == "never":
        return None
    try:
        cuda_dir = stamp.cuda_source_dir()
    except KernelError:
        return None  # an installed package without cuda/: nothing to build from
    try:
        built = cached_cpu_kernels(cache_dir, cuda_dir, on_build=_say_building)
    except KernelError as exc:
        reason = str(exc).splitlines()[0]
        os.environ[cpu.UNBUILT_ENV] = reason
        return _say(f"LEO's CPU kernels were not built ({reason}): {REFERENCE}.")
    _name_to_workers(built.path)
    now = backend.load_cpu_kernels_again()
    if now.cpu != "leo":
        return _say(
            f"LEO's CPU kernels at {built.path} did not load ({now.cpu_reason}): {REFERENCE}."
        )
    if built.cached:
        return None
    return _say(f"LEO's CPU kernels built in {built.seconds:.0f} s: {built.path}")


def _name_to_workers(lib: Path | None) -> None:
    """Tell the workers this process starts where the library is (`$LEO_CPU_KERNELS_DIR`),
    unless it is the package's, which they find themselves."""
    if lib is None or lib.parent == stamp.package_dir():
        return
    os.environ[cpu.DIR_ENV] = str(lib.parent)
    os.environ.pop(cpu.UNBUILT_ENV, None)


def _say_building(folder: Path) -> None:
    _say(f"Building LEO's CPU kernels (once for this torch and compiler, about 20 s) in {folder}")


def _say(line: str) -> str:
    print(line, file=sys.stderr, flush=True)
    return line
