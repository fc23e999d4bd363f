"""A checkpoint's optimizer state is checked against the config's optimizer before it is
loaded, and every rank's loaded checkpoint has one digest."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from leo_cli.errors import TrainError
from leo_cli.models.optim import Adam
from leo_cli.run_dir import checkpoint_digest
from leo_cli.worker.checkpoint import optimizer_problem, restore

EPOCH = 3


def built(lr: float = 0.01, weight_decay: float = 5e-4) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    return model, Adam(model.parameters(), lr=lr, weight_decay=weight_decay)


def trained() -> dict[str, Any]:
    """A checkpoint's state after EPOCH steps, as the trainer writes it."""
    model, opt = built()
    for _ in range(EPOCH):
        opt.zero_grad()
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
    state = {"epoch": EPOCH, "rng": torch.get_rng_state()}
    return {**state, "model": model.state_dict(), "optimizer": opt.state_dict()}


def _set_group(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(opt: dict[str, Any]) -> None:
        opt["param_groups"][0][key] = value

    return edit


def _set_state(index: int, key: str, value: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    def edit(opt: dict[str, Any]) -> None:
        opt["state"][index][key] = value(opt["state"][index][key])

    return edit


EDITS = {
    "lr": (_set_group("lr", 0.1), "train.lr=0.1, the config gives 0.01"),
    "weight decay": (_set_group("weight_decay", 0.0), "train.weight_decay=0.0"),
    "betas": (_set_group("betas", (0.5, 0.999)), "the optimizer's betas=(0.5, 0.999)"),
    "eps": (_set_group("eps", 1e-3), "the optimizer's eps=0.001"),
    "shape": (_set_state(0, "exp_avg", lambda t: t[:1]), "of shape [1, 4] for parameter 0"),
    "nan": (
        _set_state(1, "exp_avg_sq", lambda t: t.fill_(float("nan"))),
        "non-finite optimizer exp_avg_sq for parameter 1",
    ),
    "step": (_set_state(2, "step", lambda t: t + 1), "took 4.0 steps, not 3"),
    "foreign param": (lambda o: o["state"].update({9: {}}), "parameter 9 the model does not"),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_an_edited_optimizer_state_is_refused_in_one_sentence(case: str, tmp_path: Path) -> None:
    edit, sentence = EDITS[case]
    state = trained()
    edit(state["optimizer"])
    model, opt = built()
    with pytest.raises(TrainError) as err:
        restore(state, model, opt, tmp_path)
    message = str(err.value)
    assert sentence in message and "--resume" in message and "\n" not in message


def test_the_written_state_loads_and_other_settings_are_named() -> None:
    model, opt = built()
    state = trained()
    restore(state, model, opt, Path("ckpt"))
    assert opt.state_dict()["state"][0]["step"] == EPOCH
    # the config's learning rate differs from the checkpoint's: the run's settings are asked for
    problem = optimizer_problem(state["optimizer"], built(lr=0.02)[1], EPOCH)
    assert problem == "was trained with train.lr=0.01, the config gives 0.02"


def test_checkpoint_digest_tells_apart_what_training_reads() -> None:
    state = trained()
    assert checkpoint_digest(state) == checkpoint_digest(copy.deepcopy(state))
    assert checkpoint_digest(None) == bytes(32) != checkpoint_digest(state)
    for edit in (
        lambda s: s["model"]["0.weight"].add_(1e-7),
        lambda s: s["optimizer"]["state"][0]["exp_avg"].mul_(2),
        lambda s: s["rng"].__setitem__(0, s["rng"][0] ^ 1),
        lambda s: s["model"].update({"0.bias": s["model"]["0.bias"].to(torch.bfloat16)}),
    ):
        other = copy.deepcopy(state)
        edit(other)
        assert checkpoint_digest(other) != checkpoint_digest(state)
