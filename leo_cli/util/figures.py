"""Figures for the run folder's PNGs, drawn without pyplot: a worker that draws one at the
end of a run then does not import pyplot's backend machinery and global figure manager, and
a figure that no manager holds needs no closing."""

from __future__ import annotations

from typing import Any


def figure(**kwargs: Any) -> Any:
    """A matplotlib Figure (its keyword arguments: figsize, ...); `savefig` draws with Agg."""
    from matplotlib.figure import Figure

    return Figure(**kwargs)
