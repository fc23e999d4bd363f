"""The leo:: ops of graph attention (GAT): edge scores, edge softmax, per-head weighted SpMM.

After Velickovic et al. 2018: `leo::gat_scores` (each edge's score from its two endpoints'
halves), `leo::edge_softmax` (over each row's edges) and `leo::gat_spmm` (the weighted sum per
head). As in `ops.py`, each body is the pure-PyTorch reference, with fake and autograd
registrations beside it.

Specification: docs/design/kernels.md.
Shape suffixes: R rows (destinations), C columns (sources), E edges, H heads, F features per
head.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from leo_cli.kernels.csr import row_of_edges
from leo_cli.kernels.ops import (
    _compute_dtype,
    _require,
    _spmm_transposed,
    scatter_add_rows,
    sddmm_csr,
)
from leo_cli.util.dynamo import defer_kernels

# ---------------------------------------------------------------------------------------------
# leo::gat_scores — e_EH = LeakyReLU(a_src[col] + a_dst[row])


@torch.library.custom_op("leo::gat_scores", mutates_args=())
def gat_scores(
    indptr: Tensor, indices: Tensor, a_src: Tensor, a_dst: Tensor, negative_slope: float
) -> Tensor:
    """Unnormalised attention score of every edge and head; (E x H)."""
    _require(a_src.dtype == a_dst.dtype, lambda: "gat_scores: a_src and a_dst share a dtype")
    rows_E = row_of_edges(indptr)
    s_EH = a_src.index_select(0, indices) + a_dst.index_select(0, rows_E)
    return F.leaky_relu(s_EH, negative_slope)


@gat_scores.register_fake
def _gat_scores_fake(
    indptr: Tensor, indices: Tensor, a_src: Tensor, a_dst: Tensor, negative_slope: float
) -> Tensor:
    _require(a_src.dim() == 2 and a_dst.dim() == 2, lambda: "gat_scores: a_src, a_dst 2-D")
    _require(a_src.shape[1] == a_dst.shape[1], lambda: "gat_scores: same number of heads")
    return a_src.new_empty((indices.shape[0], a_src.shape[1]))


def _scores_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    indptr, indices, a_src, a_dst, negative_slope = inputs
    ctx.save_for_backward(indptr, indices, output)
    ctx.slope, ctx.num_cols, ctx.num_rows = negative_slope, a_src.shape[0], a_dst.shape[0]


def _scores_backward(ctx: Any, grad_EH: Tensor) -> tuple[Tensor | None, ...]:
    indptr, indices, e_EH = ctx.saved_tensors
    # LeakyReLU's slope is 1 where the output is positive, negative_slope elsewhere.
    grad_s = torch.where(e_EH > 0, grad_EH, grad_EH * ctx.slope)
    grad_src = grad_dst = None
    if ctx.needs_input_grad[2]:
        grad_src = scatter_add_rows(grad_s, indices, ctx.num_cols)
    if ctx.needs_input_grad[3]:
        grad_dst = scatter_add_rows(grad_s, row_of_edges(indptr), ctx.num_rows)
    return None, None, grad_src, grad_dst, None


gat_scores.register_autograd(_scores_backward, setup_context=_scores_setup_context)


# ---------------------------------------------------------------------------------------------
# leo::edge_softmax — alpha_EH = softmax of the scores over each row's edges


def _row_sums(rows_E: Tensor, v_EH: Tensor, num_rows: int) -> Tensor:
    return v_EH.new_zeros((num_rows, v_EH.shape[1])).index_add_(0, rows_E, v_EH)


@torch.library.custom_op("leo::edge_softmax", mutates_args=())
def edge_softmax(indptr: Tensor, scores: Tensor) -> Tensor:
    """Per row and head, exp(e - max) / sum exp(e - max) over the row's edges; (E x H)."""
    dtype = _compute_dtype(scores.dtype)
    num_rows = indptr.shape[0] - 1
    rows_E = row_of_edges(indptr)
    e_EH = scores.to(dtype)
    max_RH = e_EH.new_full((num_rows, e_EH.shape[1]), float("-inf"))
    max_RH = max_RH.scatter_reduce(0, rows_E.unsqueeze(1).expand_as(e_EH), e_EH, "amax")
    ex_EH = (e_EH - max_RH.index_select(0, rows_E)).exp()
    den_RH = _row_sums(rows_E, ex_EH, num_rows)
    return (ex_EH / den_RH.index_select(0, rows_E)).to(scores.dtype)


@edge_softmax.register_fake
def _edge_softmax_fake(indptr: Tensor, scores: Tensor) -> Tensor:
    _require(scores.dim() == 2, lambda: "edge_softmax: scores must be 2-D (E x H)")
    return torch.empty_like(scores)


