"""The cache plan: `cache-plan.json` in the run folder, made once, read by every worker.

It holds, per rank, the cache levels (static aggregate, replicated halo positions, halo
positions fetched per edge), the chunk count of every layer (the same on every rank, since
both ends of a transfer must cut it the same way), the predicted stage times, the predicted
step time of every mode, and each rank's predicted step and busy time with their spread
(slowest busy over fastest), so `leo train` can put prediction beside measurement. The
policy's sweep over replicated shares (predicted step against replica bytes) feeds
`cache-plan.png`.

The plan is stale when the partitions, the model's widths or dropout, the policy, the
budgets or the hardware profile change (its `key` covers all of them). Its content is read
as untrusted input: `read_plan` validates every field, `check_fits` the rows and counts
against the run (cache/plan_check.py says why validation rather than a digest).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from leo_cli.cache import plan_check
from leo_cli.cache.access import PartAccess
from leo_cli.cache.cost import ModelShape, RankCache, predict
from leo_cli.cache.hardware import HardwareProfile
from leo_cli.cache.policy import Budgets, decide
from leo_cli.comm.modes import auto_chunk_count
from leo_cli.config.schema import CacheConfig, ModelConfig
from leo_cli.errors import CacheError
from leo_cli.registry import MODES, Mode, conv_of
from leo_cli.util import files

PLAN = "cache-plan.json"
FORMAT_VERSION = 2  # 2: the sweep's points say their share and budget fit; plan_s
OLDER_VERSIONS = (1,)


def model_shape(
    model: ModelConfig, num_features: int, num_classes: int, dtype_bytes: int
) -> ModelShape:
    widths = tuple(model.layer_widths(num_features, num_classes))
    return ModelShape(
        widths, model.dropout, model.effective_input_dropout, dtype_bytes,
        conv_of(model.name).extra_gemm, attention=model.attention,
        rows=tuple(model.row_widths(num_classes)),
    )  # fmt: skip


def budget_bytes(value: float | str, own_bytes: int) -> int:
    """A budget in MiB, or a percentage of the part's own feature bytes ("25%")."""
    if isinstance(value, str):
        return int(float(value.rstrip("%")) / 100.0 * own_bytes)
    return int(value * 2**20)


def budgets(cache: CacheConfig, accesses: list[PartAccess], shape: ModelShape) -> Budgets:
    own = [p.num_inner * shape.widths[0] * shape.dtype_bytes for p in accesses]
    return Budgets(
        [budget_bytes(cache.replica_budget_mb, o) for o in own],
        [budget_bytes(cache.halo_budget_mb, o) for o in own],
    )


