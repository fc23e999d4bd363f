"""cache-plan.png: the predicted step against the replicated rows, the plan's choice marked."""

from __future__ import annotations

from pathlib import Path

from leo_cli.cache.plan import CachePlan
from leo_cli.registry import MODES, planned_mode
from leo_cli.util import files


def plot_plan(plan: CachePlan, path: Path) -> None:
    """Predicted `leo` step time against the replica bytes per worker, from none to the whole
    halo (the policy's sweep), the configured budget and the plan's choice marked, the
    baselines as lines; without a sweep (replicas do not apply) the baselines alone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    if plan.sweep:
        xs = [float(p["replica_budget_mb"]) for p in plan.sweep]
        ys = [float(p["predicted_epoch_time_s"]) for p in plan.sweep]
        ax.plot(
            xs,
            ys,
            marker="o",
            label=f"{planned_mode()}, every rank replicating a share of its halo",
        )
        ax.axvline(plan.replica_budget_mb, color="red", linestyle="--", label="replica budget")
        if 0 < 2 * max(xs) < plan.replica_budget_mb:  # the budget far off the halo
            ax.set_xlim(-0.05 * max(xs), 1.1 * max(xs))
            ax.annotate(f"budget {plan.replica_budget_mb:.0f} MiB →", (0.98, 0.02),
                        xycoords="axes fraction", ha="right")  # fmt: skip
    chosen = plan.predicted.get(planned_mode())
    if chosen is not None:
        replica_mb = max((r["L1_replica_bytes"] for r in plan.bytes_per_level), default=0)
        ax.plot([replica_mb / 2**20], [chosen], marker="*", markersize=16, color="red",
                linestyle="none", label="the plan")  # fmt: skip
    baselines = [n for n, m in MODES.items() if m.exact and not m.planned]
    for mode, style in zip(baselines, ("--", ":", "-.", (0, (1, 4))), strict=False):
        t = plan.predicted.get(mode)
        if t is not None:
            ax.axhline(t, linestyle=style, color="gray", label=mode)
    title = "cache plan: predicted step against replicated rows"
    if not plan.sweep:
        title += "\n(replicas do not apply: static aggregate, attention or no cache)"
    ax.set(xlabel="replicated rows per worker (MiB, largest rank)",
           ylabel="predicted step time (s)", title=title)  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    with files.atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
