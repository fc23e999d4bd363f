"""`leo profile-cache`: partitions + hardware profile -> cache plan, table and plot."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from leo_cli.cli.common import ConfigOpt, SetOpt, handle_errors, resolve_config
from leo_cli.cli.render import FormatOpt, Sheet, output, stage_progress
from leo_cli.config import LeoConfig
from leo_cli.launch.run_folder import for_command
from leo_cli.planner.auto_mode import with_mode
from leo_cli.registry import AUTO_MODE, planned_mode
from leo_cli.run_dir import RunDir
from leo_cli.util.interrupt import Interrupted

if TYPE_CHECKING:
    from leo_cli.planner.plan import CachePlan
    from leo_cli.planner.profile.hardware import HardwareProfile

# The launcher's and the planner's modules import torch, and the hardware profile's schema
# is slow to build: they are imported where the command acts (after the config is read), so
# that `leo --help` and refused inputs answer without them.


def plan_sheet(plan: CachePlan) -> Sheet:
    """Per rank: its levels, bytes, how peers' rows move, and the planned mode's predicted
    step and busy time."""
    moves = {t for peers in plan.transport or [] for t in peers}
    in_place = "none"
    if moves & {"published-rows", "mixed"}:
        reads = [
            [t in ("published-rows", "mixed") for t in peers] for peers in plan.transport or []
        ]
        reading = sum(map(sum, reads))  # pairs reading some rows in place
        pairs = sum(  # of which every row of the owner
            reads[r][q] for r, owners in enumerate(plan.every_row) for q in owners
        )
        in_place = "L3 rows of same-host owners"
        if pairs >= reading:
            in_place = f"every row of the owner, for the {reading} pairs that read in place"
        elif pairs:
            in_place = f"every row for {pairs} of {reading} pairs, L3 rows for the rest"
    columns = ("rank", "static Â·X", "rows L1/L2/L3", "MB/step L2/L3", "peers' rows", "step s",
               "busy s")  # fmt: skip
    mode = planned_mode()
    ranks = plan.ranks_s.get(mode) or [{} for _ in plan.caches]
    rows = []
    for r, (c, b) in enumerate(zip(plan.caches, plan.bytes_per_level, strict=True)):
        levels = plan.levels[r] if plan.levels else None
        peers = plan.transport[r] if plan.transport else []
        rows.append([
            str(r),
            "yes" if c.static_aggregate else "no",
            f"{c.replica_rows.shape[0]}/{'-' if levels is None else levels['L2']}/"
            f"{c.l3_rows.shape[0]}",
            f"{b['L2_bytes_per_step'] / 1e6:.1f}/{b['L3_bytes_per_step'] / 1e6:.1f}",
            peer_transports(peers),
            *(f"{ranks[r][k]:.3f}" if k in ranks[r] else "-" for k in ("step_s", "busy_s")),
        ])  # fmt: skip
    spread = plan.spread().get(mode)
    notes = []
    if spread is not None:
        notes.append(
            f"{mode}: each rank's predicted step and busy time (its own work, no waiting); "
            f"slowest busy / fastest busy = {spread:.2f}"
        )
    title = f"cache plan (policy {plan.policy}, chunks per layer {plan.num_chunks}; read in "
    title += f"place: {in_place})"
    return Sheet("plan", title, columns, rows, notes, right=columns)


SHORT = {"process-group": "pg", "published-rows": "in place", "mixed": "mixed"}


def peer_transports(peers: list[str | None]) -> str:
    """`in place 1,2; pg 3`: the peers whose rows move each way (cache-plan.json `transport`)."""
    groups: dict[str, list[str]] = {}
    for q, t in enumerate(peers):
        if t is not None:
            groups.setdefault(SHORT[t], []).append(str(q))
    return "; ".join(f"{name} {','.join(qs)}" for name, qs in groups.items()) or "-"


def prediction_sheet(plan: CachePlan, scale: dict[str, float] | None = None) -> Sheet:
    """Per mode: the predicted step, its forward, backward and exposed wait, the ranks'
    spread, the row buffers; with `scale`, the step as auto's trials calibrate it."""
    scale = scale or {}
    columns = ["mode", "step s", "forward s", "backward s", "exposed wait s", "rank spread",
               "row buffers MB"] + ["calibrated s"] * bool(scale)  # fmt: skip
    spreads = plan.spread()
    rows = []
    for mode, t in plan.predicted.items():
        buffers = plan.buffer_bytes.get(mode)
        mb = "-" if buffers is None else f"{buffers / 1e6:.1f}"
        factor = scale.get(mode)
        tail = [f"{t * factor:.3f}" if t is not None and factor else "-"] * bool(scale)
        if t is None:
            rows.append([mode, "-", "-", "-", "-", "-", mb, *tail])
            continue
        st = plan.stages[mode]
        spread = spreads.get(mode)
        rows.append([
            mode,
            f"{t:.3f}",
            f"{st['forward_s']:.3f}",
            f"{st['backward_s']:.3f}",
            f"{st['comm_wait_s']:.3f}",
            "-" if spread is None else f"{spread:.2f}",
            mb,
            *tail,
        ])  # fmt: skip
    notes = []
    if plan.buffer_bytes:
        notes.append(
            "step columns: the modes besides leo without a cache, as leo bench runs them; row "
            "buffers: the bytes each mode holds at its peak beyond what every mode holds "
            "(segments, blocks, set-up's transpose, moving rows), all ranks together, each "
            "mode run with this plan's levels, as pipeline.mode=auto weighs them with "
            "predicted_run_s"
        )
    if scale:
        notes.append(
            "calibrated: the step times what auto's trials on this host measured over what "
            "was predicted for that mode (the median of its newest samples)"
        )
    title = "predicted training step per mode"
    return Sheet("predictions", title, tuple(columns), rows, notes, right=tuple(columns[1:]))


