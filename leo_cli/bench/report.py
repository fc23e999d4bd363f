"""Benchmark outputs: rows with ratios, and bench.json / bench.csv / bench.md / bench.png.

Ratios: every row against `blocking` at the same world size (and bench variant) and against
`pyg`, paired by round, with an interval that says its kind (bench/stats.py); with
`bench.variants`, also against the first variant's row of the same mode and world size
(`vs_variant`), with each row's final loss (variants of an exact run train the same numbers)
and `rank_spread`, the slowest rank's busy time over the fastest's. The share of communication
hidden is (blocking - P) / (blocking - compute-only) per round, P the pipeline without a cache
(`leo-no-cache`, which does the same computation as compute-only) when measured, else `leo`
(whose cache may also remove work, which can put it below the floor). Every row carries its
set-up (`setup_s`), its `wall_s` and `cost_200_epochs_s` = set-up + 200 x the epoch median.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.metadata
import importlib.util
import io
import json
import math
import os
import platform
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import torch

import leo_cli
from leo_cli.bench import stats
from leo_cli.bench.modes import baseline_mode, bench_mode_of, floor_mode, overlap_mode
from leo_cli.bench.suite import LEO, Measured, Variant, bench_variants, run_folder
from leo_cli.config import LeoConfig
from leo_cli.registry import is_auto, planned_mode
from leo_cli.run_dir import RunDir
from leo_cli.util import files
from leo_cli.util.files import write_json
from leo_cli.worker.report import git_sha

COLUMNS = (
    "system",
    "mode",
    "world_size",
    "static_aggregate",
    "dataset",
    "model",
    "epoch_time_s",
    "epoch_time_p10_s",
    "epoch_time_p90_s",
    "vs_blocking",
    "vs_blocking_ci_low",
    "vs_blocking_ci_high",
    "vs_pyg",
    "vs_pyg_ci_low",
    "vs_pyg_ci_high",
    "interval",
    "setup_s",
    "run_setup_s",
    "wall_s",
    "cost_200_epochs_s",
    "comm_bytes_per_epoch",
    "comm_wait_s",
    "test_acc",
    "predicted_epoch_time_s",
    "exact",
    "epochs_kept",
    "epochs_dropped",
    "variant",
    "vs_variant",
    "vs_variant_ci_low",
    "vs_variant_ci_high",
    "final_loss",
    "halo_dtype",
    "allocator",
    "kernels",
    "spmm",
    "peak_rss_max_bytes",
    "peak_rss_total_bytes",
    "rank_spread",
    "rank_prediction_error",
    "nodes",
    "link",
    "mode_ran",
    "fastest_mode",
    "vs_fastest",
    "vs_fastest_ci_low",
    "vs_fastest_ci_high",
)
STANDARD_EPOCHS = 200  # cost_200_epochs_s: what a standard run costs, set-up included


def _median(runs: list[dict[str, Any]], key: str) -> Any:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def planned_time(out_dir: Path | None, v: Variant) -> float | None:
    """What the cache plan of the row's run folder predicts for its mode (every LEO row)."""
    if out_dir is None:
        return None
    path = RunDir(run_folder(out_dir, v)).plan
    try:
        value = json.loads(path.read_text())["predicted_epoch_time_s"].get(v.mode)
    except (OSError, ValueError, KeyError, AttributeError):
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if number and math.isfinite(value) else None


def variant_key(v: Variant) -> tuple[str, int, bool | None, str | None]:
    return (v.mode, v.world_size, v.static_aggregate, v.variant)


