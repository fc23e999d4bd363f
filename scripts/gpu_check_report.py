"""Bookkeeping of scripts/gpu-check.sh: step records, the exactness comparison of training runs,
and gpu-check/summary.json. Standard library only (it runs before and beside .venv).

    python3 scripts/gpu_check_report.py record OUT STEP STATUS SECONDS [DETAIL]
    python3 scripts/gpu_check_report.py get JSON_FILE KEY
    python3 scripts/gpu_check_report.py compare OUT REF_RUN RUN [RUN ...]
    python3 scripts/gpu_check_report.py summarize OUT

`record` appends one step (status ok, fail, timeout or skip) to OUT/steps.jsonl; `compare`
checks that every run's loss curve equals the reference run's (float64 training: relative
difference <= 1e-9, as the CPU exactness tests ask), that each says it is exact and ran the
CUDA kernels, and writes OUT/exactness.json; `summarize` writes OUT/summary.json from what the
steps left in OUT and exits non-zero when a step failed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

RTOL = 1e-9
PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def record(out: Path, step: str, status: str, seconds: str, detail: str = "") -> None:
    """Append one step's outcome to OUT/steps.jsonl."""
    row = {"step": step, "status": status, "seconds": round(float(seconds), 1), "detail": detail}
    with (out / "steps.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")


def get(path: Path, key: str) -> str:
    """A top-level value of a JSON file, as the shell wants it ("" for null)."""
    value = json.loads(path.read_text()).get(key)
    return "" if value is None else str(value)


def losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [float(r["loss"]) for r in rows]


def max_relative_difference(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) / max(abs(y), 1e-300) for x, y in zip(a, b, strict=True)), default=0.0)


def compare_run(ref: list[float], run: Path) -> dict[str, Any]:
    """How one run's losses and summary compare with the reference curve."""
    if not (run / "summary.json").is_file() or not (run / "metrics.jsonl").is_file():
        return {"run": str(run), "mode": None, "world_size": None,
                "problems": ["the run did not finish (see train.log)"]}  # fmt: skip
    got = losses(run)
    summary = json.loads((run / "summary.json").read_text())
    result: dict[str, Any] = {
        "run": str(run),
        "mode": summary.get("mode"),
        "world_size": summary.get("world_size"),
        "kernels": summary.get("kernels"),
        "exact": summary.get("exact"),
        "epochs": len(got),
    }
    problems = []
    if len(got) != len(ref):
        problems.append(f"{len(got)} epochs, the reference has {len(ref)}")
    else:
        result["max_rel_loss_diff"] = max_relative_difference(got, ref)
        if result["max_rel_loss_diff"] > RTOL:
            problems.append(f"losses differ by {result['max_rel_loss_diff']:.2e} > {RTOL}")
    if summary.get("exact") is not True:
        problems.append("summary.json does not say exact")
    if summary.get("kernels") != "cuda":
        problems.append(f"kernels {summary.get('kernels')!r}, not cuda")
    config = run / "resolved_config.yaml"
    asked = config.is_file() and "transport: shared-memory" in config.read_text()
    result["published_bytes"] = summary.get("mean_step_published_bytes")
    if asked and not (result["published_bytes"] or 0) > 0:
        problems.append("pipeline.transport=shared-memory, yet no row was read in place")
    result["problems"] = problems
    return result


def compare(out: Path, ref_run: Path, runs: list[Path]) -> int:
    """Write OUT/exactness.json; 0 when every run matches the reference."""
    ref = losses(ref_run)
    results = [compare_run(ref, run) for run in runs]
    report = {"reference": str(ref_run), "reference_losses": ref, "rtol": RTOL, "runs": results}
    (out / "exactness.json").write_text(json.dumps(report, indent=2))
    for r in results:
        verdict = "ok" if not r["problems"] else "; ".join(r["problems"])
        diff = r.get("max_rel_loss_diff")
        shown = "n/a" if diff is None else f"{diff:.1e}"
        name = f"{Path(r['run']).name} ({r['mode']} x{r['world_size']})"
        print(f"{name}: max relative loss difference {shown}: {verdict}")
    return 0 if all(not r["problems"] for r in results) else 1


def pytest_counts(log: Path) -> dict[str, int]:
    """Counts of pytest's closing line ("3 passed, 1 skipped in 2.0s") in a log."""
    if not log.is_file():
        return {}
    closing = [line for line in log.read_text().splitlines() if PYTEST_COUNTS.search(line)]
    if not closing:
        return {}
    return {kind: int(n) for n, kind in PYTEST_COUNTS.findall(closing[-1])}


def bench_digest(path: Path) -> dict[str, Any] | None:
    """The bench's copy bandwidth and its rows (each kernel's share of that bandwidth)."""
    if not path.is_file():
        return None
    bench = json.loads(path.read_text())
    return {k: bench.get(k) for k in ("device", "backend", "copy_bandwidth", "rows")}


def read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def summarize(out: Path) -> int:
    """Write OUT/summary.json; 0 when no step failed or timed out."""
    steps_file = out / "steps.jsonl"
    lines = steps_file.read_text().splitlines() if steps_file.exists() else []
    steps = [json.loads(line) for line in lines]
    failed = [s["step"] for s in steps if s["status"] in ("fail", "timeout")]
    summary = {
        "ok": not failed and bool(steps),
        "failed_steps": failed,
        "steps": steps,
        "wall_s": round(sum(s["seconds"] for s in steps), 1),
        "env": read_json(out / "env.json"),
        "gpu_tests": pytest_counts(out / "pytest-gpu.log"),
        "exactness": read_json(out / "exactness.json"),
        "bench": bench_digest(out / "bench_gpu.json"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    for s in steps:
        print(f"  {s['step']:<10} {s['status']:<8} {s['seconds']:>7.1f} s  {s['detail']}")
    print(f"gpu-check: {'ok' if summary['ok'] else 'FAILED: ' + ', '.join(failed)} ({out})")
    return 0 if summary["ok"] else 1


def main(argv: list[str]) -> int:
    command, args = argv[0], argv[1:]
    if command == "record":
        record(Path(args[0]), *args[1:])
        return 0
    if command == "get":
        print(get(Path(args[0]), args[1]))
        return 0
    if command == "compare":
        return compare(Path(args[0]), Path(args[1]), [Path(a) for a in args[2:]])
    if command == "summarize":
        return summarize(Path(args[0]))
    raise SystemExit(f"unknown command {command!r} (record, get, compare, summarize)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
