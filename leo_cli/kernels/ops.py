"""The leo:: custom ops: declarations, pure-PyTorch reference kernels, fake and autograd.

Each op is declared once with `torch.library.custom_op`; its body is the reference (the CPU
path unless LEO's CPU SpMM serves `spmm_csr` and `fused_aggregate` (`cpu.py`), the path under
`LEO_KERNELS=ref`, the test oracle of LEO's CUDA and CPU kernels), and the fake and autograd
registrations below serve every backend. Backward passes call the ops themselves, so LEO's
kernels serve the backward too.

Specification: docs/design/kernels.md.
Shape suffixes: R rows of a CSR (destination nodes), C its columns (source nodes), E edges,
F features, N gathered or scattered rows; (R+1) and (C+1) are pointer arrays.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from leo_cli.kernels import spmm_calls, variants
from leo_cli.kernels.backend import require_cpu_kernels, require_cuda_kernels
from leo_cli.kernels.csr import inverse_permutation, row_of_edges
from leo_cli.kernels.slabs import slab_width
from leo_cli.util.dynamo import defer_kernels
from leo_cli.util.keyed import random_bytes

_LOW_PRECISION = (torch.float16, torch.bfloat16)
_MKL: bool = torch.backends.mkl.is_available()  # type: ignore[no-untyped-call]
_SDDMM_CHUNK_ELEMENTS = 1 << 24  # 64 MB of float32 per temporary


def _consume_beta_warning() -> None:
    """Spend torch's once-per-process "CSR support is beta" warning here, silently.

    Otherwise it lands in a user's first aggregation; what we use of CSR tensors is stable.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        empty = torch.zeros(1, dtype=torch.int64)
        torch.sparse_csr_tensor(empty, empty[:0], torch.zeros(0), size=(0, 0))


_consume_beta_warning()


def _require(condition: bool, message: Callable[[], str]) -> None:
    """torch._check (a guard fake tensors and torch.compile understand), typed. A plain bool
    that holds returns at once: torch._check's first call imports its symbolic shapes (and
    sympy), a cost in a worker's first step for a condition with nothing to guard."""
    if condition is True:
        return
    torch._check(condition, message)  # type: ignore[no-untyped-call]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in _LOW_PRECISION else dtype


def _csr_matmul(
    indptr: Tensor,
    indices: Tensor,
    values_E: Tensor,
    x_CF: Tensor,
    num_rows: int,
    noted: bool = False,
) -> Tensor:
    """A @ x in the compute dtype, with torch's CSR kernel (MKL on the CPU, cuSPARSE on GPUs);
    on the CPU in column slabs when x is larger than the cache (`slab_width`) as the variant
    in use says (`variants.py`: `auto` for a process alone on its host, `torch-slabs` always,
    `torch` never). `noted`: the caller has told `spmm_calls` of this product already."""
    if not noted:
        spmm_calls.note(indptr, indices, x_CF, num_rows)
    dtype = _compute_dtype(x_CF.dtype)
    adj = _adjacency(indptr, indices, values_E, num_rows, x_CF, dtype)
    num_cols, width = x_CF.shape
    slab = width if x_CF.is_cuda else _cpu_slab(num_cols, width, dtype.itemsize)
    if slab >= width:
        return _addmm(adj, x_CF.to(dtype))
    variants.note_slabs()
    # One slab of x copied out at a time, converted to the compute dtype as it is copied (its
    # rows contiguous, so gathering them reads the cache, not DRAM), and its product copied
    # into the output's columns: two slab-sized buffers. Each output element sums the same
    # edges; MKL may order a row's sum by the width it computes, so the last bits can differ
    # from one call's (kernels/variants.py).
    x_CW = torch.empty((num_cols, slab), dtype=dtype, device=x_CF.device)
    part_RW = torch.empty((num_rows, slab), dtype=dtype, device=x_CF.device)
    out = torch.empty((num_rows, width), dtype=dtype, device=x_CF.device)
    for c0 in range(0, width, slab):
        x_CW.copy_(x_CF[:, c0 : c0 + slab])
        torch.addmm(part_RW, adj, x_CW, beta=0.0, out=part_RW)
        out[:, c0 : c0 + slab].copy_(part_RW)
    return out


