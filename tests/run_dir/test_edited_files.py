"""A corpus of edited run files: `leo train --resume` on a run folder with one file edited
(plan, hardware profile, partitions' META and part files, checkpoint, metrics, config) either
refuses in one sentence that names what to fix, or trains the numbers the untouched run gives.
It never trains other numbers while summary.json says `exact`: each case's outcome is fixed
here, so a change of behaviour shows as a failure to read."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers.cli import TINY, leo

pytestmark = [pytest.mark.dist, pytest.mark.integration]

ARGS = [*TINY, "--set", "train.checkpoint_every=2"]
FIRST, LAST = 4, 6  # the edited run stopped after epoch 4; the resume trains to 6
OTHER: list[Path] = []  # the run of another seed (the fixture's)


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["epoch"]: r["loss"] for r in rows}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, float]]:
    """A 2-worker run stopped after epoch FIRST, and the losses of one trained to LAST (and
    beside them, `other`: a run of another seed stopped at FIRST, whose checkpoints a case
    copies in)."""
    root = tmp_path_factory.mktemp("corpus")
    for name, epochs, seed in (("ref", LAST, 0), ("run", FIRST, 0), ("other", FIRST, 1)):
        res = leo("train", *ARGS, "--set", f"run.out_dir={root / name}", "--set",
                  f"train.num_epochs={epochs}", "--set", f"run.seed={seed}")  # fmt: skip
        assert res.returncode == 0, res.stderr
    OTHER.append(root / "other")
    return root / "run", losses(root / "ref")


def edit_json(path: Path, change: Callable[[Any], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def edit_checkpoint(run: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = run / "checkpoints" / f"epoch_{FIRST:06d}.pt"
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)


def flip_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(data)


def _set(tree: Any, keys: list[Any], value: Any) -> None:
    for k in keys[:-1]:
        tree = tree[k]
    tree[keys[-1]] = value


def _scale_weight(state: dict[str, Any]) -> None:
    name = next(iter(state["model"]))
    state["model"][name] = state["model"][name] * 1.01


def _lr(state: dict[str, Any]) -> None:
    state["optimizer"]["param_groups"][0]["lr"] = 0.05


def _older(run: Path) -> None:
    folder = run / "checkpoints"
    shutil.copy(folder / "epoch_000002.pt", folder / f"epoch_{FIRST:06d}.pt")


def _foreign(run: Path) -> None:
    """The same epoch's checkpoint of another run (another seed: the same shapes)."""
    name = f"epoch_{FIRST:06d}.pt"
    shutil.copy(OTHER[0] / "checkpoints" / name, run / "checkpoints" / name)


def _garble_line(run: Path) -> None:
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines[1] = "{not json\n"
    (run / "metrics.jsonl").write_text("".join(lines))


def _drop_digest(run: Path) -> None:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows[FIRST - 1].pop("checkpoint_sha256")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _part_array(run: Path) -> Path:
    return run / "partitions" / "part_1" / "indices.npy"


# name -> (edit, outcome, what stderr names): "refused" (non-zero exit, one sentence, no
# traceback) or "exact" (the untouched run's losses for every epoch, a skipped checkpoint
# named in a warning).
SKIPPED = f"epoch_{FIRST:06d}.pt cannot be read"
EDITS: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "plan: static_aggregate flipped": (
        lambda run: edit_json(
            run / "cache-plan.json", lambda d: _set(d, ["ranks", 0, "static_aggregate"], True)
        ),
        "refused",
        "cache-plan.json",
    ),
    "plan: not JSON": (
        lambda run: (run / "cache-plan.json").write_text("{"),
        "refused",
        "cache-plan.json",
    ),
    "plan: a rank's L3 rows made up": (
        lambda run: edit_json(
            run / "cache-plan.json", lambda d: _set(d, ["ranks", 1, "l3_rows"], [10**9])
        ),
        "refused",
        "cache-plan.json",
    ),
    "hardware profile: not JSON": (
        lambda run: (run / "hardware.json").write_text("["),
        "exact",
        "",
    ),
    "hardware profile: a negative rate": (
        lambda run: edit_json(
            run / "hardware.json", lambda d: _set(d, ["compute", "pass_bytes_per_s", 0], -1.0)
        ),
        "exact",
        "",
    ),
    "META: another node count": (
        lambda run: edit_json(
            run / "partitions" / "META.json", lambda d: _set(d, ["dataset", "num_nodes"], 601)
        ),
        "exact",
        "",
    ),
    "part file: a byte flipped": (lambda run: flip_byte(_part_array(run), -3), "refused", "part_1"),
    "part file: cut short": (
        lambda run: _part_array(run).write_bytes(_part_array(run).read_bytes()[:-8]),
        "refused",
        "part_1",
    ),
    "checkpoint: a weight changed": (
        lambda run: edit_checkpoint(run, _scale_weight),
        "exact",
        SKIPPED,
    ),
    "checkpoint: another learning rate": (lambda run: edit_checkpoint(run, _lr), "exact", SKIPPED),
    "checkpoint: an older one in its place": (_older, "exact", SKIPPED),
    "checkpoint: cut short": (
        lambda run: (run / "checkpoints" / f"epoch_{FIRST:06d}.pt").write_bytes(b"PK"),
        "exact",
        SKIPPED,
    ),
    "checkpoint: another run's of the same epoch": (_foreign, "exact", SKIPPED),
    "metrics: the newest checkpoint's digest removed": (_drop_digest, "exact", SKIPPED),
    "metrics: a line in the middle that is not JSON": (_garble_line, "refused", "line 2"),
    "metrics: a row that is not one": (
        lambda run: (run / "metrics.jsonl").write_text('{"epoch": "x"}\n'),
        "refused",
        "metrics.jsonl",
    ),
    "config: another hidden width": (
        lambda run: (run / "resolved_config.yaml").write_text(
            (run / "resolved_config.yaml")
            .read_text()
            .replace("hidden_channels: 16", "hidden_channels: 32")
        ),
        "refused",
        "model.hidden_channels",
    ),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_an_edited_run_file_is_refused_or_gives_the_same_numbers(
    case: str, runs: tuple[Path, dict[int, float]], tmp_path: Path
) -> None:
    finished, reference = runs
    edit, outcome, names = EDITS[case]
    run = tmp_path / "run"
    shutil.copytree(finished, run, symlinks=False)  # partitions become the copy's own
    edit(run)
    res = leo("train", *ARGS, "--set", f"run.out_dir={run}", "--set", f"train.num_epochs={LAST}",
              "--resume")  # fmt: skip
    assert "Traceback" not in res.stderr, res.stderr
    if outcome == "refused":
        assert res.returncode != 0, f"{case}: trained\n{res.stdout}"
        message = " ".join(res.stderr.split())
        assert names in message, message
        return
    assert res.returncode == 0, f"{case}: {res.stderr}"
    assert names in " ".join(res.stderr.split()), res.stderr
    got = losses(run)
    assert sorted(got) == list(range(1, LAST + 1))
    np.testing.assert_allclose(
        [got[e] for e in range(1, LAST + 1)], [reference[e] for e in range(1, LAST + 1)], rtol=1e-5
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["exact"] is True
