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
    """Published rows of one owner, on time or late, recording the reader's waits."""

    def __init__(self, rows_BF: torch.Tensor, on_time: bool, events: list[str]) -> None:
        self.rows_BF, self.on_time, self.events = rows_BF, on_time, events

    def published(self, stream: int, writer: int) -> bool:
        return self.on_time

    def begin_read(self, stream: int, writer: int) -> tuple[int, int]:
        self.events.append("wait")
        return 1, 1

    def forward_rows(self, q: int, copy: int, width: int) -> torch.Tensor:
        return self.rows_BF

    def end_read(self, stream: int, writer: int, k: int) -> None:
        pass


def csr(dense: torch.Tensor) -> kernels.CSR:
    rows, cols = torch.nonzero(dense, as_tuple=True)
    return kernels.CSR.from_coo(rows, cols, dense[rows, cols], *dense.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_late_owner_waits_after_the_local_sums(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = torch.Generator().manual_seed(0)
    mask = lambda *s: (torch.rand(*s, generator=g) < 0.5).to(dtype)  # noqa: E731
    local_NN = torch.rand(6, 6, generator=g, dtype=dtype) * mask(6, 6)
    remote_NB = torch.rand(6, 4, generator=g, dtype=dtype) * mask(6, 4)
    h_NF = torch.randn(6, 3, generator=g, dtype=dtype)
    rows_BF = torch.randn(4, 3, generator=g, dtype=dtype)
    inner_csr, remote_csr = csr(local_NN), csr(remote_NB)
    inner = ColumnBlock(0, 6, None, inner_csr, inner_csr.transpose())
    owner = OwnerRows(1, ColumnBlock(0, 4, None, remote_csr, remote_csr.transpose()),
                      torch.arange(4), remote_csr)  # fmt: skip

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
    for on_time in (True, False):
        events.clear()
        rows = Rows(rows_BF, on_time, events)
        reader = InPlace(rows, 0, torch.zeros(0), [owner], {}, CommStats())  # type: ignore[arg-type]
        out[on_time] = reader.aggregate(inner, h_NF, layer=0)
        assert events == (["wait", "fused"] if on_time else ["local", "wait", "remote"])
    assert torch.equal(out[True], out[False])
    torch.testing.assert_close(out[False], local_NN @ h_NF + remote_NB @ rows_BF)
