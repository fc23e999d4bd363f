"""cache-plan.png: the predicted step time against the replica budget, the plan's point marked."""

from __future__ import annotations

from pathlib import Path

from leo_cli.cache.plan import CachePlan
from leo_cli.util import files


def plot_plan(plan: CachePlan, path: Path) -> None:
    """Predicted `leo` step time against the replica budget, the configured budget marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [p["replica_budget_mb"] for p in plan.sweep]
    ys = [p["predicted_epoch_time_s"] for p in plan.sweep]
    ax.plot(xs, ys, marker="o", label="leo (predicted)")
    chosen = plan.predicted["leo"] or 0.0
    ax.plot([plan.replica_budget_mb], [chosen], marker="*", markersize=16, color="red",
            linestyle="none", label="configured budget")  # fmt: skip
    for mode, style in (("blocking", "--"), ("leo-no-cache", ":")):
        t = plan.predicted[mode]
        if t is not None:
            ax.axhline(t, linestyle=style, color="gray", label=mode)
    ax.set(xlabel="replica budget per worker (MiB)", ylabel="predicted step time (s)",
           title="cache plan: predicted step time against replica budget")  # fmt: skip
    ax.legend()
    fig.tight_layout()
    with files.atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
