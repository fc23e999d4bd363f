"""partitions/META.json as untrusted input: the fields LEO reads, checked before any is used.

Every part file is checked against the sha256 META.json lists for it, but META.json itself is
a plain file: a hand edit, a copy cut short or a file of another tool must stop a run with one
sentence naming the field, not with a KeyError or a TypeError deep in a worker. Checked here:
the counts LEO computes with (whole, non-negative numbers; not `true`), one list entry per
part in `stats`, and a file list that names exactly the arrays of every part
(`part_<r>/<array>.npy`, r below `num_parts`, each with a 64-hex-digit sha256): nothing else
is ever opened through it. Fields LEO only shows (timings, peaks) need to be numbers.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from leo_cli.graph.layout import LocalPart
from leo_cli.util.strict import Finite

Count = Annotated[StrictInt, Field(ge=0)]
Positive = Annotated[StrictInt, Field(ge=1)]
Share = Annotated[Finite, Field(gt=0, le=1)]
Digest = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]
ARRAYS = frozenset(
    f.name for f in dataclasses.fields(LocalPart) if f.name not in ("rank", "num_parts")
)
_FILE = re.compile(r"^part_(0|[1-9][0-9]*)/([a-z_]+)\.npy$")


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class DatasetMeta(_Open):
    name: StrictStr
    num_nodes: Positive
    num_edges: Count
    num_features: Positive
    num_classes: Positive
    num_train: Positive


class StatsMeta(_Open):
    nodes: list[Count]
    edges: list[Count]
    halo_nodes: list[Count]
    edge_cut: Count
    num_undirected_edges: Count
    edge_cut_fraction: Finite
    balance: Finite
    node_balance: Finite
    replication_factor: Finite


class MetisMeta(_Open):
    edge_fraction: Share
    requested_edge_fraction: Share
    memory_limit_gb: Finite | None
    projected_gb: Finite
    exact_projected_gb: Finite
    feature_bytes: Count
    sampling: StrictStr | None = None


class VertexWeightsMeta(_Open):
    """What a node weighed (graph/partitioners.py `WorkMeasure`)."""

    rule: Literal["degree", "cost"]
    per_node: Annotated[Finite, Field(gt=0)]
    per_edge: Annotated[Finite, Field(ge=0)]


class StorageMeta(_Open):
    """What the storage layer reads: the part count and the file list."""

    format_version: Literal[1]
    num_parts: Annotated[StrictInt, Field(ge=1, le=4096)]
    files: dict[str, Digest]

    @model_validator(mode="after")
    def _files_per_part(self) -> StorageMeta:
        found: dict[int, set[str]] = {r: set() for r in range(self.num_parts)}
        for rel in self.files:
            m = _FILE.match(rel)
            if m is None or m.group(2) not in ARRAYS or int(m.group(1)) >= self.num_parts:
                raise ValueError(f"files: {rel!r} is not an array of one of the parts")
            found[int(m.group(1))].add(m.group(2))
        for r, names in found.items():
            if names != ARRAYS:
                missing = ", ".join(sorted(ARRAYS - names))
                raise ValueError(f"files: part_{r} lacks {missing}")
        return self


class Meta(StorageMeta):
    """Everything the partition stage writes and the other stages read."""

    method: StrictStr
    seed: Count
    source_key: StrictStr
    dataset: DatasetMeta
    stats: StatsMeta
    metis: MetisMeta | None = None
    part_weights: list[Share] | None = None
    """Target share of every part (null: equal parts)."""
    vertex_weights: VertexWeightsMeta | None = None
    """The rule of METIS's vertex weights and the measure of `achieved_shares` (absent in
    partitions written before it: the degree rule)."""
    achieved_shares: list[Annotated[Finite, Field(ge=0, le=1)]] | None = None
    """Share of every part in `vertex_weights`' measure (degree rule: nodes plus in-edges)."""
    achieved_node_shares: list[Annotated[Finite, Field(ge=0, le=1)]] | None = None
    """Share of every part in nodes."""
    owners_sha256: Digest | None = None
    timings_s: dict[str, Finite] = {}
    peak_rss_gb: dict[str, Finite] = {}

    @model_validator(mode="after")
    def _per_part(self) -> Meta:
        for name in ("nodes", "edges", "halo_nodes"):
            if len(getattr(self.stats, name)) != self.num_parts:
                raise ValueError(f"stats.{name} must hold one count per part ({self.num_parts})")
        for name in ("part_weights", "achieved_shares", "achieved_node_shares"):
            values = getattr(self, name)
            if values is not None and len(values) != self.num_parts:
                raise ValueError(f"{name} must hold one share per part ({self.num_parts})")
        return self


def meta_problem(meta: Any, stage: bool = True) -> str | None:
    """What is wrong with META.json's content (one phrase naming the field), or None.

    `stage=False` checks only what the storage layer reads (`read_part`: the part count and
    the file list), for partitions written without the stage's sections.
    """
    try:
        (Meta if stage else StorageMeta).model_validate(meta)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        shown = f", got {value!r}" if isinstance(value, str | int | float | bool) else ""
        return f"{where}: {message}{shown}" if where else message
    return None