def _adjacency(
    indptr: Tensor, indices: Tensor, values_E: Tensor, num_rows: int, x_CF: Tensor,
    dtype: torch.dtype,
) -> Tensor:  # fmt: skip
    """torch's CSR tensor of A (num_rows x x's rows) in `dtype` on x's device, for its SpMM."""
    return torch.sparse_csr_tensor(
        indptr,
        indices,
        values_E.to(dtype),
        size=(num_rows, x_CF.shape[0]),
        dtype=dtype,
        device=x_CF.device,
        check_invariants=False,
    )


def _cpu_slab(num_cols: int, width: int, itemsize: int) -> int:
    """Columns per slab of torch's CPU SpMM under the variant in use."""
    variant = variants.cpu_spmm()
    if variant == variants.TORCH:
        return width
    shared = False if variant == variants.TORCH_SLABS else None
    return slab_width(num_cols, width, itemsize, shared)


def _addmm(adj: Tensor, x_CF: Tensor) -> Tensor:
    """adj @ x into a fresh output."""
    # addmm with beta=0 into an uninitialised output (beta=0 ignores its contents, NaN
    # included): torch.mm would zero a fresh output and copy it through addmm, ~25% slower.
    out = torch.empty((adj.shape[0], x_CF.shape[1]), dtype=x_CF.dtype, device=x_CF.device)
    torch.addmm(out, adj, x_CF, beta=0.0, out=out)
    return out


def adds_in_place(out_RF: Tensor, x_CF: Tensor) -> bool:
    """Whether `add_csr_matmul_` sums A @ x straight into out: a CPU product by MKL of x whole
    (no slabs) in out's dtype, the compute dtype, into a contiguous out that shares no
    memory with x, where this machine's MKL adds each row's finished sum into out at that
    width (`_mkl_adds_alike`: the sums `out += A @ x` makes with a fresh product), without
    the product's (R x F) buffer and the pass adding it."""
    dtype = _compute_dtype(x_CF.dtype)
    on_cpu = x_CF.device.type == out_RF.device.type == "cpu" and _MKL
    shapes = out_RF.dim() == x_CF.dim() == 2 and out_RF.is_contiguous()
    if not (on_cpu and shapes and out_RF.dtype == x_CF.dtype == dtype):
        return False
    if out_RF.untyped_storage().data_ptr() == x_CF.untyped_storage().data_ptr():
        return False  # out is x or a view of it: adding into it would change x mid-product
    num_cols, width = x_CF.shape
    return _cpu_slab(num_cols, width, dtype.itemsize) >= width and _mkl_adds_alike(dtype, width)


@functools.cache
def _mkl_adds_alike(dtype: torch.dtype, width: int) -> bool:
    """Whether this machine's MKL, adding A @ x into y at this width, gives `y + A @ x` to
    the bit (each row's sum finished before it is added): checked once per process, dtype
    and width on a small product with rows of 0 to 300 entries, since MKL picks its code by
    the CPU and the width; where it does not, `add_csr_matmul_` makes the product and adds
    it."""
    cpu = torch.device("cpu")
    gen = torch.Generator(cpu).manual_seed(0)
    lengths = torch.tensor([0, 1, 2, 3, 7, 8, 9, 16, 17, 31, 64, 100, 300], device=cpu)
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=cpu), lengths.cumsum(0)])
    edges = int(lengths.sum())
    indices = torch.randint(0, 500, (edges,), generator=gen, device=cpu)
    values = torch.rand(edges, generator=gen, dtype=dtype, device=cpu)
    adj = torch.sparse_csr_tensor(indptr, indices, values, size=(len(lengths), 500), device=cpu)
    x = torch.randn(500, width, generator=gen, dtype=dtype, device=cpu)
    y = torch.randn(len(lengths), width, generator=gen, dtype=dtype, device=cpu)
    fresh = y + _addmm(adj, x)
    torch.addmm(y, adj, x, out=y)
    return torch.equal(y, fresh)


