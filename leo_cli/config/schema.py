"""The config schema: one pydantic model per section of the config (names are a contract).

Every field is documented by the docstring under it; `leo config keys` (config/keys.py) and
docs/config.md list those texts. Unknown keys are rejected (`extra="forbid"`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from leo_cli import registry

DROPOUT_STEP = 1 / 256  # resolution of dropout rates: one random byte per entry
# Most chunks per peer of one pipelined transfer (pipeline.num_chunks and the cache plan's
# counts): every chunk is a message per peer and layer and a block of the CSR per peer, so an
# unbounded count only trades speed for memory (10**12 ran a worker out of memory).
MAX_CHUNKS = 64


def accepts_bool(annotation: Any) -> bool:
    """Whether a field's type admits true/false (bool itself, Any, or a union holding one)."""
    if annotation is bool or annotation is Any:
        return True
    args = get_args(annotation)
    if get_origin(annotation) is Literal:
        return any(isinstance(a, bool) for a in args)
    if get_origin(annotation) in (Union, UnionType, Annotated):
        return any(accepts_bool(a) for a in args)
    return False


class Section(BaseModel):
    """Common settings of every config section."""

    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        # YAML reads `true` as a boolean, which pydantic would take as 1 (a 1 MiB budget, one
        # chunk): where a number or text is meant, true/false is a mistake, not a value.
        if info.field_name is None:
            return value
        annotation = cls.model_fields[info.field_name].annotation
        items = value if isinstance(value, list) else [value]
        if any(isinstance(v, bool) for v in items) and not accepts_bool(annotation):
            item = get_args(annotation)[0] if get_origin(annotation) is list else None
            if item is None or not accepts_bool(item):
                raise ValueError("must be a number or a name, not true/false")
        return value


class RunConfig(Section):
    name: str = "default"
    """Run name, shown in tables and summaries."""
    out_dir: Path | None = None
    """Folder that receives everything the run produces (plan, metrics, checkpoints, a link to
    its partitions). null: `leo train` makes a new folder `runs/<name>/<date>-<time>` for every
    run (`--resume` continues the newest of that name); `leo partition`, `leo profile-cache`
    and `leo bench` use `runs/<name>`. `leo train` refuses a folder that already holds a
    run's results unless given --resume or --overwrite; the other commands refuse it."""
    cache_dir: Path | None = None
    """Where partitions and cache plans are kept, one folder per fingerprint of what they
    depend on (dataset, partition settings, seed; for a plan also the model, cache settings
    and hardware profile), shared by the runs that use it: a run folder's `partitions` links
    there and its plan is a copy. null: `leo-cache` beside the run folder
    (`runs/<name>/leo-cache` for unnamed runs, shared by every run of that name). When set,
    this machine's hardware profiles are kept there too (`hardware/`), unless
    `LEO_HARDWARE_CACHE` names their folder (otherwise ~/.cache/leo/hardware). Delete it
    to reclaim the space; runs rebuild what they miss. Runs on several machines
    (launch.nnodes > 1) keep their partitions and plan in the run folder, which the nodes
    share."""

    @property
    def folder(self) -> Path:
        """`out_dir`, once the command has chosen it (launch/run_folder.py)."""
        assert self.out_dir is not None, "run.out_dir is chosen before anything uses it"
        return self.out_dir

    seed: int = Field(0, ge=0, lt=2**63)
    """Seed of the synthetic graph, METIS, initial weights and dropout masks (0 <= seed < 2**63)."""
    tensorboard: bool = False
    """Also write rank 0's per-epoch scalars (those of metrics.jsonl) as TensorBoard event files
    in the run folder's `tensorboard/` (`tensorboard --logdir runs`); needs the tensorboard
    package (`pip install tensorboard`, or the checkout's `tensorboard` extra)."""


class SyntheticConfig(Section):
    num_nodes: int = Field(20_000, ge=2, le=100_000_000)
    """Number of nodes of the synthetic graph."""
    avg_degree: float = Field(10.0, gt=0)
    """Average (undirected) degree of the synthetic graph."""
    num_classes: int = Field(8, ge=2, le=1000)
    """Number of classes (= communities of the block model)."""
    num_features: int = Field(64, ge=1, le=100_000)
    """Width of the node features."""
    homophily: float = Field(0.6, ge=0.0, le=1.0)
    """Fraction of each node's edges that stay inside its own community."""
    feature_noise: float = Field(4.0, ge=0.0)
    """Standard deviation of the noise added to the class centroid of each node's features."""
    degree_exponent: float = Field(2.5, gt=1.0)
    """Power-law exponent of the expected degrees (smaller = more skewed)."""


class DataConfig(Section):
    name: str = "synthetic"
    """`synthetic`, `cora`, `citeseer`, `pubmed`, `ogbn-<name>` or a path to a `.npz` graph file."""
    root: Path = Path("data")
    """Folder holding the raw dataset files (see datasets/<name>.md for the layout)."""
    synthetic: SyntheticConfig = SyntheticConfig()
    """Parameters of the built-in synthetic graph."""
    normalize_features: Literal["auto", True, False] = "auto"
    """Divide each node's features by their sum (rows that sum to zero stay zero), the usual
    preprocessing of Planetoid's bag-of-words features (PyG's `NormalizeFeatures` gives the
    same on non-negative features whose rows sum to at least 1): `auto` does it for cora,
    citeseer and pubmed and not otherwise; true or false for every dataset."""

    @field_validator("root", mode="after")
    @classmethod
    def _expand_user(cls, value: Path) -> Path:
        return value.expanduser()


