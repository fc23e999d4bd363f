"""The server `leo train`'s workers fork from (launch/preload.py), started as the run begins,
before this process imports torch, so that the two import it side by side.

The server must run in the environment its workers get (the CPU library's folder, the
allocator's preload, numpy's threads), which set-up knows only once it has looked for them (the
`preload` stage, `elastic.start_early`). That stage writes down the difference between the
environment the run began in and the one its server got, keyed by what decides it (the launch
settings, the worker count and threads, the variables of the environment set-up reads, the
working directory, torch's and Python's installs, what the server imports); a later run with
the same key starts its server in that environment first. The `preload` stage then asks for its
server as before: in the same environment it is the one already importing, in another it is
replaced (`preload.ensure_server` compares them), so a wrong guess costs time, never a worker
in the wrong environment.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from leo_cli.config import LeoConfig
from leo_cli.launch import preload
from leo_cli.util import files

FOLDER = "worker-server"  # in the run's cache: one record per key
KEEP = 16  # records kept in a cache, the newest
# What of the environment a run begins in decides what set-up adds for its server: LEO's own
# settings, the allocator's, threads, the compiler and the paths it is found and loaded from.
KEYED_PREFIXES = ("LEO_", "LD_", "MALLOC", "OMP_", "MKL_", "KMP_", "THP_", "TORCH", "CUDA")
KEYED = ("PATH", "PYTHONPATH", "CC", "CXX")

# This process's run: its key and the environment it began in (None: no run through `server`).
_began: tuple[str, dict[str, str]] | None = None


@contextlib.contextmanager
def server(cfg: LeoConfig, cache_dir: Path) -> Iterator[None]:
    """Within: a run of `cfg` whose cache is `cache_dir`. Its server is started now where an
    earlier run with the same key wrote down its environment; the `preload` stage writes it
    down (`remember`). A run that fails stops a server started during it where none of its
    workers runs any more (not left importing for nobody)."""
    global _began
    began = _environment()
    key = _key(cfg, began)
    _began = (key, began)
    before = preload.server_pid()
    try:
        if cfg.launch.emulate is None:  # emulated nodes launch their own, as their own runs
            _start(_record(cache_dir, key))
        yield
    except BaseException:
        if preload.server_pid() not in (None, before):  # started during this run
            preload.stop_idle()
        raise
    finally:
        _began = None


def remember(cache_dir: Path, library: Path | None) -> None:
    """Write down the environment of the server this process runs (after the `preload` stage
    started or kept it) for later runs with this run's key, and the CPU library it loads
    (`library`: a later run starts no server before it exists again); nothing outside
    `server`."""
    held = preload.held_environment()
    if _began is None or held is None:
        return
    key, began = _began
    env, modules = held
    record = {
        "set": {k: v for k, v in env.items() if began.get(k) != v},
        "unset": sorted(k for k in began if k not in env),
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "modules": list(modules),
        "requires": [] if library is None else [str(library)],
    }
    path = _record(cache_dir, key)
    with contextlib.suppress(OSError):  # a cache it cannot write: no early start next time
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_json(path, record)
        for old in sorted(path.parent.glob("*.json"), key=_age)[KEEP:]:
            old.unlink(missing_ok=True)


def _age(path: Path) -> float:
    try:
        return -path.stat().st_mtime
    except OSError:
        return 0.0


def _start(path: Path) -> bool:
    """Start the server in the environment `path` wrote down; nothing where there is no
    record, an unreadable one, or the files it needs are gone (a server that imported LEO
    without its CPU library would keep the reference kernels), or the server cannot start."""
    try:
        record = json.loads(path.read_text())
        env = {str(k): str(v) for k, v in record["set"].items()}
        unset = [str(k) for k in record["unset"]]
        threads, modules = record["threads"], [str(m) for m in record["modules"]]
        required = [Path(str(p)) for p in record["requires"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    if not all(p.is_file() for p in required):
        return False
    saved = dict(os.environ)
    try:
        os.environ.update(env)
        for k in unset:
            os.environ.pop(k, None)
        if threads is not None:
            os.environ["OMP_NUM_THREADS"] = str(threads)
        return preload.ensure_server(*modules)
    except OSError:  # no process to start now: the `preload` stage starts one as before
        return False
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _environment() -> dict[str, str]:
    """This process's environment as the server compares it."""
    return preload.server_environment(os.environ)


def _key(cfg: LeoConfig, began: dict[str, str]) -> str:
    torch = importlib.util.find_spec("torch")
    origin = Path(torch.origin) if torch is not None and torch.origin else None
    installed = [str(origin), origin.stat().st_mtime_ns] if origin and origin.exists() else None
    keyed = {k: v for k, v in began.items() if k.startswith(KEYED_PREFIXES) or k in KEYED}
    material: dict[str, Any] = {
        "launch": cfg.launch.model_dump(mode="json"),
        "parts": cfg.partition.num_parts,
        "env": sorted(keyed.items()),
        "threads": [os.environ.get("OMP_NUM_THREADS"), os.cpu_count()],  # the workers' threads
        "cwd": os.getcwd(),
        "torch": installed,
        "python": [sys.executable, sys.version],
        "path": sys.path,
        "imports": preload.PRELOAD,  # a record of a server that imported others is not this one's
    }
    return hashlib.sha256(files.json_text(material).encode()).hexdigest()[:16]


def _record(cache_dir: Path, key: str) -> Path:
    return Path(cache_dir) / FOLDER / f"{key}.json"
