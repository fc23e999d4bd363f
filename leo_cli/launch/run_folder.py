"""Which folder a command writes (`run.out_dir`): a new one per `leo train` unless named, so
a second run never deletes the first one's results."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

from leo_cli.config import LeoConfig
from leo_cli.errors import ConfigError
from leo_cli.run_dir import RunDir

RUNS = Path("runs")  # where unnamed run folders go: runs/<name>/<date>-<time>
CACHE_FOLDER = "leo-cache"  # beside the run folder, where `run.cache_dir` is null
STAMP = "%Y%m%d-%H%M%S"
STAMPED = re.compile(r"(?P<stamp>\d{8}-\d{6})(?:-(?P<k>\d+))?")


def named(cfg: LeoConfig) -> Path:
    """`runs/<name>` (the name made safe for a folder)."""
    return RUNS / (re.sub(r"[^A-Za-z0-9_.+-]+", "-", cfg.run.name).strip("-.") or "run")


def machine_cache_dir(cfg: LeoConfig, run_dir: Path) -> Path:
    """This machine's cache for the run in `run_dir`: `run.cache_dir`, null: `leo-cache`
    beside the run folder."""
    return cfg.run.cache_dir or Path(run_dir).resolve().parent / CACHE_FOLDER


def with_folder(cfg: LeoConfig, folder: Path) -> LeoConfig:
    """`cfg` with `run.out_dir = folder`."""
    return cfg.model_copy(update={"run": cfg.run.model_copy(update={"out_dir": folder})})


def for_command(cfg: LeoConfig) -> LeoConfig:
    """`leo partition`, `leo profile-cache`, `leo bench`: `runs/<name>` unless named.

    Raises:
        ConfigError: the named folder holds a trained run, whose record of what it trained
            with (resolved config, partitions, plan) these commands would replace.
    """
    if cfg.run.out_dir is None:
        return with_folder(cfg, named(cfg))
    if holds_results(cfg.run.out_dir):
        raise ConfigError(
            f"run.out_dir={cfg.run.out_dir} holds a trained run, whose resolved_config.yaml, "
            "partitions and plan this command would replace; name another folder, or leave "
            "run.out_dir unset (leo train --resume continues that run)."
        )
    return cfg


def holds_results(folder: Path) -> bool:
    """Whether a folder holds a training run's results (metrics, summary or checkpoints);
    partitions, a profile or a plan alone do not count."""
    run = RunDir(folder)
    saved = run.checkpoints.is_dir() and any(run.checkpoints.iterdir())
    return run.metrics.is_file() or run.summary.is_file() or saved


def for_train(cfg: LeoConfig, resume: bool, overwrite: bool, now: float | None = None) -> LeoConfig:
    """`leo train`'s folder: the one named, else a new `runs/<name>/<date>-<time>`, or with
    --resume the newest of that name.

    Raises:
        ConfigError: --resume with nothing to resume, a named folder that holds a run without
            --resume or --overwrite, or several nodes without a folder they share.
    """
    if cfg.run.out_dir is None:
        if cfg.launch.nnodes > 1:
            raise ConfigError(
                "launch.nnodes > 1 needs run.out_dir: every node must name the same folder "
                "(on a file system they share)."
            )
        folder = newest(named(cfg)) if resume else fresh(named(cfg), now)
        return with_folder(cfg, folder)
    if not (resume or overwrite) and holds_results(cfg.run.out_dir):
        raise ConfigError(
            f"run.out_dir={cfg.run.out_dir} already holds a run; continue it with --resume, "
            "replace it with --overwrite, or leave run.out_dir unset for a new folder per run."
        )
    return cfg


@contextlib.contextmanager
def dropped_if_empty(folder: Path, made: bool) -> Iterator[None]:
    """Inside, a run in `folder`; when it fails and `made` (the folder is this run's new one,
    `fresh`) and nothing was written there (refused before it started), the folder goes too."""
    try:
        yield
    except BaseException:
        if made:
            with contextlib.suppress(OSError):  # not empty, or gone: it stays as it is
                folder.rmdir()
        raise


def fresh(parent: Path, now: float | None = None) -> Path:
    """A new folder under `parent`, made here (two runs started in the same second get one
    each): the time, then `-2`, `-3`, ... .

    Raises:
        ConfigError: `parent` cannot be written.
    """
    stamp = time.strftime(STAMP, time.localtime(now))
    k = 1
    while True:
        folder = parent / (stamp if k == 1 else f"{stamp}-{k}")
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            k += 1
        except OSError as exc:
            raise ConfigError(
                f"Cannot create {folder} ({exc.strerror}); set run.out_dir to a writable folder."
            ) from None


def _order(folder: Path) -> tuple[str, int] | None:
    """The sort key of a run folder's name (`<date>-<time>[-k]`), None for other names."""
    m = STAMPED.fullmatch(folder.name)
    return None if m is None else (m["stamp"], int(m["k"] or 1))


def newest(parent: Path) -> Path:
    """The newest run folder under `parent`, by the time in its name (other folders, such as
    a benchmark's, are not runs of this name).

    Raises:
        ConfigError: there is none.
    """
    runs = [p for p in parent.glob("*") if _order(p) and RunDir(p).config.is_file()]
    runs.sort(key=lambda p: _order(p) or ("", 0))
    if not runs:
        raise ConfigError(
            f"--resume found no run under {parent}; name the run's folder with "
            "--set run.out_dir=FOLDER."
        )
    return runs[-1]


def resume_note(folder: Path, workers: int) -> str | None:
    """One sentence when a run resumes on another worker count than its last epochs had."""
    rows = [r for r in RunDir(folder).read_metrics() if isinstance(r, dict)]
    before = rows[-1].get("workers") if rows else None
    if not isinstance(before, int) or before == workers:
        return None
    exact = all(r.get("exact") is True for r in rows)  # inexact modes differ by count
    return (
        f"resuming from the last checkpoint on {workers} worker{'s' * (workers != 1)} (it "
        f"trained on {before}) with partitions and a plan made for {workers}"
        + (f"; the numbers are those of {before}." if exact else ".")
    )