METIS_OPTIONS = ("metis_edge_fraction", "metis_memory_gb")  # the keys only METIS reads


PartWeight = Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]
PART_OPTIONS = ("part_weights", "owners_path")  # keys added after partitions had source keys


MAX_SHARE_RATIO = 1e3  # the largest part's target share over the smallest's


class PartitionConfig(Section):
    num_parts: int = Field(2, ge=1, le=4096)
    """Number of parts (one per worker)."""
    method: Literal["metis", "random", "range", "file"] = "metis"
    """`metis` (edge-balanced METIS), `random` (uniform owners), `range` (contiguous ids) or
    `file` (the owners in `owners_path`, e.g. from a distributed partitioner)."""
    owners_path: Path | None = None
    """`method=file`: a .npy array of one owner rank (0 .. num_parts-1, integers) per node of
    the dataset, as a distributed partitioner (ParMETIS, DistDGL's) writes it; checked when
    read (length, range, every part non-empty)."""
    part_weights: Literal["uniform", "measured"] | list[PartWeight] = "uniform"
    """Target share of the work of each part: `uniform` (equal parts), `measured` (shares
    proportional to each worker's speed for this model, from the hardware probe, which then
    runs before partitioning) or num_parts positive numbers (normalised). METIS gets them as
    target part weights; unequal weights are shares of time, so each node then weighs its
    predicted work (the cost model's seconds per node and per in-edge, from the hardware
    profile, which is found or probed first): METIS's vertex weights and `range`'s blocks
    follow it, `random` draws owners with these probabilities."""
    metis_edge_fraction: float = Field(1.0, gt=0.0, le=1.0)
    """Share of the undirected edges METIS sees: all edges of low-degree nodes and a seeded
    sample of those between hubs, weighted up by 1 / sqrt(keep probability); vertex weights
    still count every edge. 1 is exact METIS on the whole graph. METIS needs about 100-140
    bytes per directed edge, so 0.5 halves the partition stage's peak on large graphs at a
    slightly higher edge cut (+0.66% at 0.42 on a 2.4M-node synthetic graph: docs/results.md)."""
    metis_memory_gb: float | None = Field(8.0, gt=0.0)
    """Memory (GB = 1e9 bytes) the METIS step may plan for, projected from the graph's size
    (about 100-140 bytes per directed edge METIS sees, plus the node arrays); when METIS on
    metis_edge_fraction of the edges would need more, it sees a sample of them (as above) sized
    to fit, and the stage says so. null: no limit (METIS sees metis_edge_fraction of the edges,
    all by default, whatever that needs; a 2.4M-node, 119M-edge graph needs about 16 GB)."""

    @field_validator("part_weights", mode="before")
    @classmethod
    def _weights_form(cls, value: Any) -> Any:
        numbers = isinstance(value, list) and all(
            isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 1e6 for v in value
        )
        if value not in ("uniform", "measured") and not numbers:
            raise ValueError("must be uniform, measured or a list of positive numbers (up to 1e6)")
        return value

    @field_validator("owners_path", mode="after")
    @classmethod
    def _expand_owners(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser()

    @model_validator(mode="after")
    def _weights_and_owners(self) -> PartitionConfig:
        if (self.owners_path is None) != (self.method != "file"):
            raise ValueError(
                "partition.owners_path names the owners file of partition.method=file and "
                "applies to it only; set both or neither"
            )
        weights = self.part_weights
        if isinstance(weights, list) and len(weights) != self.num_parts:
            raise ValueError(
                f"partition.part_weights lists {len(weights)} weights for "
                f"partition.num_parts={self.num_parts}; give one per part"
            )
        if isinstance(weights, list) and max(weights) > MAX_SHARE_RATIO * min(weights):
            raise ValueError(
                f"partition.part_weights spans {max(weights) / min(weights):,.1f}x from the "
                f"smallest to the largest; keep it within {MAX_SHARE_RATIO:,.0f}x"
            )
        if weights != "uniform" and self.method == "file":
            raise ValueError(
                "partition.part_weights does not apply to partition.method=file (the file "
                "fixes every owner); remove it"
            )
        return self

    @model_validator(mode="after")
    def _metis_options_need_metis(self) -> PartitionConfig:
        # Only METIS reads them: another method would accept them and ignore them. (A changed
        # value, not a set one: a resolved config written out lists every default.)
        for key in METIS_OPTIONS:
            default = type(self).model_fields[key].default
            if getattr(self, key) != default and self.method != "metis":
                raise ValueError(
                    f"partition.{key} applies to partition.method=metis only (method is "
                    f"{self.method}); remove it or set partition.method=metis"
                )
        return self


def named(values: Iterable[str]) -> dict[str, Any]:
    """The names a text field takes from a registry table, for `leo config keys` and the
    suggestions of config errors (config/keys.py)."""
    return {"names": list(values)}


def one_of(names: list[str], value: str) -> str:
    """A name from a registry table, or a sentence listing them."""
    if value not in names:
        raise ValueError(f"must be one of {', '.join(names)}")
    return value


class ModelConfig(Section):
    name: str = Field(registry.DEFAULT_CONV, json_schema_extra=named(registry.CONVS))
    """GNN architecture (leo_cli/registry.py): `gcn`, `sage` (mean aggregator), `gin` (sum +
    MLP) or `gat` (multi-head attention)."""
    hidden_channels: int = Field(64, ge=1)
    """Width of the hidden layers (for `gat`: per head; a hidden layer is heads x this)."""
    num_layers: int = Field(2, ge=1, le=64)
    """Number of message-passing layers."""
    dropout: float = Field(0.5, ge=0.0, lt=1.0)
    """Dropout probability on the input of every layer after the first (and of the first
    too unless input_dropout says otherwise): 0, or between 1/256 and 255/256."""
    input_dropout: float | None = Field(None, ge=0.0, lt=1.0)
    """Dropout probability on the first layer's input features; null means the same as
    `dropout` (Kipf & Welling, PyG's example); 0 as in DGL's GCN example."""

    heads: int = Field(8, ge=1, le=64)
    """`gat`: attention heads of every hidden layer (concatenated)."""
    output_heads: int = Field(1, ge=1, le=64)
    """`gat`: attention heads of the output layer (averaged; 1 as in the paper's Cora model)."""
    attention_dropout: float = Field(0.6, ge=0.0, lt=1.0)
    """`gat`: dropout probability on the attention weights (the paper's 0.6); masks keyed by
    (seed, epoch, layer, head, global source id, global destination id)."""

    def layer_widths(self, num_features: int, num_classes: int) -> list[int]:
        """Input width of every layer, then the output width (attention: hidden = heads x
        channels)."""
        hidden = self.hidden_channels * (self.heads if self.attention else 1)
        return [num_features] + [hidden] * (self.num_layers - 1) + [num_classes]

    def row_widths(self, num_classes: int) -> list[int]:
        """Width of the row each layer computes before aggregating: its output width, or for
        attention heads x (channels + 1), the transformed features and the source score per
        head."""
        if not self.attention:
            return self.layer_widths(0, num_classes)[1:]
        hidden = self.heads * (self.hidden_channels + 1)
        return [hidden] * (self.num_layers - 1) + [self.output_heads * (num_classes + 1)]

    @property
    def attention(self) -> bool:
        """The convolution weights edges by attention (registry: `Conv.attention`)."""
        return registry.conv_of(self.name).attention

    @property
    def admits_replicas(self) -> bool:
        """L1 replicas and the static aggregate apply (registry: `Conv.admits_replicas`)."""
        return registry.conv_of(self.name).admits_replicas

    @property
    def effective_input_dropout(self) -> float:
        """The first layer's input dropout rate (`input_dropout`, or `dropout` when null)."""
        return self.dropout if self.input_dropout is None else self.input_dropout

    @field_validator("name")
    @classmethod
    def _known_conv(cls, value: str) -> str:
        return one_of(list(registry.CONVS), value)

    @model_validator(mode="after")
    def _attention_settings_need_gat(self) -> ModelConfig:
        # Only attention reads them: a changed value for another model would be ignored.
        if not self.attention:
            for key in ("heads", "output_heads", "attention_dropout"):
                if getattr(self, key) != type(self).model_fields[key].default:
                    names = " or ".join(n for n, c in registry.CONVS.items() if c.attention)
                    raise ValueError(
                        f"model.{key} applies to model.name={names} only (model.name is "
                        f"{self.name}); remove it or set model.name={names}"
                    )
        return self

    @field_validator("dropout", "input_dropout", "attention_dropout")
    @classmethod
    def _representable_rate(cls, value: float | None) -> float | None:
        # Masks draw one random byte per entry (models/dropout.py), so rates are multiples of
        # 1/256: a smaller nonzero rate would silently become 0, a larger one 255/256.
        if value is not None and value != 0.0 and not DROPOUT_STEP <= value <= 1.0 - DROPOUT_STEP:
            raise ValueError(
                "must be 0 or between 1/256 and 255/256 (masks draw one random byte per "
                "entry; other rates would round to 0 or 255/256)"
            )
        return value


class TrainConfig(Section):
    num_epochs: int = Field(100, ge=1)
    """Number of full-graph epochs."""
    lr: float = Field(0.01, gt=0)
    """Adam learning rate."""
    weight_decay: float = Field(5.0e-4, ge=0)
    """Adam weight decay (L2)."""
    eval_every: int = Field(1, ge=1)
    """Evaluate train/val/test accuracy every this many epochs."""
    checkpoint_every: int = Field(10, ge=1)
    """Write a checkpoint every this many epochs."""
    dtype: Literal["float32", "float64"] = "float32"
    """Floating-point type of features, weights and embeddings."""


Budget = Annotated[float, Field(ge=0, allow_inf_nan=False)] | str


class CacheConfig(Section):
    policy: Literal["none", "degree", "leo"] = "leo"
    """How halo rows are assigned to cache levels: `none` (exchange every halo row each
    layer), `degree` (replicate the most-read rows first) or `leo` (the cost model decides)."""
    replica_budget_mb: Budget = 256.0
    """Memory for L1 replicas (layer-0 input rows of halo nodes) per worker: MiB, or a
    percentage of the part's own feature bytes such as "50%"."""
    halo_budget_mb: Budget = 1024.0
    """Memory for the L2 halo buffer per worker (MiB or "N%"); rows beyond it are fetched per
    edge (L3), the least-read first."""
    static_aggregate: bool = True
    """Compute layer 0's aggregation `Â·X` once when its input never changes
    (`model.input_dropout` = 0): layer 0 then needs no exchange and no SpMM (level L1s)."""
    hardware: Path | None = None
    """A hardware profile written by `leo profile-cache` (hardware.json) to use instead of
    probing this machine; null probes once per run folder."""

    @model_validator(mode="after")
    def _levels_need_a_policy(self) -> CacheConfig:
        # With policy none no cache level is used: a changed value would be accepted and
        # ignored. (A changed value, not a set one: a resolved config lists every default.)
        if not self.enabled:
            for key in ("static_aggregate", "replica_budget_mb"):
                if getattr(self, key) != type(self).model_fields[key].default:
                    raise ValueError(
                        f"cache.{key} has no effect with cache.policy=none; remove it or set "
                        "cache.policy=leo or degree"
                    )
        return self

    @property
    def enabled(self) -> bool:
        """The policy places rows in cache levels (registry: `Policy.caches`)."""
        return registry.policy_of(self.policy).caches

    @field_validator("replica_budget_mb", "halo_budget_mb")
    @classmethod
    def _budget(cls, value: float | str) -> float | str:
        if isinstance(value, str):
            number = value.rstrip("%")
            if not value.endswith("%") or not number.replace(".", "", 1).isdigit():
                raise ValueError('must be MiB (a number >= 0) or a percentage such as "50%"')
        return value


class PipelineConfig(Section):
    mode: str = Field(registry.DEFAULT_MODE, json_schema_extra=named(registry.mode_settings()))
    """Halo exchange (leo_cli/registry.py): `auto` (the fastest exact mode, measured by the
    workers before the first epoch or predicted by the cache plan: see `choose`; `leo` with one
    worker), `leo`
    (pipelined), `blocking`, `fine-grained` (MGG), `shared-memory` (UVM); `compute-only` skips
    the exchange (wrong numbers; `leo bench`)."""
    choose: Literal["measure", "estimate", "remeasure"] = "measure"
    """How `auto` picks among its candidates (docs/design/planning.md): `measure` (the workers
    try the candidates the cost model keeps (not those its calibrated predictions, by this
    host's earlier trials, put slower than another beyond their errors), the exact modes and
    leo's plan with and without
    replicas or rows read in place, for `trial_steps` forward and backward steps each before
    the first epoch, and train the fastest; the result is kept as wisdom in run.cache_dir, so a
    later run with the same inputs trains at once), `remeasure` (measure even where wisdom
    exists) or `estimate` (the cost model's prediction alone, weighed by `auto_margin`). Mode
    trials: none with one worker, a mode set by name, or on resume. SpMM variant trials (see
    `spmm`): whenever `spmm=auto` under `measure` or `remeasure` on CPU workers with more than
    one variant to try, with one worker or a mode set by name too."""
    spmm: Literal["auto", "leo", "torch", "torch-slabs"] = "auto"
    """Which sparse-dense product serves CPU tensors (kernels/variants.py): `auto` (under
    `choose=measure`, also with one worker or a mode set by name: the workers time the
    variants that apply on the SpMMs one step makes, `trial_steps` passes each, before the
    first epoch and train the fastest (`torch-slabs` only where no other is within 3% of it),
    kept as wisdom like `auto`'s mode; under `estimate`:
    LEO's where its CPU library is loaded, else torch's, in column slabs for a process alone
    on its host), `leo` (LEO's CPU
    SpMM: its library must load), `torch` (torch's CSR SpMM, MKL's where torch has it) or
    `torch-slabs` (torch's in column slabs that fit the last-level cache). Every variant
    computes the same sums up to their order. GPU tensors use the CUDA kernels whatever it
    says."""
    trial_steps: int = Field(3, ge=1, le=20)
    """`choose=measure`: timed forward and backward steps per mode candidate (after one
    warm-up step; more while they add up to under 0.5 s, at most 20; fewer once two agree
    within 3%; a candidate whose first step is slower than the best's slowest stops there, one
    whose warm-up step is past that by as much as any warm-up so far stops before it), and
    passes over one step's recorded
    SpMMs per SpMM variant (more while under 0.1 s; a variant whose first two passes are over
    1.3x the best's stops there: its first is cold)."""
    trial_payback: bool = True
    """`choose=measure`: try only the candidates (modes, leo's plan variants, SpMM variants)
    whose trial may repay itself over the run's epochs (what it could save at most, its
    measured or predicted step against the best one's less its uncertainty, times the epochs,
    must exceed what its trial costs: planner/auto_mode.py `payback`); the others are noted,
    and a run too short to repay any comparison trains the expected fastest (calibrated, else
    predicted) untried. `false`: try every
    candidate the other rules keep (trials whose wisdom later runs of the same inputs reuse)."""
    payback_epochs: int | None = Field(None, ge=1)
    """`trial_payback`: the run length, in epochs, the trials must repay themselves over, in
    the parent and the workers alike (on resume too), and the length wisdom of trials cut
    short is kept for (a later run longer than it measures again); null: the run's own
    epochs (`train.num_epochs`, less those done on resume). `leo bench`'s `auto` row sets
    it to the config's `train.num_epochs` (the run a user would train) where it is null."""
    levels: Literal["own", "planned", "no-replicas", "no-in-place"] = "own"
    """Which cache levels the workers use: `own` (the plan made for this mode), or the plan
    made for leo as this mode can use it (`planned`; a mode that reads nothing in place
    exchanges the rows leo reads in place), without its replicas (`no-replicas`) or without
    rows read in place (`no-in-place`). `auto`'s measured choice writes the candidate that won
    here in the run folder's resolved_config.yaml; set by name it reproduces that run."""
    auto_margin: float = Field(0.1, ge=0.0, lt=1.0)
    """`auto` with `choose=estimate`: modes predicted within this fraction of the fastest step
    count as fast, and of those auto runs the one whose buffers for moving rows (cache-plan.json
    `predicted_buffer_bytes`) are smaller than the fastest's by more than this fraction, the
    smallest; 0: always the fastest predicted. At ogbn-products size predictions missed measured
    epochs by 2 to 62% (docs/results.md), so ones that close do not rank modes; the buffers
    decide memory. 0.1 is a judgement, not a measured error bound."""
    num_chunks: Literal["auto"] | int = "auto"
    """Chunks per peer for the modes that cut transfers into chunks (leo): 1 to 64 (each is one
    message per peer and layer), or `auto`: the cache plan's count per layer (1, 2, 4 or 8,
    the fastest it predicts), and without a plan (cache.policy=none) chunks of about 4 MiB per
    peer (1 to 4). A count with pipeline.mode=auto limits auto to the modes that chunk."""

    transport: Literal["auto", "process-group", "shared-memory"] = "auto"
    """How halo rows of same-host owners move in the modes that can read rows in place (leo,
    fine-grained): `auto` (the cache plan's choice per pair of reader and owner: the owner's
    L3 rows read in place from its published rows and its L2 rows in bulk through the process
    group, or every row of the owner read in place; fine-grained reads every row in place),
    `process-group`
    (every row through the process group: L2 in bulk, L3 once per reading edge),
    `shared-memory` (every row of a same-host owner read in place; on CUDA workers through
    PyTorch's symmetric memory, a path not yet run on a GPU, which `auto` leaves to the process
    group). Owners on other hosts always use the process group. `shared-memory` with
    pipeline.mode=auto limits auto to the modes that read in place."""
    halo_dtype: Literal["float32", "bfloat16", "float16", "int8"] = "float32"
    """Type of the neighbour rows aggregations read: `float32` (as computed, in train.dtype),
    `bfloat16` (rounded to nearest: 2 bytes an element), `float16` (each row scaled by a power
    of two, then rounded to nearest: 2 bytes an element and 1 a row), `int8` (a power-of-two
    scale per row and stochastic rounding keyed by seed, epoch, layer, direction and global
    row: 1 byte an element and 1 a row). Every row is rounded, local ones included, so 1, 2
    or 4 workers give the same numbers; rows travel rounded, and so do the output gradients
    the backward pass reads (not for gat: its halo gradients travel in train.dtype). No
    replicas (L1) or rows read in place (L3) under a narrow type; the static aggregate (L1s)
    stays (layer 0 then reads no row per step)."""

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, value: str) -> str:
        return one_of(registry.mode_settings(), value)

    @model_validator(mode="after")
    def _chunks_need_a_chunking_mode(self) -> PipelineConfig:
        # With `auto` a set count limits the choice to the modes that chunk (auto_mode.py).
        chunking_mode = registry.is_auto(self.mode) or registry.mode_of(self.mode).chunks
        if self.num_chunks != "auto" and not chunking_mode:
            chunking = ", ".join(n for n in registry.pipeline_modes() if registry.mode_of(n).chunks)
            raise ValueError(
                f"pipeline.num_chunks applies to modes that cut transfers into chunks "
                f"({chunking}), not pipeline.mode={self.mode}; remove it"
            )
        return self

    @model_validator(mode="after")
    def _narrow_rows_move_through_the_process_group(self) -> PipelineConfig:
        if self.rounds_rows and registry.row_transport(self.transport).every_row:
            raise ValueError(
                f"pipeline.transport=shared-memory reads rows in place in the training dtype, "
                f"not pipeline.halo_dtype={self.halo_dtype}; use auto or process-group"
            )
        return self

    @model_validator(mode="after")
    def _levels_without_rows_in_place_read_none(self) -> PipelineConfig:
        if self.levels == "no-in-place" and registry.row_transport(self.transport).every_row:
            raise ValueError(
                "pipeline.levels=no-in-place reads no row in place, which "
                "pipeline.transport=shared-memory asks for every row; drop one of the two"
            )
        return self

    @property
    def rounds_rows(self) -> bool:
        """Neighbour rows are rounded to a narrower type than they are computed in."""
        return self.halo_dtype != "float32"

    @field_validator("num_chunks")
    @classmethod
    def _bounded_chunks(cls, value: Literal["auto"] | int) -> Literal["auto"] | int:
        if value != "auto" and not 1 <= int(value) <= MAX_CHUNKS:
            raise ValueError(f"must be `auto` or a whole number from 1 to {MAX_CHUNKS}")
        return value


