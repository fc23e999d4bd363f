"""Which kernels serve the leo:: ops: the reference everywhere, plus LEO's kernels when built.

`LEO_KERNELS` (`auto`, the default; `ref`; `cuda`; `cpu`) chooses, once per process at the
first import of `leo_cli.kernels`, whether to load `leo_cli._C` (the CUDA kernels, built by `leo
compile`) and `leo_cli/_leo_cpu.so` (the CPU SpMM, built by `leo compile --cpu`; `cpu.py`).
Loading checks the build stamp, loads the library and registers its kernels (the CUDA ones are
also called once on a visible GPU); a stale or failing library leaves the reference in place
with one warning, and under `cuda` (`cpu`) `active_backend()` raises the reason when the CUDA
(CPU) kernels did not load. `auto` loads whichever is built; `ref` neither.

Specification: docs/design/kernels.md.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from leo_cli.errors import KernelError
from leo_cli.kernels import stamp

ENV_VAR = "LEO_KERNELS"
EXTENSION = "leo_cli._C"
_CHOICES = {"auto": "auto", "ref": "ref", "reference": "ref", "cuda": "cuda", "cpu": "cpu"}


@dataclass(frozen=True)
class Backend:
    """The kernels in use: `name` ("cuda" or "reference") serves CUDA tensors, `cpu` ("leo" or
    "reference") CPU tensors; `reason` and `cpu_reason` say why."""

    name: str
    reason: str
    cpu: str = "reference"
    cpu_reason: str = ""

    @property
    def has_cuda_kernels(self) -> bool:
        return self.name == "cuda"


_ACTIVE: Backend | None = None


def requested_backend(env: Mapping[str, str] | None = None) -> str:
    """The normalised `LEO_KERNELS` value: "auto", "ref", "cuda" or "cpu".

    Raises:
        KernelError: the variable holds something else than auto, ref, cuda or cpu.
    """
    raw = (os.environ if env is None else env).get(ENV_VAR, "auto").strip().lower() or "auto"
    if raw not in _CHOICES:
        raise KernelError(f"{ENV_VAR}={raw!r} is not one of auto, ref, cuda, cpu")
    return _CHOICES[raw]


def _fallback(reason: str) -> str:
    """Warn once that a built extension is unusable (a silent fallback would hide a slowdown)."""
    warnings.warn(f"{reason}; using the reference kernels", RuntimeWarning, stacklevel=3)
    return reason


def first_use_failure() -> str | None:
    """Run every op once on tiny CUDA tensors; None when they work (or no GPU is visible).

    A library built without this GPU's architecture loads and registers fine and only fails
    at its first launch ("no kernel image is available for execution on the device").
    """
    from leo_cli.kernels import ops
    from leo_cli.kernels.csr import CSR

    if not torch.cuda.is_available():
        return None
    try:
        csr = CSR.from_arrays(torch.tensor([0, 1, 2]), torch.tensor([1, 0])).to("cuda")
        x = torch.ones(2, 4, device="cuda")
        idx = torch.tensor([1, 0], device="cuda")
        arrays = (csr.indptr, csr.indices, csr.values, x, csr.t_indptr, csr.t_indices, csr.t_perm)
        ops.spmm_csr(*arrays, 2)
        ops.fused_aggregate(*arrays, *arrays, 2)
        ops.scatter_add_rows(ops.gather_rows(x, idx), idx, 2)
        torch.cuda.synchronize()
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return None


def stale_build(pkg: Path, cuda_dir: Path | None) -> str | None:
    """Why the leo_cli._C in `pkg` does not belong to `cuda_dir`'s sources, or None.

    The stamp beside the library (written by `leo compile`) records the fingerprint of the
    sources, torch, CUDA and architectures, and the library's identity. Without sources (an
    installed package) there is nothing to compare and the library is trusted; without a
    library there is nothing to check.
    """
    libs = stamp.installed_extensions(pkg)
    if cuda_dir is None or not libs:
        return None
    rebuild = "rebuild it with `leo compile`"
    stamp_file = stamp.stamp_path(pkg)
    recorded = stamp.read_stamp(stamp_file)
    if recorded is None:
        return f"{EXTENSION} has no readable build stamp at {stamp_file}; {rebuild}"
    fingerprint = stamp.source_fingerprint(cuda_dir, str(recorded.get("archs", "")))
    if recorded.get("fingerprint") != fingerprint:
        return (
            f"{EXTENSION} was built from other CUDA sources or for another torch than this "
            f"checkout's {cuda_dir}; {rebuild}"
        )
    if not any(stamp.is_recorded_library(lib, recorded) for lib in libs):
        return f"{EXTENSION} is not the library `leo compile` recorded in {stamp_file}; {rebuild}"
    return None


def _checkout_stale_build() -> str | None:
    """stale_build for this checkout: the package's library and cuda/ beside it."""
    try:
        cuda_dir = stamp.cuda_source_dir()
    except KernelError:
        return None  # an installed package without cuda/: nothing to compare with
    return stale_build(stamp.package_dir(), cuda_dir)


