"""Counter-based dropout: masks depend on global ids and the key only, at the right rate."""

from __future__ import annotations

import weakref
from contextlib import nullcontext
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import random_graph

from leo_cli.config import load_config
from leo_cli.graph.layout import build_parts
from leo_cli.graph.types import DatasetInfo
from leo_cli.models.dropout import (
    Recomputed,
    attention_key,
    counter_dropout,
    edge_ids,
    keep_mask,
    relu_dropout,
    stream_key,
)
from leo_cli.registry import conv_of
from leo_cli.worker.assemble import assemble


def test_mask_of_any_row_subset_equals_the_full_mask() -> None:
    ids = torch.arange(5000)
    key = stream_key(seed=3, epoch=7, layer=1)
    full = keep_mask(ids, 37, key, 0.5)
    subset = torch.randperm(5000, generator=torch.Generator().manual_seed(0))[:1234]
    assert torch.equal(keep_mask(ids[subset], 37, key, 0.5), full[subset])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_keep_rate_and_unbiased_scale(p: float) -> None:
    x = torch.ones(20000, 64, dtype=torch.float64)
    y = counter_dropout(x, torch.arange(20000), p, stream_key(0, 1, 0))
    assert (y > 0).double().mean().item() == pytest.approx(1 - p, abs=0.01)
    assert y.mean().item() == pytest.approx(1.0, abs=0.01)


def test_dropout_drops_the_masked_entries_and_their_gradients() -> None:
    x = torch.randn(70000, 9, dtype=torch.float64, requires_grad=True)  # three row chunks
    key = stream_key(3, 1, 0)
    y = counter_dropout(x, torch.arange(70000), 0.5, key)
    kept = keep_mask(torch.arange(70000), 9, key, 0.5)
    torch.testing.assert_close(y, torch.where(kept, x * 2.0, 0.0), rtol=0, atol=0)
    grad = torch.randn_like(y)
    y.backward(grad)
    torch.testing.assert_close(x.grad, torch.where(kept, grad * 2.0, 0.0), rtol=0, atol=0)


def test_keys_give_independent_masks() -> None:
    ids = torch.arange(4000)
    a = keep_mask(ids, 64, stream_key(0, 1, 0), 0.5).double() - 0.5
    for other in (stream_key(0, 2, 0), stream_key(0, 1, 1), stream_key(1, 1, 0)):
        b = keep_mask(ids, 64, other, 0.5).double() - 0.5
        assert abs((a * b).mean().item() * 4) < 0.02


def test_zero_rate_is_identity() -> None:
    x = torch.randn(10, 3)
    assert counter_dropout(x, torch.arange(10), 0.0, 5) is x


@pytest.mark.parametrize("offset", [2**31, 2**32, 2**40, 2**62])
def test_ids_differing_only_in_high_bits_get_different_masks(offset: int) -> None:
    ids = torch.arange(2000)
    key = stream_key(0, 1, 0)
    same = keep_mask(ids, 64, key, 0.5) == keep_mask(ids + offset, 64, key, 0.5)
    assert not same.all(dim=1).any()


@pytest.mark.slow
def test_distinct_ids_never_share_a_mask() -> None:
    # 2.4M rows (ogbn-products): with 64 columns at p = 0.5 a row's mask is 64 random bits, so
    # by the birthday bound even one shared mask has probability ~1e-7. A 31-bit row hash gave
    # ~1300 rows that share another row's whole mask.
    num_nodes, key = 2_400_000, stream_key(0, 1, 0)
    packed = []
    for start in range(0, num_nodes, 1 << 18):
        ids = torch.arange(start, min(start + (1 << 18), num_nodes))
        bytes_N8 = keep_mask(ids, 64, key, 0.5).view(torch.int64)  # 8 bools per int64
        packed.append((bytes_N8 << torch.arange(8)).sum(dim=1))  # 64 mask bits per row
    assert num_nodes - torch.unique(torch.cat(packed)).numel() == 0


def test_stream_keys_use_every_bit_of_large_seeds() -> None:
    top = 2**63 - 1  # largest run.seed
    keys = {stream_key(seed, 1, 0) for seed in (top, top - 1, top - 2**62, 0)}
    assert len(keys) == 4
    assert stream_key(top, 1, 0) != stream_key(top, 1, 1) != stream_key(top, 2, 0)


