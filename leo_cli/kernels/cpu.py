"""LEO's own CPU kernels (cuda/cpu/, built by `leo compile --cpu`): loading and registration.

The library `leo_cli/_leo_cpu.so` defines `leo_cpu::spmm_csr`, a CSR SpMM that prefetches the
gathered rows of x; registered here as the CPU kernel of `leo::spmm_csr` and of
`leo::fused_aggregate` (two SpMMs summed, as the reference does). Low-precision inputs are
computed in float32 and returned in their dtype, as the reference does. `backend.py` decides
whether to load it (`LEO_KERNELS`); a library whose stamp does not match this checkout's
sources is not loaded. The library is the package's (`leo compile --cpu`) unless stale, else the
one in `$LEO_CPU_KERNELS_DIR` (the cache's build that `leo train` sets for its workers). Runtime
only: `leo_cli/kernel_tools/build_cpu.py` builds.

Specification: docs/design/kernels.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch import Tensor

from leo_cli.errors import KernelError
from leo_cli.kernels import ops, spmm_calls, stamp, variants
from leo_cli.kernels.ops import _check_fused_dtypes, _compute_dtype, _require
from leo_cli.util.dynamo import defer_kernels

LIBRARY = "_leo_cpu.so"
STAMP = "_leo_cpu.stamp.json"
# The flags the library is compiled with: the baseline instruction set of the architecture (no
# -march=native), so a library built on one machine runs on any other of the same kind; the
# kernel is bound by random reads of memory, where wider vectors gain little (results.md).
CFLAGS = ("-O3", "-fopenmp")

DIR_ENV = "LEO_CPU_KERNELS_DIR"  # a folder holding a built library and its stamp
UNBUILT_ENV = "LEO_CPU_UNBUILT"  # why the launcher built none (said where none loads)

_LOADED: Path | None = None


def library_path(pkg: Path | None = None) -> Path:
    """Where `leo compile --cpu` installs the library (beside the package's modules)."""
    return (pkg or stamp.package_dir()) / LIBRARY


def library_to_load() -> Path:
    """The library this process loads: the package's where it has one that is not stale, else
    the one in `$LEO_CPU_KERNELS_DIR` where that is set, else the package's (missing or stale:
    the loader says which). A stale package library does not hide the cache's build."""
    own = library_path()
    folder = os.environ.get(DIR_ENV)
    if not folder or (own.is_file() and stale_library(own.parent, _cuda_dir()) is None):
        return own
    return library_path(Path(folder))


def _cuda_dir() -> Path | None:
    """This checkout's cuda/, or None (an installed package without one)."""
    try:
        return stamp.cuda_source_dir()
    except KernelError:
        return None


def unbuilt_reason() -> str:
    """Why no library is there to load: what the launcher said, or how to build one."""
    return os.environ.get(UNBUILT_ENV) or (
        "run `leo compile --cpu`; `leo train` builds it where a C++ compiler is present"
    )


def stamp_path(pkg: Path | None = None) -> Path:
    """Where `leo compile --cpu` records what it built, beside the library."""
    return (pkg or stamp.package_dir()) / STAMP


def source_dir(cuda_dir: Path) -> Path:
    """The CPU kernels' sources in a cuda/ folder."""
    return cuda_dir / "cpu"


def source_fingerprint(cuda_dir: Path) -> str:
    """sha256 of the sources under cuda/cpu/, torch's and Python's versions and the flags."""
    meta = f"torch={torch.__version__};cflags={' '.join(CFLAGS)};py={sys.version}"
    return stamp.hash_sources(cuda_dir, (source_dir(cuda_dir).name,), meta)


def stale_library(pkg: Path, cuda_dir: Path | None) -> str | None:
    """Why the library in `pkg` is not a build of `cuda_dir`'s CPU sources for this torch, or
    None. Without sources to compare with (an installed package), the stamp's torch version
    decides alone."""
    lib = library_path(pkg)
    rebuild = "rebuild it with `leo compile --cpu`"
    recorded = stamp.read_stamp(stamp_path(pkg))
    if recorded is None:
        return f"{lib} has no readable build stamp at {stamp_path(pkg)}; {rebuild}"
    if recorded.get("torch") != torch.__version__:
        return (
            f"{lib} was built for torch {recorded.get('torch')}, not {torch.__version__}; {rebuild}"
        )
    if cuda_dir is None or not source_dir(cuda_dir).is_dir():
        return None
    if recorded.get("fingerprint") != source_fingerprint(cuda_dir):
        return f"{lib} was built from other sources or for another torch; {rebuild}"
    if not stamp.is_recorded_library(lib, recorded):
        return f"{lib} is not the library `leo compile --cpu` recorded; {rebuild}"
    return None


def load(lib: Path) -> None:
    """Load the library and register its kernels for CPU tensors (once per process).

    Raises:
        OSError, RuntimeError: the library does not load or does not define leo_cpu::spmm_csr.
    """
    global _LOADED
    if _LOADED is not None:
        return
    torch.ops.load_library(str(lib))  # type: ignore[no-untyped-call]
    torch.ops.leo_cpu.spmm_csr.default  # noqa: B018  (raises when an op is missing)
    torch.ops.leo_cpu.keyed_dropout.default  # noqa: B018
    torch.ops.leo_cpu.bias_relu_dropout.default  # noqa: B018
    ops.spmm_csr.register_kernel("cpu")(_spmm_csr_cpu)
    ops.keyed_dropout.register_kernel("cpu")(_keyed_dropout_cpu)
    ops.bias_relu_dropout.register_kernel("cpu")(_bias_relu_dropout_cpu)
    ops.fused_aggregate.register_kernel("cpu")(_fused_aggregate_cpu)
    for op in (ops.spmm_csr, ops.keyed_dropout, ops.bias_relu_dropout, ops.fused_aggregate):
        defer_kernels(op)  # as ops.py's own (util/dynamo.py)
    _LOADED = lib


def loaded() -> Path | None:
    """The library serving CPU tensors in this process, or None (the reference serves them)."""
    return _LOADED


def _spmm(indptr: Tensor, indices: Tensor, values: Tensor, x: Tensor, num_rows: int) -> Tensor:
    """A @ x with the library's kernel, in the compute dtype (float32 for low precision); with
    torch's where the variant in use says so (`variants.py`)."""
    spmm_calls.note(indptr, indices, x, num_rows)
    if variants.uses_torch():
        return ops._csr_matmul(indptr, indices, values, x, num_rows, noted=True)
    dtype = _compute_dtype(x.dtype)
    out: Tensor = torch.ops.leo_cpu.spmm_csr(
        indptr, indices, values.to(dtype), x.to(dtype), num_rows
    )
    return out


def _spmm_csr_cpu(
    indptr: Tensor,
    indices: Tensor,
    values: Tensor,
    x: Tensor,
    t_indptr: Tensor,
    t_indices: Tensor,
    t_perm: Tensor,
    num_rows: int,
    max_degree: int = -1,
    t_max_degree: int = -1,
) -> Tensor:
    _require(values.dtype == x.dtype, lambda: "spmm_csr: values and x must share a dtype")
    return _spmm(indptr, indices, values, x, num_rows).to(x.dtype)


def _keyed_dropout_cpu(x: Tensor, ids: Tensor, key: int, threshold: int, scale: float) -> Tensor:
    out: Tensor = torch.ops.leo_cpu.keyed_dropout(x, ids, key, threshold, scale)
    return out


def _bias_relu_dropout_cpu(
    h: Tensor, bias: Tensor | None, ids: Tensor, key: int, threshold: int, scale: float
) -> Tensor:
    out: Tensor = torch.ops.leo_cpu.bias_relu_dropout(h, bias, ids, key, threshold, scale)
    return out


def _fused_aggregate_cpu(
    indptr: Tensor,
    indices: Tensor,
    values: Tensor,
    x_local: Tensor,
    t_indptr: Tensor,
    t_indices: Tensor,
    t_perm: Tensor,
    r_indptr: Tensor,
    r_indices: Tensor,
    r_values: Tensor,
    x_remote: Tensor,
    rt_indptr: Tensor,
    rt_indices: Tensor,
    rt_perm: Tensor,
    num_rows: int,
    max_degree: int = -1,
    t_max_degree: int = -1,
    r_max_degree: int = -1,
    rt_max_degree: int = -1,
) -> Tensor:
    _check_fused_dtypes(values, x_local, r_values, x_remote)
    out = _spmm(indptr, indices, values, x_local, num_rows)
    add_spmm_(out, r_indptr, r_indices, r_values, x_remote.to(x_local.device), num_rows)
    return out.to(x_local.dtype)


def add_spmm_(
    out: Tensor, indptr: Tensor, indices: Tensor, values: Tensor, x: Tensor, num_rows: int
) -> None:
    """out += A @ x (out in the compute dtype): torch's SpMM adds in place where it serves
    (`ops.add_csr_matmul_`), the library's kernel makes a product to add."""
    if variants.uses_torch():
        ops.add_csr_matmul_(out, indptr, indices, values, x, num_rows)
    else:
        out += _spmm(indptr, indices, values, x, num_rows)
