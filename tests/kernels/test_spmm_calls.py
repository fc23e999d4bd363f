"""The CPU SpMMs of a step, recorded and made again under each variant
(kernels/spmm_calls.py): forward and backward are both recorded, with the CSR and the widths
they multiplied, and replaying them computes nothing the step sees."""

from __future__ import annotations

import pytest
import torch

from leo_cli import kernels
from leo_cli.kernel_tools.synthetic import random_csr
from leo_cli.kernels import slabs, spmm_calls, variants


def test_a_step_records_its_forward_and_backward_spmms() -> None:
    csr = random_csr(600, 2000, 8000, seed=5)
    x = torch.randn(2000, 16).requires_grad_()
    with spmm_calls.recording() as calls:
        out = kernels.spmm(csr, x)
        out.backward(torch.ones(600, 16))
    assert spmm_calls._recorded is None  # nothing is recorded outside
    assert [(c.num_rows, c.num_cols, c.width) for c in calls] == [(600, 2000, 16), (2000, 600, 16)]
    assert calls[0].indptr is csr.indptr and calls[0].indices is csr.indices  # the job's own
    kernels.spmm(csr, x.detach())
    assert len(calls) == 2


@pytest.mark.parametrize("name", [variants.TORCH, variants.TORCH_SLABS])
def test_a_replay_times_every_call_and_leaves_the_rng(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(slabs, "last_level_cache_bytes", lambda: 1 << 20)
    csr = random_csr(600, 2000, 8000, seed=5)
    with spmm_calls.recording() as calls:
        kernels.spmm(csr, torch.randn(2000, 64))
        kernels.spmm(csr, torch.randn(2000, 4, dtype=torch.float64))
    assert [c.slabbed() for c in calls] == [True, False]  # 512 kB of x against 210 kB
    replay = spmm_calls.Replay(calls)
    rng = torch.get_rng_state()
    variants.set_cpu_spmm(name)
    try:
        seconds, passes = replay.time(2)
        assert len(replay.one_pass()) == 2
    finally:
        variants.set_cpu_spmm(variants.AUTO)
    assert seconds > 0 and passes == 2 and torch.equal(torch.get_rng_state(), rng)
    assert replay.time(1, min_s=1e9, max_passes=3)[1] == 3  # more passes while short


def test_the_static_aggregate_uses_the_rules_variant_whatever_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Made once before `auto`'s trials choose the SpMM, the static aggregate must be made by
    the same variant in a run that sets one by name, or the two runs differ in the last bit."""
    from leo_cli.comm import levels

    used: list[str] = []
    spmm = kernels.spmm
    monkeypatch.setattr(kernels, "spmm", lambda *a: used.append(variants.cpu_spmm()) or spmm(*a))
    csr = random_csr(600, 600, 3000, seed=5)
    x = torch.randn(600, 8)
    variants.set_cpu_spmm(variants.TORCH)
    try:
        out = levels.static_aggregate(csr, None, x, distributed=False)  # type: ignore[arg-type]
        assert variants.cpu_spmm() == variants.TORCH  # as it was
    finally:
        variants.set_cpu_spmm(variants.AUTO)
    assert used == [variants.AUTO] and out.shape == (600, 8)


def test_a_replay_far_off_after_its_first_passes_stops_there() -> None:
    """Not after its first pass alone: that one pays the variant's one-time costs."""
    csr = random_csr(600, 2000, 8000, seed=5)
    with spmm_calls.recording() as calls:
        kernels.spmm(csr, torch.randn(2000, 16))
    replay = spmm_calls.Replay(calls)
    seen: list[float] = []
    assert spmm_calls.STOP_AFTER == 2
    assert replay.time(3, stop=lambda s: seen.append(s) or True)[1] == 2
    assert replay.time(3, stop=lambda s: False)[1] == 3 and len(seen) == 1 and seen[0] > 0
    assert replay.time(1, stop=lambda s: seen.append(s) or True)[1] == 1 and len(seen) == 1
