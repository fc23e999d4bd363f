"""A run's set-up as one pipeline of named stages, in the order they happen:

    checks -> preload -> resume -> nodes_probe -> [hardware] -> part_weights -> partitions
    -> attempt -> started -> [hardware] -> plan -> mode -> mode_plan -> resolved -> launch

Each stage is a function that takes the record of the stages before it (`Setup`) and returns
it with its own result filled in, and what its output cost (`Cost`: made now, or reused and
what it cost when made). The pipeline times every stage (`Setup.seconds`) and books the
stages that have a key in summary.json's `setup_parts_s` (`partition_s`, `probe_s`,
`plan_s`) on the run's `RunTimer`. The hardware profile comes before the part weights when
they need it (unequal weights; `leo profile-cache --force`), else after the partitions, so
that a bad dataset is said before a probe runs.

A stage calls its steps in turn (the launch checks, the profile's look-ups, the mode choice),
each going down the layers on its own with what the stage hands it: what several steps need
of the lower layers is read once (`Workers`: this node's worker count, device and module).

`leo train` and `leo bench` run the whole list, `leo partition` the prefix up to
`partitions`, `leo profile-cache` the prefix up to `plan` (`Ask` says what each asks). On
nodes other than 0 of several machines, the stages node 0 owns are replaced by waits: the
probe node 0 runs is joined, the resolved config it writes last is waited for.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from leo_cli.comm.dist import uses_cuda
from leo_cli.config import LeoConfig, write_resolved
from leo_cli.graph.layout import ProgressFn
from leo_cli.graph.partition_cache import PartitionResult, Weigher, ensure_partitions, weighted
from leo_cli.kernels import active_backend
from leo_cli.launch.choice import (
    SPMM_PREFIX,
    calibration_errors,
    calibration_pairs,
    from_wisdom,
    keep_trials,
    kept,
    scale,
    setting_of,
    wisdom_dir,
)
from leo_cli.launch.cpu_kernels import check_cpu_kernels, check_cpu_spmm, ensure_cpu_kernels
from leo_cli.launch.elastic import (
    Workers,
    run_workers,
    start_early,
    worker_module,
    workers_per_node,
)
from leo_cli.launch.launcher import (
    check_device,
    check_resumable,
    check_tensorboard,
    clear_run_files,
    wait_for_partitions,
    written,
)
from leo_cli.launch.run_folder import machine_cache_dir
from leo_cli.launch.stages import (
    accesses_kept,
    check_nodes_profile,
    given_profile,
    join_probe,
    needs_profile,
    new_profile,
    partition_cache_dir,
    placement,
    plan_for,
    saved_profile_for,
    weigher_for,
)
from leo_cli.planner.auto_mode import (
    ModeChoice,
    choose,
    epochs_to_repay,
    kept_spmm,
    measures,
    planning_config,
    resumed,
    resumed_spmm,
    spmm_candidates,
    to_try,
    with_choice,
    write_choice,
)
from leo_cli.planner.checks import check_config, check_transport
from leo_cli.planner.plan import CachePlan, PlanInputs
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.planner.wisdom import calibrated, wisdom_key, wisdom_path
from leo_cli.registry import is_auto
from leo_cli.run_dir import RunDir
from leo_cli.util.rss import available_memory_bytes
from leo_cli.util.timing import RunTimer

OnStart = Callable[[LeoConfig, Path], None]


@dataclass(frozen=True)
class Ask:
    """What a command asks of set-up; the same for every stage (see the constructors)."""

    cfg: LeoConfig
    run_dir: Path
    checks: Literal["launch", "config", "none"] = "none"  # what `checks` checks
    launching: bool = False  # workers start at the end (`leo train`, `leo bench`)
    resume: bool = False
    allow_inexact: bool = False
    rebuild: bool = False  # partitions made again (`leo partition --force`)
    force: bool = False  # the plan made again, a saved profile checked again
    reprobe: bool = False  # the machine measured again, first
    hardware: Path | None = None  # a given profile (`--hardware`)
    always_plan: bool = False  # a plan whatever the policy (`leo profile-cache`)
    verify_parts: bool = True  # False: each worker verifies its own part's checksums
    joined: bool = False  # the other nodes run the same command and join its probes
    progress: ProgressFn | None = None
    on_start: OnStart | None = None  # set-up is done, the workers start next
    timer: RunTimer = field(default_factory=RunTimer)

    @classmethod
    def train(
        cls,
        cfg: LeoConfig,
        resume: bool = False,
        allow_inexact: bool = False,
        progress: ProgressFn | None = None,
        timer: RunTimer | None = None,
        on_start: OnStart | None = None,
    ) -> Ask:
        """`leo train` (and each run of `leo bench`): every stage, then the workers."""
        return cls(
            cfg, cfg.run.folder.resolve(), checks="launch", launching=True, resume=resume,
            allow_inexact=allow_inexact, verify_parts=False, joined=True, progress=progress,
            on_start=on_start, timer=timer or RunTimer(),
        )  # fmt: skip

    @classmethod
    def profile_cache(
        cls, cfg: LeoConfig, force: bool, hardware: Path | None, progress: ProgressFn | None
    ) -> Ask:
        """`leo profile-cache`: the config checked, partitions, profile, a plan in any case;
        `force` measures the machine again first (unless a profile is given) and makes the
        plan anew."""
        reprobe = force and hardware is None and cfg.cache.hardware is None
        return cls(
            cfg, cfg.run.folder.resolve(), checks="config", force=force, reprobe=reprobe,
            hardware=hardware, always_plan=True, joined=True, progress=progress,
        )  # fmt: skip

    @classmethod
    def partition(cls, cfg: LeoConfig, force: bool, progress: ProgressFn | None) -> Ask:
        """`leo partition`: the partitions (and the profile unequal weights are priced with),
        on the node it runs on alone."""
        return cls(cfg, cfg.run.folder.resolve(), rebuild=force, progress=progress)


@dataclass(frozen=True)
class Setup:
    """The stages' results so far: each stage fills its own fields."""

    ask: Ask
    seconds: dict[str, float] = field(default_factory=dict)  # per stage run, the pipeline's
    workers: Workers | None = None  # this node's workers, as the launch checks found them
    stale: tuple[int, int, int] | None = None  # node > 0: the resolved config to outwait
    hardware: HardwareProfile | None = None
    weigher: Weigher | None = None
    parts: PartitionResult | None = None
    started: ModeChoice | None = None  # a resumed auto run's mode, planned for alone
    made_for: PlanInputs | None = None  # what the plan is made for
    plan: CachePlan | None = None
    choice: ModeChoice | None = None
    run_cfg: LeoConfig | None = None  # the config with the mode that runs
    resumed_cfg: LeoConfig | None = None  # a resumed run's, with its SpMM variant

    @property
    def cfg(self) -> LeoConfig:
        """The config set-up plans with (a resumed run's own SpMM variant); the workers start
        from the one given (`launch`)."""
        return self.resumed_cfg or self.ask.cfg

    @property
    def run_dir(self) -> Path:
        return self.ask.run_dir

    @property
    def meta(self) -> dict[str, Any]:
        assert self.parts is not None, "the partitions stage runs first"
        return self.parts.meta


