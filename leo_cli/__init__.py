"""LEO: pipelined full-graph GNN training with hierarchical caching.

`from leo_cli import train, bench` runs what `leo train` and `leo bench` run (leo_cli/api.py);
they load on first use, so a worker process importing the package loads neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["RunSummary", "__version__", "bench", "train"]

if TYPE_CHECKING:
    from leo_cli.api import RunSummary, train


def __getattr__(name: str) -> Any:
    if name in ("train", "RunSummary"):
        from leo_cli import api

        return getattr(api, name)
    if name == "bench":  # the subpackage, callable (leo_cli/bench/__init__.py)
        import importlib

        return importlib.import_module("leo_cli.bench")
    raise AttributeError(f"module 'leo_cli' has no attribute {name!r}")
