"""Which kernels serve the leo:: ops: the reference everywhere, plus CUDA kernels when built.

`leo_cli._C` is the extension `leo compile` builds from cuda/. Importing it registers its
kernels for the CUDA dispatch key of the ops in `ops.py`; CPU tensors always use the reference.
The environment variable `LEO_KERNELS` chooses:

- `auto` (default): load `leo_cli._C` when it imports, else stay on the reference;
- `ref` (or `reference`): never load it (the CUDA dispatch key then runs the reference too);
- `cuda`: load it or fail with the reason.

The choice is made once per process, the first time `leo_cli.kernels` is imported (a loaded
extension cannot be unloaded), so set the variable before that.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

from leo_cli.errors import KernelError

ENV_VAR = "LEO_KERNELS"
EXTENSION = "leo_cli._C"
_CHOICES = {"auto": "auto", "ref": "ref", "reference": "ref", "cuda": "cuda"}


@dataclass(frozen=True)
class Backend:
    """The kernels in use: `name` is "cuda" or "reference"; `reason` says why."""

    name: str
    reason: str

    @property
    def has_cuda_kernels(self) -> bool:
        return self.name == "cuda"


_ACTIVE: Backend | None = None


def requested_backend(env: Mapping[str, str] | None = None) -> str:
    """The normalised `LEO_KERNELS` value: "auto", "ref" or "cuda".

    Raises:
        KernelError: the variable holds something else.
    """
    raw = (os.environ if env is None else env).get(ENV_VAR, "auto").strip().lower() or "auto"
    if raw not in _CHOICES:
        raise KernelError(f"{ENV_VAR}={raw!r} is not one of auto, ref, cuda")
    return _CHOICES[raw]


def _import_extension() -> str | None:
    """Import leo_cli._C; None on success, else why it failed."""
    try:
        importlib.import_module(EXTENSION)
    except ModuleNotFoundError:
        return f"{EXTENSION} is not built (run `leo compile` where torch has CUDA)"
    except (ImportError, OSError, RuntimeError) as exc:
        # Built against another torch, or torch here has no CUDA libraries to link. Built but
        # unusable deserves a warning: falling back silently would hide a slowdown.
        reason = f"{EXTENSION} failed to load: {exc}"
        warnings.warn(f"{reason}; using the reference kernels", RuntimeWarning, stacklevel=2)
        return reason
    return None


def select_backend(env: Mapping[str, str] | None = None) -> Backend:
    """Decide (and load) the backend as `LEO_KERNELS` asks.

    Raises:
        KernelError: `LEO_KERNELS=cuda` and the extension does not load, or a bad value.
    """
    choice = requested_backend(env)
    if choice == "ref":
        return Backend("reference", f"{ENV_VAR}=ref")
    failure = _import_extension()
    if failure is None:
        return Backend("cuda", f"{EXTENSION} loaded: CUDA kernels serve CUDA tensors")
    if choice == "cuda":
        raise KernelError(f"{ENV_VAR}=cuda but {failure}")
    return Backend("reference", failure)


def active_backend() -> Backend:
    """The backend of this process, selected on first call."""
    global _ACTIVE
    if _ACTIVE is None:
        _ACTIVE = select_backend()
    return _ACTIVE