@dataclass(frozen=True)
class Cost:
    """What a stage's output cost this run: made now (`reused_s` None: the pipeline's clock
    says how long), or reused (`reused_s`: what it cost when it was made)."""

    reused_s: float | None = None


MADE = Cost()
StageFn = Callable[[Setup], tuple[Setup, Cost | None]]  # None: nothing made or reused


@dataclass(frozen=True)
class Stage:
    """One step of set-up: its name, function and key in `setup_parts_s`, when a command
    runs it, and whether node 0 owns it (other nodes run `wait` in its place, or nothing)."""

    name: str
    run: StageFn
    timed_as: str | None = None
    when: Callable[[Ask], bool] = lambda ask: True
    owned: bool = False
    wait: StageFn | None = None


def check_supported(cfg: LeoConfig, allow_inexact: bool = False) -> Workers:
    """Devices as the parent sees them, the kernels `LEO_KERNELS` and `pipeline.spmm` ask for
    (an unbuilt extension under `LEO_KERNELS=cuda` is said before partitioning; LEO's CPU
    library is checked as far as known before the build on first use), then the config
    checks that every worker repeats; this node's workers, as they were found.

    What the checks need of the lower layers (the worker count, CUDA or not) is read once,
    into `Workers`; each check then goes down the layers on its own, called in turn here.
    """
    workers = Workers(workers_per_node(cfg), uses_cuda(cfg.launch), worker_module(cfg))
    check_device(cfg.launch, workers.per_node, workers.cuda)
    check_tensorboard(cfg.run.tensorboard and cfg.launch.node_rank == 0)  # node 0 holds rank 0
    check_cpu_kernels(cfg)
    check_config(cfg, allow_inexact)
    check_transport(cfg, workers.cuda)
    return workers


