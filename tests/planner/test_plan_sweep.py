"""The plan's sweep (cache-plan.png) comes from the policy's own evaluations, from no replica
to the whole halo, instead of re-running the policy at several budgets."""

from __future__ import annotations

from typing import Any

import pytest
from test_cost import hardware, part

from leo_cli.config.schema import CacheConfig
from leo_cli.planner import make as plan_module
from leo_cli.planner import policy as policy_module
from leo_cli.planner.cost import ModelShape
from leo_cli.registry import auto_candidates, priced_runs

# Two layers, 16 -> 8 -> 4, input dropout on: replicas apply (no static aggregate).
SHAPE = ModelShape((16, 8, 4), 0.5, 0.5, 4, extra_gemm=False)


def test_plan_prices_the_sweep_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    predict = policy_module.predict

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[4])
        return predict(*args, **kwargs)

    monkeypatch.setattr(policy_module, "predict", counted)
    monkeypatch.setattr(plan_module, "predict", counted)
    accesses = [part(0), part(1)]
    made = plan_module.make_plan(CacheConfig(), accesses, SHAPE, hardware(), ("k", "i", "g"))
    ranks, layers = len(accesses), SHAPE.num_layers
    replicas = 2 * ranks * (len(policy_module.REPLICA_FRACTIONS) + 1)  # two passes
    chunks = layers * len(policy_module.CHUNK_CHOICES)
    # every priced run's prediction, then the auto candidates' but the planned one's, with the plan
    run_with_plan = len(auto_candidates()) - 1
    budget = (
        len(policy_module.SWEEP_SHARES) + replicas + chunks + 1 + len(priced_runs()) + run_with_plan
    )
    assert len(calls) <= budget  # re-running the policy per sweep point took ~6x as many
    shares = [p["replica_share"] for p in made.sweep]
    assert shares == list(policy_module.SWEEP_SHARES)
    whole_halo_mb = 4 * 16 * 4 / 2**20  # 4 halo rows of 16 float32 inputs
    assert made.sweep[-1]["replica_budget_mb"] == pytest.approx(whole_halo_mb)
    assert all(p["within_budget"] for p in made.sweep)  # 256 MiB holds the whole halo


def test_no_sweep_where_replicas_do_not_apply() -> None:
    static = ModelShape((16, 8, 4), 0.5, 0.0, 4, extra_gemm=False)  # no input dropout
    made = plan_module.make_plan(CacheConfig(), [part(0), part(1)], static, hardware(), ("k",) * 3)
    assert made.sweep == [] and all(c.static_aggregate for c in made.caches)
