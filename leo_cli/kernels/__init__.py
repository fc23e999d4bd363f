"""Sparse kernels of LEO as torch custom ops, and the small API the models and comm code use.

The ops (`ops.py`, `gat_ops.py`) have a pure-PyTorch reference; CUDA kernels from `leo_cli._C`
serve CUDA tensors and LEO's CPU SpMM (`cpu.py`) CPU tensors when built (`backend.py`).
Everything here is differentiable and traceable by `torch.compile(fullgraph=True)`, and indices
are checked before they reach a kernel, so a bad one raises the same `KernelError` on every
device.

Specification: docs/design/kernels.md.
Shape suffixes: R rows of a CSR (destination nodes), C its columns (source nodes), E edges,
F features, N gathered or scattered rows.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from leo_cli.errors import KernelError
from leo_cli.kernels import cpu, gat_ops, ops, variants
from leo_cli.kernels.backend import Backend, active_backend, load_at_import, require_cpu_kernels
from leo_cli.kernels.csr import CSR

__all__ = [
    "CSR",
    "bias_relu_dropout",
    "Backend",
    "active_backend",
    "backend_name",
    "check_row_indices",
    "edge_softmax",
    "fused_aggregate",
    "gat_scores",
    "gat_spmm",
    "gather_rows",
    "keyed_dropout",
    "scatter_add_rows",
    "sddmm",
    "spmm",
    "spmm_add_",
]

# Load LEO's CUDA and CPU kernels (if built and wanted) before any op runs. An unhonoured
# LEO_KERNELS=cuda (cpu) is raised by active_backend() and by the ops asked to serve CUDA (CPU)
# tensors, not here: `leo compile` imports this package to build them.
load_at_import()


def _values_for(csr: CSR, x: Tensor) -> Tensor:
    """The CSR's edge values in x's dtype (a differentiable cast when they differ)."""
    return csr.values if csr.values.dtype == x.dtype else csr.values.to(x.dtype)


def _check_operand(csr: CSR, x: Tensor, name: str) -> None:
    if x.dim() != 2 or x.shape[0] != csr.num_cols:
        raise ValueError(
            f"{name} must have shape ({csr.num_cols}, F) for this CSR, got {tuple(x.shape)}"
        )
    if x.device != csr.device:
        raise ValueError(f"{name} is on {x.device} but the CSR is on {csr.device}")


def spmm(csr: CSR, x: Tensor) -> Tensor:
    """out_RF = A @ x_CF: out[i] = sum over edges e of row i of values[e] * x[indices[e]].

    Differentiable in x and in `csr.values` (when they require grad); the backward uses the
    CSR's precomputed transpose.
    """
    _check_operand(csr, x, "x")
    out_RF: Tensor = ops.spmm_csr(
        csr.indptr,
        csr.indices,
        _values_for(csr, x),
        x,
        csr.t_indptr,
        csr.t_indices,
        csr.t_perm,
        csr.num_rows,
        csr.max_degree,
        csr.t_max_degree,
    )
    return out_RF


def spmm_add_(out_RF: Tensor, csr: CSR, x: Tensor) -> None:
    """out_RF += A @ x in place, with the sums of `out_RF += spmm(csr, x)` (to the bit): for
    aggregations that add several sources into one output. Where torch's CPU SpMM serves in
    out's dtype and no gradient is wanted, MKL adds into out (`ops.adds_in_place`): no (R x F)
    product, no pass adding it; elsewhere the op's product is added.
    """
    _check_operand(csr, x, "x")
    if out_RF.shape != (csr.num_rows, x.shape[1]):
        raise ValueError(f"out must have shape ({csr.num_rows}, {x.shape[1]}), got {out_RF.shape}")
    wanted = (x.requires_grad, csr.values.requires_grad, out_RF.requires_grad)
    grads = torch.is_grad_enabled() and any(wanted)
    library = cpu.loaded() is not None and not variants.uses_torch()  # LEO's kernel serves
    traced = torch.compiler.is_compiling()  # the product and the add are ops a graph holds
    if grads or library or traced or not ops.adds_in_place(out_RF, x):
        out_RF += spmm(csr, x)
        return
    require_cpu_kernels(x.device)
    ops.add_csr_matmul_(out_RF, csr.indptr, csr.indices, csr.values, x, csr.num_rows)


def sddmm(csr: CSR, a: Tensor, b: Tensor) -> Tensor:
    """values_E[e] = <a[row(e)], b[col(e)]> for every edge of csr's pattern (a: R x F, b: C x F)."""
    _check_operand(csr, b, "b")
    if a.dim() != 2 or a.shape[0] != csr.num_rows:
        raise ValueError(
            f"a must have shape ({csr.num_rows}, F) for this CSR, got {tuple(a.shape)}"
        )
    values_E: Tensor = ops.sddmm_csr(
        csr.indptr, csr.indices, a, b, csr.t_indptr, csr.t_indices, csr.t_perm,
        csr.max_degree, csr.t_max_degree,
    )  # fmt: skip
    return values_E


