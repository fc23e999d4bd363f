"""Rounded rows (comm/rounding.py) and the aggregation that reads them (comm/aggregate.py):
codecs on their own, and every mode's aggregator with gradients read as rows against the dense
transpose, for each kind of edge weights."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from helpers.ranks import spawn_ranks
from test_modes import OUT, OWNER, WIDTH, hand_made, inputs

from leo_cli.comm.aggregate import Rounding
from leo_cli.comm.exchange import CommStats
from leo_cli.comm.modes import Wiring, make_aggregator
from leo_cli.comm.rounding import CODECS, Int8Codec, backward_key, exponents
from leo_cli.comm.views import L3, level_view
from leo_cli.graph.layout import LocalPart, build_parts
from leo_cli.graph.types import Graph
from leo_cli.models.local_graph import part_adjacency, transpose_scales
from leo_cli.registry import MODES, mode_of, pipeline_modes
from leo_cli.worker.assemble import halo_plan

INT8 = Int8Codec()


def rows(n: int = 64, f: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, f, dtype=torch.float64, generator=gen) * torch.rand(n, 1, generator=gen)
    ids = torch.randperm(10 * n, generator=gen)[:n]
    return h, ids


def round_trip(h: torch.Tensor, ids: torch.Tensor, key: int | None) -> torch.Tensor:
    return INT8.decode(INT8.encode(h, ids, key), h.dtype)


def step_of(top: torch.Tensor, bound: float) -> torch.Tensor:
    """2**e per row, e the exponent the codecs pick for a row of largest magnitude `top`."""
    return torch.ldexp(torch.ones_like(top), exponents(top, bound).double()).unsqueeze(1)


def test_bfloat16_rounds_to_nearest() -> None:
    h, ids = rows()
    codec = CODECS["bfloat16"]
    assert codec is not None and codec.wire_dtype == torch.bfloat16
    assert torch.equal(codec.decode(codec.encode(h, ids, 7), h.dtype), h.bfloat16().double())


@pytest.mark.parametrize("size", [1.0, 1e-7, 1e-30, 1e6])
def test_float16_rows_keep_their_precision_at_any_magnitude(size: float) -> None:
    """A power-of-two scale per row: no underflow of small rows (gradients of a large graph),
    no overflow past 65504; float16's 11 bits relative to the row's largest value."""
    h, ids = rows()
    h = h * size
    codec = CODECS["float16"]
    assert codec is not None
    wire = codec.encode(h, ids, None)
    assert wire.dtype == torch.uint8 and wire.shape == (h.shape[0], 2 * h.shape[1] + 1)
    err = (codec.decode(wire, h.dtype) - h).abs()
    assert (err <= h.abs().amax(1, keepdim=True) * 2**-11).all()


def test_int8_rows_are_within_one_step_of_their_scale() -> None:
    h, ids = rows()
    for size in (1.0, 1e-30, 1e20):  # gradient rows are small: the scale spans float32's range
        x = h * size
        top = x.abs().amax(1)
        step = step_of(top, 127.0)
        assert ((step >= top.unsqueeze(1) / 127) & (step < 2 * top.unsqueeze(1) / 127)).all()
        wire = INT8.encode(x, ids, 11)
        assert wire.dtype == torch.uint8 and wire.shape == (x.shape[0], x.shape[1] + 1)
        assert ((round_trip(x, ids, 11) - x).abs() < step * (1 + 1e-6)).all()
        assert ((round_trip(x, ids, None) - x).abs() <= step * (0.5 + 1e-6)).all()  # nearest
    exact = torch.tensor([[127.0, -64.0, 1.0]], dtype=torch.float64)  # a power of two: kept
    assert torch.equal(round_trip(exact, ids[:1], 11), exact)
    zero = torch.zeros(3, 5, dtype=torch.float64)
    assert torch.equal(round_trip(zero, ids[:3], 11), zero)


@pytest.mark.parametrize("name", ["bfloat16", "float16", "int8"])
def test_no_row_one_row_and_a_row_of_a_larger_buffer(name: str) -> None:
    """Arrivals are slices of one buffer, a chunk may hold one row or none: each decodes as
    the same rows encoded alone (a one-row slice of a packed buffer has its odd stride)."""
    codec = CODECS[name]
    assert codec is not None
    h, ids = rows(n=5, f=3)
    wire = codec.encode(h, ids, None)
    whole = codec.decode(wire, h.dtype)
    for lo, hi in ((0, 0), (2, 3), (1, 4), (4, 5)):
        np.testing.assert_array_equal(codec.decode(wire[lo:hi], h.dtype), whole[lo:hi])


@pytest.mark.parametrize("name", ["float16", "int8"])
def test_rows_that_are_not_finite_stay_not_finite(name: str) -> None:
    """NaN, inf or a float64 value past float32's range decodes to NaN (the trainer's NaN
    check stops the run), and the other rows are untouched."""
    codec = CODECS[name]
    assert codec is not None
    h = torch.tensor(
        [[1.0, float("nan"), 3.0], [1.0, 2.0, float("inf")], [1e300, 1.0, 0.0], [1.0, 2.0, 4.0]],
        dtype=torch.float64,
    )
    back = codec.decode(codec.encode(h, torch.arange(4), 3), h.dtype)
    assert torch.isnan(back[:3]).all() and torch.isfinite(back[3]).all()


def test_int8_rounding_is_keyed_by_row_not_by_position() -> None:
    """The same row id and key round alike wherever the row sits (any worker, any batch);
    another key, or the backward stream, draws other bits."""
    h, ids = rows()
    perm = torch.randperm(h.shape[0], generator=torch.Generator().manual_seed(1))
    whole = INT8.encode(h, ids, 5)
    assert torch.equal(INT8.encode(h[perm], ids[perm], 5), whole[perm])
    assert torch.equal(INT8.encode(h[:10], ids[:10], 5), whole[:10])
    assert not torch.equal(INT8.encode(h, ids, 6), whole)
    assert not torch.equal(INT8.encode(h, ids, backward_key(5)), whole)


def test_int8_stochastic_rounding_is_unbiased() -> None:
    """Averaged over keys, the rounded rows approach the rows (nearest rounding does not)."""
    h, ids = rows(n=16, f=16)
    step = step_of(h.abs().amax(1), 127.0)
    mean = torch.stack([round_trip(h, ids, k) for k in range(400)]).mean(0)
    err = ((mean - h) / step).abs()
    assert err.max() < 0.1  # one step spread over 400 draws: sigma <= 0.025 step
    nearest = ((round_trip(h, ids, None) - h) / step).abs()
    assert nearest.mean() > 5 * err.mean()


# -- the aggregation: gradients read as rows equal the transpose ---------------------------


class Exact:
    """A codec that rounds nothing: the backward still reads the gradient as rows."""

    name, wire_dtype, element_bytes, row_bytes = "exact", torch.float64, 8, 0
    stochastic = False

    def wire_width(self, width: int) -> int:
        return width

    def encode(self, h_XF: torch.Tensor, ids_X: torch.Tensor, key: int | None) -> torch.Tensor:
        return h_XF

    def decode(self, wire_XW: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return wire_XW.to(dtype)


def dense(g: Graph, model: str) -> torch.Tensor:
    whole = build_parts(g, np.zeros(g.num_nodes, dtype=np.int64), 1)[0]
    adj = part_adjacency(whole, model, torch.float64, torch.device("cpu"))
    order = torch.from_numpy(np.asarray(whole.inner_nodes, dtype=np.int64))
    out = torch.zeros(g.num_nodes, g.num_nodes, dtype=torch.float64)
    out[order.unsqueeze(1), order.unsqueeze(0)] = adj.to_dense()
    return out


def aggregate_as_rows(part: LocalPart, model: str, mode: str, g_in: dict) -> dict[str, Any]:
    """One mode's aggregation with rows 'rounded' to float64 (no rounding at all), so the
    backward reads the gradient as rows through `Aᵀ = diag(r)·A·diag(c)` and nothing else."""
    ids = torch.from_numpy(np.asarray(part.inner_nodes, dtype=np.int64))
    cpu = torch.device("cpu")
    adj = part_adjacency(part, model, torch.float64, cpu)
    rounding = Rounding(Exact(), ids)
    scales = transpose_scales(part, model, torch.float64, cpu)
    local_H = torch.from_numpy(np.array(part.halo_owner_local))
    wiring = Wiring(CommStats(), local_H, WIDTH, torch.float64, rounding, scales)
    plan = halo_plan(part, cpu)
    view = (adj, plan)
    if MODES[mode].per_edge_rows:  # one halo column per remote edge
        view = level_view(adj, plan, torch.full((plan.num_halo,), L3, dtype=torch.int64))
    agg = make_aggregator(mode_of(mode), *view, wiring, [2])
    x = g_in["x"][ids].clone().requires_grad_(True)
    w = g_in["w"].clone().requires_grad_(True)
    y, _ = agg.transform_aggregate(x, w, 0, key=3)
    (y * g_in["grad"][ids]).sum().backward()
    assert x.grad is not None and w.grad is not None
    return {
        "ids": ids.numpy(), "y": y.detach().numpy(), "x_grad": x.grad.numpy(),
        "w_grad": w.grad.numpy(),
    }  # fmt: skip


def every_mode_and_model(rank: int, world: int, parts: list[LocalPart], g_in: dict) -> dict:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    exact = [m for m in pipeline_modes() if mode_of(m).exact]
    return {
        (model, mode): aggregate_as_rows(parts[rank], model, mode, g_in)
        for model in ("gcn", "sage", "gin")
        for mode in exact
    }


@pytest.mark.dist
def test_gradients_read_as_rows_equal_the_transpose() -> None:
    """Every exact mode, GCN's symmetric, SAGE's mean and GIN's sum weights: the backward
    that moves output-gradient rows gives `Aᵀ·g` (a wrong r or c for the mean, or a row sent
    to the wrong peer, would not)."""
    g = hand_made()
    parts = build_parts(g, OWNER, 2)
    g_in = inputs(g.num_nodes)
    h = g_in["x"] @ g_in["w"].t()
    by_rank = spawn_ranks(every_mode_and_model, 2, parts, g_in)
    for res in by_rank:
        assert not isinstance(res, Exception), res
    for model, mode in by_rank[0]:
        A = dense(g, model)
        grad_x = (A.t() @ g_in["grad"]) @ g_in["w"]
        for res in by_rank:
            got = res[(model, mode)]
            ids, label = got["ids"], f"{model} {mode}"
            np.testing.assert_allclose(got["y"], (A @ h)[ids], atol=1e-12, err_msg=label)
            np.testing.assert_allclose(got["x_grad"], grad_x[ids], atol=1e-12, err_msg=label)
        w_grad = sum(res[(model, mode)]["w_grad"] for res in by_rank)
        np.testing.assert_allclose(w_grad, g_in["grad"].t() @ A @ g_in["x"], atol=1e-12)
    assert OUT > 0