def checks(s: Setup) -> tuple[Setup, Cost | None]:
    """Devices, kernels and the config as the workers will check it (`leo train`), or the
    config alone (`leo profile-cache`): refused inputs are said before any work."""
    if s.ask.checks == "launch":
        return replace(s, workers=check_supported(s.cfg, s.ask.allow_inexact)), None
    if s.ask.checks == "config":
        check_config(s.cfg)
    return s, None


def preload(s: Setup) -> tuple[Setup, Cost | None]:
    """LEO's CPU SpMM built (once, before the server loads it as it imports), then the server
    the workers fork from starts: its imports run beside set-up."""
    assert s.workers is not None, "the launch checks run first"
    cache = machine_cache_dir(s.cfg, s.run_dir)
    ensure_cpu_kernels(cache)
    backend = active_backend()
    check_cpu_spmm(s.cfg, backend.cpu == "leo")  # before any expensive stage
    start_early(s.cfg, s.workers, cache)
    return s, None


def resume(s: Setup) -> tuple[Setup, Cost | None]:
    """A resumed run keeps its settings, and its newest checkpoint reads (said here, not
    only in worker logs); set-up goes on with the SpMM variant it started with, untried."""
    check_resumable(s.cfg, s.run_dir)
    RunDir(s.run_dir).read_latest()
    return replace(s, resumed_cfg=resumed_spmm(s.cfg, s.run_dir)), None


def nodes_probe(s: Setup) -> tuple[Setup, Cost | None]:
    """Several machines: the short launch every node joins to check a saved profile."""
    a = s.ask
    probed = check_nodes_profile(
        s.cfg, s.run_dir, a.always_plan, a.force, a.hardware, progress=a.progress
    )
    return s, MADE if probed else None


def join(s: Setup) -> tuple[Setup, Cost | None]:
    """Node > 0, for node 0's probes: join them when node 0 runs one. After a probe both
    joined, the resolved config in the folder is an earlier launch's until node 0 rewrites
    it (`stale`): it must not start this node's agent while node 0 prepares."""
    a = s.ask
    before = written(RunDir(s.run_dir).config)
    probed = join_probe(s.cfg, s.run_dir, a.always_plan, a.force, a.hardware)
    return replace(s, stale=before if probed else None), None


def profile_first(ask: Ask) -> bool:
    """Whether the hardware profile is needed before the partitions: unequal part weights
    are priced with it, and `--force` measures the machine before anything uses it."""
    return weighted(ask.cfg.partition) or ask.reprobe


def wants_profile(ask: Ask) -> bool:
    """Whether the run uses a hardware profile (a plan, unequal part weights)."""
    return ask.always_plan or ask.reprobe or needs_profile(ask.cfg)


def hardware(s: Setup) -> tuple[Setup, Cost | None]:
    """The hardware profile: given, saved (run folder, this machine's store), or probed
    (launch/stages.py `find_profile`, its steps in turn)."""
    a, cfg, num = s.ask, s.cfg, s.cfg.partition.num_parts
    own = RunDir(s.run_dir).hardware
    found = given_profile(cfg, own, a.hardware)
    if found is None:  # one machine: saved ones are measured as this run's workers sit
        threads = None if cfg.launch.nnodes > 1 else placement(cfg, workers_per_node(cfg))
        found = saved_profile_for(cfg, own, num, threads, a.reprobe)
    if found is not None:
        return replace(s, hardware=found), Cost(found.probe_s)
    return replace(s, hardware=new_profile(cfg, s.run_dir, num, a.progress)), MADE


