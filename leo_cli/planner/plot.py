"""cache-plan.png: the predicted step against the share of the halo replicated, the plan's
choice marked; beside it, every rank's halo rows per cache level."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from leo_cli.planner.plan import CachePlan
from leo_cli.registry import planned_mode, priced_runs
from leo_cli.util import figures, files

LEVEL_COLOURS = {"L1": "tab:green", "L2": "tab:blue", "L3": "tab:orange", "in place": "tab:purple"}


def plot_plan(plan: CachePlan, path: Path) -> None:
    """Two panels: the sweep (`sweep_panel`) and the rows per level (`levels_panel`)."""
    fig = figures.figure(figsize=(12, 4.5))
    sweep_ax, levels_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    sweep_panel(sweep_ax, plan)
    levels_panel(levels_ax, plan)
    # Margins fixed for this size (room for the top axis and a two-line title): tight_layout
    # draws the figure once more to measure its text, a third of the plot's time.
    fig.subplots_adjust(left=0.075, right=0.99, bottom=0.11, top=0.85, wspace=0.17)
    with files.atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=100)


def whole_halo_mb(plan: CachePlan) -> float | None:
    """MiB of the largest rank's whole halo at input width (the sweep's point replicating all
    of it), or None without a sweep."""
    sizes = [
        float(p["replica_budget_mb"]) / float(p["replica_share"])
        for p in plan.sweep
        if float(p["replica_share"]) > 0
    ]
    return max(sizes) if sizes else None


def sweep_panel(ax: Any, plan: CachePlan) -> None:
    """Predicted step of the planned mode against the share of every rank's halo replicated
    (0 to the whole halo; MiB of the largest rank on the top axis), the configured replica
    budget and the plan's choice on that scale, the baselines as lines; without a sweep
    (replicas do not apply) the baselines alone."""
    halo_mb = whole_halo_mb(plan)
    swept = False
    if plan.sweep and halo_mb:
        swept = True
        xs = [100 * float(p["replica_share"]) for p in plan.sweep]
        ys = [float(p["predicted_epoch_time_s"]) for p in plan.sweep]
        ax.plot(xs, ys, marker="o", label=f"{planned_mode()}, every rank replicating a share")
        budget = 100 * plan.replica_budget_mb / halo_mb
        label = f"replica budget {plan.replica_budget_mb:.0f} MiB"
        if budget > 100:  # the whole halo fits: the budget bounds nothing
            label += f" (≥ whole halo, {halo_mb:.3g} MiB)"
        ax.axvline(min(budget, 100), color="red", linestyle="--", label=label)
        top = ax.secondary_xaxis(
            "top", functions=(lambda s: s * halo_mb / 100, lambda mb: 100 * mb / halo_mb)
        )
        top.set_xlabel("replicated MiB (largest rank)")
        chosen = plan.predicted.get(planned_mode())
        if chosen is not None:
            replica_mb = max((r["L1_replica_bytes"] for r in plan.bytes_per_level), default=0)
            ax.plot([100 * replica_mb / 2**20 / halo_mb], [chosen], marker="*", markersize=16,
                    color="red", linestyle="none", label="the plan")  # fmt: skip
    ax.set_xlim(-3, 103)
    baselines = [p for p in priced_runs() if p.runs.exact and not p.cached]
    lines = []
    for run, style in zip(baselines, ("--", ":", "-.", (0, (1, 4))), strict=False):
        t = plan.predicted.get(run.name)
        if t is not None:
            ax.axhline(t, linestyle=style, color="gray", label=run.label)
            lines.append(t)
    if not swept and lines:  # from 0, as with a sweep (lines under 1 s alone leave 0..1)
        ax.set_ylim(0, 1.25 * max(lines))
    title = "predicted step against replicated rows"
    if not plan.sweep:
        title += "\n(replicas do not apply: static aggregate, attention or no cache)"
    ax.set(xlabel="share of every rank's halo replicated (%)",
           ylabel="predicted step time (s)", title=title)  # fmt: skip
    ax.legend(fontsize=8)


def level_rows(levels: dict[str, int]) -> dict[str, int]:
    """A rank's halo rows split so they stack to its halo: L1 replicas, L2 and L3 rows through
    the process group, rows read in place. The plan counts in-place rows among L2 and L3
    without saying which; they are taken off L3 first (every L3 row of a same-host owner is
    read in place, and the L2 rows too of the owners a pair reads every row of)."""
    from_l3 = min(levels["in_place"], levels["L3"])
    return {
        "L1": levels["L1"],
        "L2": levels["L2"] - (levels["in_place"] - from_l3),
        "L3": levels["L3"] - from_l3,
        "in place": levels["in_place"],
    }


def levels_panel(ax: Any, plan: CachePlan) -> None:
    """Stacked bars per rank: halo rows at L1, L2, L3 and read in place (the plan's
    `levels`)."""
    ranks = list(range(len(plan.caches)))
    ax.set(xlabel="rank", ylabel="halo rows", title="halo rows per level")
    ax.set_xticks(ranks)
    if plan.levels is None:
        ax.text(0.5, 0.5, "levels not recorded", ha="center", transform=ax.transAxes)
        return
    split = [level_rows(levels) for levels in plan.levels]
    bottom = [0] * len(ranks)
    for level, colour in LEVEL_COLOURS.items():
        heights = [rows[level] for rows in split]
        ax.bar(ranks, heights, bottom=bottom, color=colour, label=level)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    if not any(bottom):
        ax.text(0.5, 0.5, "no halo rows", ha="center", transform=ax.transAxes)
    ax.legend(fontsize=8)