# A `tc` rate: a number and a unit of bits per second (`100mbit`, `1gbit`, `2.5gbit`).
LINK_RATE = r"[0-9]+(\.[0-9]+)?(kbit|mbit|gbit)"


def positive_rate(rate: str) -> bool:
    """A `tc` rate above zero (`LINK_RATE`)."""
    return re.fullmatch(LINK_RATE, rate) is not None and float(rate.rstrip("kmgbit")) > 0


class EmulateConfig(Section):
    """Emulated nodes on this machine: network, hostname and /dev/shm namespaces per node, a
    rate-limited link from each node to a switch (launch/emulate.py)."""

    nodes: int = Field(ge=2, le=64)
    """How many nodes to emulate; `partition.num_parts` workers are spread evenly over them."""
    link: str | list[str | None] | None = None
    """Each node's uplink rate (`tc` units: `100mbit`, `1gbit`, `10gbit`), in both directions;
    one value for every node, a list of one per node, or null for an unlimited link."""

    @field_validator("link")
    @classmethod
    def _rates(cls, value: str | list[str | None] | None) -> str | list[str | None] | None:
        for rate in value if isinstance(value, list) else [value]:
            if rate is not None and not positive_rate(rate):
                raise ValueError("must be a rate such as 100mbit, 1gbit or 10gbit, or null")
        return value

    @model_validator(mode="after")
    def _one_rate_per_node(self) -> EmulateConfig:
        if isinstance(self.link, list) and len(self.link) != self.nodes:
            raise ValueError(
                f"launch.emulate.link lists {len(self.link)} rates for {self.nodes} nodes; give "
                "one rate per node or one for all"
            )
        return self

    def rates(self) -> list[str | None]:
        """The uplink rate of every node (None: unlimited)."""
        return list(self.link) if isinstance(self.link, list) else [self.link] * self.nodes