def _softmax_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    indptr, _ = inputs
    ctx.save_for_backward(indptr, output)


def _softmax_backward(ctx: Any, grad_EH: Tensor) -> tuple[None, Tensor]:
    indptr, alpha_EH = ctx.saved_tensors
    rows_E = row_of_edges(indptr)
    # d alpha_k / d e_j = alpha_k (delta_kj - alpha_j), summed over the row.
    dot_RH = _row_sums(rows_E, alpha_EH * grad_EH, indptr.shape[0] - 1)
    return None, alpha_EH * (grad_EH - dot_RH.index_select(0, rows_E))


edge_softmax.register_autograd(_softmax_backward, setup_context=_softmax_setup_context)


# ---------------------------------------------------------------------------------------------
# leo::gat_spmm — out_RHF[i, h] = sum_e alpha_EH[e, h] * x_CHF[col(e), h]


def _head_spmm(indptr: Tensor, indices: Tensor, w_E: Tensor, x_CF: Tensor, rows: int) -> Tensor:
    """One head's weighted sum with torch's CSR kernel (MKL on the CPU)."""
    dtype = _compute_dtype(x_CF.dtype)
    adj = torch.sparse_csr_tensor(
        indptr, indices, w_E.to(dtype), size=(rows, x_CF.shape[0]), check_invariants=False
    )
    return torch.mm(adj, x_CF.to(dtype).contiguous())


@torch.library.custom_op("leo::gat_spmm", mutates_args=())
def gat_spmm(
    indptr: Tensor,
    indices: Tensor,
    alpha: Tensor,
    x: Tensor,
    t_indptr: Tensor,
    t_indices: Tensor,
    t_perm: Tensor,
    num_rows: int,
    max_degree: int = -1,
    t_max_degree: int = -1,
) -> Tensor:
    """Per head, the attention-weighted sum of in-neighbours' rows; (R x H x F).

    The transpose arrays (see `CSR`) and the degrees (as in `spmm_csr`) are only read by the
    backward pass.
    """
    _require(alpha.dtype == x.dtype, lambda: "gat_spmm: alpha and x must share a dtype")
    heads = [_head_spmm(indptr, indices, alpha[:, h], x[:, h], num_rows) for h in range(x.shape[1])]
    if not heads:
        return x.new_empty((num_rows, 0, x.shape[2]))
    return torch.stack(heads, 1).to(x.dtype)


@gat_spmm.register_fake
def _gat_spmm_fake(
    indptr: Tensor,
    indices: Tensor,
    alpha: Tensor,
    x: Tensor,
    t_indptr: Tensor,
    t_indices: Tensor,
    t_perm: Tensor,
    num_rows: int,
    max_degree: int = -1,
    t_max_degree: int = -1,
) -> Tensor:
    _require(x.dim() == 3 and alpha.dim() == 2, lambda: "gat_spmm: x (C x H x F), alpha (E x H)")
    _require(alpha.shape[1] == x.shape[1], lambda: "gat_spmm: one alpha column per head")
    return x.new_empty((num_rows, x.shape[1], x.shape[2]))


def _gat_spmm_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    indptr, indices, alpha, x, t_indptr, t_indices, t_perm, _, degree, t_degree = inputs
    ctx.save_for_backward(indptr, indices, alpha, x, t_indptr, t_indices, t_perm)
    ctx.degrees = (degree, t_degree)


def _head(t: Tensor, h: int) -> Tensor:
    return t[:, h].contiguous()


def _gat_spmm_backward(ctx: Any, grad_RHF: Tensor) -> tuple[Tensor | None, ...]:
    indptr, indices, alpha, x, t_indptr, t_indices, t_perm = ctx.saved_tensors
    t = (t_indptr, t_indices, t_perm)
    grad_alpha = grad_x = None
    heads = range(x.shape[1])
    if ctx.needs_input_grad[3]:  # per head: A_hᵀ · grad_h
        grad_x = torch.stack(
            [
                _spmm_transposed(
                    indptr, indices, _head(alpha, h), *t, _head(grad_RHF, h), ctx.degrees
                )
                for h in heads
            ],
            1,
        )
    if ctx.needs_input_grad[2]:  # per head and edge: <grad_h[row], x_h[col]>
        grad_alpha = torch.stack(
            [
                sddmm_csr(indptr, indices, _head(grad_RHF, h), _head(x, h), *t, *ctx.degrees)
                for h in heads
            ],
            1,
        )
    return None, None, grad_alpha, grad_x, None, None, None, None, None, None


gat_spmm.register_autograd(_gat_spmm_backward, setup_context=_gat_spmm_setup_context)

# Their first calls need no torch._dynamo while nothing compiles (util/dynamo.py).
for _op in (gat_scores, edge_softmax, gat_spmm):
    defer_kernels(_op)
