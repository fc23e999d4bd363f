"""Run files a resumed run reads back (metrics.jsonl, checkpoints) are checked: a row or a
checkpoint LEO did not write stops the run in one sentence instead of a worker traceback or
wrong numbers in summary.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from leo_cli.errors import TrainError
from leo_cli.models.optim import Adam
from leo_cli.run_dir import RunDir, checkpoint_digest
from leo_cli.worker.checkpoint import restore


def row(epoch: int, **extra: Any) -> dict[str, Any]:
    return {"epoch": epoch, "loss": 1.0, "epoch_time_s": 0.1, "comm_bytes": 10, **extra}


BAD_ROWS: dict[str, tuple[str, str]] = {
    "not an object": ("[1, 2]", "line 2"),
    "no loss": (json.dumps({"epoch": 2, "epoch_time_s": 0.1, "comm_bytes": 1}), "loss"),
    "NaN loss": ('{"epoch": 2, "loss": NaN, "epoch_time_s": 0.1, "comm_bytes": 1}', "loss"),
    "epoch as text": (json.dumps(row(2) | {"epoch": "2"}), "epoch"),
    "true as bytes": (json.dumps(row(2) | {"comm_bytes": True}), "comm_bytes"),
    "accuracy above one": (json.dumps(row(2, val_acc=3.0)), "val_acc"),
    "'no' as exact": (json.dumps(row(2, exact="no")), "exact"),
    "epoch repeated": (json.dumps(row(1)), "epoch 1 does not follow epoch 1"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_bad_metrics_row_stops_resume(tmp_path: Path, case: str) -> None:
    line, needle = BAD_ROWS[case]
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps(row(1)) + "\n" + line + "\n" + json.dumps(row(3)) + "\n")
    with pytest.raises(TrainError) as info:
        RunDir(tmp_path).truncate_metrics(3)
    message = str(info.value)
    assert f"{path} line 2" in message and needle in message and "--resume" in message


def test_a_row_being_appended_is_not_read_yet(tmp_path: Path) -> None:
    """A reader of a live run (the progress bar, a test polling it) can see the first part of
    a line the writer is still appending (a line that crosses a page boundary): it reads the
    complete rows before it."""
    RunDir(tmp_path).append_metrics(row(1))
    text = json.dumps(row(2))
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write(text[: len(text) // 2])
    assert [r["epoch"] for r in RunDir(tmp_path).read_metrics()] == [1]


def test_good_rows_are_kept_up_to_the_checkpoint(tmp_path: Path) -> None:
    for epoch in (1, 2, 3):
        RunDir(tmp_path).append_metrics(row(epoch, val_acc=0.5, cold=epoch == 1))
    RunDir(tmp_path).truncate_metrics(2)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [1, 2]


def state(model: torch.nn.Module) -> dict[str, Any]:
    return {
        "model": model.state_dict(),
        "optimizer": Adam(model.parameters()).state_dict(),
    }


def test_checkpoint_not_written_by_leo_is_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint that loads but is not ours (wrong epoch, no optimizer, NaN weights) is
    treated as unreadable: the one before it is used, with a warning."""
    model = torch.nn.Linear(3, 2)
    RunDir(tmp_path).save_checkpoint(2, state(model))
    newest = RunDir(tmp_path).save_checkpoint(4, state(model))
    for bad in (
        {"epoch": 7, "rng": torch.get_rng_state(), **state(model)},
        {"epoch": 4, "rng": torch.get_rng_state(), "model": {}},
        {"epoch": True, "rng": torch.get_rng_state(), **state(model)},
        {"epoch": 4, "rng": torch.get_rng_state(), **state(model)}
        | {"model": {"weight": torch.full((2, 3), float("nan"))}},
        {"epoch": 4, "rng": torch.get_rng_state()[:100], **state(model)},  # a cut generator
    ):
        torch.save(bad, newest)
        loaded = RunDir(tmp_path).load_latest()
        assert loaded is not None and loaded["epoch"] == 2
        assert "cannot be read" in capsys.readouterr().err


