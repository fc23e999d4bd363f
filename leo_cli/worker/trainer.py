"""The training loop of one worker: exact full-graph epochs and all-reduced evaluation.

`fit` reads top to bottom: per epoch a step, a stop on a non-finite loss, evaluation every
`train.eval_every` epochs, one metrics row (rank 0) and a checkpoint every
`train.checkpoint_every` (rank 0). Works with and without a process group: a single process
(P = 1) is the same code path with identity collectives, and is the oracle the distributed
runs are compared against. Legend: N inner rows, F features, C classes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from leo_cli.comm.dist import all_gather_, all_reduce_
from leo_cli.comm.exchange import HaloPlan
from leo_cli.comm.grads import GradReducer
from leo_cli.config.schema import TrainConfig
from leo_cli.errors import TrainError
from leo_cli.graph.layout import LocalPart
from leo_cli.models.gnn import GNN
from leo_cli.models.local_graph import LocalGraph
from leo_cli.run_dir import RunDir, checkpoint_digest
from leo_cli.worker.board import Board


@dataclass
class WorkerData:
    """A worker's tensors: features, labels, split masks and the global training-set size."""

    x_NF: Tensor
    y_N: Tensor
    train_N: Tensor
    val_N: Tensor
    test_N: Tensor
    num_train_global: int

    @classmethod
    def from_part(
        cls, part: LocalPart, num_train_global: int, dtype: torch.dtype, device: torch.device
    ) -> WorkerData:
        def t(a: np.ndarray) -> Tensor:
            return torch.from_numpy(np.array(a)).to(device)

        # The features, the largest array a worker reads, stay on the part's (copy-on-write)
        # file map when nothing converts them: pages come from the file, not anonymous memory.
        x = np.asarray(part.x)
        x_NF = torch.from_numpy(x if x.flags.writeable else np.array(x))
        return cls(
            x_NF.to(device=device, dtype=dtype),
            t(part.y),
            t(part.train_mask),
            t(part.val_mask),
            t(part.test_mask),
            num_train_global,
        )


