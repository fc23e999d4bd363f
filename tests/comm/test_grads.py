"""Summing weight gradients (comm/grads.py): a reducer leaves nothing alive after its job."""

from __future__ import annotations

import gc
import weakref

import torch

from leo_cli.comm.grads import BucketedGradReducer


def test_a_freed_reducer_frees_its_models_parameters() -> None:
    # `auto`'s trials build and free a job per candidate: a reducer whose gradient hooks held
    # it strongly kept every freed candidate's model alive (the hooks live in C++, out of
    # reach of Python's cycle collector).
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    reducer = BucketedGradReducer([list(layer.parameters()) for layer in model])
    weight = weakref.ref(model[0].weight)
    kept = weakref.ref(reducer)
    del model, reducer
    gc.collect()
    assert weight() is None and kept() is None


def test_the_hooks_still_reach_a_live_reducer() -> None:
    model = torch.nn.Linear(3, 2)
    reducer = BucketedGradReducer([list(model.parameters())])
    launched: list[int] = []
    reducer.group = "a group"  # as if distributed; the launch is recorded, not sent
    reducer._launch = lambda params: launched.append(len(params))  # type: ignore[method-assign]
    reducer.start()
    model(torch.ones(1, 3)).sum().backward()
    assert launched == [2] and reducer.pending == {}  # the bucket launched once both were ready
