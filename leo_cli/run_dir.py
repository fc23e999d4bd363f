"""A run folder: the one owner of its paths, readers and writers (docs/design/run-files.md).

Every file of a run goes through `RunDir`: the resolved config, metrics.jsonl, summary.json,
status.json, the checkpoints, the set-up stamps the parent leaves for rank 0, and the names
of the files other stages write there (partitions, hardware profile, cache plan, mode choice).
What is read back is untrusted input (an edit, a copy cut short, another version's file): a
metrics row or a checkpoint that is not what LEO wrote stops the run with one sentence naming
the file. Writes are atomic (util/files.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from leo_cli.errors import TrainError
from leo_cli.util import files
from leo_cli.util.strict import Finite

KEEP_CHECKPOINTS = 2  # newest checkpoints kept; older ones are deleted after a good write
Count = Annotated[StrictInt, Field(ge=0)]


class RunDir:
    """The files of one run folder, by name, with their readers and writers."""

    CONFIG = "resolved_config.yaml"
    METRICS = "metrics.jsonl"
    SUMMARY = "summary.json"
    STATUS = "status.json"
    CURVES = "curves.png"
    PLAN = "cache-plan.json"
    PLAN_PLOT = "cache-plan.png"
    HARDWARE = "hardware.json"
    MODE_CHOICE = "mode-choice.json"
    REGROUPED = "regrouped.json"  # the last time the run went on with fewer workers
    PARTITIONS = "partitions"
    SOURCE_DIGESTS = ".source-digests.json"  # sha256 of the raw files, by path and stamp
    CHECKPOINTS = "checkpoints"
    SET_ASIDE = "set-aside"  # in checkpoints/: files a resume skipped, kept with a note
    SET_ASIDE_NOTE = "NOTE.txt"
    SETUP = ".setup.json"
    FIRST_SETUP = ".first-setup.json"  # the launch's first attempt's set-up, for restarts
    ERRORS = ".errors"
    HEARTBEATS = ".heartbeat"
    LOGS = "logs"
    PROBE = "probe"
    EMULATE = "emulate"  # the emulated nodes' configs and logs (launch.emulate)
    TENSORBOARD = "tensorboard"  # rank 0's event files (run.tensorboard)
    # What one attempt writes and a fresh start clears (partitions, plan and profile stay).
    ATTEMPT_FILES = (METRICS, SUMMARY, STATUS, CURVES, MODE_CHOICE, REGROUPED)
    ATTEMPT_FOLDERS = (CHECKPOINTS, HEARTBEATS, ERRORS, LOGS, TENSORBOARD)

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def __truediv__(self, name: str) -> Path:
        return self.root / name

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    @property
    def config(self) -> Path:
        return self.root / self.CONFIG

    @property
    def metrics(self) -> Path:
        return self.root / self.METRICS

    @property
    def summary(self) -> Path:
        return self.root / self.SUMMARY

    @property
    def status(self) -> Path:
        return self.root / self.STATUS

    @property
    def curves(self) -> Path:
        return self.root / self.CURVES

    @property
    def plan(self) -> Path:
        return self.root / self.PLAN

    @property
    def plan_plot(self) -> Path:
        return self.root / self.PLAN_PLOT

    @property
    def hardware(self) -> Path:
        return self.root / self.HARDWARE

    @property
    def mode_choice(self) -> Path:
        return self.root / self.MODE_CHOICE

    @property
    def regrouped(self) -> Path:
        return self.root / self.REGROUPED

    @property
    def partitions(self) -> Path:
        return self.root / self.PARTITIONS

    @property
    def checkpoints(self) -> Path:
        return self.root / self.CHECKPOINTS

    @property
    def errors(self) -> Path:
        return self.root / self.ERRORS

    @property
    def best(self) -> Path:
        """The best-validation model (`checkpoints/best.pt`)."""
        return self.checkpoints / "best.pt"

    @property
    def logs(self) -> Path:
        return self.root / self.LOGS

    @property
    def emulate(self) -> Path:
        return self.root / self.EMULATE

    @property
    def setup_file(self) -> Path:
        return self.root / self.SETUP

    # metrics.jsonl

    def read_metrics(self) -> list[Any]:
        """Every line of metrics.jsonl, parsed; a line that is not JSON comes back as its text
        (`check_rows` names it), but for a last line still being appended (no newline yet),
        which is left out."""
        rows: list[Any] = []
        if self.metrics.is_file():
            text = self.metrics.read_text(errors="replace")
            lines = text.splitlines()
            for i, line in enumerate(lines):
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    if i < len(lines) - 1 or text.endswith("\n"):
                        rows.append(line)
        return rows

    def truncate_metrics(self, last_epoch: int) -> None:
        """Keep only epochs <= last_epoch, so a resumed run appends without duplicates."""
        rows = self.read_metrics()
        check_rows(rows, self.metrics)  # read back on resume: kept rows go into summary.json
        rows = [r for r in rows if r["epoch"] <= last_epoch]
        files.write_text(self.metrics, "".join(files.json_text(r) + "\n" for r in rows))

    def append_metrics(self, row: dict[str, Any]) -> None:
        """One line per epoch (strict JSON; never appended through a symlink). A row that
        records a checkpoint's digest is on disk before that checkpoint is written, so no power
        loss leaves a checkpoint without its row."""
        fsync = "checkpoint_sha256" in row
        files.append_line(self.metrics, files.json_text(row), fsync=fsync)

    # summary.json, status.json

    def read_summary(self) -> dict[str, Any]:
        """summary.json, or {} when it is missing or unreadable."""
        return read_json(self.summary)

    def write_summary(self, summary: dict[str, Any]) -> None:
        files.write_json(self.summary, summary)

    def update_summary(self, fields: dict[str, Any]) -> None:
        """Add fields to an existing summary.json (the parent's `wall_s`); none: nothing."""
        summary = self.read_summary()
        if summary:
            self.write_summary({**summary, **fields})

    def write_status(
        self, state: str, reason: str | None = None, stages: dict[str, float] | None = None
    ) -> None:
        """The run's state; `reason` why it ended where there is one; `stages` rank 0's
        finished set-up stages (seconds by name) while the state is `setup`."""
        status: dict[str, Any] = {"state": state}
        if reason is not None:
            status["reason"] = reason
        if stages is not None:
            status["stages"] = stages
        files.write_json(self.status, status)

    def read_status(self) -> dict[str, Any]:
        """status.json, or {} when it is missing or unreadable."""
        return read_json(self.status)

    def read_regrouped(self) -> dict[str, Any]:
        """regrouped.json (the last change of worker count, `launch.nnodes: MIN:MAX`: when,
        how long it took, the sentence `leo train` shows), or {}."""
        return read_json(self.regrouped)

    # the parent's set-up stamps

    def write_setup(self, payload: dict[str, Any]) -> None:
        files.write_json(self.setup_file, payload)

    def write_first_setup(self, launched_at: float | None, setup: dict[str, Any]) -> None:
        files.write_json(self.root / self.FIRST_SETUP, {"launched_at": launched_at, **setup})

    def read_first_setup(self, launched_at: float | None) -> dict[str, Any]:
        """The set-up fields an earlier attempt of this launch recorded, or {}."""
        data = read_json(self.root / self.FIRST_SETUP)
        if data.pop("launched_at", "none") != launched_at:
            return {}
        return data

    def read_setup(self, launched_at: float | None) -> dict[str, Any]:
        """What the parent of this launch wrote (empty under plain torchrun or when stale)."""
        if launched_at is None:
            return {}
        data = read_json(self.setup_file)
        return data if data.get("launched_at") == launched_at else {}

    # checkpoints

    def list_checkpoints(self) -> list[tuple[int, Path]]:
        """(epoch, path) of every complete checkpoint, oldest first."""
        found = []
        for path in self.checkpoints.glob("epoch_*.pt"):
            m = re.fullmatch(r"epoch_(\d+)\.pt", path.name)
            if m:
                found.append((int(m.group(1)), path))
        return sorted(found)

    def save_checkpoint(self, epoch: int, state: dict[str, Any]) -> Path:
        """Write `checkpoints/epoch_<e>.pt` via a temporary file and an atomic rename; keep
        the newest `KEEP_CHECKPOINTS`. Torch's global generator goes in too (dropout masks
        are keyed by epoch, so the epoch is the rest of training's random state)."""
        import torch  # here: the config layer reads run folders without loading torch

        folder = self.checkpoints
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"epoch_{epoch:06d}.pt"
        files.sweep_temporaries(folder)  # left by a save that was killed
        with files.atomic_file(path, fsync=True) as f:
            torch.save({"epoch": epoch, "rng": torch.get_rng_state(), **state}, f)
        for _, old in self.list_checkpoints()[:-KEEP_CHECKPOINTS]:
            old.unlink(missing_ok=True)
        return path

    def save_best(self, epoch: int, accuracies: dict[str, Any], model: dict[str, Any]) -> Path:
        """Write `checkpoints/best.pt` atomically: the epoch, its accuracies and the model's
        state dict (what `leo export` takes out)."""
        import torch

        self.checkpoints.mkdir(parents=True, exist_ok=True)
        with files.atomic_file(self.best, fsync=True) as f:
            torch.save({"epoch": epoch, **accuracies, "model": model}, f)
        return self.best

    def read_best(self) -> dict[str, Any]:
        """`checkpoints/best.pt`, loaded with weights_only=True and checked.

        Raises:
            TrainError: it is missing or not what `save_best` writes.
        """
        import torch

        if not self.best.is_file():
            raise TrainError(
                f"{self.root} has no best-validation model ({self.best} is missing); train "
                "with validation nodes, or with a LEO that keeps one."
            )
        try:
            state = torch.load(self.best, map_location="cpu", weights_only=True)
            model = state["model"]
            if not isinstance(state["epoch"], int) or not all(
                isinstance(v, torch.Tensor) for v in model.values()
            ):
                raise ValueError("not a model state dict")
        except Exception as exc:  # an unreadable file names itself
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise TrainError(f"{self.best} cannot be read ({reason}).") from None
        result: dict[str, Any] = state
        return result

    def read_latest(self) -> dict[str, Any] | None:
        """The newest checkpoint that loads (weights_only=True) and checks, or None.

        A file that cannot be read, or whose contents are not the digest its epoch's metrics
        row recorded (edited, or copied from another run), is reported on stderr and the one
        before it is tried, so one bad file costs `train.checkpoint_every` epochs, not the run.

        Raises:
            TrainError: checkpoints exist but none of them can be read.
        """
        newest_first = [path for _, path in reversed(self.list_checkpoints())]
        for i, path in enumerate(newest_first):
            try:
                state = self.read_recorded(path)
            except Exception as exc:  # a corrupt file must name itself, not crash
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                if i + 1 == len(newest_first):
                    raise TrainError(
                        f"No checkpoint in {self.checkpoints} can be read ({path.name}: "
                        f"{reason}); start again without --resume."
                    ) from None
                print(
                    f"warning: checkpoint {path} cannot be read ({reason}); trying "
                    f"{newest_first[i + 1].name} instead.",
                    file=sys.stderr,
                )
                continue
            return state
        return None

    def read_recorded(self, path: Path) -> dict[str, Any]:
        """A checkpoint of this run, loaded and checked (`read_checkpoint`), and its contents
        the digest its epoch's metrics row recorded: required once a row of its epoch or
        before records one (LEO writes the row before the file, so only an edit, a copy from
        another run or an older version's rows leave it out).

        Raises:
            Exception: whatever makes it unreadable, not ours or not what its epoch saved.
        """
        state = read_checkpoint(path)
        recorded = self.recorded_digests()
        epoch = int(state["epoch"])
        digest = recorded.get(epoch)
        if digest is None and any(e <= epoch for e in recorded):
            raise ValueError(f"{self.metrics.name} records no digest for its epoch {epoch}")
        if digest is not None and digest != checkpoint_digest(state).hex():
            raise ValueError(
                f"its contents are not what epoch {epoch} saved (the digest in "
                f"{self.metrics.name} differs)"
            )
        return state

    def recorded_digests(self) -> dict[int, str]:
        """The `checkpoint_sha256` of each epoch whose metrics row records one (rows that are
        not what LEO writes are passed over here; `check_rows` names them)."""
        out: dict[int, str] = {}
        for row in self.read_metrics():
            if isinstance(row, dict) and type(row.get("epoch")) is int:
                digest = row.get("checkpoint_sha256")
                if isinstance(digest, str):
                    out[row["epoch"]] = digest
        return out

    def set_aside_checkpoints_after(self, epoch: int) -> list[Path]:
        """Move the checkpoints of epochs after `epoch`, the one a resume started from, into
        `checkpoints/set-aside/` with a line each in its NOTE.txt: the resume skipped them
        (unreadable, or not what their epoch's row recorded), and once their metrics rows are
        truncated nothing would tell them apart at the next resume. Returns where they went."""
        moved = []
        for saved, path in self.list_checkpoints():
            if saved <= epoch:
                continue
            aside = self.checkpoints / self.SET_ASIDE
            aside.mkdir(exist_ok=True)
            dest = aside / path.name
            k = 1
            while dest.exists():
                k += 1
                dest = aside / f"{path.stem}-{k}{path.suffix}"
            path.rename(dest)
            files.append_line(
                aside / self.SET_ASIDE_NOTE,
                f"{dest.name}: skipped by a resume from epoch {epoch} (unreadable, or not what "
                f"its epoch's row in {self.METRICS} recorded); set aside, not used again.",
            )
            print(f"warning: checkpoint {path.name} set aside as {dest}.", file=sys.stderr)
            moved.append(dest)
        return moved

    def load_latest(self) -> dict[str, Any] | None:
        """`read_latest`, with torch's global generator restored from it."""
        import torch

        state = self.read_latest()
        if state is not None:
            torch.set_rng_state(state["rng"])
        return state


def read_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint file, loaded with weights_only=True and checked (`check_checkpoint`).

    Raises:
        Exception: whatever makes it unreadable or not ours (the caller names the file).
    """
    import torch

    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    check_checkpoint(state, epoch_of(path))  # untrusted: loads, but is it ours?
    return state


def checkpoint_digest(state: dict[str, Any] | None) -> bytes:
    """SHA-256 of what a checkpoint gives training (epoch, generator, model, optimizer),
    tensors by name, dtype, shape and bytes; 32 zero bytes for no checkpoint. Ranks compare it:
    per-node copies of a run folder can hold different files of one epoch."""
    import hashlib

    import torch

    if state is None:
        return bytes(32)
    h = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous().reshape(-1)
            h.update(f"{t.dtype}{list(value.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            for key in sorted(value, key=repr):
                h.update(repr(key).encode())
                feed(value[key])
        elif isinstance(value, list | tuple):
            for item in value:
                feed(item)
        else:
            h.update(repr(value).encode())

    feed({k: state.get(k) for k in ("epoch", "rng", "model", "optimizer")})
    return h.digest()


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`, or {} when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return {}
    return data if isinstance(data, dict) else {}


def epoch_of(path: Path) -> int:
    """The epoch in a checkpoint's file name."""
    return int(path.name.removeprefix("epoch_").removesuffix(".pt"))


class MetricsRow(BaseModel):
    """The fields of a metrics.jsonl row that summary.json is computed from (others pass)."""

    model_config = ConfigDict(extra="allow")

    epoch: Annotated[StrictInt, Field(ge=1)]
    loss: Finite
    epoch_time_s: Annotated[Finite, Field(ge=0)]
    comm_bytes: Count
    train_acc: Annotated[Finite, Field(ge=0, le=1)] | None = None
    val_acc: Annotated[Finite, Field(ge=0, le=1)] | None = None
    test_acc: Annotated[Finite, Field(ge=0, le=1)] | None = None
    comm_wait_s: Annotated[Finite, Field(ge=0)] | None = None
    comm_transfer_s: Annotated[Finite, Field(ge=0)] | None = None
    step_comm_bytes: Count | None = None
    step_published_bytes: Count | None = None
    rank_step_s: list[Annotated[Finite, Field(ge=0)]] | None = None
    rank_busy_s: list[Annotated[Finite, Field(ge=0)]] | None = None
    cold: StrictBool = False
    exact: StrictBool = True
    workers: Annotated[StrictInt, Field(ge=1)] | None = None
    checkpoint_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None


def check_rows(rows: list[Any], path: Path) -> None:
    """Every row a metrics row, epochs increasing.

    Raises:
        TrainError: naming the line and the field.
    """
    last = 0
    for line, row in enumerate(rows, start=1):
        try:
            epoch = MetricsRow.model_validate(row).epoch
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "the row"
            problem = f"{where}: {err['msg']}"
        else:
            if epoch > last:
                last = epoch
                continue
            problem = f"epoch {epoch} does not follow epoch {last}"
        raise TrainError(
            f"{path} line {line} is not a metrics row LEO wrote ({problem}); delete that line "
            "and the ones after it to resume, or start again without --resume."
        )


def check_checkpoint(state: Any, epoch: int) -> None:
    """What `RunDir.save_checkpoint` writes: the epoch of its file name, torch's RNG state,
    and the model's and optimizer's state dicts.

    Raises:
        ValueError: what is wrong (the caller names the file).
    """
    import torch

    if not isinstance(state, dict):
        raise ValueError("not a checkpoint dictionary")
    saved = state.get("epoch")
    if type(saved) is not int or saved != epoch:
        raise ValueError(f"its epoch is {saved!r}, its name says {epoch}")
    rng = state.get("rng")
    if not isinstance(rng, torch.Tensor) or rng.dtype != torch.uint8 or rng.dim() != 1:
        raise ValueError("its rng entry is not torch's generator state")
    expected = torch.get_rng_state().numel()
    if rng.numel() != expected:
        raise ValueError(
            f"its rng entry holds {rng.numel()} bytes, torch's generator state {expected}"
        )
    model = state.get("model")
    if not isinstance(model, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in model.items()
    ):
        raise ValueError("its model entry is not a state dict of tensors")
    opt = state.get("optimizer")
    if not isinstance(opt, dict) or not isinstance(opt.get("param_groups"), list):
        raise ValueError("its optimizer entry is not an optimizer state dict")
    for name, value in model.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ValueError(f"its weight {name} is not finite")
