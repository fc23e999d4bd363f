"""Every cache level at every budget equals single-process training (issue: exactness first).

Replicated rows aggregate first at input width with masks drawn locally (keyed by global id),
rows fetched per edge travel once per edge, the static aggregate stands in for layer 0 when
its input never changes: none of it may change the numbers.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_graph
from helpers.ranks import chunks_of, global_logits, run_many

from leo_cli.config import LeoConfig, load_config

pytestmark = pytest.mark.dist

MODELS = ("gcn", "sage", "gin")
GRAPH = dict(num_nodes=120, num_edges=500, num_features=12, num_classes=4, seed=3)


def cfg(
    model: str, input_dropout: float, mode: str = "leo", width: int = 8, *extra: str
) -> LeoConfig:
    return load_config(
        None,
        [
            f"model.name={model}",
            f"pipeline.mode={mode}",
            *chunks_of(mode, 2),
            "train.dtype=float64",
            "model.dropout=0.3",
            f"model.input_dropout={input_dropout}",
            f"model.hidden_channels={width}",
            "model.num_layers=3",
            *extra,
        ],
    )


def close(got: list[dict], ref: dict, num_nodes: int, label: str) -> None:
    for r in got:
        np.testing.assert_allclose(r["losses"], ref["losses"], rtol=1e-10, err_msg=label)
        assert r["acc"] == ref["acc"], label
        for a, b in zip(r["grads"], ref["grads"], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, err_msg=label)
        for a, b in zip(r["params"], ref["params"], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11, err_msg=label)
    order = np.argsort(ref["ids"])
    np.testing.assert_allclose(
        global_logits(got, num_nodes), ref["logits"][order], rtol=1e-9, atol=1e-10, err_msg=label
    )


@pytest.mark.parametrize("world", [2, 4])
def test_cache_levels_match_single_process(world: int) -> None:
    g = random_graph(**GRAPH)
    # (model, input dropout, spec): replicas partial / all, per-edge rows, static aggregate.
    cases = [(m, 0.4, s) for m in MODELS for s in ("half", "all", "l3", None)]
    cases += [(m, 0.0, s) for m in MODELS for s in ("static", "static+half", None)]
    cases += [("gcn", 0.4, "static+half"), ("gcn", 0.0, "half"), ("sage", 0.4, "overlap")]
    cases += [("gcn", 0.4, "uneven")]  # views shared by the layers on some parts only
    refs = {
        (m, p): r[0]
        for (m, p), r in zip(
            [(m, p) for m in MODELS for p in (0.0, 0.4)],
            run_many([cfg(m, p, "blocking") for m in MODELS for p in (0.0, 0.4)], g, 1, 3),
            strict=True,
        )
    }
    results = run_many(
        [cfg(m, p) for m, p, _ in cases], g, world, 3, specs=[s for _, _, s in cases]
    )
    sent = {}
    for (model, p, spec), got in zip(cases, results, strict=True):
        close(got, refs[(model, p)], g.num_nodes, f"{model} input_dropout={p} {spec} P={world}")
        sent[(model, p, spec)] = sum(r["bytes"] for r in got)
    for m in MODELS:  # the levels were really used: fewer bytes, or more for per-edge rows
        assert sent[(m, 0.4, "all")] < sent[(m, 0.4, None)]
        assert sent[(m, 0.4, "l3")] > sent[(m, 0.4, None)]
        assert sent[(m, 0.0, "static")] < sent[(m, 0.0, None)]


def test_modes_with_a_cache_and_aggregate_first_layers() -> None:
    """Baseline modes given a plan, and a first layer that aggregates before it transforms
    (input narrower than hidden), where replicas join the aggregation at input width."""
    g = random_graph(num_nodes=120, num_edges=500, num_features=4, num_classes=3, seed=7)
    modes = ("blocking", "fine-grained", "shared-memory", "leo")
    ref = run_many([cfg("sage", 0.4, "blocking", width=16)], g, 1, 3)[0][0]
    got = run_many(
        [cfg("sage", 0.4, m, width=16) for m in modes], g, 3, 3, specs=["half"] * len(modes)
    )
    for mode, result in zip(modes, got, strict=True):
        close(result, ref, g.num_nodes, f"sage aggregate-first {mode}")


def test_p1_static_aggregate_matches() -> None:
    g = random_graph(**GRAPH)
    ref = run_many([cfg("gcn", 0.0)], g, 1, 3)[0][0]
    got = run_many([cfg("gcn", 0.0)], g, 1, 3, specs=["static"])[0]
    close(got, ref, g.num_nodes, "P=1 static")


def test_float32_curves_with_replicas_and_static_aggregate() -> None:
    """float32: rows aggregated first (replicas, the static aggregate) change the order of
    summation, so curves agree to rounding, not bit for bit (measured: ~1e-7 relative)."""
    g = random_graph(**GRAPH)

    def f32(p: float, mode: str = "leo") -> LeoConfig:
        return cfg("gcn", p, mode).model_copy(
            update={"train": cfg("gcn", p).train.model_copy(update={"dtype": "float32"})}
        )

    refs = [r[0] for r in run_many([f32(0.4, "blocking"), f32(0.0, "blocking")], g, 1, 15)]
    got = run_many([f32(0.4), f32(0.0)], g, 4, 15, specs=["all", "static"])
    for ref, result, label in zip(refs, got, ("replicas", "static"), strict=True):
        worst = max(
            float(np.max(np.abs(np.subtract(r["losses"], ref["losses"])) / np.abs(ref["losses"])))
            for r in result
        )
        print(f"float32 {label} P=4 vs P=1: max relative loss difference {worst:.2e}")
        assert worst < 1e-5, label


@pytest.mark.parametrize("world", [3])
def test_every_transport_matches_single_process(world: int) -> None:
    """L3 rows read in place (`auto`), every row read in place (`shared-memory`), every row
    through the process group (`process-group`): the same numbers, in leo and fine-grained,
    with input dropout on and off; and the published rows really carry what they should."""
    g = random_graph(**GRAPH)
    cases = [
        ("gcn", 0.4, "leo", "half", "auto"),
        ("gcn", 0.4, "leo", "half", "process-group"),
        ("sage", 0.0, "leo", "static+half", "shared-memory"),
        ("gin", 0.4, "leo", None, "shared-memory"),
        ("gcn", 0.4, "fine-grained", None, "auto"),
        ("gcn", 0.4, "fine-grained", None, "process-group"),
    ]
    refs = {
        (m, p): run_many([cfg(m, p, "blocking")], g, 1, 3)[0][0]
        for m, p in sorted({(m, p) for m, p, *_ in cases})
    }
    cfgs = [cfg(m, p, mode, 8, f"pipeline.transport={t}") for m, p, mode, _, t in cases]
    results = run_many(cfgs, g, world, 3, specs=[s for *_, s, _ in cases])
    published = {}
    for (model, p, mode, spec, t), got in zip(cases, results, strict=True):
        label = f"{model} input_dropout={p} {mode} {spec} transport={t} P={world}"
        close(got, refs[(model, p)], g.num_nodes, label)
        published[(mode, t)] = sum(r["published"] for r in got)
    assert published[("leo", "process-group")] == 0
    assert published[("fine-grained", "process-group")] == 0
    assert published[("leo", "auto")] > 0 and published[("fine-grained", "auto")] > 0
    assert published[("leo", "shared-memory")] > published[("leo", "auto")]


def test_segments_without_a_static_layer_0s_width_train_the_same_numbers() -> None:
    """Two layers, 12 features -> 8 -> 4 classes, layer 0 served by the static aggregate:
    segments and published rows are reserved at the widest width a layer exchanges (below
    layer 0's), in leo reading in place and in shared-memory; the same numbers."""
    g = random_graph(**GRAPH)
    two = ("model.num_layers=2",)
    cases = [
        ("leo", "static+half", "pipeline.transport=shared-memory"),
        ("leo", "static+half", "pipeline.transport=auto"),
        ("shared-memory", "static", "pipeline.transport=auto"),
    ]
    ref = run_many([cfg("gcn", 0.0, "blocking", 8, *two)], g, 1, 3)[0][0]
    cfgs = [cfg("gcn", 0.0, mode, 8, *two, t) for mode, _, t in cases]
    results = run_many(cfgs, g, 2, 3, specs=[spec for _, spec, _ in cases])
    for (mode, spec, t), got in zip(cases, results, strict=True):
        close(got, ref, g.num_nodes, f"gcn 2 layers {mode} {spec} {t}")
        assert sum(r["published"] for r in got) > 0 or mode == "shared-memory", (mode, t)
