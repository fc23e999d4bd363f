"""The tables LEO grows along: pipeline modes, the runs a cache plan prices, cache policies,
convolutions and the bench's peers, one record each.

In the spirit of torch.distributed.pipelining's schedule table and torchtitan's `TrainSpec`:
a record says what the rest of the code needs to know about a mode or a convolution, as
fields, and code asks the record (`mode_of("leo").overlap`) instead of comparing names. Only
the registries spell mode and model names (this module; the bench's roles in
bench/modes.py); the implementations register beside their code (the transports in
comm/modes.py, the layers in models/layers.py and models/gat.py) under the names given here,
and tests/test_registry.py checks that every record has one.

A `Mode` says what the runtime does; a `Priced` run is what the planner predicts (a mode with
or without the plan's levels), derived from the modes; a `Conv` names the PyG layer the bench
compares with and the PyG model its weights export to (`PygModel`).

Pure data (no torch), so the config schema, at the bottom of the imports, validates against it.
Adding a mode: its transport module, one `Mode` line here and its cost terms (planner/cost.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Transport = Literal["point-to-point", "all-to-all", "segment", "none"]
EdgeWeights = Literal["symmetric", "mean", "sum", "attention"]
Framework = Literal["pyg", "dgl"]  # whose layers a bench peer trains


@dataclass(frozen=True)
class Wire:
    """How a transport (`Mode.transport`) moves halo rows: what its run-time class
    (comm/modes.py `TRANSPORTS`) does, in the terms the cost model prices (planner/cost.py).

    Attributes:
        name: the transport's key.
        transfer: how a transfer is timed: each peer's message on its own, none where no row
            moves (`per-peer`); one collective everyone waits out for the busiest rank
            (`collective`); rows written to a host segment, a barrier, rows read out
            (`segment`); nothing moves (`none`).
        packs: rows to send are gathered into a fresh send buffer.
        receives_fresh: arriving rows (and gradients) land in a fresh buffer.
        reads_out: the halo buffer is read out of the shared segment.
        fills_zeros: the halo buffer is written with zeros (nothing arrives).
        gradient_buffer: halo gradients are copied into one buffer for the collective.
        gradients_as_rows: the backward moves the output gradient as rows, the forward's way
            (`Aᵀ·g` is an aggregation on a symmetric graph: comm/aggregate.py
            `backward_rows`), not halo gradients as partial sums; attention layers excepted.
        one_host: it reaches the workers of one host only (a host's shared segment).
    """

    name: Transport
    transfer: Literal["per-peer", "collective", "segment", "none"]
    packs: bool = False
    receives_fresh: bool = False
    reads_out: bool = False
    fills_zeros: bool = False
    gradient_buffer: bool = False
    gradients_as_rows: bool = False
    one_host: bool = False

    @property
    def moves_rows(self) -> bool:
        return self.transfer != "none"


WIRES: dict[str, Wire] = {
    w.name: w
    for w in (
        Wire("point-to-point", "per-peer", packs=True, receives_fresh=True),
        Wire("all-to-all", "collective", packs=True, receives_fresh=True, gradient_buffer=True),
        Wire("segment", "segment", reads_out=True, gradients_as_rows=True, one_host=True),
        Wire("none", "none", fills_zeros=True),
    )
}


@dataclass(frozen=True)
class Mode:
    """One pipeline mode (`pipeline.mode`): what moves halo rows at run time, and how.

    Attributes:
        name: the key in configs and tables.
        help: one line for `--help` and the README.
        transport: how halo rows move (`WIRES`; comm/transport.py): asynchronous
            point-to-point chunks, one all-to-all, a shared-memory segment per host, or not
            at all.
        overlap: the update is split boundary-first (where a part has interior rows enough
            to hide anything: comm/aggregate.py `splits_update`) and arriving rows are
            aggregated while later ones travel (the LEO pipeline).
        chunks: transfers are cut into `pipeline.num_chunks` chunks per peer.
        cache_levels: can hold replicas (L1) and rows fetched per edge (L3); every mode can
            use the static aggregate (L1s).
        per_edge_rows: every remote edge brings its own row (MGG's scheme).
        reads_in_place: rows of same-host owners can be read in place from their published
            rows (comm/inplace.py): the L3 rows (`pipeline.transport=auto`; every row for a
            per-edge mode) or every row (`shared-memory`).
        bucketed_grads: weight gradients are all-reduced per layer, asynchronously, during
            the backward pass (else one all-reduce after it).
    """

    name: str
    help: str
    transport: Transport
    overlap: bool = False
    chunks: bool = False
    cache_levels: bool = False
    per_edge_rows: bool = False
    reads_in_place: bool = False
    bucketed_grads: bool = False

    @property
    def wire(self) -> Wire:
        """How its transport moves rows (`WIRES`)."""
        return WIRES[self.transport]

    @property
    def exact(self) -> bool:
        """Its numbers equal one process's (otherwise `leo train` needs --allow-inexact): the
        halo rows arrive."""
        return self.wire.moves_rows

    @property
    def one_host(self) -> bool:
        """Every worker must be on one host."""
        return self.wire.one_host

    @property
    def planned(self) -> bool:
        """The cache plan's levels are priced for it (the others without a cache)."""
        return self.name == PLANNED_MODE


AUTO_MODE = "auto"  # what `pipeline.mode` may also say: a mode chosen per run, not a Mode
DEFAULT_MODE = AUTO_MODE
DEFAULT_CONV = "gcn"
PLANNED_MODE = "leo"  # the mode the cache plan's levels are made for

MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode(
            "leo",
            "the pipeline: boundary rows first, chunks in flight while the inner rows are "
            "aggregated, each chunk aggregated as it lands; per-layer gradient all-reduce",
            transport="point-to-point",
            overlap=True,
            chunks=True,
            cache_levels=True,
            reads_in_place=True,
            bucketed_grads=True,
        ),
        Mode(
            "blocking",
            "the whole halo in one all-to-all, wait, then aggregate (DGL/PyG-style)",
            transport="all-to-all",
            cache_levels=True,
        ),
        Mode(
            "fine-grained",
            "no deduplication: every remote edge brings its own row (MGG's scheme)",
            transport="all-to-all",
            cache_levels=True,
            per_edge_rows=True,
            reads_in_place=True,
        ),
        Mode(
            "shared-memory",
            "rows written to one shared segment per host between two barriers, halo rows read "
            "out of it (the unified-memory baseline; one host)",
            transport="segment",
        ),
        Mode(
            "compute-only",
            "the same computation with the transfers removed (wrong numbers on purpose): the "
            "floor perfect overlap would reach",
            transport="none",
        ),
    )
}