class PhaseClock:
    """Phases of a step: wall clock on the CPU; on CUDA, events on the current stream (a kernel
    launch returns before its work is done), read once at the end of the step: the step's one
    wait for the device, instead of one at every stamp."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list[tuple[str, Any]] = [("start", self._mark())]
        self._seconds: list[float] | None = None

    def _mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
        return event

    def stamp(self, phase: str) -> None:
        self._marks.append((phase, self._mark()))
        self._seconds = None

    def _since_start(self) -> list[float]:
        """Seconds from the start to each mark (on CUDA: waits for the last event, once)."""
        if self._seconds is None:
            first = self._marks[0][1]
            if self.cuda:
                self._marks[-1][1].synchronize()
                self._seconds = [first.elapsed_time(m) / 1000.0 for _, m in self._marks]
            else:
                self._seconds = [m - first for _, m in self._marks]
        return self._seconds

    @property
    def phases(self) -> dict[str, float]:
        """Seconds of each stamped phase, by name."""
        t = self._since_start()
        return {name: t[i] - t[i - 1] for i, (name, _) in enumerate(self._marks) if i > 0}

    def total(self) -> float:
        return self._since_start()[-1]


def train_step(
    model: GNN,
    opt: torch.optim.Optimizer,
    reducer: GradReducer,
    g: LocalGraph,
    data: WorkerData,
    seed: int,
    epoch: int,
    update: bool = True,
) -> tuple[float, dict[str, float]]:
    """One full-graph step; returns the global mean training loss and phase times. Without
    `update` the optimizer does not step (`auto`'s trials: worker/trials.py)."""
    model.train()
    opt.zero_grad(set_to_none=True)
    reducer.start()
    clock = PhaseClock(data.x_NF.device)
    logits = model(data.x_NF, g, seed=seed, epoch=epoch)
    # Each worker's sum is scaled by the global count, so summed gradients are the global mean's.
    loss = F.cross_entropy(logits[data.train_N], data.y_N[data.train_N], reduction="sum")
    loss = loss / data.num_train_global
    clock.stamp("forward_s")
    loss.backward()  # type: ignore[no-untyped-call]
    clock.stamp("backward_s")
    reducer.finish()
    clock.stamp("allreduce_s")
    if update:
        opt.step()
        clock.stamp("optimizer_s")
    total = all_reduce_(loss.detach().clone().to(torch.float64))
    clock.stamp("loss_sync_s")  # waits for the slowest rank, like the all-reduce
    times = {**clock.phases, "step_s": clock.total()}
    return float(total.item()), times


@torch.no_grad()
def evaluate(model: GNN, g: LocalGraph, data: WorkerData) -> dict[str, float | None]:
    """Train/val/test accuracy from all-reduced correct and total counts (None: empty split)."""
    model.eval()
    pred = model(data.x_NF, g).argmax(dim=1)
    correct = pred == data.y_N
    masks = (data.train_N, data.val_N, data.test_N)
    counts = torch.tensor(
        [[int((correct & m).sum()), int(m.sum())] for m in masks], dtype=torch.float64
    )
    all_reduce_(counts)
    accs = [float(c / n) if n > 0 else None for c, n in counts.tolist()]
    return {"train_acc": accs[0], "val_acc": accs[1], "test_acc": accs[2]}


@dataclass
class Job:
    """Everything one worker trains with (worker/assemble.py builds it)."""

    halo: HaloPlan
    graph: LocalGraph
    reducer: GradReducer
    data: WorkerData
    model: GNN
    optimizer: torch.optim.Optimizer
    static_layer0: bool = False  # layer 0 trains on the static aggregate (cache level L1s)

    def step(self, seed: int, epoch: int) -> tuple[float, dict[str, float]]:
        return train_step(
            self.model, self.optimizer, self.reducer, self.graph, self.data, seed, epoch
        )

    def evaluate(self) -> dict[str, float | None]:
        return evaluate(self.model, self.graph, self.data)


@dataclass(frozen=True)
class RunLog:
    """Where rank 0 writes the rows and checkpoints of `fit` (other ranks: `rank` > 0)."""

    run: RunDir
    rank: int
    row_extras: dict[str, Any]  # the same in every row (bytes per cache level, exactness)
    board: Board | None = None  # TensorBoard events (run.tensorboard), rank 0 only


def fit(job: Job, train: TrainConfig, seed: int, start: int, log: RunLog) -> None:
    """Train epochs `start + 1 .. train.num_epochs`; rank 0 keeps the model of the first
    epoch with the best validation accuracy (`checkpoints/best.pt`)."""
    stats = job.graph.aggregator.stats
    best = keep_best_of(log.run, start) if log.rank == 0 else None
    for epoch in range(start + 1, train.num_epochs + 1):
        stats.reset()
        loss, times = job.step(seed, epoch)
        if not math.isfinite(loss):
            raise TrainError(
                f"training loss became {loss} at epoch {epoch}; lower train.lr "
                "(checkpoints of earlier epochs, if any, are kept in checkpoints/)."
            )
        stats.settle()
        row: dict[str, Any] = {"epoch": epoch, "loss": loss, **times}
        step_comm = (stats.wait_s, stats.transfer_s, stats.remote_bytes, stats.published_bytes)
        if epoch % train.eval_every == 0 or epoch == train.num_epochs:
            t0 = time.perf_counter()
            row.update(job.evaluate())
            row["eval_s"] = time.perf_counter() - t0
        row.update(reduce_epoch_stats(times["step_s"], *step_comm, stats.remote_bytes))
        row.update(rank_times(times, step_comm[0]))  # the step's waits, not the evaluation's
        row.update(log.row_extras, cold=epoch == start + 1)
        if log.rank != 0:
            continue
        written = None
        if epoch % train.checkpoint_every == 0 or epoch == train.num_epochs:
            # What the checkpoint will hold, so a resume can tell an edited one.
            model, optimizer = job.model.state_dict(), job.optimizer.state_dict()
            written = {"epoch": epoch, "rng": torch.get_rng_state(), "model": model,
                       "optimizer": optimizer}  # fmt: skip
            row["checkpoint_sha256"] = checkpoint_digest(written).hex()
        log.run.append_metrics(row)
        if log.board is not None:
            log.board.add_row(row)
        val = row.get("val_acc")
        if val is not None and (best is None or val > best):
            best = val
            log.run.save_best(epoch, accuracies(row), job.model.state_dict())
        if written is not None:
            log.run.save_checkpoint(epoch, written)  # the very contents of the digest


def keep_best_of(run: RunDir, start: int) -> float | None:
    """The best validation accuracy of epochs 1 .. `start` (a resumed run's), and
    `checkpoints/best.pt` made to hold its model: a best model of a later epoch belongs to the
    attempt that died and goes, replaced by the checkpoint of the best epoch where one is kept
    (else none is left until a resumed epoch does better)."""
    rows = [r for r in run.read_metrics() if isinstance(r, dict) and r.get("val_acc") is not None]
    top = max(rows, key=lambda r: r["val_acc"], default=None)
    if not run.best.is_file():
        return None if top is None else float(top["val_acc"])
    if run.read_best()["epoch"] > start:
        run.best.unlink()
        kept = dict(run.list_checkpoints())
        if top is not None and top["epoch"] in kept:
            try:
                state = run.read_recorded(kept[top["epoch"]])
            except Exception:  # an unreadable checkpoint (read_latest names it) leaves no best
                return float(top["val_acc"])
            run.save_best(top["epoch"], accuracies(top), state["model"])
    return None if top is None else float(top["val_acc"])


def accuracies(row: dict[str, Any]) -> dict[str, Any]:
    """The accuracies of a metrics row that `checkpoints/best.pt` keeps."""
    return {k: row.get(k) for k in ("train_acc", "val_acc", "test_acc")}


def rank_times(times: dict[str, float], wait_s: float) -> dict[str, list[float]]:
    """Every rank's step time (`rank_step_s`) and its busy time (`rank_busy_s`: the step less
    the time it waited for peers: rows and gradients, the gradient all-reduce, the loss sum).

    Steps end together (the all-reduces wait for the slowest rank), so the busy times are
    what tells a fast rank from a slow one.
    """
    waited = wait_s + times.get("allreduce_s", 0.0) + times.get("loss_sync_s", 0.0)
    mine = torch.tensor([times["step_s"], max(0.0, times["step_s"] - waited)], dtype=torch.float64)
    every = all_gather_(mine)
    return {"rank_step_s": every[:, 0].tolist(), "rank_busy_s": every[:, 1].tolist()}


def reduce_epoch_stats(
    step_s: float,
    wait_s: float,
    transfer_s: float,
    step_bytes: int,
    published_bytes: int,
    all_bytes: int,
) -> dict[str, Any]:
    """The slowest worker's step time, communication times of the training step (mean over
    workers, and the longest wait), remote bytes summed over workers (step, of which through
    published rows, and whole epoch)."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    t = all_reduce_(torch.tensor([step_s, wait_s], dtype=torch.float64), op="max")
    counts = [wait_s, transfer_s, step_bytes, all_bytes, published_bytes]
    s = all_reduce_(torch.tensor(counts, dtype=torch.float64))
    return {
        "epoch_time_s": float(t[0]),
        "comm_wait_s": float(s[0]) / world,
        "comm_wait_max_s": float(t[1]),
        "comm_transfer_s": float(s[1]) / world,
        "step_comm_bytes": int(s[2]),
        "comm_bytes": int(s[3]),
        "step_published_bytes": int(s[4]),
    }


def restore(
    state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path
) -> None:
    """Load a checked checkpoint into the model and optimizer; the optimizer's settings must be
    the config's and its state the model's (shapes, finite, one step per epoch).

    Raises:
        TrainError: it was written for another model or config, or its state is not sound.
    """
    where = f"checkpoint of epoch {state['epoch']} in {folder}"
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TrainError(
            f"{where} does not fit this model ({reason}); start again without --resume or "
            "use the run's settings."
        ) from None
    problem = optimizer_problem(state["optimizer"], optimizer, state["epoch"])
    if problem is not None:
        raise TrainError(f"{where} {problem}; start again without --resume or use its settings.")
    optimizer.load_state_dict(state["optimizer"])


# The optimizer settings that come from the config, by the key that sets them.
CONFIG_KEYS = {"lr": "train.lr", "weight_decay": "train.weight_decay"}


def optimizer_problem(saved: Any, optimizer: torch.optim.Optimizer, epoch: int) -> str | None:
    """What makes a checkpoint's optimizer state unfit for `optimizer` (built from the config),
    or None: its groups' settings (learning rate, weight decay, betas, eps, ...) must be
    `optimizer`'s, and each parameter's state the parameter's shape, finite, `epoch` steps."""
    built = optimizer.state_dict()
    groups, state = saved.get("param_groups"), saved.get("state")
    if not isinstance(state, dict) or len(groups) != len(built["param_groups"]):
        return "holds optimizer state for another model"
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for mine, theirs in zip(built["param_groups"], groups, strict=True):
        if not isinstance(theirs, dict) or theirs.get("params") != mine["params"]:
            return "holds optimizer state for another model"
        for key, value in mine.items():
            if key != "params" and key in theirs and theirs[key] != value:
                name = CONFIG_KEYS.get(key, f"the optimizer's {key}")
                return f"was trained with {name}={theirs[key]!r}, the config gives {value!r}"
    for index, entry in state.items():
        if not isinstance(index, int) or not 0 <= index < len(params):
            return f"holds optimizer state for a parameter {index!r} the model does not have"
        if not isinstance(entry, dict):
            return f"holds optimizer state for parameter {index} that is not a dictionary"
        for key, value in entry.items():
            if not isinstance(value, Tensor):
                return f"holds optimizer state {key!r} that is not a tensor"
            if not bool(torch.isfinite(value).all()):
                return f"holds a non-finite optimizer {key} for parameter {index}"
            if key == "step":
                if value.numel() != 1 or float(value) != epoch:
                    return f"says parameter {index} took {value.tolist()} steps, not {epoch}"
            elif value.shape != params[index].shape:
                return (
                    f"holds an optimizer {key} of shape {list(value.shape)} for parameter "
                    f"{index} of shape {list(params[index].shape)}"
                )
    return None