# idx tensor -> (its version when checked, min, max): a plan's index tensors are checked once.
_INDEX_RANGES: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _index_range(idx: Tensor) -> tuple[int, int]:
    """(min, max) of a non-empty index tensor, computed once per tensor and version."""
    version = idx._version
    cached = _INDEX_RANGES.get(idx)  # type: ignore[no-untyped-call]
    if cached is not None and cached[0] == version:
        return int(cached[1]), int(cached[2])
    low, high = torch.aminmax(idx)
    found = (int(low), int(high))
    _INDEX_RANGES[idx] = (version, *found)
    return found


def check_row_indices(idx: Tensor, num_rows: int, op: str) -> None:
    """Raise KernelError unless idx is a 1-D integer tensor with values in [0, num_rows).

    Skipped while torch.compile traces (the indices were checked where the plan was built).
    """
    if idx.dim() != 1 or idx.dtype not in (torch.int32, torch.int64):
        raise KernelError(f"{op}: idx must be a 1-D int32 or int64 tensor, got {idx.dtype}")
    if idx.numel() == 0 or torch.compiler.is_compiling():
        return
    low, high = _index_range(idx)
    if low < 0 or high >= num_rows:
        raise KernelError(
            f"{op}: indices must lie in [0, {num_rows}), got values in [{low}, {high}]"
        )


def bias_relu_dropout(
    h_NF: Tensor, bias_F: Tensor | None, ids_N: Tensor, key: int, threshold: int, scale: float
) -> Tensor:
    """relu(h + bias) with keyed inverted dropout in one pass (`ops.bias_relu_dropout`): entry
    (i, j) kept (times `scale`) where the random byte of (ids_N[i], j) under `key` is at least
    `threshold` (0: no dropout); backward from the output alone."""
    if h_NF.dim() != 2 or ids_N.shape != (h_NF.shape[0],):
        raise ValueError(
            f"h (N x F) and ids (N) must match, got {tuple(h_NF.shape)} and {tuple(ids_N.shape)}"
        )
    if bias_F is not None and bias_F.shape != (h_NF.shape[1],):
        raise ValueError(f"bias must have {h_NF.shape[1]} entries, got {tuple(bias_F.shape)}")
    out: Tensor = ops.bias_relu_dropout(h_NF, bias_F, ids_N, key, threshold, scale)
    return out


def keyed_dropout(x_NF: Tensor, ids_N: Tensor, key: int, threshold: int, scale: float) -> Tensor:
    """Inverted dropout of a tensor without a gradient (`ops.keyed_dropout`): entry (i, j) kept
    (times `scale`) where the random byte of (ids_N[i], j) under `key` is at least
    `threshold`, else 0."""
    if x_NF.dim() != 2 or ids_N.shape != (x_NF.shape[0],):
        raise ValueError(
            f"x (N x F) and ids (N) must match, got {tuple(x_NF.shape)} and {tuple(ids_N.shape)}"
        )
    out: Tensor = ops.keyed_dropout(x_NF, ids_N, key, threshold, scale)
    return out