def auto_line(cfg: LeoConfig, run_dir: Path, plan: CachePlan) -> str:
    """What `leo train` would do under `pipeline.mode=auto` with this plan (none with
    cache.policy=none: training makes no plan then): the candidates its workers would try,
    or the mode it would run and why."""
    from leo_cli.graph.storage import read_meta
    from leo_cli.launch.setup import choose_mode

    auto = with_mode(cfg, AUTO_MODE)
    used = None if not cfg.cache.enabled else plan
    choice = choose_mode(auto, run_dir, read_meta(RunDir(run_dir).partitions), used)
    if choice.trials:
        return f"pipeline.mode=auto would try: {', '.join(choice.trials)}"
    return f"pipeline.mode=auto would run: {choice.describe()}"


def profile_line(hw: HardwareProfile, now: datetime, given: bool = False) -> str:
    """When and where the plan's rates were measured: a profile is kept per machine and
    worker count, and on a shared machine its rates age with the load. `given`: the profile
    was named (--hardware, cache.hardware), so --force does not measure it again."""
    try:
        measured = datetime.fromisoformat(hw.created_utc)
    except ValueError:
        when = f"measured at {hw.created_utc!r}"
    else:
        utc = measured.replace(tzinfo=UTC) if measured.tzinfo is None else measured
        utc = utc.astimezone(UTC)
        hours = max(0.0, (now - utc).total_seconds() / 3600)
        age = f"{hours * 60:.0f} min" if hours < 1 else f"{hours:.1f} h"
        when = f"measured {utc:%Y-%m-%d %H:%M} UTC ({age} ago)"
    again = "" if given else "; --force measures it again (rates move with the machine's load)"
    where = f"{hw.hostname}, {hw.world_size} workers, allocator {hw.allocator}"
    return f"Hardware profile: {when} on {where}{again}."


@handle_errors
def profile_cache_cmd(
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    hardware: Annotated[
        Path | None,
        typer.Option(
            "--hardware",
            help="Use this hardware profile (a hardware.json written by an earlier run) "
            "instead of probing the machine.",
            show_default=False,
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Probe the machine again (even when a saved profile fits) and make the plan "
            "again even when it is fresh; unequal part weights are weighed again with the new "
            "rates (the parts are rebuilt).",
        ),
    ] = False,
    fmt: FormatOpt = "auto",
) -> None:
    """Decide which halo rows to cache at which level, and predict every mode's step time.

    Partitions the graph when needed, counts halo reuse per rank, measures the machine
    with a short probe (or reads --hardware), then writes cache-plan.json and
    cache-plan.png into run.out_dir, and says which mode pipeline.mode=auto would run.
    """
    shown = output(fmt)
    cfg = for_command(resolve_config(config, overrides))
    from leo_cli.launch.choice import scale, setting_of, wisdom_dir
    from leo_cli.launch.nodes import run_nodes
    from leo_cli.launch.setup import Ask, run_setup
    from leo_cli.planner.profile.hardware import HARDWARE_FILE, HardwareProfile

    ask = Ask.profile_cache(cfg, force, hardware, progress=None)
    checked = run_setup(ask, last="checks")
    if cfg.launch.emulate is not None:  # every emulated node runs this command itself
        flags = ["--force"] * force + ([] if hardware is None else ["--hardware", str(hardware)])
        run_nodes(cfg, "profile-cache", flags)
        return
    run_dir = ask.run_dir
    if cfg.launch.node_rank > 0:  # node 0 partitions, plans and reports; the others probe
        run_setup(ask, last="plan", done=checked)
        return
    try:
        with stage_progress(shown.console) as progress:
            ask = replace(ask, progress=progress)
            plan = run_setup(ask, last="plan", done=checked).plan
    except Interrupted as exc:
        exc.note = "probe workers stopped; no plan was written: run the command again."
        raise
    assert plan is not None
    shown.sheet(plan_sheet(plan))
    shown.sheet(prediction_sheet(plan, scale(wisdom_dir(cfg, run_dir), setting_of(cfg))))
    shown.say(auto_line(cfg, run_dir, plan))
    if (run_dir / HARDWARE_FILE).is_file():
        hw = HardwareProfile.read(run_dir / HARDWARE_FILE)
        given = hardware is not None or cfg.cache.hardware is not None
        shown.say(profile_line(hw, datetime.now(UTC), given))
    shown.say(f"Wrote {run_dir / 'cache-plan.json'} and {run_dir / 'cache-plan.png'}")
