"""Which CPU SpMM serves CPU tensors in this process (`pipeline.spmm`): a kernel variant.

Several SpMMs compute the same sums for CPU tensors, at speeds that depend on the CPU, its
cache and the graph: LEO's own (`leo`, `cpu.py`, where the library is loaded), torch's CSR
SpMM (`torch`: MKL's where torch has it), and torch's in column slabs that each fit a share
of the last-level cache (`torch-slabs`, `slabs.py`). `auto` is the rule without a measurement:
LEO's where loaded, else torch's, in slabs for a process alone on its host whose x is larger
than the cache share. `auto`'s trials (worker/trials.py) time the variants that apply and set
the fastest here. The variants compute the same sums, up to their order (MKL may order a
row's sum by the width it computes; the test tolerance of tests/kernels/test_slabs.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from leo_cli.errors import KernelError

AUTO = "auto"
LEO = "leo"
TORCH = "torch"
TORCH_SLABS = "torch-slabs"
VARIANTS = (AUTO, LEO, TORCH, TORCH_SLABS)

_current = AUTO
_slabs_taken = False  # whether a torch-slabs SpMM cut x into slabs since the last reset


def set_cpu_spmm(name: str) -> None:
    """Serve CPU SpMMs with `name` from now on.

    Raises:
        KernelError: `leo` where LEO's CPU library is not loaded, or an unknown name.
    """
    global _current
    from leo_cli.kernels import cpu

    if name not in VARIANTS:
        raise KernelError(f"pipeline.spmm={name!r} is not one of {', '.join(VARIANTS)}")
    if name == LEO and cpu.loaded() is None:
        raise KernelError(
            "pipeline.spmm=leo but LEO's CPU kernels are not loaded in this process "
            f"({cpu.unbuilt_reason()}); set pipeline.spmm=auto or torch"
        )
    _current = name


@contextmanager
def serving(name: str) -> Iterator[None]:
    """`with serving(name):` CPU SpMMs inside use `name`; the variant before, after."""
    before = _current
    set_cpu_spmm(name)
    try:
        yield
    finally:
        set_cpu_spmm(before)


def cpu_spmm() -> str:
    """The variant serving CPU SpMMs (`auto` where none was set)."""
    return _current


def uses_torch() -> bool:
    """Whether torch's CSR SpMM serves, also where LEO's library is loaded."""
    return _current in (TORCH, TORCH_SLABS)


def note_slabs() -> None:
    """Called by an SpMM that cut x into column slabs."""
    global _slabs_taken
    _slabs_taken = True


def slabs_taken(reset: bool = False) -> bool:
    """Whether some SpMM cut x into slabs since the last reset (then reset, if asked): a
    `torch-slabs` trial where none did runs as `torch` does."""
    global _slabs_taken
    taken = _slabs_taken
    if reset:
        _slabs_taken = False
    return taken
