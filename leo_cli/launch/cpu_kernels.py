"""LEO's CPU SpMM for a run, built on first use: before its workers start, `leo train` builds
the library (cuda/cpu/) into the run's cache where a C++ compiler is present, once per
sources, torch and compiler (kernel_tools/build_cpu.py `cached_cpu_kernels`), and tells its
workers where it is (`$LEO_CPU_KERNELS_DIR`). Where none can be built, one line says so and
the reference kernels serve CPU tensors (summary.json `kernels`, `kernels_reason`).

`LEO_CPU_BUILD=never` skips the build (the test suite sets it: its runs use the kernels the
checkout has, and no test pays a compile it does not ask for); `LEO_KERNELS=ref` needs none;
a package that holds its own library (`leo compile --cpu`) uses that one. `LEO_KERNELS=cpu`
builds it the same way, and refuses the run where it cannot be built or loaded; so does
`pipeline.spmm=leo` on CPU workers (`check_cpu_kernels` before any work, `check_cpu_spmm`
after the build).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from leo_cli.config import LeoConfig
from leo_cli.errors import ConfigError, KernelError
from leo_cli.kernel_tools.build_cpu import cached_cpu_kernels, check_toolchain
from leo_cli.kernels import backend, cpu, stamp, variants

BUILD_ENV = "LEO_CPU_BUILD"  # "never": no build on first use
REFERENCE = "the reference kernels serve CPU tensors"


def ensure_cpu_kernels(cache_dir: Path) -> str | None:
    """Have LEO's CPU SpMM loaded in this process and named to the workers it starts, built
    into `cache_dir` where needed (also under `LEO_KERNELS=cpu`, whose selection found none
    yet); the one line said (None where nothing was to do).

    Raises:
        KernelError: as `kernels.active_backend` (`LEO_KERNELS` asks for what did not load),
            and under `LEO_KERNELS=cpu` where the library cannot be built or loaded.
    """
    requested = backend.requested_backend()
    if requested == "ref":
        return None
    try:
        active: backend.Backend | None = backend.active_backend()
    except KernelError:
        if requested != "cpu":
            raise
        active = None  # LEO_KERNELS=cpu, no library yet: built here as under auto
    if active is not None and active.cpu == "leo":
        # Loaded already (an earlier launch in this process): name it to these workers too,
        # or they would serve CPU tensors with the reference under a run keyed on `leo`.
        _name_to_workers(cpu.loaded())
        return None
    skipped = not_built_here(toolchain=False)  # (a missing compiler is said below)
    if skipped is not None:
        if active is None:
            raise _cpu_refused(skipped)
        return None
    try:
        built = cached_cpu_kernels(cache_dir, stamp.cuda_source_dir(), on_build=_say_building)
    except KernelError as exc:
        reason = str(exc).splitlines()[0]
        os.environ[cpu.UNBUILT_ENV] = reason
        if active is None:
            raise _cpu_refused(reason) from None
        return _say(f"LEO's CPU kernels were not built ({reason}): {REFERENCE}.")
    _name_to_workers(built.path)
    now = backend.load_cpu_kernels_again()  # under LEO_KERNELS=cpu: raises if it did not load
    if now.cpu != "leo":
        return _say(
            f"LEO's CPU kernels at {built.path} did not load ({now.cpu_reason}): {REFERENCE}."
        )
    if built.cached:
        return None
    return _say(f"LEO's CPU kernels built in {built.seconds:.0f} s: {built.path}")


def not_built_here(toolchain: bool = True) -> str | None:
    """Why `leo train` builds no CPU library on first use here (`LEO_CPU_BUILD=never`, an
    installed package without the sources, and with `toolchain` no compiler or ninja), or
    None: it tries."""
    if os.environ.get(BUILD_ENV, "").strip().lower() == "never":
        return f"{BUILD_ENV}=never"
    try:
        stamp.cuda_source_dir()
        if toolchain:
            check_toolchain()
    except KernelError as exc:
        return str(exc).splitlines()[0]
    return None


def _cpu_refused(reason: str) -> KernelError:
    return KernelError(
        f"{backend.ENV_VAR}=cpu but LEO's CPU kernels are not built and were not built now "
        f"({reason}); run `leo compile --cpu` where a C++ compiler is present, or set "
        f"{backend.ENV_VAR}=auto"
    )


def check_cpu_kernels(cfg: LeoConfig) -> None:
    """Before any work: what `LEO_KERNELS` and `pipeline.spmm=leo` ask of LEO's CPU kernels,
    as far as it is known before the build on first use (`ensure_cpu_kernels`, which checks
    again after it: `check_cpu_spmm`).

    Raises:
        KernelError: `LEO_KERNELS` asks for kernels that did not load (and, for `cpu`, will
            not be built here).
        ConfigError: `pipeline.spmm=leo` on CPU workers where the library is not loaded and
            will not be built.
    """
    requested = backend.requested_backend()
    try:
        active = backend.active_backend()
    except KernelError:
        if requested != "cpu":
            raise
        unbuildable = not_built_here()
        if unbuildable is not None:
            raise _cpu_refused(unbuildable) from None
        return  # built on first use, refused there where it fails
    if active.cpu == "leo" or requested == "ref":
        check_cpu_spmm(cfg, active.cpu == "leo", f"{backend.ENV_VAR}=ref")
        return
    unbuildable = not_built_here()
    if unbuildable is not None:
        check_cpu_spmm(cfg, False, unbuildable)


def check_cpu_spmm(cfg: LeoConfig, loaded: bool, reason: str | None = None) -> None:
    """Refuse `pipeline.spmm=leo` on CPU workers without LEO's CPU library loaded (CUDA
    workers' tensors use the CUDA kernels whatever it says).

    Raises:
        ConfigError: one sentence naming the key, why and what to do.
    """
    from leo_cli.comm.dist import uses_cuda  # torch

    if cfg.pipeline.spmm != variants.LEO or loaded or uses_cuda(cfg.launch):
        return
    why = reason or cpu.unbuilt_reason()
    raise ConfigError(
        f"pipeline.spmm=leo needs LEO's CPU kernels, which are not loaded ({why}); set "
        "pipeline.spmm=auto (or torch), or build them with `leo compile --cpu`."
    )


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
