"""One full-graph training step of a worker, its evaluation and what it measured.

`train_step` is the step (forward, backward, gradient all-reduce, optimizer), `evaluate` the
all-reduced accuracies (`correct_counts` a rank's share of them), `Job` everything a worker
trains with (worker/assemble.py builds it), `epoch_stats` an epoch's numbers over every rank
(and an evaluation's accuracies, from the same collective). Works with and without a process
group: a single process (P = 1) is the same code path with identity collectives, and is the
oracle the distributed runs are compared against. Legend: N inner rows, F features, C classes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from leo_cli.comm.dist import all_gather_, all_reduce_
from leo_cli.comm.exchange import HaloPlan
from leo_cli.comm.grads import GradReducer
from leo_cli.graph.layout import LocalPart
from leo_cli.models.gnn import GNN
from leo_cli.models.local_graph import LocalGraph


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


ACCURACY_KEYS = ("train_acc", "val_acc", "test_acc")


@torch.no_grad()
def correct_counts(model: GNN, g: LocalGraph, data: WorkerData) -> Tensor:
    """This rank's correct predictions and sizes of the train, val and test splits: [3, 2]
    float64 (whole numbers, summed exactly over ranks)."""
    model.eval()
    pred = model(data.x_NF, g).argmax(dim=1)
    correct = pred == data.y_N
    masks = (data.train_N, data.val_N, data.test_N)
    return torch.tensor(
        [[int((correct & m).sum()), int(m.sum())] for m in masks], dtype=torch.float64
    )


def accuracies(counts_S2: Tensor) -> dict[str, float | None]:
    """Train/val/test accuracy from every rank's summed `correct_counts` (None: empty split)."""
    accs = [float(c / n) if n > 0 else None for c, n in counts_S2.tolist()]
    return dict(zip(ACCURACY_KEYS, accs, strict=True))


def evaluate(model: GNN, g: LocalGraph, data: WorkerData) -> dict[str, float | None]:
    """Train/val/test accuracy from all-reduced correct and total counts (None: empty split)."""
    return accuracies(all_reduce_(correct_counts(model, g, data)))


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

    def correct_counts(self) -> Tensor:
        """This rank's share of an evaluation (`epoch_stats` sums the ranks')."""
        return correct_counts(self.model, self.graph, self.data)


def epoch_stats(
    times: dict[str, float],
    wait_s: float,
    transfer_s: float,
    step_bytes: int,
    published_bytes: int,
    all_bytes: int,
    counts_S2: Tensor | None = None,
) -> dict[str, Any]:
    """An epoch's numbers over every rank, from one all-gather: the slowest worker's step
    time, communication times of the training step (mean over workers, and the longest wait),
    remote bytes summed over workers (step, of which through published rows, and whole epoch),
    and every rank's step time (`rank_step_s`) and busy time (`rank_busy_s`: the step less the
    time it waited for peers: rows and gradients, the gradient all-reduce, the loss sum); with
    this rank's `correct_counts` of an evaluation, the accuracies too (`ACCURACY_KEYS`), from
    the same gather instead of a collective of their own.

    Steps end together (the all-reduces wait for the slowest rank), so the busy times are
    what tells a fast rank from a slow one.
    """
    step_s = times["step_s"]
    waited = wait_s + times.get("allreduce_s", 0.0) + times.get("loss_sync_s", 0.0)
    mine = [step_s, max(0.0, step_s - waited), wait_s, transfer_s, step_bytes, all_bytes,
            published_bytes]  # fmt: skip
    sent = torch.tensor(mine, dtype=torch.float64)
    if counts_S2 is not None:
        sent = torch.cat([sent, counts_S2.to(torch.float64).flatten()])
    every = all_gather_(sent)
    world = every.shape[0]
    total = every.sum(dim=0)
    accs = {} if counts_S2 is None else accuracies(total[len(mine) :].view(-1, 2))
    return {
        **accs,
        "epoch_time_s": float(every[:, 0].max()),
        "comm_wait_s": float(total[2]) / world,
        "comm_wait_max_s": float(every[:, 2].max()),
        "comm_transfer_s": float(total[3]) / world,
        "step_comm_bytes": int(total[4]),
        "comm_bytes": int(total[5]),
        "step_published_bytes": int(total[6]),
        "rank_step_s": every[:, 0].tolist(),
        "rank_busy_s": every[:, 1].tolist(),
    }
