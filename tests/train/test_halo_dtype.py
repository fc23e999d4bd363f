"""`pipeline.halo_dtype`: rows rounded the same on every worker count, and fewer bytes moved."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import leo_here, random_graph
from dist_harness import chunks_of, global_logits, run_many
from test_modes_exact import EXACT, MODELS, assert_same_run

from leo_cli.config import LeoConfig, load_config

pytestmark = pytest.mark.dist

GRAPH = dict(num_nodes=120, num_edges=500, num_features=12, num_classes=4, seed=3)


def cfg_of(model: str, mode: str, halo: str, dtype: str = "float64") -> LeoConfig:
    return load_config(
        None,
        [
            f"model.name={model}",
            f"pipeline.mode={mode}",
            f"pipeline.halo_dtype={halo}",
            *chunks_of(mode, 2),
            f"train.dtype={dtype}",
            "model.dropout=0.3",
            "model.hidden_channels=8",
            "model.num_layers=3",
        ],
    )


@pytest.mark.parametrize("world", [2, 4])
def test_rounded_rows_are_the_same_on_every_worker_count(world: int) -> None:
    """Every model and exact mode with bfloat16 rows equals one process with bfloat16 rows
    (float64 accumulation); float16 for one of them; the rounding changes the numbers."""
    g = random_graph(**GRAPH)
    cases = [(m, mode, "bfloat16") for m in MODELS for mode in EXACT]
    cases.append(("gcn", "leo", "float16"))
    refs = {
        (m, halo): r[0]
        for (m, halo), r in zip(
            [(m, "bfloat16") for m in MODELS] + [("gcn", "float16")],
            run_many(
                [cfg_of(m, "blocking", "bfloat16") for m in MODELS]
                + [cfg_of("gcn", "blocking", "float16")],
                g,
                1,
                3,
            ),
            strict=True,
        )
    }
    results = run_many([cfg_of(*c) for c in cases], g, world, 3)
    for (model, mode, halo), got in zip(cases, results, strict=True):
        assert_same_run(got, refs[(model, halo)], g.num_nodes, f"{model} {mode} {halo} P={world}")
    wide = run_many([cfg_of("gcn", "blocking", "float32")], g, 1, 3)[0][0]
    assert not np.allclose(refs[("gcn", "bfloat16")]["logits"], wide["logits"], rtol=1e-6)
    assert not np.allclose(refs[("gcn", "float16")]["logits"], wide["logits"], rtol=1e-9)


def test_narrow_rows_halve_the_forward_bytes() -> None:
    """Rows travel in the narrow type, gradients in the training dtype (float32): the bytes
    drop by half of the forward rows' share, whatever the narrow type."""
    g = random_graph(**GRAPH)
    cfgs = [cfg_of("gcn", "blocking", h, "float32") for h in ("float32", "bfloat16", "float16")]
    wide, bf16, f16 = (sum(r["bytes"] for r in got) for got in run_many(cfgs, g, 2, 2))
    assert bf16 == f16
    assert wide / 2 < bf16 < wide


def test_gat_rows_are_rounded_alike() -> None:
    g = random_graph(**GRAPH)

    def cfg(mode: str) -> LeoConfig:
        return load_config(
            None,
            [
                "model.name=gat",
                f"pipeline.mode={mode}",
                "pipeline.halo_dtype=bfloat16",
                "train.dtype=float64",
                "model.hidden_channels=4",
                "model.heads=2",
            ],
        )

    ref = run_many([cfg("blocking")], g, 1, 3)[0][0]
    for mode, got in zip(EXACT, run_many([cfg(m) for m in EXACT], g, 3, 3), strict=True):
        np.testing.assert_allclose(got[0]["losses"], ref["losses"], rtol=1e-10, err_msg=mode)
        np.testing.assert_allclose(
            global_logits(got, g.num_nodes)[np.argsort(np.argsort(ref["ids"]))],
            ref["logits"],
            rtol=1e-9,
            atol=1e-10,
            err_msg=mode,
        )


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (["pipeline.halo_dtype=int8"], "not built yet"),
        (["pipeline.halo_dtype=float16", "pipeline.transport=shared-memory"], "in place"),
    ],
)
def test_refused_settings(sets: list[str], words: str) -> None:
    res = leo_here("train", *[a for s in sets for a in ("--set", s)])
    assert res.returncode != 0
    assert words in res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