def test_a_checkpoint_unlike_its_recorded_digest_is_skipped_then_set_aside(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """metrics.jsonl records each checkpoint's digest: a checkpoint edited (or copied from
    another run) is skipped with a warning, and the resume moves it into checkpoints/set-aside/
    with a note (not deleted: the user may want it), so the next resume cannot take it once its
    row is gone; rows that are not objects do not stop the reading."""
    run, model = RunDir(tmp_path), torch.nn.Linear(3, 2)
    digests = {}
    for epoch in (2, 4):
        saved = {"epoch": epoch, "rng": torch.get_rng_state(), **state(model)}
        digests[epoch] = checkpoint_digest(saved).hex()
        run.save_checkpoint(epoch, state(model))
    rows = [row(e, checkpoint_sha256=digests.get(e)) for e in (1, 2, 3, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run.read_latest()["epoch"] == 4  # type: ignore[index]
    with torch.no_grad():
        model.weight.add_(1e-3)  # what an edit does: same shapes, other numbers
    torch.save(
        {"epoch": 4, "rng": torch.get_rng_state(), **state(model)}, run.list_checkpoints()[-1][1]
    )
    assert run.read_latest()["epoch"] == 2  # type: ignore[index]
    assert "epoch_000004.pt cannot be read" in capsys.readouterr().err
    edited = run.list_checkpoints()[-1][1].read_bytes()
    aside = run.set_aside_checkpoints_after(2)
    assert [e for e, _ in run.list_checkpoints()] == [2]
    assert aside == [run.checkpoints / "set-aside" / "epoch_000004.pt"]
    assert aside[0].read_bytes() == edited
    note = (run.checkpoints / "set-aside" / "NOTE.txt").read_text()
    assert note.startswith("epoch_000004.pt: skipped by a resume from epoch 2")
    assert "set aside as" in capsys.readouterr().err
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write("[1]\n")  # not a row: read past here (check_rows names it when it matters)
    assert run.recorded_digests() == {2: digests[2], 4: digests[4]}


def test_a_row_recording_a_checkpoint_is_on_disk_before_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a power loss a checkpoint whose digest row was lost would be judged foreign:
    the row is fsynced when appended, before the (fsynced) checkpoint is written."""
    import os

    synced: list[str] = []
    real = os.fsync
    monkeypatch.setattr(
        os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd))
    )
    run = RunDir(tmp_path)
    run.append_metrics(row(1))
    assert not any(p.endswith("metrics.jsonl") for p in synced)  # a plain row: no fsync
    run.append_metrics(row(2, checkpoint_sha256="00"))
    run.save_checkpoint(2, state(torch.nn.Linear(3, 2)))
    files = [Path(p).name for p in synced if not Path(p).is_dir()]
    assert files[0] == "metrics.jsonl" and any(".epoch_000002.pt" in f for f in files[1:])


def test_checkpoint_of_another_model_is_one_sentence(tmp_path: Path) -> None:
    RunDir(tmp_path).save_checkpoint(2, state(torch.nn.Linear(3, 2)))
    loaded = RunDir(tmp_path).load_latest()
    assert loaded is not None
    other = torch.nn.Linear(5, 2)
    with pytest.raises(TrainError, match=r"epoch 2 .* does not fit this model") as info:
        restore(loaded, other, Adam(other.parameters()), tmp_path / "checkpoints")
    assert "\n" not in str(info.value)


def test_unreadable_run_files_read_as_nothing(tmp_path: Path) -> None:
    """summary.json and the set-up stamps are read as {} when they are not a JSON object
    (a list, bytes that are not UTF-8, a torn write): the parent then adds nothing."""
    run = RunDir(tmp_path)
    run.summary.write_text("[1, 2]")
    assert run.read_summary() == {}
    run.update_summary({"wall_s": 1.0})
    assert run.summary.read_text() == "[1, 2]"  # left as it was
    run.setup_file.write_bytes(b"\xff\xfe{")
    assert run.read_setup(1.0) == {}
    run.write_summary({"setup_s": 2.0})
    run.update_summary({"wall_s": 3.0})
    assert run.read_summary() == {"setup_s": 2.0, "wall_s": 3.0}
