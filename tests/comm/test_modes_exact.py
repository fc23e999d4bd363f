"""Every pipeline mode equals single-process training (exactness first)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_graph
from helpers.ranks import chunks_of, global_logits, run_many

from leo_cli.config import LeoConfig, load_config
from leo_cli.graph.types import Graph, symmetrize

pytestmark = pytest.mark.dist

MODELS = ("gcn", "sage", "gin")
EXACT = ("blocking", "leo", "fine-grained", "shared-memory")


def float64_cfg(model: str, mode: str, chunks: int = 2) -> LeoConfig:
    return load_config(
        None,
        [
            f"model.name={model}",
            f"pipeline.mode={mode}",
            *chunks_of(mode, chunks),
            "train.dtype=float64",
            "model.dropout=0.3",
            "model.hidden_channels=8",
            "model.num_layers=3",
        ],
    )


def assert_same_run(got: list[dict], ref: dict, num_nodes: int, label: str) -> None:
    """Losses, logits, first-step gradients and parameters after 3 Adam steps."""
    for r in got:
        np.testing.assert_allclose(r["losses"], ref["losses"], rtol=1e-10, err_msg=label)
        assert r["acc"] == ref["acc"], label
    order = np.argsort(ref["ids"])
    np.testing.assert_allclose(
        global_logits(got, num_nodes), ref["logits"][order], rtol=1e-9, atol=1e-10, err_msg=label
    )
    for r in got:
        for a, b in zip(r["grads"], ref["grads"], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, err_msg=label)
        for a, b in zip(r["params"], ref["params"], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11, err_msg=label)


def check_world(g: Graph, world: int, chunk_counts: tuple[int, ...], owner=None) -> None:
    """Every model x exact mode x chunk count on `world` ranks against one process."""
    cases = [(m, "blocking", 1) for m in MODELS]
    cases += [(m, mode, 1) for m in MODELS for mode in EXACT if mode not in ("blocking", "leo")]
    cases += [(m, "leo", k) for m in MODELS for k in chunk_counts]
    refs = {
        m: r[0]
        for m, r in zip(
            MODELS, run_many([float64_cfg(m, "blocking") for m in MODELS], g, 1, 3), strict=True
        )
    }
    results = run_many([float64_cfg(*c) for c in cases], g, world, 3, owner=owner)
    sent = {}
    for (model, mode, k), got in zip(cases, results, strict=True):
        assert_same_run(got, refs[model], g.num_nodes, f"{model} {mode} chunks={k} P={world}")
        sent[(model, mode, k)] = sum(r["bytes"] for r in got)
    for model in MODELS:
        # Same rows, pipelined; fine-grained sends one row per remote edge.
        assert sent[(model, "leo", chunk_counts[0])] == sent[(model, "blocking", 1)]
        assert sent[(model, "fine-grained", 1)] > sent[(model, "blocking", 1)]


GRAPH = dict(num_nodes=120, num_edges=500, num_features=12, num_classes=4, seed=3)


def test_every_mode_matches_single_process_p2() -> None:
    check_world(random_graph(**GRAPH), 2, (1, 2, 7))


def test_every_mode_matches_single_process_p4() -> None:
    check_world(random_graph(**GRAPH), 4, (2, 7))


def test_p3_with_an_empty_and_a_trainingless_part() -> None:
    g = random_graph(**GRAPH)
    # Part 1 holds only nodes outside the training set; part 2 holds no node at all.
    owner = np.where(g.train_mask_N, 0, 1).astype(np.int64)
    owner[np.flatnonzero(~g.train_mask_N)[::2]] = 0
    assert (owner == 1).any() and not g.train_mask_N[owner == 1].any()
    check_world(g, 3, (7,), owner=owner)


def test_float32_loss_curves_of_every_mode_agree() -> None:
    g = random_graph(num_nodes=300, num_edges=1500, num_features=16, num_classes=5, seed=5)

    def cfg(mode: str) -> LeoConfig:
        return load_config(
            None, ["model.dropout=0.5", "model.hidden_channels=16", f"pipeline.mode={mode}"]
        )

    ref = run_many([cfg("blocking")], g, 1, num_steps=15)[0][0]["losses"]
    for world in (2, 4):
        for mode, got in zip(EXACT, run_many([cfg(m) for m in EXACT], g, world, 15), strict=True):
            np.testing.assert_allclose(
                got[0]["losses"], ref, rtol=1e-5, err_msg=f"{mode} P={world}"
            )


def banded_graph(num_nodes: int, reach: int, seed: int) -> Graph:
    """Node i linked to i+1 .. i+`reach`: cut into contiguous blocks, a part's rows are
    interior but for `reach` at each cut."""
    rng = np.random.default_rng(seed)
    src = np.repeat(np.arange(num_nodes), reach)
    dst = src + np.tile(np.arange(1, reach + 1), num_nodes)
    keep = dst < num_nodes
    split = rng.integers(0, 3, num_nodes)
    return Graph(
        name="banded",
        edge_index_2E=symmetrize(np.stack([src[keep], dst[keep]]), num_nodes),
        x_NF=rng.standard_normal((num_nodes, 12)).astype(np.float32),
        y_N=rng.integers(0, 4, num_nodes).astype(np.int64),
        train_mask_N=split == 0,
        val_mask_N=split == 1,
        test_mask_N=split == 2,
        num_classes=4,
    )


def test_leo_splits_its_update_where_a_part_has_interior_rows() -> None:
    """Parts mostly interior (a banded graph in contiguous blocks): `leo` splits its update
    boundary-first (the rows peers read first, then the interior's), also where those rows
    are read in place from its published rows; the same numbers as one process."""
    g, world = banded_graph(240, 3, seed=7), 2
    owner = (np.arange(g.num_nodes) * world // g.num_nodes).astype(np.int64)
    cases = [(m, k, None) for m in MODELS for k in (1, 2)] + [(m, 2, "l3") for m in MODELS]
    refs = run_many([float64_cfg(m, "blocking") for m in MODELS], g, 1, 3)
    ref = {m: r[0] for m, r in zip(MODELS, refs, strict=True)}
    cfgs = [float64_cfg(m, "leo", k) for m, k, _ in cases]
    specs = [spec for _, _, spec in cases]
    results = run_many(cfgs, g, world, 3, owner=owner, specs=specs)
    for (model, k, spec), got in zip(cases, results, strict=True):
        label = f"{model} leo chunks={k} levels={spec}"
        assert all(r["split"] for r in got), label
        assert (sum(r["published"] for r in got) > 0) == (spec == "l3"), label
        assert_same_run(got, ref[model], g.num_nodes, label)


def test_compute_only_is_not_exact_and_sends_nothing() -> None:
    g = random_graph(**GRAPH)
    ref = run_many([float64_cfg("gcn", "blocking")], g, 1, 3)[0][0]
    got = run_many([float64_cfg("gcn", "compute-only")], g, 2, 3)[0]
    assert sum(r["bytes"] for r in got) == 0
    assert not np.allclose(got[0]["losses"], ref["losses"], rtol=1e-6)