class LaunchConfig(Section):
    nproc: int | None = Field(None, ge=1)
    """Workers on this node; default `partition.num_parts` divided by `nnodes`."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where workers compute: `auto` uses CUDA when available."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Process-group backend: `auto` means gloo on CPU, nccl on CUDA."""
    nnodes: int = Field(1, ge=1)
    """Number of machines (torchrun's --nnodes), or `MIN:MAX` (quoted in YAML or not): start
    on MAX and go on with as few as MIN when machines are lost (sets `min_nodes`). The
    survivors re-form the group, re-partition for their worker count and resume from the last
    checkpoint with the same numbers (docs/multi-node.md); not with `partition.method=file`,
    whose owners are for one worker count."""
    min_nodes: int | None = Field(None, ge=1)
    """The fewest machines the job goes on with (what `nnodes: MIN:MAX` sets); null: all
    `nnodes`, and a lost machine ends the job."""
    last_call_s: int = Field(30, ge=1)
    """Under `nnodes: MIN:MAX`: seconds the rendezvous waits for more machines once MIN are
    in (torch's `last_call_timeout`), at start and again after a machine is lost; unused
    otherwise."""
    keep_alive_s: int = Field(5, ge=1)
    """Under `nnodes: MIN:MAX`: seconds between a machine's keep-alive beats to the rendezvous
    (torch's `keep_alive_interval`); one silent for three beats is lost. Unused otherwise."""
    node_rank: int = Field(0, ge=0)
    """Rank of this machine (torchrun's --node-rank)."""
    master_addr: str = "localhost"
    """Rendezvous host (torchrun's --master-addr)."""
    master_port: int = Field(0, ge=0, le=65535)
    """Rendezvous port; 0 picks a free one (single node only)."""
    max_restarts: int = Field(0, ge=0)
    """How often the elastic agent restarts failed workers (torchrun's --max-restarts)."""
    timeout_s: float = Field(300.0, gt=0)
    """Collective timeout: a stalled worker ends the job after this many seconds."""
    cpu_affinity: list[list[Annotated[int, Field(ge=0, le=1 << 20)]]] | None = None
    """null (no pinning) or one list of core ids per local worker, e.g. [[0],[1],[1]]: worker
    0 alone on core 0, workers 1 and 2 sharing core 1. Applied when a worker (or hardware
    probe worker) starts, before its threads do; each gets as many threads as cores unless
    OMP_NUM_THREADS is set."""
    allocator: Literal["auto", "jemalloc", "system"] = "auto"
    """Memory allocator of the workers (and of the hardware probe and `leo bench`'s peers):
    `jemalloc` (preloaded), `system` (the C library's malloc; under glibc a worker returns
    set-up's temporaries to the system: docs/design/memory.md), or `auto`: jemalloc where the
    machine has it (Debian/Ubuntu: apt install libjemalloc2), else the system's, and the run
    says which. A user's own LD_PRELOAD or MALLOC_CONF is left as it is. summary.json records each
    worker's peak resident memory (peak_rss_bytes)."""
    keep_freed_memory: bool = False
    """false (default): a worker hands large freed blocks back to the system (glibc: at once,
    each its own mapping; jemalloc: over its default decay time), so its peak stays close to
    what a step holds live; with `huge_pages` fresh blocks fault in mostly 2 MiB at a time. true:
    it keeps what a step frees for the next one (glibc: from the end of set-up; jemalloc: its
    decays off), so fresh tensors cost no page faults, at the price of resident memory (the
    steps' peak plus what the heap cannot reuse). Measured at ogbn-products size: true ran
    epochs about 20% shorter for about 35% more memory (docs/results.md). `leo bench`'s PyG
    peers follow it too; the hardware probe is launched with the default whatever this says.
    docs/design/memory.md."""
    huge_pages: bool = True
    """PyTorch in the workers (and `leo bench`'s PyG peers) advises transparent huge pages
    for every tensor of 2 MiB or more (THP_MEM_ALLOC_ENABLE=1): the tensor's 2 MiB-aligned
    stretches then fault in 2 MiB at a time instead of 4 KiB. Works where the kernel's
    transparent huge pages are `madvise` or `always` (the run's summary says whether); a
    THP_MEM_ALLOC_ENABLE of the user's own stands. The hardware probe is launched with it
    whatever this says. docs/design/memory.md."""
    emulate: EmulateConfig | None = None
    """null, or {nodes: N, link: RATE}: run as N emulated nodes on this machine (root only),
    each in its own network, hostname and /dev/shm namespaces, linked through a switch at RATE
    per node (`1gbit`; null: unlimited). Each node runs `leo train` as a real node would
    (launch.nnodes=N, its node_rank, rendezvous at node 0), so multi-node runs and slow
    links can be measured on one machine (docs/multi-node.md)."""

    @model_validator(mode="before")
    @classmethod
    def _node_range(cls, data: Any) -> Any:
        """`nnodes: MIN:MAX` -> `min_nodes: MIN`, `nnodes: MAX`."""
        if not isinstance(data, dict) or not isinstance(data.get("nnodes"), str):
            return data
        low, sep, high = data["nnodes"].partition(":")
        if not sep or not low.strip().isdigit() or not high.strip().isdigit():
            return data  # not a range: the field's own error
        return {**data, "nnodes": int(high), "min_nodes": int(low)}

    @model_validator(mode="after")
    def _node_range_order(self) -> LaunchConfig:
        if self.min_nodes is not None and self.min_nodes > self.nnodes:
            raise ValueError(
                f"launch.min_nodes={self.min_nodes} is more than launch.nnodes={self.nnodes}; "
                "give launch.nnodes as MIN:MAX with MIN <= MAX"
            )
        return self

    def elastic(self) -> bool:
        """Whether the job goes on with fewer machines than it starts on (`nnodes: MIN:MAX`)."""
        return self.min_nodes is not None and self.min_nodes < self.nnodes

    @model_validator(mode="after")
    def _emulation_owns_the_nodes(self) -> LaunchConfig:
        if self.emulate is not None and (
            self.nnodes > 1 or self.nproc is not None or self.min_nodes is not None
        ):
            raise ValueError(
                "launch.emulate sets launch.nnodes, node_rank and nproc for each emulated node; "
                "remove launch.nnodes and launch.nproc, or launch.emulate"
            )
        return self

    @field_validator("cpu_affinity")
    @classmethod
    def _core_lists(cls, value: list[list[int]] | None) -> list[list[int]] | None:
        for cores in value or []:
            if not cores or len(set(cores)) != len(cores):
                raise ValueError("every worker needs a non-empty list of distinct core ids")
        return value


