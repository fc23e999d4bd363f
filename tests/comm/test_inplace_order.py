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
    spmm, fused, add = kernels.spmm, kernels.fused_aggregate, kernels.spmm_add_
    adding: list[bool] = []  # inside spmm_add_: a product it makes is its own

    def traced_spmm(a: kernels.CSR, x: torch.Tensor) -> Any:
        if not adding:
            events.append("local" if a is inner_csr else "remote")
        return spmm(a, x)

    def traced_add(out: torch.Tensor, a: kernels.CSR, x: torch.Tensor) -> None:
        events.append("remote")
        adding.append(True)
        try:
            add(out, a, x)
        finally:
            adding.pop()

    def traced_fused(*args: Any) -> Any:
        events.append("fused")
        return fused(*args)

    monkeypatch.setattr(kernels, "spmm", traced_spmm)
    monkeypatch.setattr(kernels, "fused_aggregate", traced_fused)
    monkeypatch.setattr(kernels, "spmm_add_", traced_add)
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
