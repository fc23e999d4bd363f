"""A corpus of edited run files: `leo train --resume` on a run folder with one file edited
(plan, hardware profile, partitions' META and part files, checkpoint, metrics, config) either
refuses in one sentence that names what to fix, or trains the numbers the untouched run gives.
It never trains other numbers while summary.json says `exact`: each case's outcome is fixed
here, so a change of behaviour shows as a failure to read.

Each case is decided by the readers a resume runs before its first step; they run here in
this process (`resume_reads`) on a copy of the session's trained run (tests/conftest.py) with
one file edited: a refusal is a LeoError naming the file, a case that trains on reads the
untouched run's partitions and a checkpoint that run saved. Two cases go through `leo train
--resume` end to end: one refused by a worker, one that trains the untouched run's losses."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import TrainedRun
from helpers.cli import leo

from leo_cli.config import load_config
from leo_cli.errors import LeoError
from leo_cli.graph.storage import read_meta, read_part
from leo_cli.graph.types import DatasetInfo
from leo_cli.launch.setup import prepare
from leo_cli.planner.plan import load_plan
from leo_cli.run_dir import RunDir, checkpoint_digest

pytestmark = [pytest.mark.dist, pytest.mark.integration]  # the trained run: a `leo train`

FIRST, OLDER = 6, 4  # the run's newest checkpoint (the one edited) and the one kept before it


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["epoch"]: r["loss"] for r in rows}


def resume_reads(run: Path, trained: TrainedRun) -> dict[str, Any]:
    """What `leo train --resume` reads before training, in this process: the launcher's
    `prepare` (config, newest checkpoint, partitions, hardware profile, plan), then each
    worker's reads (resolved config, META, its part's files against their checksums, the
    newest checkpoint that checks, the plan, rank 0's metrics cut back to that checkpoint).

    Returns:
        the checkpoint state the run would go on from.

    Raises:
        LeoError: the one sentence the run refuses with.
    """
    cfg = load_config(None, [*trained.settings, f"run.out_dir={run}"])
    prepare(cfg, resume=True, progress=None)
    folder = RunDir(run)
    resolved = load_config(folder.config)
    meta = read_meta(folder.partitions)
    for rank in range(int(meta["num_parts"])):
        read_part(folder.partitions, rank, mmap=True)
    state = folder.read_latest()
    assert state is not None, "the run has checkpoints"
    assert load_plan(resolved, run, meta) is not None  # a plan made for this run
    folder.truncate_metrics(int(state["epoch"]))
    return state


def part_files(run: Path) -> dict[str, bytes]:
    parts = RunDir(run).partitions.resolve()
    return {str(p.relative_to(parts)): p.read_bytes() for p in sorted(parts.rglob("*.npy"))}


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
    shutil.copy(folder / f"epoch_{OLDER:06d}.pt", folder / f"epoch_{FIRST:06d}.pt")


def _foreign(run: Path) -> None:
    """The same epoch's checkpoint of another run: every tensor of the model and of the
    optimizer's state drawn again (another seed: the same shapes, a well-formed file)."""
    generator = torch.Generator().manual_seed(1)

    def redraw(tree: Any) -> Any:
        if isinstance(tree, torch.Tensor) and tree.is_floating_point():
            return torch.randn(tree.shape, generator=generator, dtype=tree.dtype)
        if isinstance(tree, dict):
            return {k: redraw(v) for k, v in tree.items()}
        if isinstance(tree, list):
            return [redraw(v) for v in tree]
        return tree

    edit_checkpoint(run, lambda state: state.update(
        model=redraw(state["model"]), optimizer=redraw(state["optimizer"])))  # fmt: skip


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
def test_an_edited_run_file_is_refused_or_read_as_the_untouched_run(
    case: str, trained_run: TrainedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit, outcome, names = EDITS[case]
    run = trained_run.copy(tmp_path / "run")
    recorded = RunDir(run).recorded_digests()
    edit(run)
    capsys.readouterr()
    if outcome == "refused":
        with pytest.raises(LeoError) as info:  # one sentence (the CLI prints no traceback)
            resume_reads(run, trained_run)
        message = " ".join(str(info.value).split())
        assert names in message, message
        return
    state = resume_reads(run, trained_run)
    assert names in " ".join(capsys.readouterr().err.split())
    # It goes on from a checkpoint the untouched run saved (the digest its metrics row
    # recorded): the newest, or the one before when the newest was skipped.
    epoch = int(state["epoch"])
    assert epoch == (OLDER if names == SKIPPED else FIRST), case
    assert checkpoint_digest(state).hex() == recorded[epoch]
    assert [r["epoch"] for r in RunDir(run).read_metrics()] == list(range(1, epoch + 1))
    # on the untouched run's parts and the counts of META.json training reads (a META edit
    # elsewhere, such as the node count, is a statistic no number depends on)
    assert part_files(run) == part_files(trained_run.folder)
    meta = read_meta(RunDir(run).partitions)
    untouched = read_meta(trained_run.folder / "partitions")
    assert DatasetInfo.from_meta(meta) == DatasetInfo.from_meta(untouched)
    assert meta["num_parts"] == untouched["num_parts"]


@pytest.mark.parametrize("case", ["part file: a byte flipped", "checkpoint: a weight changed"])
def test_an_edited_run_file_through_leo_train_resume(
    case: str, trained_run: TrainedRun, tmp_path: Path
) -> None:
    """End to end: a worker's refusal reaches the console as one sentence; a skipped
    checkpoint costs epochs, and the run trains the untouched run's losses to the end."""
    edit, outcome, names = EDITS[case]
    run = trained_run.copy(tmp_path / "run")
    edit(run)
    sets = [arg for item in trained_run.settings for arg in ("--set", item)]
    res = leo("train", *sets, "--set", f"run.out_dir={run}", "--resume")
    assert "Traceback" not in res.stderr, res.stderr
    if outcome == "refused":
        assert res.returncode != 0, f"{case}: trained\n{res.stdout}"
        message = " ".join(res.stderr.split())
        assert names in message, message
        return
    assert res.returncode == 0, f"{case}: {res.stderr}"
    assert names in " ".join(res.stderr.split()), res.stderr
    got, reference = losses(run), losses(trained_run.folder)
    assert sorted(got) == list(range(1, FIRST + 1))
    np.testing.assert_allclose(
        [got[e] for e in range(1, FIRST + 1)], [reference[e] for e in range(1, FIRST + 1)],
        rtol=1e-5,
    )  # fmt: skip
    summary = json.loads((run / "summary.json").read_text())
    assert summary["exact"] is True