# Keys a benchmark variant may not set: the bench sets them per row, or they are its own.
BENCH_OWN_KEYS = ("run.", "bench.", "partition.num_parts", "launch.nproc", "pipeline.mode")


class BenchVariant(Section):
    """A named set of `--set` overrides that `leo bench` runs as variants of every LEO row."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
    """The variant's name: the `variant` column and its run folders' name."""
    set: list[str] = []
    """`dotted.key=value` overrides, as --set takes them (e.g. partition.part_weights=measured)."""

    @field_validator("set")
    @classmethod
    def _own_keys(cls, value: list[str]) -> list[str]:
        for item in value:
            key = item.partition("=")[0].strip()
            if "=" not in item or not key:
                raise ValueError(f"{item!r} is not of the form dotted.key=value")
            if key.startswith(BENCH_OWN_KEYS) or key in BENCH_OWN_KEYS:
                raise ValueError(
                    f"{key} is set by leo bench itself (bench.modes, bench.world_sizes, "
                    "run.out_dir); a variant cannot set it"
                )
        return value


class BenchConfig(Section):
    modes: list[str] = Field(
        registry.priced_names(),
        min_length=1,
        json_schema_extra=named([registry.AUTO_MODE, *registry.priced_names()]),
    )
    """Modes to compare (the runs a cache plan prices, leo_cli/registry.py; their roles in
    leo_cli/bench/modes.py): `leo`, `leo-no-cache` (pipeline, cache.policy
    none), `blocking`, `fine-grained`, `shared-memory`, `compute-only` (no exchange: the
    overlap floor), and `auto` (a user's default run: its candidates measured again every
    round, `pipeline.choose=remeasure`, the trials in its set-up; the row names the modes it
    ran and its epoch over the fastest exact mode's, `vs_fastest`)."""
    world_sizes: list[Annotated[int, Field(ge=1)]] = Field([4], min_length=1)
    """Worker counts to measure (at 1 worker every mode is the same single process: one row)."""
    peers: list[str] = Field(["pyg", "pyg-csr"], json_schema_extra=named(registry.PEERS))
    """Single-process peers on the same graph, widths, dropout and optimizer (leo_cli/registry.py
    `PEERS`): `pyg` (PyG's GCNConv or GATConv on edge_index), `pyg-csr` (on a CSR adjacency),
    `dgl` (DGL's GraphConv, SAGEConv, GINConv or GATConv, run under bench.peer_python). A row
    whose framework does not import, or has no layer for model.name, is skipped with a
    sentence."""
    peer_python: Path | None = None
    """Python interpreter that runs the peers which read the graph from a file (`dgl`): a
    separate environment with DGL (and the torch it was built for); it needs torch, numpy and
    DGL, not LEO. null: LEO's own interpreter. The PyG peers run in LEO's interpreter."""
    repeats: int = Field(5, ge=1)
    """Rounds; each runs every variant once, interleaved (A B C A B C ...). From 5 rounds on
    ratios get a 95% bootstrap interval, below that the range of the per-round values."""
    num_epochs: int = Field(5, ge=1)
    """Timed epochs per run."""
    warmup_epochs: int = Field(1, ge=0)
    """Untimed epochs at the start of every run."""
    variants: list[BenchVariant] = []
    """Named override sets, each run as a variant of every LEO row, interleaved with the
    others (A B A B ...), e.g. [{name: uniform, set: [partition.part_weights=uniform]},
    {name: measured, set: [partition.part_weights=measured]}]; ratios `vs_variant` are to the
    first. Empty: the config as it is."""
    links: list[str | None] = []
    """With launch.emulate: link rates to run every LEO row at (e.g. [null, 10gbit, 1gbit];
    null: unlimited), interleaved like variants (each rate a variant `link-<rate>`, crossed
    with bench.variants); rows say their `link` and `nodes`. Empty: launch.emulate's own."""

    @field_validator("links")
    @classmethod
    def _link_rates(cls, value: list[str | None]) -> list[str | None]:
        if len(set(value)) != len(value):
            raise ValueError("must not list a rate twice")
        for rate in value:
            if rate is not None and not positive_rate(rate):
                raise ValueError("must list rates such as 100mbit, 1gbit or 10gbit, or null")
        return value

    @field_validator("variants")
    @classmethod
    def _distinct_variants(cls, value: list[BenchVariant]) -> list[BenchVariant]:
        if len({v.name for v in value}) != len(value):
            raise ValueError("variant names must differ")
        return value

    @field_validator("modes")
    @classmethod
    def _known_modes(cls, value: list[str]) -> list[str]:
        return [one_of([registry.AUTO_MODE, *registry.priced_names()], v) for v in value]

    @field_validator("peers")
    @classmethod
    def _known_peers(cls, value: list[str]) -> list[str]:
        return [one_of(list(registry.PEERS), v) for v in value]

    @field_validator("modes", "world_sizes", "peers")
    @classmethod
    def _no_duplicates(cls, value: list[Any]) -> list[Any]:
        if len(set(value)) != len(value):
            raise ValueError("must not list a value twice")
        return value


class LeoConfig(Section):
    """The whole config tree."""

    run: RunConfig = RunConfig()
    data: DataConfig = DataConfig()
    partition: PartitionConfig = PartitionConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    cache: CacheConfig = CacheConfig()
    pipeline: PipelineConfig = PipelineConfig()
    launch: LaunchConfig = LaunchConfig()
    bench: BenchConfig = BenchConfig()

    @model_validator(mode="after")
    def _a_node_range_needs_a_partitioner(self) -> LeoConfig:
        if self.launch.elastic() and self.partition.method == "file":
            raise ValueError(
                "launch.nnodes MIN:MAX re-partitions for the workers left after a loss, but "
                "partition.method=file holds owners for partition.num_parts workers only; use "
                "partition.method=metis (or random, range), or a fixed launch.nnodes"
            )
        return self

    @model_validator(mode="after")
    def _links_need_nodes(self) -> LeoConfig:
        if self.bench.links and self.launch.emulate is None:
            raise ValueError(
                "bench.links needs emulated nodes to put links between: set launch.emulate "
                "(e.g. {nodes: 2}), or remove bench.links"
            )
        return self

    @property
    def admits_replicas(self) -> bool:
        """L1 replicas apply: the convolution aggregates raw inputs first (not attention), and
        neighbour rows are not rounded (`pipeline.halo_dtype`: an exchanged row is the rounded
        `x·W`, a replica would aggregate the raw `x`). The static aggregate (L1s) needs the
        first only: layer 0 then reads no row per step, on any worker count."""
        return self.model.admits_replicas and not self.pipeline.rounds_rows