def add_csr_matmul_(
    out_RF: Tensor,
    indptr: Tensor,
    indices: Tensor,
    values_E: Tensor,
    x_CF: Tensor,
    num_rows: int,
    noted: bool = False,
) -> None:
    """out += A @ x with torch's CSR kernel: in place where `adds_in_place` says so, else a
    fresh product added (`_csr_matmul`). `noted` as there."""
    if not adds_in_place(out_RF, x_CF):
        out_RF += _csr_matmul(indptr, indices, values_E, x_CF, num_rows, noted)
        return
    if not noted:
        spmm_calls.note(indptr, indices, x_CF, num_rows)
    adj = _adjacency(indptr, indices, values_E, num_rows, x_CF, x_CF.dtype)
    torch.addmm(out_RF, adj, x_CF, out=out_RF)


def _back_perm(t_perm: Tensor) -> Tensor:
    """The `t_perm` argument for an SpMM over the transpose, called from a backward pass.

    That SpMM's own transpose is the original matrix, whose edge order is the inverse of
    t_perm. Only a double backward reads it, and only when grad mode is on inside the backward
    (create_graph=True) can one follow; otherwise an empty tensor saves an O(E) scatter.
    """
    if torch.is_grad_enabled():
        return inverse_permutation(t_perm)
    return t_perm.new_empty(0)


def _spmm_transposed(
    indptr: Tensor,
    indices: Tensor,
    values_E: Tensor,
    t_indptr: Tensor,
    t_indices: Tensor,
    t_perm: Tensor,
    grad_RF: Tensor,
    degrees: tuple[int, int] = (-1, -1),
) -> Tensor:
    """A^T @ grad (C x F), with the precomputed transpose; degrees: (A's, A^T's) max degree."""
    # A CSR may drop its permutation when it only ever runs forward (comm/blocks.py): a
    # gradient through it would gather the wrong edge values, so it is refused here.
    _require(
        t_perm.shape[0] == values_E.shape[0],
        lambda: (
            "backward through a CSR without its edge permutation (t_perm is empty: a "
            "forward-only CSR such as a ColumnBlock's); differentiate through the block's own "
            "backward instead"
        ),
    )
    num_cols = t_indptr.shape[0] - 1
    t_values = values_E.index_select(0, t_perm)  # ~4x faster than values_E[t_perm] on CPU
    grad_CF: Tensor = spmm_csr(
        t_indptr,
        t_indices,
        t_values,
        grad_RF,
        indptr,
        indices,
        _back_perm(t_perm),
        num_cols,
        degrees[1],
        degrees[0],
    )
    return grad_CF


# ---------------------------------------------------------------------------------------------
# leo::spmm_csr — out_RF = A_RC @ x_CF


