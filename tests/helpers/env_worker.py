"""A stand-in worker module for launch tests: `main([dir, code])` writes what its process sees
to `<dir>/<pid>.json` and returns `code` (`raise`: raises instead)."""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import torch

from leo_cli.comm.segments import JOB_ENV


def main(argv: list[str]) -> int:
    seen = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "sid": os.getsid(0),
        "cwd": os.getcwd(),
        "threads": torch.get_num_threads(),
        "rank": os.environ.get("RANK"),
        "job": os.environ.get(JOB_ENV),
        "mark": os.environ.get("LEO_TEST_MARK"),
        "argv": sys.argv[1:],
        "cli": sorted(m for m in sys.modules if m.startswith("leo_cli.cli")),
        "frozen": gc.get_freeze_count(),  # objects a collection leaves alone
        "drawing": {"matplotlib.figure", "matplotlib.backends.backend_agg"} <= set(sys.modules),
    }
    Path(argv[0], f"{os.getpid()}.json").write_text(json.dumps(seen))
    if argv[1] == "raise":
        raise RuntimeError("a worker's own error")
    return int(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