def mode_of(name: str) -> Mode:
    """The record of a mode (names are validated by the config schema)."""
    return MODES[name]


def pipeline_modes() -> list[str]:
    """The modes a run can use (not `auto`)."""
    return list(MODES)


def mode_settings() -> list[str]:
    """What `pipeline.mode` accepts: `auto` (planner/auto_mode.py resolves it to a mode before
    workers start) and the modes a run can use."""
    return [AUTO_MODE, *pipeline_modes()]


def is_auto(setting: str) -> bool:
    """Whether a `pipeline.mode` setting asks for the mode to be chosen (`auto`)."""
    return setting == AUTO_MODE


def auto_candidates() -> list[str]:
    """The modes `auto` chooses among: the exact ones (not compute-only), the planned mode
    first (it wins ties and runs when nothing is predicted)."""
    exact = [m for m in pipeline_modes() if MODES[m].exact]
    return sorted(exact, key=lambda m: not MODES[m].planned)


def planned_mode() -> str:
    """The mode the cache plan's levels are made for."""
    return PLANNED_MODE


@dataclass(frozen=True)
class Priced:
    """One run the cache plan predicts (the keys of plan.json's `predicted`, `stages` and
    `ranks_s`; `bench.modes` times the same runs): a mode with the plan's levels, or without
    a cache.

    Attributes:
        name: the key of its prediction.
        mode: the pipeline mode it runs (`MODES`).
        cached: it runs with the plan's levels (the planned mode); else without a cache, cut
            into the chunks a run without a plan chooses.
    """

    name: str
    mode: str
    cached: bool

    @property
    def runs(self) -> Mode:
        """The mode it runs."""
        return MODES[self.mode]

    @property
    def label(self) -> str:
        """How a plot names it: a mode priced without a cache under the mode's own name is
        marked `(no cache)`."""
        marked = not self.cached and self.name == self.mode
        return f"{self.name} (no cache)" if marked else self.name