def part_weights(s: Setup) -> tuple[Setup, Cost | None]:
    """Unequal part weights: the weigher the partitioner sizes parts with."""
    assert s.hardware is not None, "the hardware stage runs first"
    return replace(s, weigher=weigher_for(s.cfg, s.hardware)), None


def partitions(s: Setup) -> tuple[Setup, Cost | None]:
    """The run's partitions, reused while their source is unchanged, else made."""
    cfg, a = s.cfg, s.ask
    parts = ensure_partitions(
        cfg.data, cfg.partition, cfg.run.seed, s.run_dir, a.rebuild, a.progress, a.verify_parts,
        weigher=s.weigher, cache_dir=partition_cache_dir(cfg, s.run_dir),
    )  # fmt: skip
    made = sum(parts.meta.get("timings_s", {}).values())
    return replace(s, parts=parts), MADE if not parts.reused else Cost(made)


def attempt(s: Setup) -> tuple[Setup, Cost | None]:
    """This attempt starts clean: no plan of parts rebuilt now, none of an earlier
    attempt's metrics and checkpoints (unless resumed), errors or status."""
    run = RunDir(s.run_dir)
    assert s.parts is not None
    if not s.parts.reused:  # a plan made from the parts before a rebuild is made again
        run.plan.unlink(missing_ok=True)
    if not s.ask.resume:
        clear_run_files(s.run_dir)
    shutil.rmtree(run.errors, ignore_errors=True)
    run.status.unlink(missing_ok=True)  # `leo train` shows this attempt's set-up
    return s, None


def _plan(s: Setup, cfg: LeoConfig, made_for: PlanInputs) -> tuple[CachePlan, Cost]:
    """`plan_for` with the stage's inputs."""
    assert s.hardware is not None and s.parts is not None
    a, shared = s.ask, s.parts.reused
    made = plan_for(
        cfg, s.run_dir, s.hardware, a.force, a.verify_parts, a.progress, shared, made_for
    )
    return made[0], Cost(made[1])


def started(s: Setup) -> tuple[Setup, Cost | None]:
    """A resumed run under `pipeline.mode=auto` keeps the mode it started with."""
    return replace(s, started=resumed(s.cfg, s.run_dir)), None


def plan(s: Setup) -> tuple[Setup, Cost | None]:
    """The cache plan: the planned mode's under `pipeline.mode=auto`, or the mode a
    resumed auto run started with (it plans for it alone)."""
    cfg = s.cfg if s.started is None else with_choice(s.cfg, s.started)
    made_for = PlanInputs.of(cfg, s.meta)
    made, cost = _plan(s, cfg, made_for)
    return replace(s, made_for=made_for, plan=made), cost


