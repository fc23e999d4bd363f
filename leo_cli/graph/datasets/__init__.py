"""Dataset loaders: turn `data.name` into an in-memory `Graph`.

`load_dataset` is the one entry point. Accepted names:

- `synthetic`: the built-in degree-corrected block model (`data.synthetic.*`, seeded by
  `run.seed`);
- `cora`, `citeseer`, `pubmed`: raw Planetoid files under `data.root`;
- `ogbn-arxiv`, `ogbn-products`, `ogbn-papers100M`: OGB folders under `data.root`, offline;
- a path ending in `.npz` (relative to the working directory, or absolute).

Every loader returns a symmetric graph (`symmetrize`) that passes `check_graph`. Dataset cards
with layouts and expected accuracies live in `datasets/<name>.md`.
"""

from __future__ import annotations

from pathlib import Path

from leo_cli.config.schema import DataConfig
from leo_cli.errors import DataError
from leo_cli.graph.types import Graph, ProgressFn, row_normalise

from .npz import load_npz
from .ogb import OGB_DATASETS, load_ogb
from .ogb import canonical_name as ogb_canonical_name
from .ogb import source_files as ogb_source_files
from .planetoid import PLANETOID_NAMES, PLANETOID_PARTS, load_planetoid
from .synthetic import generate

__all__ = ["accepted_names", "load_dataset"]


def accepted_names() -> list[str]:
    """Every dataset name `data.name` accepts (besides a path to a `.npz` file)."""
    return ["synthetic", *PLANETOID_NAMES, *OGB_DATASETS]


def load_dataset(cfg: DataConfig, seed: int, progress: ProgressFn | None = None) -> Graph:
    """Load (or generate) the dataset that `cfg.name` names.

    Args:
        cfg: the `data` config section.
        seed: run seed; only the synthetic generator uses it.
        progress: `(stage, done, total)` callback for loaders with steps worth reporting.

    Returns:
        The graph, symmetric, without self-loops or duplicate edges.

    Raises:
        DataError: the name is unknown or the dataset's files are missing or invalid.
    """
    if cfg.name.lower() in PLANETOID_NAMES:  # normalised from the raw values it reads
        return load_planetoid(cfg.name.lower(), cfg.root, normalizes(cfg))
    graph = _load(cfg, seed, progress)
    if normalizes(cfg):
        graph.x_NF = row_normalise(graph.x_NF)
    return graph


def normalizes(cfg: DataConfig) -> bool:
    """Whether the features are row-normalised (`data.normalize_features`)."""
    if cfg.normalize_features == "auto":
        return cfg.name.lower() in PLANETOID_NAMES
    return bool(cfg.normalize_features)


def _load(cfg: DataConfig, seed: int, progress: ProgressFn | None) -> Graph:
    """The graph as its files hold it (features as given)."""
    name = cfg.name
    if name == "synthetic":
        return generate(cfg.synthetic, seed, progress)
    if name.lower().startswith("ogbn-"):
        return load_ogb(name, cfg.root)
    if name.lower().endswith(".npz"):
        return load_npz(name)
    accepted = ", ".join(f"`{n}`" for n in accepted_names())
    raise DataError(
        f"data.name = {name!r} is not a known dataset: use one of {accepted} "
        "or a path to a `.npz` graph file."
    )


def source_files(cfg: DataConfig) -> list[Path]:
    """The files a dataset is read from, those that exist, for staleness checks.

    Exactly the files the loader reads: none for the synthetic graph, and for OGB neither
    ogb's caches (`processed/`, `split_dict.pt`) nor files LEO does not use.
    """
    name = cfg.name.lower()
    if name == "synthetic":
        return []
    if name in PLANETOID_NAMES:
        files = [cfg.root / f"ind.{name}.{part}" for part in PLANETOID_PARTS]
    elif name.startswith("ogbn-"):
        files = ogb_source_files(ogb_canonical_name(cfg.name), cfg.root)
    else:
        files = [Path(cfg.name).expanduser()]
    return [path for path in files if path.is_file()]