UNCACHED_PLANNED = "leo-no-cache"  # the planned mode priced without a cache


def priced_runs() -> list[Priced]:
    """What a cache plan predicts, in the tables' order: every mode (the planned one with the
    plan's levels, the others without a cache), then the planned mode without a cache."""
    runs = [Priced(m, m, cached=MODES[m].planned) for m in MODES]
    return [*runs, Priced(UNCACHED_PLANNED, PLANNED_MODE, cached=False)]


def priced_names() -> list[str]:
    """The keys of a plan's predictions: the names `bench.modes` accepts (but `auto`)."""
    return [p.name for p in priced_runs()]


def priced_of(name: str) -> Priced:
    """The record of a priced run (`bench.modes` names are validated by the config schema)."""
    return next(p for p in priced_runs() if p.name == name)


def prediction_key(pipeline_mode: str, cached: bool) -> str:
    """The plan's prediction a run in `pipeline_mode` is compared with: the planned mode
    without a cache is predicted under its own key; every other mode under its name."""
    same = (p.name for p in priced_runs() if p.mode == pipeline_mode and p.cached == cached)
    return next(same, pipeline_mode)


@dataclass(frozen=True)
class Policy:
    """One cache policy (`cache.policy`).

    Attributes:
        name: the key in configs.
        help: one line for `--help`.
        caches: it places halo rows in cache levels (a plan is made and read); without it
            every halo row is exchanged each layer and no plan is needed to train.
        replicas: how it chooses the L1 replicas: the most-read rows first within the
            budget, or the cost model's pick (planner/policy.py).
    """

    name: str
    help: str
    caches: bool = True
    replicas: Literal["most-read", "cost-model"] = "cost-model"


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("none", "exchange every halo row each layer", caches=False),
        Policy("degree", "replicate the most-read rows first", replicas="most-read"),
        Policy("leo", "the cost model decides"),
    )
}
NO_CACHE = next(p.name for p in POLICIES.values() if not p.caches)


def policy_of(name: str) -> Policy:
    """The record of a cache policy (names are validated by the config schema)."""
    return POLICIES[name]


@dataclass(frozen=True)
class RowTransport:
    """One `pipeline.transport` setting: how the rows of same-host owners reach a worker.

    Attributes:
        name: the key in configs.
        help: one line for `--help`.
        in_place: which same-host rows are read in place from their owners' published rows
            (comm/inplace.py): none (every row through the process group), the L3 rows and
            the pairs where the plan chose every row (`planned`), or every row (`every`).
        gpu: CUDA workers read in place too (peer GPU memory; asked for by name only).
    """

    name: str
    help: str
    in_place: Literal["none", "planned", "every"]
    gpu: bool = False

    @property
    def every_row(self) -> bool:
        """Every row of a same-host owner is read in place, not only the planned ones."""
        return self.in_place == "every"


ROW_TRANSPORTS: dict[str, RowTransport] = {
    t.name: t
    for t in (
        RowTransport("auto", "L3 rows in place, every row where the plan predicts it faster",
                     "planned"),
        RowTransport("process-group", "every row through the process group", "none"),
        RowTransport("shared-memory", "every same-host row read in place", "every", gpu=True),
    )
}  # fmt: skip


