"""Wisdom: what `auto`'s trials measured, kept in the cache so that a later run with the same
inputs trains the winner at once (FFTW's wisdom, cuDNN's benchmark cache).

One file per key, `<cache>/wisdom/<key>.json`. The key (`wisdom_key`) covers what decides the
trials: the partitions and the plan (graph, parts, model, cache settings, hardware profile),
the model's shape and dtypes, the halo dtype and transport, the workers and their placement,
this host, torch and the kernels, and the candidates. The parent computes it and reads the
file (`read_wisdom`); rank 0 of the workers writes it after the trials (`write_wisdom`).

Specification: docs/design/planning.md.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from leo_cli.config import LeoConfig
from leo_cli.errors import CacheError
from leo_cli.util import files

FORMAT_VERSION = 1
FOLDER = "wisdom"
# Launch settings that change how fast a candidate runs (not where the run folder is).
PLACEMENT_KEYS = (
    "nproc", "nnodes", "device", "backend", "cpu_affinity", "allocator", "keep_freed_memory",
    "huge_pages", "emulate",
)  # fmt: skip


@dataclass(frozen=True)
class Wisdom:
    """What trials measured: the winning candidate, every candidate's median step (None:
    stopped early), why some were not tried or stopped, and the rule the winner won by."""

    key: str
    winner: str
    rule: str
    measured_s: dict[str, float | None]
    notes: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "key": self.key,
            "winner": self.winner,
            "rule": self.rule,
            "measured_s": self.measured_s,
            "notes": self.notes,
            "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }


def wisdom_key(cfg: LeoConfig, inputs: list[str], kernels: str, names: list[str]) -> str:
    """The digest of what decides a run's trials (see the module docstring). `inputs`: the
    partitions' and plan's digests (graph, cache settings, hardware profile); `kernels`: the
    kernel backend's name; `names`: the candidates, in the order they are tried."""
    launch = cfg.launch.model_dump(mode="json")
    material = {
        "format": FORMAT_VERSION,
        "inputs": inputs,
        "model": cfg.model.model_dump(mode="json"),
        "dtype": cfg.train.dtype,
        "pipeline": cfg.pipeline.model_dump(
            mode="json", include={"halo_dtype", "transport", "num_chunks", "trial_steps"}
        ),
        "parts": cfg.partition.num_parts,
        "launch": {k: launch[k] for k in PLACEMENT_KEYS},
        "host": [platform.node(), platform.machine(), platform.processor()],
        "torch": torch.__version__,
        "kernels": kernels,
        "candidates": names,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def wisdom_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / FOLDER / f"{key}.json"


def read_wisdom(path: Path, names: list[str]) -> Wisdom | None:
    """The wisdom kept at `path`, or None where there is none.

    Raises:
        CacheError: the file is there but is not wisdom for this key and these candidates
            (unreadable, edited, another LEO's): one sentence naming it.
    """
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        wisdom = Wisdom(
            key=str(data["key"]),
            winner=str(data["winner"]),
            rule=str(data["rule"]),
            measured_s={
                str(k): None if v is None else float(v) for k, v in dict(data["measured_s"]).items()
            },  # fmt: skip
            notes={str(k): str(v) for k, v in dict(data.get("notes") or {}).items()},
        )
        version = data["format_version"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
        raise CacheError(f"{path} is not readable wisdom ({type(exc).__name__})") from None
    if version != FORMAT_VERSION or wisdom.key != path.stem:
        raise CacheError(f"{path} was written for another key or by another LEO")
    if wisdom.winner not in names or wisdom.measured_s.get(wisdom.winner) is None:
        raise CacheError(f"{path} names a winner ({wisdom.winner!r}) that was not measured here")
    return wisdom


def write_wisdom(path: Path, wisdom: Wisdom) -> None:
    """Keep `wisdom` at `path` (atomic: a reader sees the old file or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_json(path, wisdom.to_json())