def choose_mode(
    cfg: LeoConfig,
    run_dir: Path,
    meta: dict[str, Any],
    plan: CachePlan | None,
    made_for: PlanInputs | None = None,
) -> ModeChoice:
    """The mode of a new run: set by name, predicted (`pipeline.choose=estimate`, one
    worker, a single candidate), measured before by a run with the same inputs (wisdom,
    under `measure`), or the candidates the workers are to try (`ModeChoice.trials`), with
    where their result is to be kept; likewise the CPU SpMM variant (`pipeline.spmm=auto`:
    `ModeChoice.spmm_trials`, tried also with one worker or a mode set by name). `made_for`:
    what the plan stage planned for (worked out here where it did not run).

    The `mode` stage's steps, called in turn (launch/choice.py, planner/auto_mode.py,
    planner/wisdom.py); `leo profile-cache` runs them for its auto line."""
    num_parts = int(meta["num_parts"])
    cache = wisdom_dir(cfg, run_dir)
    estimate = choose(cfg, plan, num_parts)
    here = scale(cache, setting_of(cfg))
    estimate = replace(estimate, calibrated_s=calibrated(estimate.predicted_s, here))
    backend = active_backend()
    variants = spmm_candidates(cfg, backend.cpu == "leo")
    trial = estimate
    if measures(cfg, num_parts):
        missed = calibration_errors(cache, setting_of(cfg))
        pairs = calibration_pairs(cache, setting_of(cfg))
        trial = to_try(cfg, plan, estimate, available_memory_bytes(), missed, pairs)
    trial = replace(trial, spmm=cfg.pipeline.spmm, spmm_trials=variants)
    # The candidates left out for their payback are still this run's: the key (and the wisdom
    # a longer run measured of them) is the same whatever the run's length.
    tried = trial.trials or ([trial.name] if trial.unrepaid else [])  # (untried: the pick)
    tried = [*tried, *trial.unrepaid]
    if not tried and not variants:
        return trial
    if cfg.launch.nnodes > 1 and not cfg.cache.enabled:
        return trial  # no plan, so no profile of the links in the key: kept nowhere
    made_for = made_for or PlanInputs.of(planning_config(cfg), meta)
    inputs = [made_for.inputs, made_for.graph, plan.key if plan else ""]
    kernels = f"{backend.name}/{backend.cpu}"
    names = [*tried, *(f"{SPMM_PREFIX}{v}" for v in variants)]
    path = wisdom_path(cache, wisdom_key(cfg, inputs, kernels, names))
    if cfg.pipeline.choose == "measure":
        known = kept(path, tried, variants, epochs_to_repay(cfg))
        if known is not None:
            return from_wisdom(trial, known, path)
    return replace(trial, wisdom=str(path))


def mode(s: Setup) -> tuple[Setup, Cost | None]:
    """The mode that runs: set by name, chosen by `auto` (planner/auto_mode.py), or the
    candidates the workers try first (launch/choice.py)."""
    choice = s.started or choose_mode(s.cfg, s.run_dir, s.meta, s.plan, s.made_for)
    if s.ask.resume:  # the SpMM variant it started with, and why (also with a mode by name)
        choice = kept_spmm(choice, s.ask.cfg, s.run_dir)
    return replace(s, choice=choice, run_cfg=with_choice(s.cfg, choice)), None


def mode_plan(s: Setup) -> tuple[Setup, Cost | None]:
    """The plan of the chosen mode's own levels, where auto chose a mode that reads rows in
    place otherwise than the planned one."""
    assert s.run_cfg is not None
    if s.plan is None:
        return s, None
    made_for = PlanInputs.of(s.run_cfg, s.meta)
    if s.plan.inputs == made_for.inputs:
        return s, None
    made, cost = _plan(s, s.run_cfg, made_for)
    return replace(s, made_for=made_for, plan=made), cost


def resolved(s: Setup) -> tuple[Setup, Cost | None]:
    """mode-choice.json, then the resolved config with the mode that runs: written last,
    since other nodes start once it is there and read the mode in it."""
    assert s.choice is not None and s.run_cfg is not None
    write_choice(s.run_dir, s.choice)
    run = s.cfg.run.model_copy(update={"out_dir": s.run_dir})
    write_resolved(s.run_cfg.model_copy(update={"run": run}))
    return s, None


def wait_resolved(s: Setup) -> tuple[Setup, Cost | None]:
    """Node > 0: wait for node 0's partitions, plan and resolved config (not `stale`)."""
    wait_for_partitions(s.cfg, s.run_dir, s.cfg.launch.timeout_s, s.stale)
    return s, None


def launch(s: Setup) -> tuple[Setup, Cost | None]:
    """Set-up is done (`on_start`); the workers train until they finish."""
    a = s.ask
    if a.on_start is not None:
        a.on_start(a.cfg, s.run_dir)
    try:
        run_workers(a.cfg, s.run_dir, a.resume, a.allow_inexact, a.timer)
    finally:
        if a.cfg.launch.node_rank == 0:  # rank 0 wrote what `auto`'s trials measured
            keep_trials(a.cfg, s.run_dir)
    return s, None


