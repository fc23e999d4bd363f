"""`leo bench`: LEO's modes and PyG's peers interleaved over rounds, their statistics and the
report (table, CSV, JSON, plots).

The package is callable: `from leo_cli import bench; bench(config, overrides)` runs a benchmark
(leo_cli/api.py), whether or not its modules were imported before.
"""

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from leo_cli.api import bench

        return bench(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
