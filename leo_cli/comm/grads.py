"""Summing weight gradients over workers: one flat all-reduce, or per-layer async buckets.

The bucketed reducer launches a layer's all-reduce as soon as backward has produced all of
that layer's gradients, so it overlaps the backward of the layers before it (DDP-style).
Both give the same sums (the order of the per-rank additions inside the collective may differ).
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor, nn

from leo_cli.registry import Mode


def _distributed() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def _grads(params: list[nn.Parameter]) -> list[Tensor]:
    return [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]


def _unflatten(params: list[nn.Parameter], buf: Tensor) -> None:
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = buf[offset : offset + n].view_as(p).clone()
        offset += n


class GradReducer(Protocol):
    def start(self) -> None:
        """Called before backward."""

    def finish(self) -> None:
        """Called after backward: every parameter's .grad holds the sum over workers."""


class FlatGradReducer:
    """One all-reduce of every gradient after backward (one collective per step)."""

    def __init__(self, model: nn.Module) -> None:
        self.params = list(model.parameters())

    def start(self) -> None:
        pass

    def finish(self) -> None:
        if not _distributed():
            return
        buf = torch.cat([g.reshape(-1) for g in _grads(self.params)])
        dist.all_reduce(buf)
        _unflatten(self.params, buf)


_GROUP: list[Any] = []  # [the default group, the reductions' group made within it]


def reduction_group() -> Any:
    """The process group the bucketed reductions run on, one per default group and process:
    a group made per reducer would live on in torch's registry after its job (`auto`'s
    trials build several jobs). The default group is kept beside it, so a later default
    group is never taken for it."""
    world = dist.group.WORLD
    if not _GROUP or _GROUP[0] is not world:
        _GROUP[:] = [world, dist.new_group()]
    return _GROUP[1]


class BucketedGradReducer:
    """One asynchronous all-reduce per bucket (a layer's parameters), launched from backward.

    Runs on its own process group so it never queues behind halo traffic.
    """

    def __init__(self, buckets: list[list[nn.Parameter]]) -> None:
        self.buckets = [b for b in buckets if b]
        self.group = reduction_group() if _distributed() else None
        self.pending: dict[int, set[int]] = {}
        self.works: list[tuple[Any, Tensor, list[nn.Parameter]]] = []
        self.bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        # The hooks live in C++, out of reach of Python's cycle collector: a hook holding the
        # reducer (which holds the parameters) would keep a freed job's model alive for good
        # (`auto`'s trials free a job per candidate). They reach it through a weak reference.
        me = weakref.ref(self)

        def ready(p: Tensor) -> None:
            reducer = me()
            if reducer is not None:
                reducer._ready(p)

        for bucket in self.buckets:
            for p in bucket:
                p.register_post_accumulate_grad_hook(ready)  # type: ignore[no-untyped-call]

    def start(self) -> None:
        self.pending = {i: {id(p) for p in b} for i, b in enumerate(self.buckets)}
        self.works.clear()

    def _ready(self, p: Tensor) -> None:
        i = self.bucket_of[id(p)]
        left = self.pending.get(i)
        if left is None or self.group is None:
            return
        left.discard(id(p))
        if not left:
            del self.pending[i]
            self._launch(self.buckets[i])

    def _launch(self, params: list[nn.Parameter]) -> None:
        buf = torch.cat([g.reshape(-1) for g in _grads(params)])
        work = dist.all_reduce(buf, group=self.group, async_op=True)
        self.works.append((work, buf, params))

    def finish(self) -> None:
        if self.group is None:
            return
        for i in sorted(self.pending):  # buckets whose parameters got no gradient
            self._launch(self.buckets[i])
        self.pending.clear()
        for work, buf, params in self.works:
            work.wait()
            _unflatten(params, buf)
        self.works.clear()


def make_grad_reducer(model: nn.Module, mode: Mode) -> GradReducer:
    """Bucketed async reduction where the mode's record asks for it; one flat all-reduce
    otherwise."""
    convs = getattr(model, "convs", None)
    if mode.bucketed_grads and convs is not None:
        return BucketedGradReducer([list(c.parameters()) for c in convs])
    return FlatGradReducer(model)