def _launching(ask: Ask) -> bool:
    return ask.launching


def _resumed_auto(ask: Ask) -> bool:
    return ask.resume and is_auto(ask.cfg.pipeline.mode)


HARDWARE = Stage("hardware", hardware, "probe_s", wants_profile, owned=True)
STAGES = (
    Stage("checks", checks),
    Stage("preload", preload, when=_launching),
    Stage("resume", resume, when=lambda a: a.resume, owned=True),
    Stage("nodes_probe", nodes_probe, "probe_s", lambda a: a.joined, owned=True, wait=join),
    HARDWARE,  # here when the part weights need it (`profile_first`)
    Stage("part_weights", part_weights, when=lambda a: weighted(a.cfg.partition), owned=True),
    Stage("partitions", partitions, "partition_s", owned=True),
    Stage("attempt", attempt, when=_launching, owned=True),
    Stage("started", started, when=_resumed_auto, owned=True),
    HARDWARE,  # here otherwise
    Stage("plan", plan, "plan_s", lambda a: a.always_plan or a.cfg.cache.enabled, owned=True),
    Stage("mode", mode, when=_launching, owned=True),
    Stage("mode_plan", mode_plan, "plan_s", _launching, owned=True),
    Stage("resolved", resolved, when=_launching, owned=True, wait=wait_resolved),
    Stage("launch", launch, when=_launching),
)


def stages_for(ask: Ask, last: str = "launch", table: Iterable[Stage] = STAGES) -> list[Stage]:
    """The stages `ask` runs, in order, up to `last`: the hardware profile at its one place
    (`profile_first`), the stages the command skips left out, and on a node other than 0
    the stages node 0 owns replaced by their waits."""
    first = profile_first(ask)
    positions = [i for i, stage in enumerate(table) if stage.name == "hardware"]
    keep = positions[0] if first or len(positions) < 2 else positions[1]
    todo: list[Stage] = []
    for i, stage in enumerate(table):
        if (i in positions and i != keep) or not stage.when(ask):
            pass
        elif stage.owned and ask.cfg.launch.node_rank > 0:
            todo += [] if stage.wait is None else [replace(stage, run=stage.wait, timed_as=None)]
        else:
            todo.append(stage)
        if stage.name == last:
            return todo
    raise AssertionError(f"no stage named {last!r}")


def run_stages(
    stages: Iterable[Stage], s: Setup, clock: Callable[[], float] = time.perf_counter
) -> Setup:
    """Run `stages` in order on `s`, timing each: its seconds in `Setup.seconds`, and on the
    run's timer under its key, the seconds it took (made now) or what its reused output cost
    when it was made."""
    for stage in stages:
        t0 = clock()
        s, cost = stage.run(s)
        took = clock() - t0
        s = replace(s, seconds={**s.seconds, stage.name: took})
        if stage.timed_as is not None and cost is not None:
            ran = cost.reused_s is None
            s.ask.timer.add(stage.timed_as, took if ran else cost.reused_s or 0.0, ran)
    return s


def run_setup(ask: Ask, last: str = "launch", done: Setup | None = None) -> Setup:
    """Set-up for `ask` up to the stage `last` (`done`: a set-up begun, continued after its
    stages). The parts are profiled once while the plans are made (twice under auto), and
    forgotten before the workers start."""
    s = Setup(ask) if done is None else replace(done, ask=ask)
    todo = [stage for stage in stages_for(ask, last) if stage.name not in s.seconds]
    with accesses_kept():
        s = run_stages([stage for stage in todo if stage.name != "launch"], s)
    return run_stages([stage for stage in todo if stage.name == "launch"], s)


def prepare(
    cfg: LeoConfig,
    resume: bool,
    progress: ProgressFn | None,
    allow_inexact: bool = False,
    timer: RunTimer | None = None,
) -> Path:
    """`leo train`'s set-up without the launch (partitions, profile, plan, mode, resolved
    config); the run folder. `timer` receives the stages' times."""
    ask = Ask.train(cfg, resume, allow_inexact, progress, timer)
    return run_setup(ask, last="resolved").run_dir