def row_transport(name: str) -> RowTransport:
    """The record of a `pipeline.transport` setting (validated by the config schema)."""
    return ROW_TRANSPORTS[name]


@dataclass(frozen=True)
class PygModel:
    """The PyTorch Geometric model (`torch_geometric.nn.models`) a trained convolution's weights
    load into (`leo export`, models/export.py): the same function, parameters named apart.

    Attributes:
        cls: the model class.
        keys: per layer (under `convs.<i>.`), PyG's parameter name and LEO's.
        weight: PyG's name of the first linear map's weight `[out, in]` (its `in_channels`).
        width: PyG's name of the parameter whose first dimension is a layer's output width.
        unsqueezed: PyG's names of parameters with one more leading dimension than LEO's
            (GAT's attention vectors: `[1, H, C]` for `[H, C]`).
    """

    cls: str
    keys: tuple[tuple[str, str], ...]
    weight: str
    width: str
    unsqueezed: tuple[str, ...] = ()


# Layer 0's dropped features are kept from the forward to the backward where a worker's copy
# is under this many bytes, else drawn again as often as `Conv.input_reads` says
# (models/dropout.py `Recomputed`; the cost model prices the same rule).
KEPT_DROPPED_BYTES = 32 << 20


@dataclass(frozen=True)
class Conv:
    """One convolution (`model.name`).

    Attributes:
        name: the key in configs.
        help: one line for `--help`.
        edge_weights: how edge values come from global degrees: GCN's symmetric
            normalisation with a self-loop weight, the mean over in-edges, their sum, or
            attention scores computed per step (edge values 1).
        extra_gemm: a second linear map per layer (sage's root map, gin's MLP), for the cost
            model.
        root_map: a linear map of the layer's own input beside the aggregation (sage): its
            backward reads that input.
        learnt_self_weight: the layer's own row weighs (1 + eps) with a learnt eps (gin): its
            gradient reads the row.
        attention: edge weights depend on the rows of both ends (gat): layers gather
            `[h | halo]` instead of aggregating, and neither replicas nor the static aggregate
            apply (both rest on aggregating raw inputs first).
        elu: ELU between layers (else ReLU).
        pyg_peer: the PyTorch Geometric layer `leo bench` compares with, or None.
        dgl_peer: the DGL layer `leo bench` compares with, or None.
        pyg_model: the PyTorch Geometric model its weights export to, or None.
    """

    name: str
    help: str
    edge_weights: EdgeWeights
    extra_gemm: bool = False
    root_map: bool = False
    learnt_self_weight: bool = False
    attention: bool = False
    elu: bool = False
    pyg_peer: str | None = None
    dgl_peer: str | None = None
    pyg_model: PygModel | None = None

    def peer_layer(self, framework: Framework) -> str | None:
        """The layer of `framework` that a peer of that framework trains for this one."""
        return {"pyg": self.pyg_peer, "dgl": self.dgl_peer}[framework]

    @property
    def admits_replicas(self) -> bool:
        """L1 replicas and the L1s static aggregate (aggregate-first of raw inputs)."""
        return not self.attention

    @property
    def input_reads(self) -> tuple[int, int]:
        """How often a layer's backward reads the layer's input, (update first, aggregate
        first): at layer 0, how often the dropped features are drawn again (models/dropout.py
        `Recomputed`). The update inside the aggregation reads it when it runs first, a root
        map always, a learnt self weight when the aggregation runs first on the input."""
        root, own = int(self.root_map), int(self.learnt_self_weight)
        return (1 + root, root + own)

    @property
    def diagonal(self) -> bool:
        """Its fixed self-loop weight sits on the CSR's diagonal (GCN): one more inner edge
        per row, no separate self-loop term (models/local_graph.py)."""
        return self.edge_weights == "symmetric"


