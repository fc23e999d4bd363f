"""The aggregation over rows read in place does local work first when an owner is late: the
inner block's SpMM runs before the wait for the first owner's rows (so it hides the wait),
and the sums are bit for bit those of the fused op it uses when the owner is on time."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from leo_cli import kernels
from leo_cli.comm.blocks import ColumnBlock
from leo_cli.comm.exchange import CommStats
from leo_cli.comm.inplace import InPlace, OwnerRows


class Rows:
    """Published rows of each owner, on time or late, recording the reader's waits."""

    def __init__(self, rows: dict[int, torch.Tensor], on_time: set[int], events: list[str]):
        self.rows, self.on_time, self.events = rows, on_time, events

    def published(self, stream: int, writer: int) -> bool:
        return writer in self.on_time

    def begin_read(self, stream: int, writer: int) -> tuple[int, int]:
        self.events.append(f"wait {writer}")
        return 1, 1

    def forward_rows(self, q: int, copy: int, width: int) -> torch.Tensor:
        return self.rows[q]

    def end_read(self, stream: int, writer: int, k: int) -> None:
        pass


def csr(dense: torch.Tensor) -> kernels.CSR:
    rows, cols = torch.nonzero(dense, as_tuple=True)
    return kernels.CSR.from_coo(rows, cols, dense[rows, cols], *dense.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_late_owner_waits_after_the_local_sums(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Owners 1 and 2; the first (owner 1) on time or late, the second late either way."""
    g = torch.Generator().manual_seed(0)
    mask = lambda *s: (torch.rand(*s, generator=g) < 0.5).to(dtype)  # noqa: E731
    local_NN = torch.rand(6, 6, generator=g, dtype=dtype) * mask(6, 6)
    h_NF = torch.randn(6, 3, generator=g, dtype=dtype)
    remote, published, owners = {}, {}, []
    for q, rows in ((1, 4), (2, 5)):
        remote[q] = torch.rand(6, rows, generator=g, dtype=dtype) * mask(6, rows)
        published[q] = torch.randn(rows, 3, generator=g, dtype=dtype)
        owners.append(OwnerRows(q, torch.arange(rows), csr(remote[q])))
    inner_csr = csr(local_NN)
    inner = ColumnBlock(0, 6, None, inner_csr, inner_csr.transpose())

    events: list[str] = []
    spmm, fused = kernels.spmm, kernels.fused_aggregate

    def traced_spmm(a: kernels.CSR, x: torch.Tensor) -> Any:
        events.append("local" if a is inner_csr else "remote")
        return spmm(a, x)

    def traced_fused(*args: Any) -> Any:
        events.append("fused")
        return fused(*args)

    monkeypatch.setattr(kernels, "spmm", traced_spmm)
    monkeypatch.setattr(kernels, "fused_aggregate", traced_fused)
    out = {}
    for on_time in ({1}, {2}, set()):
        events.clear()
        rows = Rows(published, on_time, events)
        reader = InPlace(rows, 0, torch.zeros(0), owners, {}, CommStats())  # type: ignore[arg-type]
        out[frozenset(on_time)] = reader.aggregate(inner, h_NF, layer=0)
        first = ["wait 1", "fused"] if 1 in on_time else ["local", "wait 1", "remote"]
        assert events == [*first, "wait 2", "remote"], on_time
    got = list(out.values())
    assert all(torch.equal(got[0], o) for o in got[1:])
    want = local_NN @ h_NF + remote[1] @ published[1] + remote[2] @ published[2]
    torch.testing.assert_close(got[0], want)


class AckedRows(Rows):
    """Published rows that record when the reader acknowledges each owner's read."""

    def end_read(self, stream: int, writer: int, k: int) -> None:
        self.events.append(f"done {writer}")


def test_cpu_workers_aggregate_a_private_copy_acknowledged_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On CPU each owner's rows are copied out before its SpMM, which reads the copy (not
    the published rows), and the read is acknowledged before the SpMM: the sums are the
    same as over the published rows."""
    g = torch.Generator().manual_seed(1)
    dense = lambda *s: torch.rand(*s, generator=g) * (torch.rand(*s, generator=g) < 0.5)  # noqa: E731
    local_NN, h_NF = dense(5, 5), torch.randn(5, 4, generator=g)
    remote = {q: dense(5, 3 + q) for q in (1, 2)}
    published = {q: torch.randn(3 + q, 4, generator=g) for q in (1, 2)}
    owners = [OwnerRows(q, torch.arange(3 + q), csr(remote[q])) for q in (1, 2)]
    inner_csr = csr(local_NN)
    inner = ColumnBlock(0, 5, None, inner_csr, inner_csr.transpose())
    events: list[str] = []
    spmm, fused = kernels.spmm, kernels.fused_aggregate
    published_ptrs = {t.data_ptr() for t in published.values()}

    def traced_spmm(a: kernels.CSR, x: torch.Tensor) -> Any:
        if a is not inner_csr:
            events.append("private" if x.data_ptr() not in published_ptrs else "published")
        return spmm(a, x)

    def traced_fused(c: kernels.CSR, h: torch.Tensor, r: kernels.CSR, x: torch.Tensor) -> Any:
        events.append("fused private" if x.data_ptr() not in published_ptrs else "fused")
        return fused(c, h, r, x)

    monkeypatch.setattr(kernels, "spmm", traced_spmm)
    monkeypatch.setattr(kernels, "fused_aggregate", traced_fused)
    reader = InPlace(AckedRows(published, {1}, events), 0, torch.zeros(0), owners, {}, CommStats())  # type: ignore[arg-type]
    out = reader.aggregate(inner, h_NF, layer=0)
    assert events == ["wait 1", "done 1", "fused private", "wait 2", "done 2", "private"]
    want = kernels.fused_aggregate(inner_csr, h_NF, owners[0].in_place, published[1])
    want += kernels.spmm(owners[1].in_place, published[2])
    assert torch.equal(out, want)