@torch.library.custom_op("leo::spmm_csr", mutates_args=())
def spmm_csr(
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
    """out[i] = sum over edges e of row i of values[e] * x[indices[e]]; (R x F).

    The transpose arrays (see `CSR`) are only read by the backward pass. The degrees (the
    longest row of A and of A^T, -1 when unknown) only steer the CUDA kernel's hub-row split.
    """
    _require(values.dtype == x.dtype, lambda: "spmm_csr: values and x must share a dtype")
    require_cuda_kernels(x.device)
    require_cpu_kernels(x.device)
    return _csr_matmul(indptr, indices, values, x, num_rows).to(x.dtype)


@spmm_csr.register_fake
def _spmm_csr_fake(
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
    _require(x.dim() == 2, lambda: "spmm_csr: x must be 2-D")
    _require(values.dtype == x.dtype, lambda: "spmm_csr: values and x must share a dtype")
    return x.new_empty((num_rows, x.shape[1]))


def _spmm_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    indptr, indices, values, x, t_indptr, t_indices, t_perm, _, degree, t_degree = inputs
    # x is only needed for the gradient of the edge values.
    saved_x = x if ctx.needs_input_grad[2] else None
    ctx.save_for_backward(indptr, indices, values, saved_x, t_indptr, t_indices, t_perm)
    ctx.degrees = (degree, t_degree)


def _spmm_backward(ctx: Any, grad_RF: Tensor) -> tuple[Tensor | None, ...]:
    indptr, indices, values, x, t_indptr, t_indices, t_perm = ctx.saved_tensors
    grad_values = grad_x = None
    if ctx.needs_input_grad[3]:
        grad_x = _spmm_transposed(
            indptr, indices, values, t_indptr, t_indices, t_perm, grad_RF, ctx.degrees
        )
    if ctx.needs_input_grad[2]:
        grad_values = sddmm_csr(
            indptr, indices, grad_RF, x, t_indptr, t_indices, t_perm, *ctx.degrees
        )
    return None, None, grad_values, grad_x, None, None, None, None, None, None


spmm_csr.register_autograd(_spmm_backward, setup_context=_spmm_setup_context)


# ---------------------------------------------------------------------------------------------
# leo::sddmm_csr — values_E[e] = <a_RF[row(e)], b_CF[col(e)]> (the gradient of edge values)


@torch.library.custom_op("leo::sddmm_csr", mutates_args=())
def sddmm_csr(
    indptr: Tensor,
    indices: Tensor,
    a: Tensor,
    b: Tensor,
    t_indptr: Tensor,
    t_indices: Tensor,
    t_perm: Tensor,
    max_degree: int = -1,
    t_max_degree: int = -1,
) -> Tensor:
    """Dot product of a's row and b's row at every edge of the pattern; (E).

    The degrees (as in `spmm_csr`) are handed to the SpMMs of the backward pass.
    """
    dtype = _compute_dtype(a.dtype)
    rows_E = row_of_edges(indptr)
    out_E = torch.empty(indices.shape[0], dtype=dtype, device=a.device)
    # Chunks bound the (chunk x F) temporaries. torch.sparse.sampled_addmm would avoid them but
    # fails on patterns with more entries than the dense matrix (duplicates).
    chunk = max(1, _SDDMM_CHUNK_ELEMENTS // max(1, a.shape[1]))
    for start in range(0, indices.shape[0], chunk):
        stop = min(start + chunk, indices.shape[0])
        a_rows = a.index_select(0, rows_E[start:stop]).to(dtype)
        b_rows = b.index_select(0, indices[start:stop]).to(dtype)
        out_E[start:stop] = (a_rows * b_rows).sum(1)
    return out_E.to(a.dtype)


@sddmm_csr.register_fake
def _sddmm_csr_fake(
    indptr: Tensor,
    indices: Tensor,
    a: Tensor,
    b: Tensor,
    t_indptr: Tensor,
    t_indices: Tensor,
    t_perm: Tensor,
    max_degree: int = -1,
    t_max_degree: int = -1,
) -> Tensor:
    _require(a.dim() == 2 and b.dim() == 2, lambda: "sddmm_csr: a and b must be 2-D")
    return a.new_empty((indices.shape[0],))


def _sddmm_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.save_for_backward(*inputs[:7])
    ctx.degrees = (inputs[7], inputs[8])


def _sddmm_backward(ctx: Any, grad_E: Tensor) -> tuple[Tensor | None, ...]:
    indptr, indices, a, b, t_indptr, t_indices, t_perm = ctx.saved_tensors
    t = (t_indptr, t_indices, t_perm)
    grad_a = grad_b = None
    if ctx.needs_input_grad[2]:
        grad_a = spmm_csr(indptr, indices, grad_E, b, *t, a.shape[0], *ctx.degrees)
    if ctx.needs_input_grad[3]:
        grad_b = _spmm_transposed(indptr, indices, grad_E, *t, a, ctx.degrees)
    return None, None, grad_a, grad_b, None, None, None, None, None


sddmm_csr.register_autograd(_sddmm_backward, setup_context=_sddmm_setup_context)


# ---------------------------------------------------------------------------------------------
# leo::gather_rows — out_NF = x[idx] (packs send buffers)


@torch.library.custom_op("leo::gather_rows", mutates_args=())
def gather_rows(x: Tensor, idx: Tensor) -> Tensor:
    """Rows idx of x; (N x F). Indices may repeat."""
    require_cuda_kernels(x.device)
    return x.index_select(0, idx)


@gather_rows.register_fake
def _gather_rows_fake(x: Tensor, idx: Tensor) -> Tensor:
    _require(x.dim() == 2 and idx.dim() == 1, lambda: "gather_rows: x 2-D, idx 1-D")
    return x.new_empty((idx.shape[0], x.shape[1]))


def _gather_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, idx = inputs
    ctx.save_for_backward(idx)
    ctx.num_rows = x.shape[0]


def _gather_backward(ctx: Any, grad_NF: Tensor) -> tuple[Tensor | None, None]:
    (idx,) = ctx.saved_tensors
    return scatter_add_rows(grad_NF, idx, ctx.num_rows), None


gather_rows.register_autograd(_gather_backward, setup_context=_gather_setup_context)


# ---------------------------------------------------------------------------------------------
# leo::scatter_add_rows — out[idx[i]] += src[i] (unpacks halo gradients)


@torch.library.custom_op("leo::scatter_add_rows", mutates_args=())
def scatter_add_rows(src: Tensor, idx: Tensor, num_rows: int) -> Tensor:
    """zeros(num_rows, F) with src's rows added at idx (repeated indices sum)."""
    require_cuda_kernels(src.device)
    dtype = _compute_dtype(src.dtype)
    out = torch.zeros((num_rows, src.shape[1]), dtype=dtype, device=src.device)
    return out.index_add_(0, idx, src.to(dtype)).to(src.dtype)


@scatter_add_rows.register_fake
def _scatter_add_rows_fake(src: Tensor, idx: Tensor, num_rows: int) -> Tensor:
    _require(src.dim() == 2 and idx.dim() == 1, lambda: "scatter_add_rows: src 2-D, idx 1-D")
    return src.new_empty((num_rows, src.shape[1]))


def _scatter_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    _, idx, _ = inputs
    ctx.save_for_backward(idx)


def _scatter_backward(ctx: Any, grad_RF: Tensor) -> tuple[Tensor | None, None, None]:
    (idx,) = ctx.saved_tensors
    return gather_rows(grad_RF, idx), None, None


scatter_add_rows.register_autograd(_scatter_backward, setup_context=_scatter_setup_context)


# ---------------------------------------------------------------------------------------------
# leo::fused_aggregate — out_RF = A_local @ x_local + A_remote @ x_remote


@torch.library.custom_op("leo::fused_aggregate", mutates_args=())
def fused_aggregate(
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
    """Aggregation over local columns (x_local) and remote columns (x_remote) in one op.

    Both CSRs have num_rows rows; the r_ arrays index x_remote, which may be another
    allocation (on GPUs a peer's buffer or pinned host memory). The reference is two SpMMs
    summed in the compute dtype (x_remote is brought to x_local's device first); the CUDA kernel
    does it in one pass with warps specialised per side. The degrees are as in `spmm_csr`.
    """
    _check_fused_dtypes(values, x_local, r_values, x_remote)
    require_cuda_kernels(x_local.device)
    require_cpu_kernels(x_local.device)
    out = _csr_matmul(indptr, indices, values, x_local, num_rows)
    add_csr_matmul_(out, r_indptr, r_indices, r_values, x_remote.to(x_local.device), num_rows)
    return out.to(x_local.dtype)


def _check_fused_dtypes(
    values: Tensor, x_local: Tensor, r_values: Tensor, x_remote: Tensor
) -> None:
    same = values.dtype == x_local.dtype == r_values.dtype == x_remote.dtype
    _require(same, lambda: "fused_aggregate: values and features must share one dtype")


@fused_aggregate.register_fake
def _fused_aggregate_fake(
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
    _require(x_local.dim() == 2 and x_remote.dim() == 2, lambda: "fused_aggregate: 2-D features")
    _require(x_local.shape[1] == x_remote.shape[1], lambda: "fused_aggregate: widths differ")
    _check_fused_dtypes(values, x_local, r_values, x_remote)
    return x_local.new_empty((num_rows, x_local.shape[1]))


def _fused_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    local = list(inputs[0:7])
    remote = list(inputs[7:14])
    if not ctx.needs_input_grad[2]:
        local[3] = None  # x_local: only the value gradient reads it
    if not ctx.needs_input_grad[9]:
        remote[3] = None
    ctx.save_for_backward(*local, *remote)
    ctx.degrees = inputs[15:19]
    ctx.remote_device = inputs[10].device


def _side_grads(
    side: tuple[Tensor, ...],
    degrees: tuple[int, int],
    grad_RF: Tensor,
    need_values: bool,
    need_x: bool,
) -> tuple[Tensor | None, Tensor | None]:
    """(grad of values, grad of x) of one side's SpMM."""
    indptr, indices, values, x, t_indptr, t_indices, t_perm = side
    grad_values = grad_x = None
    if need_x:
        grad_x = _spmm_transposed(
            indptr, indices, values, t_indptr, t_indices, t_perm, grad_RF, degrees
        )
    if need_values:
        x_CF = x.to(grad_RF.device)  # x_remote may live on a peer GPU or the host
        t = (t_indptr, t_indices, t_perm)
        grad_values = sddmm_csr(indptr, indices, grad_RF, x_CF, *t, *degrees)
    return grad_values, grad_x


def _fused_backward(ctx: Any, grad_RF: Tensor) -> tuple[Tensor | None, ...]:
    saved = ctx.saved_tensors
    need = ctx.needs_input_grad
    degrees = ctx.degrees
    gv_local, gx_local = _side_grads(saved[0:7], degrees[0:2], grad_RF, need[2], need[3])
    gv_remote, gx_remote = _side_grads(saved[7:14], degrees[2:4], grad_RF, need[9], need[10])
    if gx_remote is not None:  # x_remote may live elsewhere (a peer GPU, the host)
        gx_remote = gx_remote.to(ctx.remote_device)
    local_grads = (None, None, gv_local, gx_local, None, None, None)
    remote_grads = (None, None, gv_remote, gx_remote, None, None, None)
    return (*local_grads, *remote_grads, None, None, None, None, None)  # num_rows, degrees


fused_aggregate.register_autograd(_fused_backward, setup_context=_fused_setup_context)


# ---------------------------------------------------------------------------------------------
# leo::keyed_dropout — x ⊙ keyed dropout mask, for tensors without a gradient (the input features)

_DROPOUT_CHUNK_ROWS = 1 << 15  # bounds the reference's int64 temporaries to a few MB per chunk


def _require_byte(threshold: int) -> None:
    """A dropout threshold is compared with random bytes: 0 (keep all) to 255."""
    _require(0 <= threshold <= 255, lambda: f"dropout threshold {threshold} is not 0 to 255")


@torch.library.custom_op("leo::keyed_dropout", mutates_args=())
def keyed_dropout(x: Tensor, ids: Tensor, key: int, threshold: int, scale: float) -> Tensor:
    """x with entry (i, j) times `scale` where the random byte of (ids[i], j) under `key`
    (util/keyed.py) is at least `threshold`, else times 0 (inverted dropout). The reference on
    every device, a chunk of rows at a time, so no multiplier as large as x is allocated;
    LEO's CPU library serves CPU tensors in one pass (`cpu.py`), with the same bits. The
    output is row-major whatever x's strides, as the library's."""
    _require_byte(threshold)
    out = x.new_empty(x.shape)
    for s in range(0, x.shape[0], _DROPOUT_CHUNK_ROWS):
        e = s + _DROPOUT_CHUNK_ROWS
        mult = (random_bytes(ids[s:e], x.shape[1], key) >= threshold).to(x.dtype).mul_(scale)
        torch.mul(x[s:e], mult, out=out[s:e])
    return out


@keyed_dropout.register_fake
def _keyed_dropout_fake(x: Tensor, ids: Tensor, key: int, threshold: int, scale: float) -> Tensor:
    _require(x.dim() == 2 and ids.dim() == 1, lambda: "keyed_dropout: x 2-D, ids 1-D")
    _require_byte(threshold)
    return x.new_empty(x.shape)


# ---------------------------------------------------------------------------------------------
# leo::bias_relu_dropout — relu(h + b) ⊙ keyed dropout mask, one cache-sized chunk at a time

_EPILOGUE_CHUNK_BYTES = 4 << 20  # rows per chunk: about 4 MB of h, in the last-level cache


def _row_chunks(x: Tensor) -> list[tuple[int, int]]:
    """[start, end) row ranges of about _EPILOGUE_CHUNK_BYTES each (one range on GPUs, where
    every pass is one kernel over the whole tensor)."""
    n = x.shape[0]
    if x.is_cuda:
        return [(0, n)]
    rows = max(1, _EPILOGUE_CHUNK_BYTES // max(1, x.shape[1] * x.element_size()))
    return [(s, min(s + rows, n)) for s in range(0, n, rows)]


@torch.library.custom_op("leo::bias_relu_dropout", mutates_args=())
def bias_relu_dropout(
    h: Tensor, bias: Tensor | None, ids: Tensor, key: int, threshold: int, scale: float
) -> Tensor:
    """relu(h + bias), then entry (i, j) times `scale` where the random byte of (ids[i], j)
    under `key` (util/keyed.py) is at least `threshold`, else 0 (inverted dropout;
    threshold 0: none). The reference on every device (no CUDA kernel: torch's own serve the
    GPU), on the CPU in row chunks that stay in the cache; LEO's CPU library serves CPU
    tensors in one pass (`cpu.py`), with the same bits. The output is row-major whatever h's
    strides, as the library's.
    """
    _require_byte(threshold)
    out = h.new_empty(h.shape)
    for s, e in _row_chunks(h):
        o = out[s:e]
        if bias is None:
            o.copy_(h[s:e])
        else:
            torch.add(h[s:e], bias, out=o)
        o.clamp_(min=0)
        if threshold > 0:
            o.mul_(random_bytes(ids[s:e], h.shape[1], key) >= threshold).mul_(scale)
    return out


@bias_relu_dropout.register_fake
def _bias_relu_dropout_fake(
    h: Tensor, bias: Tensor | None, ids: Tensor, key: int, threshold: int, scale: float
) -> Tensor:
    _require(h.dim() == 2 and ids.dim() == 1, lambda: "bias_relu_dropout: h 2-D, ids 1-D")
    _require_byte(threshold)
    return h.new_empty(h.shape)


def _bias_relu_dropout_setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    _, bias, _, _, threshold, scale = inputs
    ctx.save_for_backward(output)
    ctx.scale = scale if threshold > 0 else None
    ctx.has_bias = bias is not None


def _bias_relu_dropout_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    """grad ⊙ 1[out > 0] ⊙ scale: an entry passed both ReLU and the mask exactly where the
    output is positive (scale >= 1, so no kept positive value rounds to 0)."""
    (out,) = ctx.saved_tensors
    grad_h = torch.empty_like(grad)
    for s, e in _row_chunks(grad):
        g = grad_h[s:e]  # ReLU's own backward kernel: grad where out > 0, else 0
        torch.ops.aten.threshold_backward.grad_input(grad[s:e], out[s:e], 0, grad_input=g)
        if ctx.scale is not None:
            g.mul_(ctx.scale)
    grad_bias = grad_h.sum(0) if ctx.has_bias else None
    return grad_h, grad_bias, None, None, None, None


bias_relu_dropout.register_autograd(
    _bias_relu_dropout_backward, setup_context=_bias_relu_dropout_setup_context
)

# Their first calls need no torch._dynamo while nothing compiles (util/dynamo.py).
for _op in (spmm_csr, sddmm_csr, gather_rows, scatter_add_rows, fused_aggregate, keyed_dropout,
            bias_relu_dropout):  # fmt: skip
    defer_kernels(_op)
