"""Every SpMM that LEO runs (forward, backward, through sddmm, GAT and the fused op) knows the
longest row of its matrix: on GPUs an unknown one (-1) runs the hub-row pass and allocates its
workspace (~E*F/256 bytes) on every call, hubs or not."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from leo_cli import kernels
from leo_cli.kernel_tools.synthetic import random_csr, split_local_remote
from leo_cli.planner.profile.measure import regular_csr

# Positions of the degree arguments in each op's schema.
DEGREE_ARGS = {"spmm_csr": (8, 9), "fused_aggregate": (15, 16, 17, 18)}


class DegreeLog(TorchDispatchMode):
    """Records the degree arguments of every leo::spmm_csr and leo::fused_aggregate call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        name = func.__name__.split(".")[0]
        if func.namespace == "leo" and name in DEGREE_ARGS:
            bound = list(args) + [kwargs[a.name] for a in func._schema.arguments[len(args) :]]
            self.calls.append((name, tuple(int(bound[i]) for i in DEGREE_ARGS[name])))
        return func(*args, **(kwargs or {}))


def unknown(log: DegreeLog) -> list[tuple[str, tuple[int, ...]]]:
    return [call for call in log.calls if min(call[1]) < 0]


def leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_()


def test_spmm_and_sddmm_pass_their_degrees_forward_and_backward() -> None:
    csr = random_csr(40, 30, 300, seed=1, dtype=torch.float64, huge_row_degree=50)
    x, values = leaf(torch.randn(30, 4, dtype=torch.float64)), leaf(csr.values)
    a = leaf(torch.randn(40, 4, dtype=torch.float64))
    with DegreeLog() as log:
        out = kernels.spmm(csr.with_values(values), x)
        edge = kernels.sddmm(csr, a, x)
        (out.sum() + edge.sum()).backward()
    assert len(log.calls) >= 4 and not unknown(log), log.calls


def test_gat_and_fused_backward_pass_their_degrees() -> None:
    csr = random_csr(40, 30, 300, seed=2, dtype=torch.float64)
    alpha, x = leaf(torch.rand(csr.num_edges, 2, dtype=torch.float64)), leaf(torch.randn(30, 2, 3))
    local, remote = split_local_remote(csr, num_local_cols=20)
    xl, xr = leaf(torch.randn(20, 4, dtype=torch.float64)), leaf(torch.randn(10, 4).double())
    with DegreeLog() as log:
        kernels.gat_spmm(csr, alpha, x.double()).sum().backward()
        lv, rv = leaf(local.values), leaf(remote.values)
        fused = kernels.fused_aggregate(local.with_values(lv), xl, remote.with_values(rv), xr)
        fused.sum().backward()
    assert len(log.calls) >= 5 and not unknown(log), log.calls


def test_the_probe_matrix_knows_its_degrees() -> None:
    csr = regular_csr(8, 4, 32, torch.Generator().manual_seed(0))
    assert (csr.max_degree, csr.t_max_degree) == (4, 8)