def _import_extension() -> str | None:
    """Import leo_cli._C, register its kernels and try them; None on success, else why not."""
    from leo_cli.kernels import ops  # noqa: F401  (the schemas the kernels register against)

    stale = _checkout_stale_build()
    if stale is not None:  # checked before importing: an old library may abort at load
        return _fallback(stale)
    try:
        module = importlib.import_module(EXTENSION)
    except ModuleNotFoundError:
        return f"{EXTENSION} is not built (run `leo compile` where torch has CUDA)"
    except (ImportError, OSError, RuntimeError) as exc:
        # Built against another torch, or torch here has no CUDA libraries to link.
        return _fallback(f"{EXTENSION} failed to load: {exc}")
    try:
        module.register_kernels()
    except (AttributeError, RuntimeError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return _fallback(
            f"{EXTENSION} does not match the leo:: op schemas of this checkout ({detail}); "
            "rebuild it with `leo compile --force`"
        )
    failure = first_use_failure()
    if failure is not None:
        module.unregister_kernels()
        return _fallback(
            f"{EXTENSION} failed on its first use ({failure}); rebuild it for this GPU"
        )
    return None


def _load_cpu_kernels() -> str | None:
    """Load leo_cli/_leo_cpu.so and register its kernels; None on success, else why not."""
    from leo_cli.kernels import cpu  # imports ops, which imports this module

    lib = cpu.library_to_load()
    if not lib.is_file():
        return f"{lib.name} is not built ({cpu.unbuilt_reason()})"
    try:
        cuda_dir: Path | None = stamp.cuda_source_dir()
    except KernelError:
        cuda_dir = None  # an installed package without cuda/: nothing to compare with
    stale = cpu.stale_library(lib.parent, cuda_dir)
    if stale is not None:
        return _fallback(stale)
    try:
        cpu.load(lib)
    except (OSError, RuntimeError, AttributeError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return _fallback(f"{lib} failed to load ({detail}); rebuild it with `leo compile --cpu`")
    return None


def select_backend(env: Mapping[str, str] | None = None) -> Backend:
    """Decide (and load) the backend as `LEO_KERNELS` asks.

    Raises:
        KernelError: `LEO_KERNELS=cuda` (`cpu`) and the CUDA (CPU) kernels do not load, or a
            bad value.
    """
    choice = requested_backend(env)
    if choice == "ref":
        return Backend("reference", f"{ENV_VAR}=ref", "reference", f"{ENV_VAR}=ref")
    cpu_failure = _load_cpu_kernels()
    if cpu_failure is not None and choice == "cpu":
        raise KernelError(f"{ENV_VAR}=cpu but {cpu_failure}")
    cpu_state = _cpu_state(cpu_failure)
    failure = _import_extension()
    if failure is None:
        return Backend("cuda", f"{EXTENSION} loaded: CUDA kernels serve CUDA tensors", *cpu_state)
    if choice == "cuda":
        raise KernelError(f"{ENV_VAR}=cuda but {failure}")
    return Backend("reference", failure, *cpu_state)


def _cpu_state(failure: str | None) -> tuple[str, str]:
    """(Backend.cpu, Backend.cpu_reason) after loading the CPU kernels failed or not."""
    if failure is not None:
        return "reference", failure
    from leo_cli.kernels import cpu

    return "leo", f"{cpu.loaded()} loaded: LEO's SpMM serves CPU tensors"


def load_cpu_kernels_again() -> Backend:
    """Load the CPU library where the first selection found none (the launcher has since
    built one and said where: `$LEO_CPU_KERNELS_DIR`); the backend in use either way.

    Raises:
        KernelError: as `active_backend`.
    """
    global _ACTIVE, _FAILURE, _FAILED_CHOICE
    if _FAILED_CHOICE == "cpu":  # LEO_KERNELS=cpu found none before: select again (or raise)
        _ACTIVE = _FAILURE = _FAILED_CHOICE = None
        return active_backend()
    current = active_backend()
    if current.cpu == "leo" or requested_backend() == "ref":
        return current
    cpu, cpu_reason = _cpu_state(_load_cpu_kernels())
    _ACTIVE = replace(current, cpu=cpu, cpu_reason=cpu_reason)
    return _ACTIVE


_FAILURE: KernelError | None = None  # why LEO_KERNELS=cuda (cpu) could not be honoured
_FAILED_CHOICE: str | None = None  # "cuda" or "cpu": which choice _FAILURE is about


def active_backend() -> Backend:
    """The backend of this process, selected on first call.

    Raises:
        KernelError: `LEO_KERNELS=cuda` (`cpu`) and the CUDA (CPU) kernels do not load (on
            every call).
    """
    global _ACTIVE, _FAILURE, _FAILED_CHOICE
    if _FAILURE is not None:
        raise _FAILURE
    if _ACTIVE is None:
        try:
            _ACTIVE = select_backend()
        except KernelError as exc:
            _FAILURE = exc
            _FAILED_CHOICE = _CHOICES.get(os.environ.get(ENV_VAR, "").strip().lower())
            raise
    return _ACTIVE


def load_at_import() -> None:
    """Select the backend as `leo_cli.kernels` is imported, keeping a `LEO_KERNELS=cuda` (or
    `cpu`) failure for later (see the module docstring), so `leo compile` can still import the
    package to build; a bad value still fails here.

    Raises:
        KernelError: `LEO_KERNELS` holds something else than auto, ref, cuda or cpu.
    """
    try:
        active_backend()
    except KernelError:
        if requested_backend() not in ("cuda", "cpu"):
            raise


def require_cuda_kernels(device: torch.device) -> None:
    """Called by the reference kernels: refuse to serve a CUDA tensor under an unhonoured
    `LEO_KERNELS=cuda` (the CUDA kernels would have served it had they loaded).

    Raises:
        KernelError: the reason the extension did not load.
    """
    if _FAILURE is not None and _FAILED_CHOICE == "cuda" and device.type == "cuda":
        raise _FAILURE


def require_cpu_kernels(device: torch.device) -> None:
    """Called by the reference of the ops LEO's CPU SpMM serves (`spmm_csr`, `fused_aggregate`):
    refuse a CPU tensor under an unhonoured `LEO_KERNELS=cpu`.

    Raises:
        KernelError: the reason the CPU library did not load.
    """
    if _FAILURE is not None and _FAILED_CHOICE == "cpu" and device.type == "cpu":
        raise _FAILURE
