"""The CPU SpMMs of one step, recorded and timed again under each SpMM variant (`variants.py`).

`auto`'s SpMM trials (worker/trials.py) differ only in the SpMM, so they time the SpMMs alone:
one step of the job that trains runs inside `recording()`, which notes every CPU SpMM it makes
(forward and backward: the part's real CSRs, at the widths each layer multiplies), and
`Replay.time` runs those calls again under the variant in use, on inputs of the same shapes
and dtypes (their values do not change the work). A pass is every call once; a variant's time
is the sum over calls of each call's fastest pass (another process's time slice lands in one
pass of one call, not in the sum).

Shape suffixes: E edges, C columns of a CSR, F features.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from leo_cli.kernels.slabs import slab_width

STOP_AFTER = 2  # passes a variant makes before it may be stopped as far off


@dataclass(frozen=True)
class SpmmCall:
    """One CPU SpMM: the CSR's row pointers and column indices (the job's own arrays) and
    the shape and dtype of the x it multiplied."""

    indptr: Tensor
    indices: Tensor
    num_rows: int
    num_cols: int
    width: int
    dtype: torch.dtype

    def slabbed(self) -> bool:
        """Whether `torch-slabs` would cut this call's x into column slabs."""
        itemsize = torch.tensor([], dtype=self.dtype).element_size()
        itemsize = max(itemsize, 4)  # low precision is multiplied in float32
        return slab_width(self.num_cols, self.width, itemsize, shared=False) < self.width


_recorded: list[SpmmCall] | None = None


def note(indptr: Tensor, indices: Tensor, x_CF: Tensor, num_rows: int) -> None:
    """Called by the CPU SpMM (ops.py, cpu.py) for every product it computes."""
    if _recorded is not None and x_CF.device.type == "cpu" and x_CF.dim() == 2:
        num_cols, width = x_CF.shape
        _recorded.append(SpmmCall(indptr, indices, num_rows, num_cols, width, x_CF.dtype))


@contextmanager
def recording() -> Iterator[list[SpmmCall]]:
    """`with recording() as calls:` every CPU SpMM made inside lands in `calls`."""
    global _recorded
    before, calls = _recorded, list[SpmmCall]()
    _recorded = calls
    try:
        yield calls
    finally:
        _recorded = before


class Replay:
    """Recorded calls made again: inputs of their shapes allocated once (values of ones, x
    of uniform numbers from a generator of its own: the torch random state is not touched)."""

    def __init__(self, calls: list[SpmmCall]) -> None:
        self.calls = calls
        self._values: dict[torch.dtype, Tensor] = {}
        self._x: dict[torch.dtype, Tensor] = {}
        rng = torch.Generator().manual_seed(0)
        for dtype in {c.dtype for c in calls}:
            mine = [c for c in calls if c.dtype == dtype]
            num_edges = max(c.indices.numel() for c in mine)
            numel = max(c.num_cols * c.width for c in mine)
            self._values[dtype] = torch.ones(num_edges, dtype=dtype)
            self._x[dtype] = torch.rand(numel, generator=rng).to(dtype)

    def one_pass(self) -> list[float]:
        """Every call once under the variant in use; each call's seconds."""
        from leo_cli.kernels import cpu, ops  # (cpu.py imports this module's callers)

        spmm = cpu._spmm if cpu.loaded() is not None else ops._csr_matmul
        seconds = []
        for c in self.calls:
            values_E = self._values[c.dtype][: c.indices.numel()]
            x_CF = self._x[c.dtype][: c.num_cols * c.width].view(c.num_cols, c.width)
            start = time.perf_counter()
            spmm(c.indptr, c.indices, values_E, x_CF, c.num_rows)
            seconds.append(time.perf_counter() - start)
        return seconds

    def time(
        self,
        passes: int,
        min_s: float = 0.0,
        max_passes: int = 20,
        stop: Callable[[float], bool] = lambda so_far_s: False,
    ) -> tuple[float, int]:
        """The calls' SpMM seconds under the variant in use (the sum of each call's fastest
        pass) over `passes` passes, more while they add up to under `min_s` (at most
        `max_passes`), or the first `STOP_AFTER` alone where `stop` says so of their seconds
        (a variant's first pass is cold: its calls' one-time costs, which the variant the
        calls were recorded with paid then); and the passes made."""
        fastest: list[float] | None = None
        done, spent = 0, 0.0
        while done < passes or (spent < min_s and done < max_passes):
            seconds = self.one_pass()
            fastest = seconds if fastest is None else list(map(min, fastest, seconds))
            done, spent = done + 1, spent + sum(seconds)
            if done == STOP_AFTER and stop(sum(fastest)):
                break
        return sum(fastest or []), done