def make_rows(
    cfg: LeoConfig, measured: list[Measured], out_dir: Path | None = None
) -> list[dict[str, Any]]:
    """One row per variant, with paired ratios to blocking (same P and bench variant), to
    pyg and to the first bench variant."""
    by_key = {variant_key(m.variant): m for m in measured}
    pyg = by_key.get(("pyg", 1, None, None))
    named = bench_variants(cfg)
    first = named[0].name if named else None
    rows = []
    for m in measured:
        v, s = m.variant, stats.spread(m.epochs)
        base = by_key.get((baseline_mode(), v.world_size, None, v.variant))
        vs_blocking = stats.paired_ratio(m.round_medians, base.round_medians) if base else {}
        vs_pyg = stats.paired_ratio(m.round_medians, pyg.round_medians) if pyg else {}
        ref = by_key.get((v.mode, v.world_size, v.static_aggregate, first))
        vs_variant = {}
        if first is not None and v.variant is not None and ref is not None:
            vs_variant = stats.paired_ratio(m.round_medians, ref.round_medians)
        setup = _median(m.runs, "setup_s")
        rows.append(
            {
                "system": v.system,
                "mode": v.mode,
                "variant": v.variant,
                "world_size": v.world_size,
                "static_aggregate": _any(m.runs, "static_aggregate"),
                "label": v.label,
                "dataset": cfg.data.name,
                "model": cfg.model.name,
                "epoch_time_s": s["median"],
                "epoch_time_p10_s": s["p10"],
                "epoch_time_p90_s": s["p90"],
                "vs_blocking": vs_blocking.get("value"),
                "vs_blocking_ci_low": vs_blocking.get("ci_low"),
                "vs_blocking_ci_high": vs_blocking.get("ci_high"),
                "vs_pyg": vs_pyg.get("value"),
                "vs_pyg_ci_low": vs_pyg.get("ci_low"),
                "vs_pyg_ci_high": vs_pyg.get("ci_high"),
                "interval": (vs_blocking or vs_pyg or vs_variant).get("interval"),
                "setup_s": setup,
                "run_setup_s": _median(m.runs, "run_setup_s"),
                "setup_parts_s": _median_parts(m.runs),
                "wall_s": _median(m.runs, "wall_s"),
                "cost_200_epochs_s": None
                if setup is None
                else setup + STANDARD_EPOCHS * s["median"],
                "comm_bytes_per_epoch": _median(m.runs, "comm_bytes_per_epoch"),
                "comm_wait_s": _median(m.runs, "comm_wait_s"),
                "test_acc": _median(m.runs, "test_acc"),
                "predicted_epoch_time_s": _median(m.runs, "predicted_epoch_time_s")
                or (planned_time(out_dir, v) if v.system == LEO else None),
                "exact": all(r.get("exact", True) for r in m.runs),
                "epochs_kept": len(m.epochs),
                "epochs_dropped": m.dropped,
                "round_medians": m.round_medians,
                "vs_variant": vs_variant.get("value"),
                "vs_variant_ci_low": vs_variant.get("ci_low"),
                "vs_variant_ci_high": vs_variant.get("ci_high"),
                "final_loss": _median(m.runs, "final_loss"),
                "final_losses": [r.get("final_loss") for r in m.runs],
                "halo_dtype": next((r["halo_dtype"] for r in m.runs if r.get("halo_dtype")), None),
                "allocator": next((r["allocator"] for r in m.runs if r.get("allocator")), None),
                "kernels": next((r["kernels"] for r in m.runs if r.get("kernels")), None),
                "spmm": sorted({r["spmm"] for r in m.runs if r.get("spmm")}) or None,
                "nodes": next((r["nodes"] for r in m.runs if r.get("nodes")), 1),
                "link": next((r["link"] for r in m.runs if r.get("link")), None),
                "link_bits_per_s": next(
                    (r["link_bits_per_s"] for r in m.runs if r.get("link_bits_per_s") is not None),
                    None,
                ),
                **rank_columns(m.runs),
                **peak_columns(m.runs),
                **regret_columns(m, measured),
            }
        )
    return rows