def test_attention_masks_are_their_own_stream_and_keyed_by_both_ends() -> None:
    """An edge's mask depends on (source, destination), not on its position or direction, and
    a layer's attention stream is independent of its input dropout stream."""
    src, dst = torch.arange(4000), torch.arange(4000).flip(0) + 7
    key = attention_key(0, 1, 0)
    a = keep_mask(edge_ids(src, dst), 8, key, 0.5)
    perm = torch.randperm(4000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(keep_mask(edge_ids(src[perm], dst[perm]), 8, key, 0.5), a[perm])
    centred = a.double() - 0.5
    for other in (
        keep_mask(edge_ids(dst, src), 8, key, 0.5),  # the reverse edge
        keep_mask(edge_ids(src, dst), 8, stream_key(0, 1, 0), 0.5),  # the input stream
        keep_mask(edge_ids(src, dst), 8, attention_key(0, 1, 1), 0.5),  # the next layer
        keep_mask(edge_ids(src, dst), 8, attention_key(0, 2, 0), 0.5),  # the next epoch
    ):
        assert abs((centred * (other.double() - 0.5)).mean().item() * 4) < 0.03


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("with_bias", [True, False])
def test_fused_relu_dropout_gives_the_unfused_numbers_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, p: float, with_bias: bool
) -> None:
    """relu(h + b) then counter dropout, forward and backward (h and bias gradients), across
    row chunks (a chunk of a few rows here) and rows ending at 0."""
    from leo_cli.kernels import ops

    monkeypatch.setattr(ops, "_EPILOGUE_CHUNK_BYTES", 64)
    n, f = 301, 11
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(n, f, generator=gen).to(dtype)
    bias = torch.randn(f, generator=gen).to(dtype) if with_bias else None
    h[:5] = 0.0 if bias is None else -bias  # relu's kink: h + b exactly 0, no gradient
    ids, key, grad = torch.arange(n) * 7, stream_key(2, 3, 1), torch.randn(n, f).to(dtype)
    outs = []
    for fused in (False, True):
        hh = h.clone().requires_grad_()
        bb = None if bias is None else bias.clone().requires_grad_()
        if fused:
            y = relu_dropout(hh, bb, ids, p, key)
        else:
            y = counter_dropout(torch.relu(hh if bb is None else hh + bb), ids, p, key)
        y.backward(grad)
        outs.append((y.detach(), hh.grad, None if bb is None else bb.grad))
    for a, b in zip(*outs, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_no_grad_dropout_is_the_grad_paths_numbers() -> None:
    x = torch.randn(70000, 13)  # three row chunks, float32: the scale 1/0.7 is inexact
    key, ids = stream_key(1, 2, 0), torch.arange(70000) * 3
    lean = counter_dropout(x, ids, 0.3, key)
    graded = counter_dropout(x.clone().requires_grad_(), ids, 0.3, key)
    assert torch.equal(lean, graded.detach())


@pytest.mark.slow
@pytest.mark.parametrize("recompute", [True, False])
def test_recomputed_keeps_no_dropped_copy_for_the_backward(
    recompute: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A linear map saves its input for the weight's gradient: under `saving()` it saves how
    to draw the dropped features again, and the gradient is the same to the bit."""
    monkeypatch.setattr(Recomputed, "KEPT_BYTES", 0)
    x = torch.randn(70000, 9, dtype=torch.float64)
    ids, key = torch.arange(70000), stream_key(3, 4, 0)
    weight = torch.randn(5, 9, dtype=torch.float64, requires_grad=True)
    drawn = Recomputed()
    dropped = drawn.dropout(x, ids, 0.5, key) if recompute else counter_dropout(x, ids, 0.5, key)
    kept = weakref.ref(dropped)
    with drawn.saving():
        out = F.linear(dropped, weight).relu()
    del dropped
    assert (kept() is None) == recompute  # the test tells the two apart
    out.sum().backward()
    expected = F.linear(torch.where(keep_mask(ids, 9, key, 0.5), x * 2.0, 0.0), weight.detach())
    assert torch.equal(out.detach(), expected.relu())
    g = (expected > 0).double()
    assert torch.equal(weight.grad, g.t() @ torch.where(keep_mask(ids, 9, key, 0.5), x * 2.0, 0.0))


def test_a_copy_written_since_it_was_drawn_is_saved_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Recomputed, "KEPT_BYTES", 0)
    x = torch.randn(300, 9, dtype=torch.float64)
    ids, key = torch.arange(300), stream_key(1, 1, 0)
    weight = torch.randn(5, 9, dtype=torch.float64, requires_grad=True)
    drawn = Recomputed()
    assert isinstance(drawn.saving(), nullcontext)  # nothing drawn: no hooks
    dropped = drawn.dropout(x, ids, 0.5, key)
    dropped.mul_(3.0)  # no longer what the masks draw
    saved: list[object] = []
    unpack = Recomputed._unpack
    spy = staticmethod(lambda s: saved.append(s) or unpack(s))
    monkeypatch.setattr(Recomputed, "_unpack", spy)
    with drawn.saving():
        F.linear(dropped, weight).sum().backward()
    assert saved and not any(type(s).__name__ == "_Redraw" for s in saved)
    torch.testing.assert_close(weight.grad, dropped.sum(0).expand(5, 9), rtol=1e-12, atol=1e-12)


def test_a_copy_under_the_bound_is_kept_not_drawn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below `KEPT_BYTES` the dropped copy is saved as it is (no second draw), at the bound
    it is drawn again; the gradients are the same to the bit."""
    x = torch.randn(300, 9, dtype=torch.float64)  # 21600 bytes
    ids, key = torch.arange(300) * 5, stream_key(2, 7, 0)
    grads, redraws, alive = [], [], []
    unpack = Recomputed._unpack
    saved: list[object] = []
    monkeypatch.setattr(Recomputed, "_unpack", staticmethod(lambda s: saved.append(s) or unpack(s)))
    for bound in (x.numel() * 8 + 1, x.numel() * 8):
        monkeypatch.setattr(Recomputed, "KEPT_BYTES", bound)
        saved.clear()
        weight = torch.ones(4, 9, dtype=torch.float64, requires_grad=True)
        drawn = Recomputed()
        dropped = drawn.dropout(x, ids, 0.5, key)
        copy = weakref.ref(dropped)
        with drawn.saving():
            out = F.linear(dropped, weight).square().sum()
        del dropped
        alive.append(copy() is not None)
        out.backward()
        grads.append(weight.grad)
        redraws.append(sum(type(s).__name__ == "_Redraw" for s in saved))
    assert alive == [True, False] and redraws == [0, 1]
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("name", ["gcn", "sage", "gin", "gat"])
@pytest.mark.parametrize("hidden", [2, 16])  # 7 features: update first, aggregate first
def test_models_redraw_the_dropped_features_with_the_same_gradients(
    name: str, hidden: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layer 0 keeps no dropped copy from its forward to its backward, which draws it as
    often as the registry tells the cost model (`Conv.input_reads`); gradients are the same
    to the bit as with the copy kept."""
    monkeypatch.setattr(Recomputed, "KEPT_BYTES", 0)
    g = random_graph(num_nodes=90, num_edges=400, num_features=7, num_classes=3, seed=2)
    heads = ["model.heads=2"] if name == "gat" else []
    cfg = load_config(
        None,
        [f"model.name={name}", "train.dtype=float64", f"model.hidden_channels={hidden}", *heads]
        + ["pipeline.mode=leo"],
    )
    part = build_parts(g, np.zeros(g.num_nodes, dtype=np.int64), 1)[0]
    job = assemble(cfg, part, DatasetInfo.of(g), 1, torch.device("cpu"))
    x = torch.from_numpy(g.x_NF).double()
    copies: list[weakref.ref[torch.Tensor]] = []
    dropout = Recomputed.dropout

    def spy_dropout(self: Recomputed, *args: Any) -> torch.Tensor:
        out = dropout(self, *args)
        copies.append(weakref.ref(out))
        return out

    def grads() -> tuple[list[torch.Tensor], bool]:
        """The gradients, and whether the dropped copy lived from the forward to the backward."""
        copies.clear()
        job.model.zero_grad()
        loss = job.model(x, job.graph, seed=5, epoch=3).square().sum()
        assert len(copies) == 1  # the features' dropout, layer 0 only
        kept = copies[0]() is not None
        loss.backward()
        return [p.grad.clone() for p in job.model.parameters() if p.grad is not None], kept

    redrawn: list[object] = []
    unpack = Recomputed._unpack
    spy = staticmethod(lambda saved: redrawn.append(saved) or unpack(saved))
    monkeypatch.setattr(Recomputed, "_unpack", spy)
    monkeypatch.setattr(Recomputed, "dropout", spy_dropout)
    ours, kept = grads()
    draws = sum(type(saved).__name__ == "_Redraw" for saved in redrawn)
    expected = {"gcn": (1, 0), "sage": (2, 1), "gin": (1, 1), "gat": (1, 0)}[name]
    assert not kept and draws == expected[0 if hidden == 2 else 1]
    assert conv_of(name).input_reads == expected
    monkeypatch.setattr(Recomputed, "saving", lambda self: nullcontext())
    plain, kept = grads()
    assert kept == (draws > 0)  # the copy lives where no hooks replace it: the test tells
    assert len(ours) == len(plain) and all(map(torch.equal, ours, plain))
