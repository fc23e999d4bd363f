"""What a built CUDA library records about itself, and whether it belongs to this checkout.

`leo compile` (leo_cli/kernel_tools/build.py) writes a stamp beside `leo_cli/_C*.so`: the
fingerprint of the sources under cuda/, torch, CUDA and the architectures it was built for, and
the library's identity. The runtime (kernels/backend.py) reads it before importing a library,
so a library built from other sources or for another torch is not even loaded. Runtime only:
nothing here builds.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from leo_cli.errors import KernelError
from leo_cli.util.files import sha256_file


def package_dir() -> Path:
    """The leo_cli package folder (where leo_cli/_C*.so goes)."""
    return Path(__file__).resolve().parents[1]


def cuda_source_dir() -> Path:
    """cuda/ beside the package (a repository checkout or editable install), or $LEO_CUDA_DIR.

    Raises:
        KernelError: the folder or its include/ and kernels/ subfolders are missing.
    """
    env = os.environ.get("LEO_CUDA_DIR")
    cuda_dir = Path(env) if env else package_dir().parent / "cuda"
    if not (cuda_dir / "include").is_dir() or not (cuda_dir / "kernels").is_dir():
        raise KernelError(
            f"CUDA sources not found at {cuda_dir} (need include/ and kernels/); `leo compile` "
            "runs from a repository checkout (pip install -e .) or with LEO_CUDA_DIR set"
        )
    return cuda_dir


SOURCE_SUFFIXES = (".cu", ".cuh", ".h", ".hpp", ".cpp")


def hash_sources(cuda_dir: Path, subfolders: tuple[str, ...], meta: str) -> str:
    """sha256 of the source files under `cuda_dir`'s `subfolders` (paths and contents, in a
    fixed order) and of `meta` (the build inputs that are not files)."""
    digest = hashlib.sha256()
    for sub in subfolders:
        for path in sorted((cuda_dir / sub).rglob("*")):
            if path.is_file() and path.suffix in SOURCE_SUFFIXES:
                relative = path.relative_to(cuda_dir).as_posix()
                digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(meta.encode())
    return digest.hexdigest()


def source_fingerprint(cuda_dir: Path, archs: str) -> str:
    """sha256 of the sources under include/, kernels/ and binding/ plus the build inputs."""
    meta = f"torch={torch.__version__};cuda={torch.version.cuda};archs={archs};py={sys.version}"
    return hash_sources(cuda_dir, ("include", "kernels", "binding"), meta)


def installed_extensions(pkg: Path) -> list[Path]:
    """Built copies of leo_cli._C in the package folder."""
    return sorted(p for p in pkg.glob("_C*") if p.suffix in (".so", ".pyd"))


STAMP = "_C.stamp.json"


def stamp_path(pkg: Path) -> Path:
    """Where `leo compile` records what it built: beside the library, so the record travels
    and disappears with it (git-ignored)."""
    return pkg / STAMP


def read_stamp(stamp: Path) -> dict[str, object] | None:
    """The stamp's record, or None when it is missing or unreadable."""
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return recorded if isinstance(recorded, dict) else None


def is_recorded_library(lib: Path, recorded: dict[str, object]) -> bool:
    """Whether `lib` is the library the stamp describes. Same name, size and modification time
    settle it without reading the file (every process checks); otherwise its sha256 does."""
    stat = lib.stat()
    quick = (lib.name, stat.st_size, stat.st_mtime_ns)
    if quick == (
        recorded.get("library"),
        recorded.get("library_size"),
        recorded.get("library_mtime_ns"),
    ):
        return True
    return recorded.get("library_sha256") == sha256_file(lib)
