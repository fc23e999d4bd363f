"""GAT on P workers equals GAT on one, in every pipeline mode (exactness first).

A halo row carries the transformed features and the source half of the attention score; the
softmax of a row is local; attention dropout is keyed by global ids, so masks do not depend
on the partitioning. Two heads at every layer (concatenated, then averaged) and both dropouts
on make every part of that path count.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_graph
from helpers.ranks import chunks_of, run_many
from test_modes_exact import EXACT, assert_same_run

from leo_cli.config import LeoConfig, load_config

pytestmark = pytest.mark.dist

GRAPH = dict(num_nodes=120, num_edges=500, num_features=12, num_classes=4, seed=3)


def gat_cfg(mode: str = "blocking", chunks: int = 2, *extra: str) -> LeoConfig:
    return load_config(
        None,
        [
            "model.name=gat",
            f"pipeline.mode={mode}",
            *chunks_of(mode, chunks),
            "train.dtype=float64",
            "model.dropout=0.3",
            "model.attention_dropout=0.3",
            "model.heads=2",
            "model.output_heads=2",
            "model.hidden_channels=4",
            "model.num_layers=3",
            *extra,
        ],
    )


def cases(chunk_counts: tuple[int, ...]) -> list[tuple[str, int]]:
    return [(m, 1) for m in EXACT if m != "leo"] + [("leo", k) for k in chunk_counts]


def check_world(world: int, chunk_counts: tuple[int, ...], owner: np.ndarray | None = None) -> None:
    g = random_graph(**GRAPH)
    ref = run_many([gat_cfg()], g, 1, 3)[0][0]
    todo = cases(chunk_counts)
    results = run_many([gat_cfg(m, k) for m, k in todo], g, world, 3, owner=owner)
    sent = {}
    for (mode, k), got in zip(todo, results, strict=True):
        assert_same_run(got, ref, g.num_nodes, f"gat {mode} chunks={k} P={world}")
        sent[mode] = sum(r["bytes"] for r in got)
    assert sent["leo"] == sent["blocking"] > 0
    assert sent["fine-grained"] > sent["blocking"]


def test_gat_every_mode_matches_single_process_p2() -> None:
    check_world(2, (1, 3))


def test_gat_every_mode_matches_single_process_p4() -> None:
    check_world(4, (2,))


def test_gat_p3_with_an_empty_and_a_trainingless_part() -> None:
    g = random_graph(**GRAPH)
    owner = np.where(g.train_mask_N, 0, 1).astype(np.int64)
    owner[np.flatnonzero(~g.train_mask_N)[::2]] = 0
    check_world(3, (2,), owner=owner)


def test_gat_rows_exchanged_either_side_of_the_transform() -> None:
    """Features narrower than the row a layer computes travel before the transform."""
    g = random_graph(num_nodes=120, num_edges=500, num_features=3, num_classes=4, seed=7)
    cfgs = [gat_cfg(m, 2, "model.hidden_channels=8") for m in ("blocking", "leo")]
    ref = run_many(cfgs[:1], g, 1, 3)[0][0]
    for mode, got in zip(("blocking", "leo"), run_many(cfgs, g, 2, 3), strict=True):
        assert_same_run(got, ref, g.num_nodes, f"gat narrow input {mode}")


def test_gat_float32_loss_curves_with_both_dropouts() -> None:
    g = random_graph(num_nodes=300, num_edges=1500, num_features=16, num_classes=5, seed=5)

    def cfg(mode: str) -> LeoConfig:
        return load_config(
            None,
            [
                "model.name=gat",
                "model.heads=4",
                "model.hidden_channels=4",
                "model.dropout=0.5",
                "model.attention_dropout=0.5",
                f"pipeline.mode={mode}",
            ],
        )

    ref = run_many([cfg("blocking")], g, 1, num_steps=15)[0][0]["losses"]
    for world in (2, 4):
        for mode, got in zip(EXACT, run_many([cfg(m) for m in EXACT], g, world, 15), strict=True):
            np.testing.assert_allclose(
                got[0]["losses"], ref, rtol=1e-5, err_msg=f"gat {mode} P={world}"
            )


def test_attention_dropout_changes_the_numbers() -> None:
    """The masks are really drawn (so the comparisons above cover them)."""
    g = random_graph(**GRAPH)
    on, off = run_many([gat_cfg(), gat_cfg("blocking", 2, "model.attention_dropout=0")], g, 1, 3)
    assert not np.allclose(on[0]["grads"][0], off[0]["grads"][0], rtol=1e-6)


def test_gat_with_rows_fetched_per_edge_matches() -> None:
    """Cache level L3 (a view of the halo with one row per remote edge) keeps GAT exact."""
    g = random_graph(**GRAPH)
    ref = run_many([gat_cfg()], g, 1, 3)[0][0]
    got = run_many([gat_cfg("leo")], g, 2, 3, specs=["l3"])[0]
    assert_same_run(got, ref, g.num_nodes, "gat l3")


def test_gat_refuses_replicas_and_the_static_aggregate() -> None:
    g = random_graph(**GRAPH)
    for spec in ("half", "static"):
        with pytest.raises(AssertionError, match="gat: L2/L3 rows only"):
            run_many([gat_cfg("leo", 2, "model.input_dropout=0")], g, 2, 1, specs=[spec])