def regret_columns(m: Measured, measured: list[Measured]) -> dict[str, Any]:
    """For an `auto` row: what it ran in each round (`mode_ran`, e.g. `leo x3`), the
    calibrated prediction of the mode it ran (median over rounds; `predicted_epoch_time_s` is
    the probe's), each round's choice and trials (`auto_rounds`, bench.json), and its epoch
    over the fastest exact mode's of the same workers and bench variant, paired by round
    (`vs_fastest`: its regret)."""
    v = m.variant
    keys = ("mode_ran", "fastest_mode", "vs_fastest", "vs_fastest_ci_low", "vs_fastest_ci_high",
            "calibrated_epoch_time_s", "auto_rounds")  # fmt: skip
    out: dict[str, Any] = dict.fromkeys(keys)
    if not is_auto(v.mode):
        return out
    ran = Counter(r.get("mode_ran") or "?" for r in m.runs)
    out["mode_ran"] = ", ".join(f"{n} x{k}" for n, k in ran.most_common())
    out["calibrated_epoch_time_s"] = _median(m.runs, "calibrated_epoch_time_s")
    out["auto_rounds"] = [
        {
            "mode_ran": r.get("mode_ran"),
            "epoch_time_s": t,
            "choose_s": (r.get("setup_parts_s") or {}).get("choose_s"),
            "predicted_epoch_time_s": r.get("predicted_epoch_time_s"),
            "calibrated_epoch_time_s": r.get("calibrated_epoch_time_s"),
            **(r.get("trials") or {}),
        }
        for r, t in zip(m.runs, m.round_medians, strict=False)
    ]
    exact = [
        o for o in measured
        if o.variant.system == LEO and o.variant.world_size == v.world_size
        and o.variant.variant == v.variant and o.variant.static_aggregate is None
        and not is_auto(o.variant.mode) and bench_mode_of(o.variant.mode).runs.exact
        and o.epochs
    ]  # fmt: skip
    if not exact:
        return out
    fastest = min(exact, key=lambda o: statistics.median(o.epochs))
    ratio = stats.paired_ratio(m.round_medians, fastest.round_medians)
    return out | {
        "fastest_mode": fastest.variant.mode,
        "vs_fastest": ratio.get("value"),
        "vs_fastest_ci_low": ratio.get("ci_low"),
        "vs_fastest_ci_high": ratio.get("ci_high"),
    }


def regret_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One sentence per `auto` row: what it ran, and its epoch over the fastest exact
    mode's."""
    lines = []
    for r in rows:
        if not is_auto(r["mode"]):
            continue
        named = f" [{r['variant']}]" if r.get("variant") else ""
        text = f"auto at P={r['world_size']}{named} ran {r.get('mode_ran') or '-'}"
        if r.get("vs_fastest") is not None:
            text += f"; its epoch over the fastest exact mode's ({r['fastest_mode']}): "
            text += _ratio(r, "vs_fastest") + ", per round"
        lines.append(text + ".")
    return lines


