"""Time and peak memory of the partition stage, stage by stage.

Usage: python scripts/bench_partition.py OUT_DIR [--set key=value ...]

Runs `ensure_partitions(force=True)` in this process and prints one JSON object: seconds per
stage, the peak resident set of each stage, the process's overall peak, partition quality and
the sha256 of every partition file (to compare two versions of the code on the same graph).

Per-stage peaks are exact, not sampled: at every change of the reported stage the kernel's
high-water mark (VmHWM) is read and reset (`5` written to /proc/self/clear_refs). A stage is
labelled by the last stage the code reported, so a stage that reports only when it ends (as
older versions did) shows under the label of the stage before it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from leo_cli.config import load_config
from leo_cli.graph.partition_cache import ensure_partitions


def high_water_gb() -> float:
    """VmHWM of this process in GB (peak resident set since start or the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e9
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_high_water() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def main() -> None:
    out_dir = Path(sys.argv[1])
    overrides = [a for a in sys.argv[2:] if a != "--set"]
    cfg = load_config(None, overrides + [f"run.out_dir={out_dir}"])
    peaks: dict[str, float] = {}
    current = ["start"]

    def progress(stage: str, done: int, total: int) -> None:
        if stage != current[0]:
            peaks[current[0]] = round(max(peaks.get(current[0], 0.0), high_water_gb()), 3)
            reset_high_water()
            current[0] = stage

    t0 = time.perf_counter()
    result = ensure_partitions(
        cfg.data, cfg.partition, cfg.run.seed, out_dir, force=True, progress=progress
    )
    total = time.perf_counter() - t0
    peaks[current[0]] = round(max(peaks.get(current[0], 0.0), high_water_gb()), 3)
    report = {
        "total_s": round(total, 2),
        "timings_s": result.meta.get("timings_s"),
        "peak_rss_gb_by_stage": peaks,
        "peak_gb": max(peaks.values()),  # ru_maxrss would see the resets
        "stats": {k: result.meta["stats"][k] for k in ("edge_cut", "balance", "edges")},
        "files": result.meta["files"],
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