def gather_rows(x: Tensor, idx: Tensor) -> Tensor:
    """out_NF = x[idx] (packs send buffers); backward scatter-adds into x's rows.

    Raises:
        KernelError: an index lies outside x's rows.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (rows x F), got shape {tuple(x.shape)}")
    check_row_indices(idx, x.shape[0], "gather_rows")
    if not x.dtype.is_floating_point:  # packed rounded rows (comm/rounding.py): bytes the
        return x.index_select(0, idx)  # kernels do not take, and no gradient
    out_NF: Tensor = ops.gather_rows(x, idx)
    return out_NF


def scatter_add_rows(src: Tensor, idx: Tensor, num_rows: int) -> Tensor:
    """out = zeros(num_rows, F) with out[idx[i]] += src[i] (unpacks halo gradients).

    Raises:
        KernelError: an index lies outside [0, num_rows).
    """
    if src.dim() != 2 or idx.dim() != 1 or src.shape[0] != idx.shape[0]:
        raise ValueError(
            f"src (N x F) and idx (N) must match, got {tuple(src.shape)} and {tuple(idx.shape)}"
        )
    check_row_indices(idx, num_rows, "scatter_add_rows")
    out: Tensor = ops.scatter_add_rows(src, idx, num_rows)
    return out


def fused_aggregate(local_csr: CSR, x_local: Tensor, remote_csr: CSR, x_remote: Tensor) -> Tensor:
    """local_csr @ x_local + remote_csr @ x_remote in one op (one kernel on GPUs).

    Args:
        local_csr: edges whose sources are inner or cached rows, columns indexing x_local.
        x_local: (C_local x F) inner + cached features.
        remote_csr: edges read on demand, same rows as local_csr, columns indexing x_remote.
        x_remote: (C_remote x F) features in another buffer: on GPUs possibly a peer GPU's
            (peer access is enabled, or the call is refused with the reason) or pinned host
            memory; elsewhere it is brought to x_local's device.

    Returns:
        (R x F) sums, differentiable in both feature matrices and both value arrays.
    """
    if remote_csr.num_rows != local_csr.num_rows:
        raise ValueError(
            "local and remote CSRs must have the same rows "
            f"({local_csr.num_rows} vs {remote_csr.num_rows})"
        )
    _check_operand(local_csr, x_local, "x_local")
    if x_remote.dim() != 2 or x_remote.shape[0] != remote_csr.num_cols:
        raise ValueError(
            f"x_remote must have shape ({remote_csr.num_cols}, F), got {tuple(x_remote.shape)}"
        )
    x_remote = x_remote if x_remote.dtype == x_local.dtype else x_remote.to(x_local.dtype)
    out_RF: Tensor = ops.fused_aggregate(
        local_csr.indptr,
        local_csr.indices,
        _values_for(local_csr, x_local),
        x_local,
        local_csr.t_indptr,
        local_csr.t_indices,
        local_csr.t_perm,
        remote_csr.indptr,
        remote_csr.indices,
        _values_for(remote_csr, x_local),
        x_remote,
        remote_csr.t_indptr,
        remote_csr.t_indices,
        remote_csr.t_perm,
        local_csr.num_rows,
        local_csr.max_degree,
        local_csr.t_max_degree,
        remote_csr.max_degree,
        remote_csr.t_max_degree,
    )
    return out_RF


def gat_scores(csr: CSR, a_src_CH: Tensor, a_dst_RH: Tensor, negative_slope: float) -> Tensor:
    """e_EH = LeakyReLU(a_src[col(e)] + a_dst[row(e)]): GAT's score of every edge and head."""
    if a_src_CH.shape[0] != csr.num_cols or a_dst_RH.shape[0] != csr.num_rows:
        raise ValueError(
            f"a_src needs {csr.num_cols} rows and a_dst {csr.num_rows}, got "
            f"{tuple(a_src_CH.shape)} and {tuple(a_dst_RH.shape)}"
        )
    e_EH: Tensor = gat_ops.gat_scores(csr.indptr, csr.indices, a_src_CH, a_dst_RH, negative_slope)
    return e_EH


def edge_softmax(csr: CSR, scores_EH: Tensor) -> Tensor:
    """Softmax of every head's scores over the edges of each row (rows without edges: none)."""
    if scores_EH.dim() != 2 or scores_EH.shape[0] != csr.num_edges:
        raise ValueError(f"scores must have shape ({csr.num_edges}, H), got {scores_EH.shape}")
    alpha_EH: Tensor = gat_ops.edge_softmax(csr.indptr, scores_EH)
    return alpha_EH


def gat_spmm(csr: CSR, alpha_EH: Tensor, x_CHF: Tensor) -> Tensor:
    """out_RHF[i, h] = sum over edges e of row i of alpha[e, h] * x[col(e), h] (csr's values
    are not used: the attention weights replace them)."""
    if x_CHF.dim() != 3 or x_CHF.shape[0] != csr.num_cols:
        raise ValueError(f"x must have shape ({csr.num_cols}, H, F), got {tuple(x_CHF.shape)}")
    if alpha_EH.shape != (csr.num_edges, x_CHF.shape[1]):
        raise ValueError(
            f"alpha must have shape ({csr.num_edges}, {x_CHF.shape[1]}), got {alpha_EH.shape}"
        )
    out_RHF: Tensor = gat_ops.gat_spmm(
        csr.indptr, csr.indices, alpha_EH, x_CHF,
        csr.t_indptr, csr.t_indices, csr.t_perm, csr.num_rows,
        csr.max_degree, csr.t_max_degree,
    )  # fmt: skip
    return out_RHF


def backend_name() -> str:
    """The kernels beside the reference: "cuda" (leo_cli._C serves CUDA tensors), "cpu"
    (leo_cli/_leo_cpu.so serves CPU tensors), "cuda+cpu", or "reference" when neither."""
    backend = active_backend()
    served = {"cuda": backend.has_cuda_kernels, "cpu": backend.cpu == "leo"}
    return "+".join(name for name, on in served.items() if on) or "reference"
