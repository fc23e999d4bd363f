"""Imported by the workers' server (launch/preload.py `PRELOAD`): matplotlib's Figure and its
Agg canvas, so that rank 0 draws curves.png at the end of a run without importing them then.
A matplotlib that fails to import here (an unknown MPLBACKEND, ...) is left alone: the rank
that draws imports it again and fails there, with matplotlib's own error, as it would have
without the server."""

from __future__ import annotations

import contextlib

with contextlib.suppress(Exception):
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401
