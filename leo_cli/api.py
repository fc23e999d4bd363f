"""LEO from Python: `from leo_cli import train, bench`, the functions `leo train` and `leo bench`
run.

    from leo_cli import train
    run = train("configs/cora_gcn.yaml", {"data.root": "data/planetoid", "train.num_epochs": 50})
    print(run.test_acc, run.run_dir)

`config` is a YAML path, a dict of sections, a `LeoConfig` or None (the built-in default);
`overrides` maps dotted keys to values, as `--set key=value` does.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leo_cli.config import LeoConfig
from leo_cli.config.load import read_yaml, set_dotted, validate
from leo_cli.errors import TrainError
from leo_cli.run_dir import RunDir

ConfigLike = str | os.PathLike[str] | Mapping[str, Any] | LeoConfig | None
StageFn = Callable[[str, int, int], None]  # (stage, done, total), as the progress bars take it
DEFAULT_BENCH_CONFIG = Path(__file__).parent / "bench" / "default.yaml"


@dataclass(frozen=True)
class RunSummary:
    """What a training run reports (summary.json; `raw` holds all of it)."""

    run_dir: Path
    name: str
    mode: str
    world_size: int
    num_epochs: int
    best_val_acc: float | None
    best_epoch: int | None
    test_acc: float | None  # at the best validation epoch (the model `leo export` writes)
    final_test_acc: float | None
    final_loss: float | None
    mean_epoch_time_s: float | None
    setup_s: float | None
    exact: bool
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def read(cls, run_dir: Path) -> RunSummary:
        """The summary of a finished run.

        Raises:
            TrainError: the run folder holds no summary.
        """
        s = RunDir(run_dir).read_summary()
        if not s:
            raise TrainError(f"{RunDir(run_dir).summary} is missing or unreadable.")
        return cls(
            run_dir=run_dir, name=s["name"], mode=s["mode"], world_size=s["world_size"],
            num_epochs=s["num_epochs"], best_val_acc=s.get("best_val_acc"),
            best_epoch=s.get("best_epoch"), test_acc=s.get("test_acc"),
            final_test_acc=s.get("final_test_acc"), final_loss=s.get("final_loss"),
            mean_epoch_time_s=s.get("mean_epoch_time_s"), setup_s=s.get("setup_s"),
            exact=bool(s.get("exact", True)), raw=s,
        )  # fmt: skip


def resolve(config: ConfigLike = None, overrides: Mapping[str, Any] | None = None) -> LeoConfig:
    """The validated config: defaults < `config` < `overrides` (dotted keys).

    Raises:
        ConfigError: a key or value is invalid (one sentence naming it).
    """
    if isinstance(config, LeoConfig):
        tree, source = config.model_dump(mode="json"), "the given LeoConfig"
    elif isinstance(config, Mapping):
        tree, source = copy.deepcopy(dict(config)), "the config dict"  # the caller's stays
    elif config is not None:
        tree, source = read_yaml(Path(config)), str(config)
    else:
        tree, source = {}, "the built-in defaults"
    return _over(tree, overrides or {}, source)


def _over(tree: dict[str, Any], overrides: Mapping[str, Any], source: str) -> LeoConfig:
    sources = {}
    for key, value in overrides.items():
        set_dotted(tree, key, str(value) if isinstance(value, os.PathLike) else value)
        sources[key] = f"overrides[{key!r}]"
    return validate(tree, source, sources)


def train(
    config: ConfigLike = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    allow_inexact: bool = False,
    progress: StageFn | None = None,
    on_start: Callable[[LeoConfig, Path], None] | None = None,
) -> RunSummary | None:
    """Train as `leo train` does: partitions and plan when needed, one worker per part; the
    run's summary (None on a machine other than node 0 of several, which writes none).

    `progress` receives the set-up stages; `on_start(cfg, run_dir)` runs once set-up is done,
    just before the workers start (the CLI shows its notes and progress bar there).

    Raises:
        LeoError: bad input or a failed run (one sentence).
    """
    from leo_cli.launch import early
    from leo_cli.launch.run_folder import dropped_if_empty, for_train, machine_cache_dir
    from leo_cli.util.timing import RunTimer, run_start_time

    timer = RunTimer(started_at=run_start_time())
    given = resolve(config, overrides)
    cfg = for_train(given, resume, overwrite)  # a refused folder is said without torch
    run_dir = cfg.run.folder.resolve()
    with early.server(cfg, machine_cache_dir(cfg, run_dir)):  # its imports beside ours
        from leo_cli.launch.nodes import run_nodes
        from leo_cli.launch.setup import Ask, run_setup

        ask = Ask.train(cfg, resume, allow_inexact, progress, timer, on_start)
        with dropped_if_empty(run_dir, made=given.run.out_dir is None and not resume):
            checked = run_setup(ask, last="checks")
            if cfg.launch.emulate is not None:  # every emulated node runs `leo train` itself
                flags = ["--resume" if resume else "--overwrite"]
                run_nodes(cfg, "train", flags + ["--allow-inexact"] * allow_inexact)
                return RunSummary.read(run_dir)
            run_setup(ask, done=checked)  # partitions, profile, plan, mode, the workers
    return RunSummary.read(run_dir) if cfg.launch.node_rank == 0 else None


@dataclass(frozen=True)
class BenchResult:
    """The rows of a benchmark (bench.json's) and the files written."""

    rows: list[dict[str, Any]]
    written: list[Path]


def bench(
    config: ConfigLike = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    progress: StageFn | None = None,
    on_run: Callable[[int, int, Any], None] | None = None,
    say: Callable[[str], None] = print,
    command: str | None = None,
) -> BenchResult:
    """Benchmark as `leo bench` does (default config: the bench graph); writes bench.json /
    .csv / .md / .png into run.out_dir, after every round too. `command` labels the results
    (default: this call).

    Raises:
        LeoError: bad input or a failed run (one sentence).
    """
    from leo_cli.bench import report
    from leo_cli.bench.suite import Measured, check_bench, run_suite
    from leo_cli.launch.run_folder import for_command

    cfg = for_command(resolve(DEFAULT_BENCH_CONFIG if config is None else config, overrides))
    check_bench(cfg)
    out_dir = cfg.run.folder.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    label = command or f"leo_cli.bench(config={config!r}, overrides={dict(overrides or {})!r})"
    env = report.environment(label)

    def on_round(measured: list[Measured]) -> None:
        report.write_outputs(out_dir, report.make_rows(cfg, measured, out_dir), env)

    measured = run_suite(cfg, out_dir, on_run or (lambda *_: None), progress, say, on_round)
    rows = report.make_rows(cfg, measured, out_dir)
    return BenchResult(rows, report.write_outputs(out_dir, rows, env))
