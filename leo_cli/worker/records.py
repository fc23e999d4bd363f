"""Rank 0's files of each epoch written behind the epoch loop, on one thread of their own.

An epoch's metrics row, TensorBoard scalars, best model and checkpoint wait on the disk
(a checkpoint's row and file are each synced), which the next epoch's step need not wait
for: `EpochWriter` takes each epoch's writes as one task and runs the tasks in the order
given, so a checkpoint's row is still on disk before the checkpoint. What a task writes is a
copy made when it is given (`snapshot`): the training that goes on changes the model's and
the optimizer's tensors in place.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def snapshot(state: T) -> T:
    """A copy of a state dict (tensors and containers) that later in-place updates leave alone."""
    return copy.deepcopy(state)


class EpochWriter:
    """`put(task)` queues an epoch's writes; one thread runs them in order. The first that
    fails stops the rest (no checkpoint goes without its row) and is raised by the next `put`
    or by `close()`, which waits for every queued task."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="leo-epoch-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (task := self._tasks.get()) is not None:
            if self._error is None:
                try:
                    task()
                except BaseException as exc:  # raised in the training thread
                    self._error = exc

    def put(self, task: Callable[[], Any]) -> None:
        self._raise()
        self._tasks.put(task)

    def close(self) -> None:
        """Wait for the queued writes; raise the first that failed."""
        if self._thread.is_alive():
            self._tasks.put(None)
            self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
