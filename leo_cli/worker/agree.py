"""What every rank checks before set-up's first collective: that all ranks start alike.

One all-gather compares every rank's config fingerprint (with the cache plan's bytes and
`auto`'s candidates folded in), halo counts, resume epoch and loaded checkpoint; mismatched
ranks fail with a sentence instead of hanging in the first exchange.
"""

from __future__ import annotations

import hashlib

import torch

from leo_cli.comm.dist import DistEnv, all_gather_
from leo_cli.comm.exchange import HaloPlan
from leo_cli.config import LeoConfig
from leo_cli.config.load import PER_NODE_KEYS
from leo_cli.errors import TrainError
from leo_cli.registry import mode_of, planned_mode
from leo_cli.run_dir import RunDir


def check_same_host(cfg: LeoConfig, env: DistEnv) -> None:
    """A one-host mode reaches only the workers of one host (what torchrun says, not the
    config)."""
    if mode_of(cfg.pipeline.mode).one_host and env.local_world_size != env.world_size:
        raise TrainError(
            f"pipeline.mode={cfg.pipeline.mode} needs every worker on one host, but "
            f"{env.world_size - env.local_world_size} run elsewhere; use pipeline.mode="
            f"{planned_mode()}."
        )


def with_plan(fingerprint: str, cfg: LeoConfig, run: RunDir) -> str:
    """The config fingerprint combined with the cache plan's bytes, read raw (not parsed: a
    rank whose copy is bad must fail with the others, in the cross-check): every rank must
    train with the same plan (both ends of a transfer cut it the same way)."""
    if not cfg.cache.enabled or not run.plan.is_file():
        return fingerprint
    return hashlib.sha256(bytes.fromhex(fingerprint) + run.plan.read_bytes()).hexdigest()


def with_trials(fingerprint: str, trials: list[str]) -> str:
    """The fingerprint combined with the candidates to try: every rank must try the same."""
    if not trials:
        return fingerprint
    return hashlib.sha256(bytes.fromhex(fingerprint) + "\n".join(trials).encode()).hexdigest()


def check_consistent(
    plan: HaloPlan, fingerprint: str, start: int, loaded: bytes = bytes(32)
) -> list[int]:
    """Cross-check every rank's config, halo counts, resume epoch and the digest of the
    checkpoint it loaded (`run_dir.checkpoint_digest`) in one all-gather; returns every rank's
    halo size (what the cache plan's rows are checked against).

    A node started with another config would silently train node 0's; ranks that read
    different partitions (a stale folder on one host) would run an inconsistent all-to-all;
    ranks resuming from different checkpoints would train different models.
    """
    p = len(plan.send_counts)
    digests = [bytearray(bytes.fromhex(fingerprint)), bytearray(loaded)]
    digest = torch.cat([torch.frombuffer(d, dtype=torch.int64) for d in digests])
    mine = torch.tensor([*plan.send_counts, *plan.recv_counts, start], dtype=torch.int64)
    rows = all_gather_(torch.cat([mine, digest]))
    config_at = 2 * p + 1  # then the config's digest, then the loaded checkpoint's
    loaded_at = config_at + len(digests[0]) // 8
    check_fingerprints(rows[:, config_at:loaded_at])
    check_halo_counts(rows[:, :p], rows[:, p : 2 * p])
    check_same_start(rows[:, 2 * p])
    check_same_checkpoint(rows[:, loaded_at:], start)
    return [int(n) for n in rows[:, p : 2 * p].sum(dim=1)]


def unlike_rank_0(digests: torch.Tensor) -> list[int]:
    """The ranks whose row differs from rank 0's."""
    return [r for r in range(len(digests)) if not torch.equal(digests[r], digests[0])]


def check_fingerprints(digests: torch.Tensor) -> None:
    other = unlike_rank_0(digests)
    if other:
        raise TrainError(
            f"worker ranks {other} were started with another config than rank 0 (only "
            f"{', '.join(PER_NODE_KEYS)} may differ between nodes); start every node with the "
            "same config."
        )


def check_halo_counts(send: torch.Tensor, recv: torch.Tensor) -> None:
    """`send[r][q]` rows that rank r sends to q must be the `recv[q][r]` that q expects."""
    bad = (send != recv.T).nonzero()
    if len(bad):
        r, q = bad[0].tolist()
        raise TrainError(
            f"rank {r} sends {int(send[r, q])} halo rows to rank {q} but rank {q} expects "
            f"{int(recv[q, r])} from rank {r}: the ranks read different partitions; make sure "
            "every node sees the same run.out_dir/partitions."
        )


def check_same_checkpoint(digests: torch.Tensor, epoch: int) -> None:
    """Every rank must have loaded the same checkpoint contents, not only the same epoch."""
    other = unlike_rank_0(digests)
    if other:
        raise TrainError(
            f"worker ranks {other} loaded another checkpoint of epoch {epoch} than rank 0 "
            "(different weights or optimizer state); make sure every node sees the same "
            "run.out_dir/checkpoints."
        )


def check_same_start(starts: torch.Tensor) -> None:
    """Every rank must resume from the same checkpoint (a shared folder seen inconsistently
    across machines would otherwise train different models)."""
    lo, hi = int(starts.min()), int(starts.max())
    if lo != hi:
        raise TrainError(
            f"workers found different latest checkpoints (epochs {lo} to {hi}); make sure "
            "every node sees the same run.out_dir/checkpoints."
        )
