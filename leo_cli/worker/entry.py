"""The rank side of `leo train`: `python -m leo_cli.worker.entry <run folder> [--resume]`.

Runs under the elastic agent that `leo train` starts (forked from the launcher's server,
harness/process.py `run_started` calls `main`), or under plain `torchrun`. Inside the rank
harness (heartbeat, pinning, a user error as one sentence), a `Trainer` (worker/trainer.py)
is built and trains; global rank 0 writes the summary and curves at the end.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import NoReturn

from torch.distributed.elastic.multiprocessing.errors import record

from leo_cli.harness.process import Harness, leave
from leo_cli.run_dir import RunDir
from leo_cli.worker.memory import fix_mmap_threshold
from leo_cli.worker.trainer import Trainer, WorkerArgs


def parse_args(argv: list[str] | None = None) -> WorkerArgs:
    """The worker's command line (the elastic entry passes it on: leo_cli/elastic/entry.py)."""
    parser = argparse.ArgumentParser(prog="python -m leo_cli.worker.entry")
    parser.add_argument("run_dir", type=Path, help="run folder holding resolved_config.yaml")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument(
        "--allow-inexact",
        action="store_true",
        help="allow an inexact pipeline.mode such as compute-only (for leo bench)",
    )
    parser.add_argument(
        "--config-sha", help="fingerprint of the launcher's config (default: the run folder's)"
    )
    parser.add_argument(
        "--launched-at",
        type=float,
        help="wall-clock time the launcher started the workers (set-up accounting)",
    )
    a = parser.parse_args(argv)
    return WorkerArgs(a.run_dir, a.resume, a.allow_inexact, a.config_sha, a.launched_at,
                      entered_at=time.time())  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Train this rank's part; the exit code (3: a user error, said in the run's .errors)."""
    args = parse_args(argv)
    fix_mmap_threshold()  # before set-up's large temporaries come and go (worker/memory.py)
    with Harness(heartbeat_dir=args.run_dir, errors_dir=RunDir(args.run_dir).errors) as rank:
        trainer = Trainer(args, rank.env)
        trainer.train()
        trainer.finish()
    return rank.code


@record
def entry() -> NoReturn:
    leave(main())


if __name__ == "__main__":
    entry()