def _digest(material: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def graph_inputs(
    partition_meta: dict[str, Any], model: ModelConfig, dtype: str, num_chunks: str | int
) -> str:
    """Digest of what every mode's prediction depends on: partitions, model, dtype and
    `pipeline.num_chunks`."""
    return _digest(
        {
            "format": FORMAT_VERSION,
            "partitions": partition_meta.get("files", partition_meta),
            "model": model.model_dump(mode="json"),
            "dtype": dtype,
            "num_chunks": num_chunks,
        }
    )


def plan_inputs(
    partition_meta: dict[str, Any],
    model: ModelConfig,
    cache: CacheConfig,
    dtype: str,
    num_chunks: str | int,
) -> str:
    """Digest of what the cache levels depend on: the graph inputs and the cache settings.

    Workers check it, so a plan made for other partitions or settings is never used.
    """
    settings = cache.model_dump(mode="json", exclude={"hardware"})
    graph = graph_inputs(partition_meta, model, dtype, num_chunks)
    return _digest({"graph": graph, "cache": settings})


def plan_key(inputs: str, hw: HardwareProfile) -> str:
    """Staleness key: the plan's inputs and the hardware profile it was predicted with."""
    return _digest({"inputs": inputs, "hardware": hw.fingerprint()})


@dataclass
class CachePlan:
    """What `cache-plan.json` holds (see the module docstring)."""

    key: str
    inputs: str
    graph_inputs: str
    policy: str
    caches: list[RankCache]
    num_chunks: list[int]
    predicted: dict[str, float | None]
    stages: dict[str, dict[str, float]]
    bytes_per_level: list[dict[str, int]]
    sweep: list[dict[str, float | bool]]
    replica_budget_mb: float
    plan_s: float | None = None  # seconds it took to make (accesses, policy, plot)
    ranks_s: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    """Per mode, each rank's predicted `step_s` and `busy_s` (cost.Prediction.per_rank)."""

    def spread(self) -> dict[str, float]:
        """Per mode, the slowest rank's predicted busy time over the fastest's."""
        out = {}
        for mode, ranks in self.ranks_s.items():
            busy = [r["busy_s"] for r in ranks if "busy_s" in r]
            if busy and min(busy) > 0:
                out[mode] = max(busy) / min(busy)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "key": self.key,
            "inputs": self.inputs,
            "graph_inputs": self.graph_inputs,
            "policy": self.policy,
            "num_chunks": self.num_chunks,
            "predicted_epoch_time_s": self.predicted,
            "predicted_stages_s": self.stages,
            "ranks": [
                {
                    "rank": r,
                    "static_aggregate": c.static_aggregate,
                    "replica_rows": c.replica_rows.tolist(),
                    "l3_rows": c.l3_rows.tolist(),
                    "bytes_per_level": self.bytes_per_level[r],
                }
                for r, c in enumerate(self.caches)
            ],
            "replica_budget_sweep": self.sweep,
            "replica_budget_mb": self.replica_budget_mb,
            "plan_s": self.plan_s,
            "predicted_ranks_s": self.ranks_s,
            "predicted_rank_spread": self.spread(),
        }

    @classmethod
    def from_json(cls, data: Any, path: Path) -> CachePlan:
        """The plan in `data`, validated as untrusted input (cache/plan_check.py).

        Raises:
            CacheError: naming the file and the first field that is wrong.
        """
        try:
            f = plan_check.parse(data)
        except ValueError as exc:
            raise invalid(path, str(exc)) from None
        caches = [
            RankCache(
                r.static_aggregate,
                np.asarray(r.replica_rows, dtype=np.int64),
                np.asarray(r.l3_rows, dtype=np.int64),
            )
            for r in f.ranks
        ]
        return cls(
            f.key, f.inputs, f.graph_inputs, f.policy, caches, list(f.num_chunks),
            {k: None if v is None else float(v) for k, v in f.predicted_epoch_time_s.items()},
            {m: {k: float(v) for k, v in st.items()} for m, st in f.predicted_stages_s.items()},
            [r.bytes_per_level.model_dump() for r in f.ranks],
            [p.model_dump() for p in f.replica_budget_sweep],
            float(f.replica_budget_mb), f.plan_s,
            {m: [dict(r) for r in ranks] for m, ranks in f.predicted_ranks_s.items()},
        )  # fmt: skip

    def check_fits(
        self, path: Path, halo_sizes: list[int], num_layers: int, attention: bool
    ) -> None:
        """Refuse a plan that does not fit the run (see `plan_check.fit_problem`).

        Raises:
            CacheError: naming the file and the field.
        """
        ranks = [(c.static_aggregate, c.replica_rows, c.l3_rows) for c in self.caches]
        problem = plan_check.fit_problem(ranks, self.num_chunks, halo_sizes, num_layers, attention)
        if problem is not None:
            raise invalid(path, problem)


def invalid(path: Path, problem: str) -> CacheError:
    """The one sentence for a plan that cannot be used."""
    return CacheError(
        f"{path} is not a cache plan LEO can use ({problem}); delete it and run leo "
        "profile-cache (leo train makes a new one itself)."
    )