CONVS: dict[str, Conv] = {
    c.name: c
    for c in (
        Conv(
            "gcn",
            "Kipf & Welling's GCN",
            "symmetric",
            pyg_peer="GCNConv",
            dgl_peer="GraphConv",
            pyg_model=PygModel(
                "GCN", (("lin.weight", "lin.weight"), ("bias", "bias")), "lin.weight", "lin.weight"
            ),
        ),
        Conv(
            "sage",
            "GraphSAGE, mean aggregator",
            "mean",
            extra_gemm=True,
            root_map=True,
            dgl_peer="SAGEConv",
            pyg_model=PygModel(
                "GraphSAGE",
                (
                    ("lin_l.weight", "lin_l.weight"),
                    ("lin_l.bias", "lin_r.bias"),  # PyG's bias sits on the neighbours' map
                    ("lin_r.weight", "lin_r.weight"),
                ),
                "lin_l.weight",
                "lin_l.weight",
            ),
        ),
        Conv(
            "gin",
            "GIN with a learnt eps and a 2-layer MLP",
            "sum",
            extra_gemm=True,
            learnt_self_weight=True,
            dgl_peer="GINConv",
            pyg_model=PygModel(
                "GIN",
                (
                    ("eps", "eps"),
                    ("nn.lins.0.weight", "lin1.weight"),
                    ("nn.lins.0.bias", "bias1"),  # LEO keeps the first bias apart
                    ("nn.lins.1.weight", "lin2.weight"),
                    ("nn.lins.1.bias", "lin2.bias"),
                ),
                "nn.lins.0.weight",
                "nn.lins.1.weight",
            ),
        ),
        Conv(
            "gat",
            "multi-head graph attention",
            "attention",
            attention=True,
            elu=True,
            pyg_peer="GATConv",
            dgl_peer="GATConv",
            pyg_model=PygModel(
                "GAT",
                (
                    ("lin.weight", "lin.weight"),
                    ("att_src", "att_src"),
                    ("att_dst", "att_dst"),
                    ("bias", "bias"),
                ),
                "lin.weight",
                "bias",  # lin.weight's rows are every head's
                unsqueezed=("att_src", "att_dst"),
            ),
        ),
    )
}


def conv_of(name: str) -> Conv:
    """The record of a convolution (names are validated by the config schema)."""
    return CONVS[name]


@dataclass(frozen=True)
class Peer:
    """A framework `leo bench` times beside LEO (`bench.peers`): one process on the whole
    graph, the model's layers as that framework writes them (`Conv.peer_layer`).

    Attributes:
        name: the key in `bench.peers` and the `system` of its rows.
        help: one line for the docs.
        framework: whose layers it trains.
        package: the module it imports (its row is skipped where that fails).
        script: the script file beside leo_cli/bench/peers.py that runs it under
            `bench.peer_python`, importing only torch, numpy and its framework and reading the
            graph LEO writes to a file; None: `python -m leo_cli.bench.peers` in LEO's
            interpreter.
        adjacency: what its layers aggregate over: `edge_index`, or a sparse CSR adjacency.
    """

    name: str
    help: str
    framework: Framework
    package: str
    script: str | None = None
    adjacency: Literal["edge_index", "csr"] = "edge_index"


PEERS: dict[str, Peer] = {
    p.name: p
    for p in (
        Peer("pyg", "PyTorch Geometric on edge_index", "pyg", "torch_geometric"),
        Peer(
            "pyg-csr",
            "PyTorch Geometric on a CSR adjacency",
            "pyg",
            "torch_geometric",
            adjacency="csr",
        ),
        Peer("dgl", "DGL on its own graph", "dgl", "dgl", script="dgl_peer.py"),
    )
}


def peer_of(name: str) -> Peer:
    """The record of a bench peer (names are validated by the config schema)."""
    return PEERS[name]