def rank_columns(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per rank, the median over runs of its busy time and of its predicted busy time;
    `rank_spread`: the slowest rank's median busy time over the fastest's;
    `rank_prediction_error`: the largest |predicted - measured| / measured over the ranks."""
    out: dict[str, Any] = {}
    for key in ("rank_busy_s", "predicted_rank_busy_s"):
        lists = [r[key] for r in runs if isinstance(r.get(key), list)]
        same = bool(lists) and all(len(x) == len(lists[0]) for x in lists)
        out[key] = [statistics.median(c) for c in zip(*lists, strict=True)] if same else None
    busy, predicted = out["rank_busy_s"], out["predicted_rank_busy_s"]
    out["rank_spread"] = max(busy) / min(busy) if busy and min(busy) > 0 else None
    out["rank_prediction_error"] = None
    if busy and predicted and len(predicted) == len(busy) and min(busy) > 0:
        errors = [abs(p - b) / b for p, b in zip(predicted, busy, strict=True)]
        out["rank_prediction_error"] = max(errors)
    return out


def peak_columns(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per rank (or the peer's one process), the largest peak resident memory over the runs;
    `peak_rss_max_bytes`: the largest of them; `peak_rss_total_bytes`: the largest of the runs'
    peaks of all their processes together."""
    totals = [r["peak_rss_total_bytes"] for r in runs if r.get("peak_rss_total_bytes")]
    total = {"peak_rss_total_bytes": max(totals, default=None)}
    lists = [r["peak_rss_bytes"] for r in runs if isinstance(r.get("peak_rss_bytes"), list)]
    if not lists or any(len(x) != len(lists[0]) for x in lists):
        return {"peak_rss_bytes": None, "peak_rss_max_bytes": None, **total}
    peaks = [max(col) for col in zip(*lists, strict=True)]
    return {"peak_rss_bytes": peaks, "peak_rss_max_bytes": max(peaks), **total}


def _any(runs: list[dict[str, Any]], key: str) -> bool | None:
    values = [bool(r[key]) for r in runs if r.get(key) is not None]
    return any(values) if values else None


def _median_parts(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Median of each set-up part over the runs (bench.json only)."""
    parts = [r.get("setup_parts_s") or {} for r in runs]
    names = sorted({k for p in parts for k in p})
    return {k: statistics.median(p.get(k, 0.0) for p in parts) for k in names}


def pipelined_mode(rows: list[dict[str, Any]]) -> str:
    """The mode whose overlap the hidden share measures (see the module docstring)."""
    measured = {r["mode"] for r in rows}
    return overlap_mode() if overlap_mode() in measured else planned_mode()


def hidden_shares(rows: list[dict[str, Any]]) -> dict[int | str, dict[str, Any]]:
    """Per world size (and bench variant: keys `P:variant`): (blocking - pipelined) /
    (blocking - compute-only), per round, with its interval (`share`, `ci_low`, `ci_high`,
    `interval`)."""
    t = {
        (r["mode"], r["world_size"], r.get("variant")): r["round_medians"]
        for r in rows
        if r["system"] == LEO
    }
    mode = pipelined_mode(rows)
    out: dict[int | str, dict[str, Any]] = {}
    groups = sorted({(r["world_size"], r.get("variant") or "") for r in rows})
    for w, name in groups:
        named = name or None
        b, pipe = t.get((baseline_mode(), w, named)), t.get((mode, w, named))
        floor = t.get((floor_mode(), w, named))
        if b is not None and pipe is not None and floor is not None:
            share = stats.hidden_share(b, pipe, floor)
            out[f"{w}:{name}" if name else w] = {"share": share.pop("value"), **share}
    return out


def share_warning(share: dict[str, Any]) -> str | None:
    """A share whose whole interval lies above 1 means the pipeline beat the same computation
    without any exchange: the modes do not compute alike."""
    if share.get("ci_low") is not None and share["ci_low"] > 1:
        return (
            "warning: its interval lies wholly above 1, which the pipeline cannot reach if "
            "the modes compute alike; the comparison is not like for like."
        )
    return None


def allocators(rows: list[dict[str, Any]]) -> str:
    """The LEO workers' allocators as their summaries describe them (`launch.allocator` as
    run: the library and its settings), for the machine line."""
    names = sorted({r["allocator"] for r in rows if r.get("allocator")})
    return f"; workers' allocator: {'; '.join(names)}" if names else ""


def kernel_backends(rows: list[dict[str, Any]]) -> str:
    """The kernels that served the LEO workers beside the reference (`summary.json`'s
    `kernels`: reference, cpu, cuda, cuda+cpu) and the CPU SpMM variants their runs trained
    with (`spmm`), for the machine line."""
    names = sorted({r["kernels"] for r in rows if r.get("kernels")})
    spmm = sorted({v for r in rows for v in r.get("spmm") or []})
    ran = f" (CPU SpMM: {', '.join(spmm)})" if spmm else ""
    return f"; LEO's kernels: {', '.join(names)}{ran}" if names else ""


def environment(command: str) -> dict[str, Any]:
    """Hardware and versions, so a table can be read without the machine."""
    versions = {"leo": leo_cli.__version__, "torch": torch.__version__}
    versions["python"] = platform.python_version()
    pyg = package_version("torch_geometric")
    if pyg is not None:
        versions["torch_geometric"] = pyg
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "gpu": gpu,
        "versions": versions,
        "git_sha": git_sha(),
        "command": command,
    }


def package_version(name: str) -> str | None:
    """The version of the package `import name` would load, read without importing it (an
    import of PyG costs seconds): its installed metadata where that install is the one found,
    else the `__version__` line of its `__init__.py` (a source checkout on the path), else
    the installed metadata's (an editable install that computes its version); None where
    nothing importable is found."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin).resolve()
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution(name)
        if Path(str(dist.locate_file(f"{name}/__init__.py"))).resolve() == origin:
            return dist.version
    with contextlib.suppress(OSError):
        found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", origin.read_text(), re.M)
        if found:
            return found.group(1)
    try:  # an editable install's version, whose __init__.py computes it
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


MD_HEAD = (
    "system",
    "mode",
    "P",
    "static Â·X",
    "epoch s (p10-p90)",
    "vs blocking",
    "vs pyg",
    "set-up s",
    "200-epoch cost s",
    "predicted s",
    "MB/epoch",
    "wait s",
    "peak GB",
    "all GB",
    "test acc",
    "exact",
)
INTERVAL_NAMES = {"bootstrap95": "95% CI", "range": "range"}


def interval_name(rows: list[dict[str, Any]]) -> str:
    """What the intervals of a table are (every row has as many rounds)."""
    kinds = sorted({str(r["interval"]) for r in rows if r.get("interval") is not None})
    return " / ".join(INTERVAL_NAMES[k] for k in kinds) or "no interval"


VARIANT_HEAD = (  # with bench.variants
    "vs first variant",
    "final loss",
    "rank spread",
    "rank busy s (predicted)",
    "rank prediction error",
)


def with_variants(rows: list[dict[str, Any]]) -> bool:
    """Whether the rows come from bench variants (their table has the variant columns)."""
    return any(r.get("variant") is not None for r in rows)


def head(rows: list[dict[str, Any]]) -> list[str]:
    """MD_HEAD with the ratio columns naming their interval (and, with bench variants, the
    variant after the mode and their columns at the end)."""
    name = interval_name(rows)
    ratios = ("vs blocking", "vs pyg", "vs first variant")
    names = list(MD_HEAD)
    if with_variants(rows):
        names = [*names[:2], "variant", *names[2:], *VARIANT_HEAD]
    return [f"{h} ({name})" if h in ratios else h for h in names]


def _ratio(r: dict[str, Any], key: str) -> str:
    text = _fmt(r[key], 2)
    if r[f"{key}_ci_low"] is not None:
        text += f" ({r[f'{key}_ci_low']:.2f}-{r[f'{key}_ci_high']:.2f})"
    return text


def md_cells(r: dict[str, Any], variants: bool = False) -> list[str]:
    """One markdown table row (`variants`: with the bench variant columns)."""
    cells = _base_cells(r)
    if not variants:
        return cells
    extra = [
        _ratio(r, "vs_variant") if r.get("vs_variant") is not None else "-",
        _fmt(r.get("final_loss"), 6),
        _fmt(r.get("rank_spread"), 2),
        _rank_cell(r.get("rank_busy_s"), r.get("predicted_rank_busy_s")),
        _fmt(r.get("rank_prediction_error"), 2),
    ]
    return [*cells[:2], r.get("variant") or "-", *cells[2:], *extra]


def _rank_cell(busy: list[float] | None, predicted: list[float] | None) -> str:
    """Each rank's measured busy time, with the plan's prediction in parentheses."""
    if not busy:
        return "-"
    text = " / ".join(f"{b:.3f}" for b in busy)
    return text + (f" ({' / '.join(f'{p:.3f}' for p in predicted)})" if predicted else "")


def _gigabytes(value: int | None) -> str:
    """Bytes as GB (1e9 B) with two decimals, `-` when unknown."""
    return _fmt(None if value is None else value / 1e9, 2)


def _base_cells(r: dict[str, Any]) -> list[str]:
    """The cells of MD_HEAD."""
    mb = None if r["comm_bytes_per_epoch"] is None else r["comm_bytes_per_epoch"] / 1e6
    epoch = f"{_fmt(r['epoch_time_s'])} ({_fmt(r['epoch_time_p10_s'])}-"
    epoch += f"{_fmt(r['epoch_time_p90_s'])})"
    static = {None: "-", True: "yes", False: "no"}[r["static_aggregate"]]
    ran = r.get("mode_ran")
    return [
        r["system"],
        r["mode"] if not ran else f"{r['mode']} ({ran})",
        str(r["world_size"]),
        static,
        epoch,
        _ratio(r, "vs_blocking"),
        _ratio(r, "vs_pyg"),
        _fmt(r["setup_s"], 2),
        _fmt(r["cost_200_epochs_s"], 1),
        _fmt(r["predicted_epoch_time_s"]),
        _fmt(mb, 1),
        _fmt(r["comm_wait_s"]),
        _gigabytes(r.get("peak_rss_max_bytes")),
        _gigabytes(r.get("peak_rss_total_bytes")),
        _fmt(r["test_acc"], 4),
        "yes" if r["exact"] else "no",
    ]


def share_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One sentence per world size: the hidden share, its interval, a warning if needed."""
    mode = pipelined_mode(rows)
    lines = []
    for key, share in hidden_shares(rows).items():
        w, _, name = str(key).partition(":")
        text = f"Share of communication hidden at P={w}" + (f" [{name}]" if name else "")
        text += f": {_fmt(share['share'], 2)}"
        if share["ci_low"] is not None:
            name = INTERVAL_NAMES[share["interval"]]
            text += f" ({name} {share['ci_low']:.2f}-{share['ci_high']:.2f})"
        base, floor = baseline_mode(), floor_mode()
        text += f" = ({base} - {mode}) / ({base} - {floor}), per round."
        warning = share_warning(share)
        lines.append(text + (f" **{warning}**" if warning else ""))
    return lines


FOOTNOTES = (
    "compute-only runs the exact modes' computation (the same column blocks, forward and "
    "backward, and the same gradient sums) with the transfers removed: zeros arrive in place "
    "of halo rows and returned gradients; its numbers are wrong on purpose.",
    "Set-up: from the start of a fresh `leo train` to its first training step (partitioning "
    "and cache plan as they cost when made; the hardware probe, once per machine and worker "
    "count, is not included); for peers from process start to the first step (graph, "
    "adjacency, model, GCNConv's cached normalisation; a peer run as a script, such as dgl, "
    "reads the graph from the file leo bench wrote). 200-epoch cost = set-up + 200 x the "
    "epoch median. static Â·X: layer 0 aggregated once at set-up (cache level L1s).",
    "Peak GB: the largest peak resident memory of one process (a worker, or the peer) over "
    "the row's runs, set-up included (GB = 1e9 B). All GB: the peak of the job's processes "
    "together (launcher and workers, proportional set size sampled every 0.5 s, less often "
    "where sampling is slow; a peer's own peak).",
)

VARIANT_NOTE = (
    "Variants (bench.variants) run interleaved with each other; `vs first variant` pairs each "
    "round with the first variant's row of the same mode and workers. Rank busy s: each rank's "
    "median step less the time it waited for peers, with the plan's prediction in "
    "parentheses; rank spread = slowest / fastest busy time; prediction error = the largest "
    "|predicted - measured| / measured over the ranks."
)


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    """A paste-able table: times, ratios with intervals, set-up, bytes, accuracy; then hidden
    shares and what the columns mean."""
    names = head(rows)
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    lines += ["| " + " | ".join(md_cells(r, with_variants(rows))) + " |" for r in rows]
    lines += ["", *share_lines(rows), *regret_lines(rows), "", *FOOTNOTES]
    if with_variants(rows):
        lines += ["", VARIANT_NOTE]
    lines += [
        "",
        f"Machine: {env['cpu']}, {env['cores']} cores, GPU: {env['gpu'] or 'none'}; "
        f"torch {env['versions']['torch']}{allocators(rows)}{kernel_backends(rows)}. "
        f"Command: `{env['command']}`",
    ]
    return "\n".join(lines) + "\n"


def write_outputs(out_dir: Path, rows: list[dict[str, Any]], env: dict[str, Any]) -> list[Path]:
    """bench.json, bench.csv, bench.md and bench.png in out_dir (each written atomically)."""
    write_json(
        out_dir / "bench.json",
        {
            "rows": rows,
            "env": env,
            "hidden_share": {str(k): v for k, v in hidden_shares(rows).items()},
        },
    )
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    _atomic_text(out_dir / "bench.csv", buf.getvalue())
    _atomic_text(out_dir / "bench.md", markdown(rows, env))
    plot(rows, out_dir / "bench.png")
    written = [out_dir / f"bench.{ext}" for ext in ("json", "csv", "md", "png")]
    if any(r.get("link_bits_per_s") is not None for r in rows):
        plot_links(rows, out_dir / "bench-links.png")
        written.append(out_dir / "bench-links.png")
    return written


def _atomic_text(path: Path, text: str) -> None:
    files.write_text(path, text)  # a fresh temporary file, then a rename


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Epoch time by mode and world size (compute-only floor as a dashed line); bytes moved."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(12, 4.5))
    worlds = sorted({r["world_size"] for r in rows})
    labels = list(dict.fromkeys(r["label"] for r in rows if r["mode"] != floor_mode()))
    width = 0.8 / max(len(labels), 1)
    for i, label in enumerate(labels):
        for ax, key in ((ax_t, "epoch_time_s"), (ax_b, "comm_bytes_per_epoch")):
            xs, ys = [], []
            for j, w in enumerate(worlds):
                row = next((r for r in rows if r["label"] == label and r["world_size"] == w), None)
                if row is not None and row[key] is not None:
                    xs.append(j + i * width)
                    ys.append(row[key] / (1e6 if key != "epoch_time_s" else 1))
            ax.bar(xs, ys, width, label=label)
    for j, w in enumerate(worlds):
        floor = next((r for r in rows if r["mode"] == floor_mode() and r["world_size"] == w), None)
        if floor is not None:
            ax_t.hlines(
                floor["epoch_time_s"],
                j - width / 2,
                j + 0.8 - width / 2,
                colors="k",
                linestyles="dashed",
                label=f"{floor_mode()} floor" if j == 0 else None,
            )
    for ax, title, unit in (
        (ax_t, "epoch time", "seconds (median)"),
        (ax_b, "bytes moved per epoch", "MB"),
    ):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(worlds))], [f"P={w}" for w in worlds])
        ax.set(title=title, ylabel=unit)
    ax_t.legend(fontsize=8)
    fig.tight_layout()
    with files.atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)


def plot_links(rows: list[dict[str, Any]], path: Path) -> None:
    """Epoch time against the emulated link rate, one line per mode and world size: measured
    (solid) beside predicted (dashed); an unlimited link stands right of the fastest rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    linked = [r for r in rows if r.get("link_bits_per_s") is not None]
    rates = sorted({r["link_bits_per_s"] for r in linked if r["link_bits_per_s"] > 0})
    top = (rates[-1] if rates else 1e9) * 10  # where the unlimited link is drawn

    def x(r: dict[str, Any]) -> float:
        return float(r["link_bits_per_s"] or top) / 1e9

    fig, ax = plt.subplots(figsize=(7, 4.5))

    def label(r: dict[str, Any]) -> str:  # one line per mode, workers and bench variant
        base = str(r.get("variant") or "").rpartition("+link-")[0]
        return f"{r['mode']} P={r['world_size']}" + (f" [{base}]" if base else "")

    for name in dict.fromkeys(label(r) for r in linked):
        line = sorted((r for r in linked if label(r) == name), key=x)
        (drawn,) = ax.plot([x(r) for r in line], [r["epoch_time_s"] for r in line], "o-",
                           label=name)  # fmt: skip
        predicted = [(x(r), r["predicted_epoch_time_s"]) for r in line
                     if r.get("predicted_epoch_time_s") is not None]  # fmt: skip
        if predicted:
            ax.plot(*zip(*predicted, strict=True), "x--", color=drawn.get_color())
    unlimited = ["unlimited"] if any(not r["link_bits_per_s"] for r in linked) else []
    ticks = [*(r / 1e9 for r in rates), *(top / 1e9 for _ in unlimited)]
    ax.set_xscale("log")
    ax.set_xticks(ticks, [*(f"{r / 1e9:g}" for r in rates), *unlimited])
    ax.set(xlabel="link rate per node (Gbit/s)", ylabel="epoch time, s (median)",
           title="epoch time against the link (dashed: predicted)")  # fmt: skip
    ax.legend(fontsize=8)
    fig.tight_layout()
    with files.atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