def _seconds(value: Any) -> float | None:
    """A recorded duration: a finite number >= 0, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9:
        raise ValueError(f"plan_s must be seconds, not {value!r}")
    return float(value)


def bytes_per_level(p: PartAccess, c: RankCache, shape: ModelShape) -> dict[str, int]:
    """Bytes this rank holds at L1 (replicas, static aggregate) and receives per step at L2/L3."""
    l3 = np.zeros(p.num_halo, dtype=bool)
    l3[c.l3_rows] = True
    l1 = np.zeros(p.num_halo, dtype=bool)
    l1[c.replica_rows] = True
    per_step_l2 = per_step_l3 = 0
    for layer in range(shape.num_layers):
        if layer == 0 and c.static_aggregate:
            continue
        a, b = shape.widths[layer], shape.widths[layer + 1]
        # Rows forward, gradients backward, except layer 0 aggregating first: its input
        # needs no gradient, so nothing flows back.
        directions = 1 if layer == 0 and b >= a else 2
        w = shape.exchanged_width(layer) * shape.dtype_bytes * directions
        skip = l1 if layer == 0 else np.zeros_like(l1)
        per_step_l2 += int((~l3 & ~skip).sum()) * w
        per_step_l3 += int(p.reuse_H[l3 & ~skip].sum()) * w
    row_in = shape.widths[0] * shape.dtype_bytes
    return {
        "L1_replica_bytes": int(l1.sum()) * row_in,
        "L1s_static_bytes": p.num_inner * row_in if c.static_aggregate else 0,
        "L2_bytes_per_step": per_step_l2,
        "L3_bytes_per_step": per_step_l3,
    }


def make_plan(
    cache: CacheConfig,
    accesses: list[PartAccess],
    shape: ModelShape,
    hw: HardwareProfile,
    keys: tuple[str, str, str],
    num_chunks: str | int = "auto",
) -> CachePlan:
    """Run the policy (which also gives the replica sweep for the plot), predict every mode
    with the chunk counts it will run (`num_chunks`: the `pipeline.num_chunks` setting).

    `keys` are the plan's (key, inputs, graph_inputs) digests.
    """
    b = budgets(cache, accesses, shape)
    decision = decide(cache.policy, accesses, shape, b, hw, cache.static_aggregate)
    if num_chunks != "auto":  # a set count serves every layer (and the plan says so)
        decision.num_chunks = [int(num_chunks)] * shape.num_layers
    none = [RankCache() for _ in accesses]
    predicted: dict[str, float | None] = {}
    stages: dict[str, dict[str, float]] = {}
    ranks_s: dict[str, list[dict[str, float]]] = {}
    for name, mode in MODES.items():
        caches = decision.caches if mode.planned else none
        chunks = chunks_run(mode, decision.num_chunks, num_chunks, accesses, shape)
        try:
            pred = predict(accesses, caches, shape, hw, name, chunks)
        except CacheError:  # the profile lacks that link (e.g. shared memory across hosts)
            predicted[name] = None
            continue
        predicted[name], stages[name] = pred.epoch_time_s, pred.stages
        ranks_s[name] = [{"step_s": t["step_s"], "busy_s": t["busy_s"]} for t in pred.per_rank]
    return CachePlan(
        *keys, cache.policy, decision.caches, decision.num_chunks, predicted, stages,
        [bytes_per_level(p, c, shape) for p, c in zip(accesses, decision.caches, strict=True)],
        decision.sweep, max(b.replica_bytes) / 2**20, ranks_s=ranks_s,
    )  # fmt: skip


def chunks_run(
    mode: Mode,
    planned: list[int],
    setting: str | int,
    accesses: list[PartAccess],
    shape: ModelShape,
) -> list[int]:
    """The chunk counts a run of `mode` cuts its transfers into (train/assemble.py
    chunk_counts): none for a mode that does not chunk; the `pipeline.num_chunks` setting; the
    plan's; or for a mode run without a plan (cache.policy none) the 4 MiB heuristic of
    comm/modes.py, whose count every worker agrees on (the largest)."""
    if not mode.chunks:
        return [1]
    if setting != "auto" or mode.cache_policy != "none":
        return planned
    width = max(shape.exchanged_width(layer) for layer in range(shape.num_layers))
    rows = max(max([*p.send_counts, *p.recv_counts, 0]) for p in accesses)
    return [auto_chunk_count(rows * width * shape.dtype_bytes)]


def write_plan(run_dir: Path, plan: CachePlan) -> Path:
    """Write cache-plan.json atomically (a fresh temporary file, then a rename).

    Raises:
        CacheError: the run folder cannot hold it (no space, or the name is a folder).
    """
    path = run_dir / PLAN
    try:
        files.write_text(path, files.json_text(plan.to_json()))
    except OSError as exc:
        raise CacheError(
            f"cannot write {path} ({exc.strerror or exc}); remove what is there or choose "
            "another run.out_dir."
        ) from None
    return path


def read_plan(run_dir: Path) -> CachePlan | None:
    """The run folder's plan, validated, or None when there is none (or an earlier LEO's).

    Raises:
        CacheError: it is not a regular file, not UTF-8 JSON, or not a valid plan.
    """
    path = run_dir / PLAN
    if not path.exists():
        return None
    if not path.is_file():
        raise CacheError(f"{path} is not a file; remove it and run leo profile-cache.")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 JSON"
        raise CacheError(
            f"cannot read {path} ({reason}); delete it and run leo profile-cache."
        ) from None
    if isinstance(data, dict) and data.get("format_version") in OLDER_VERSIONS:
        return None  # made by an earlier LEO: made again, like a missing one
    return CachePlan.from_json(data, path)
