"""`pipeline.choose=measure` end to end: a measured run trains the numbers of its winner set by
name, keeps its trials as wisdom that the next run with the same inputs reuses (and a changed
key, `remeasure` or an edited file does not), and resumes with the mode and levels it started
with (segments of freed candidates: tests/worker/test_trials.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import TINY, leo

from leo_cli.config import load_config
from leo_cli.planner.auto_mode import NOT_REPAID
from leo_cli.planner.profile.hardware import HardwareProfile
from leo_cli.planner.wisdom import Sample, add_samples, calibration_path, factors, read_samples

pytestmark = [pytest.mark.integration, pytest.mark.dist]

# Input dropout: layer 0 exchanges rows and the plan replicates some, so leo's variants are
# candidates too. Every candidate tried, though 3 epochs would not repay a trial.
SHORT = [*TINY, "--set", "model.input_dropout=0.5", "--set", "train.num_epochs=3"]
ARGS = [*SHORT, "--set", "pipeline.trial_payback=false"]
# A calibrated step far above the measured ones (any scale decides alike: the payback rule
# compares steps with steps), so a note's figures tell which side wrote it.
EXPECTED = 1.0


def train(run: Path, cache: Path, *more: str, args: list[str] = ARGS) -> dict[str, Any]:
    res = leo("train", *args, "--set", f"run.out_dir={run}", "--set", f"run.cache_dir={cache}",
              *more)  # fmt: skip
    assert res.returncode == 0, res.stderr
    summary = json.loads((run / "summary.json").read_text())
    summary["stderr"] = res.stderr
    return summary


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_measured_run_trains_its_winner_and_keeps_wisdom(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    s = train(tmp_path / "measured", cache)
    assert s["mode_rule"].startswith("measured ") and s["mode_trials"] == []
    tried = s["mode_measured_s"]
    assert len(tried) >= 2 and s["setup_parts_s"]["choose_s"] > 0
    resolved = load_config(tmp_path / "measured" / "resolved_config.yaml").pipeline
    assert (resolved.mode, resolved.levels) == (s["mode"], s["mode_levels"])
    wisdom = Path(s["mode_wisdom"])
    kept = json.loads(wisdom.read_text())
    assert wisdom.parent == cache / "wisdom" and kept["measured_s"] == tried

    # The winner set by name: the same numbers to the last bit, no trials.
    by_name = train(tmp_path / "by-name", cache, "--set", f"pipeline.mode={resolved.mode}",
                    "--set", f"pipeline.levels={resolved.levels}")  # fmt: skip
    assert losses(tmp_path / "by-name") == losses(tmp_path / "measured")
    assert (by_name["mode"], by_name["mode_levels"]) == (s["mode"], s["mode_levels"])
    # no mode trials (the SpMM variants are still tried under pipeline.spmm=auto)
    assert by_name["mode_measured_s"] == {} and by_name["mode_rule"] is None

    # What was measured against what was predicted calibrates later predictions here: a
    # median, or the one timed step of a trial stopped there.
    samples = json.loads(calibration_path(cache).read_text())["samples"]
    predicted, spent = s["mode_predicted_s"], s["mode_trial_s"]
    stepped = {n for n in tried if tried[n] or "first_step_s" in spent[n]}
    assert {x["mode"] for x in samples} == {n for n in stepped if n in predicted}
    assert all(x["setting"]["workers"] == 2 for x in samples)

    # Same inputs again: the wisdom decides, nothing is tried.
    again = train(tmp_path / "again", cache)
    scale = factors(read_samples(calibration_path(cache)))
    assert again["mode_calibrated_s"] == pytest.approx(
        {m: t * scale[m] for m, t in again["mode_predicted_s"].items() if m in scale}
    )
    assert again["mode_rule"].endswith("by an earlier run with the same inputs (wisdom)")
    assert again["setup_parts_s"]["choose_s"] == 0
    assert (again["mode"], again["mode_levels"]) == (s["mode"], s["mode_levels"])
    assert again["mode_measured_s"] == tried and losses(tmp_path / "again") == losses(
        tmp_path / "measured"
    )

    # An edited wisdom file: one line, then measured again and replaced.
    wisdom.write_text("{not json")
    edited = train(tmp_path / "edited", cache)
    assert f"warning: {wisdom} is not readable wisdom (JSONDecodeError); measuring" in " ".join(
        edited["stderr"].split()
    )
    assert edited["mode_rule"].startswith("measured ") and "Traceback" not in edited["stderr"]
    assert json.loads(wisdom.read_text())["measured_s"] == edited["mode_measured_s"]

    # remeasure measures again (a changed key does too: tests/planner/test_wisdom.py).
    fresh = train(tmp_path / "remeasure", cache, "--set", "pipeline.choose=remeasure")
    assert fresh["setup_parts_s"]["choose_s"] > 0 and "wisdom" not in fresh["mode_rule"]
    assert fresh["mode_wisdom"] == s["mode_wisdom"]  # same key, replaced


def test_a_measured_run_resumes_with_its_mode_and_levels(tmp_path: Path) -> None:
    run, cache = tmp_path / "run", tmp_path / "cache"
    first = train(run, cache)
    before = losses(run)
    more = train(run, cache, "--resume", "--set", "train.num_epochs=5")
    assert (more["mode"], more["mode_levels"]) == (first["mode"], first["mode_levels"])
    assert more["mode_measured_s"] == first["mode_measured_s"]  # no trials on resume
    assert losses(run)[:3] == before and len(losses(run)) == 5
    resolved = load_config(run / "resolved_config.yaml").pipeline
    assert (resolved.mode, resolved.levels) == (first["mode"], first["mode_levels"])
    assert more["spmm_rule"] == first["spmm_rule"] and more["spmm"] == first["spmm"]


def test_a_run_of_a_mode_by_name_resumes_with_its_spmm_and_why(tmp_path: Path) -> None:
    run, cache = tmp_path / "run", tmp_path / "cache"
    first = train(run, cache, "--set", "pipeline.mode=blocking")
    assert first["spmm"] != "auto" and first["spmm_rule"].startswith("measured ")
    more = train(run, cache, "--resume", "--set", "pipeline.mode=blocking",
                 "--set", "train.num_epochs=5")  # fmt: skip
    kept = ("spmm", "spmm_rule", "spmm_measured_s")
    assert {k: more[k] for k in kept} == {k: first[k] for k in kept}  # no trials on resume
    assert len(losses(run)) == 5


def test_estimate_tries_nothing(tmp_path: Path) -> None:
    s = train(tmp_path / "run", tmp_path / "cache", "--set", "pipeline.choose=estimate")
    assert s["mode_measured_s"] == {} and s["mode_wisdom"] is None
    assert not s["mode_rule"].startswith("measured")
    assert not (tmp_path / "cache" / "wisdom").exists()


def test_a_run_too_short_to_repay_a_trial_tries_nothing(tmp_path: Path) -> None:
    """One epoch repays no trial (auto_mode `payback`): the cost model's pick trains untried,
    every other candidate and SpMM variant is noted with what it could have saved, and no
    wisdom is kept (nothing was measured); its numbers are that mode's set by name."""
    cache = tmp_path / "cache"
    one = [*SHORT, "--set", "train.num_epochs=1"]
    s = train(tmp_path / "short", cache, args=one)
    assert s["mode_measured_s"] == {} and s["spmm_measured_s"] == {} and s["mode_trials"] == []
    assert s["mode_rule"] == "expected fastest, untried: no trial would repay itself over 1 epochs"
    untried = {n for n, why in s["mode_notes"].items() if why.startswith(NOT_REPAID)}
    assert len(untried) >= 2 and any(n.startswith("spmm=") for n in untried)
    assert not (cache / "wisdom").exists() or not list((cache / "wisdom").glob("[0-9a-f]*.json"))
    resolved = load_config(tmp_path / "short" / "resolved_config.yaml").pipeline
    by_name = train(tmp_path / "by-name", cache, "--set", f"pipeline.mode={resolved.mode}",
                    "--set", f"pipeline.levels={resolved.levels}", "--set",
                    f"pipeline.spmm={resolved.spmm}", args=one)  # fmt: skip
    assert by_name["mode"] == s["mode"]
    assert losses(tmp_path / "by-name") == losses(tmp_path / "short")


def test_the_workers_leave_out_a_candidate_that_their_measurements_say_cannot_repay(
    tmp_path: Path, hw_profile: HardwareProfile
) -> None:
    """The payback rule on the workers (worker/trials.py `not_repaid`): the parent, on its
    expected steps, keeps a candidate its trial may just repay (building in one step); the
    workers, once the first candidates are measured, count their measured builds (several
    steps each on this graph) and leave it out unbuilt, saying so in mode_notes. The run
    trains its winner's numbers, those of that winner set by name.

    The expected steps come from calibration samples written here (planner/wisdom.py), so the
    parent's decision does not depend on this machine: `leo` and `fine-grained` at `EXPECTED`
    s (`leo` exactly, `fine-grained` to within 90%: it may save 0.9 x 30 = 27 of the best's
    measured steps, so only a build of over 24 steps leaves it out; at 50%, 12 steps, a host at
    load 15 did), `blocking` at 1.02 x that to within 16% (over 30 epochs it may save 0.143 x 30 =
    4.3 expected steps, its trial costs 4.08: repaid, but not once it builds in more than 1.2
    steps), `shared-memory` 3 x (left out as surely slower)."""
    hw = tmp_path / "hw.json"
    hw_profile.write(hw)
    base = [*TINY, "--set", "pipeline.spmm=torch", "--set", f"cache.hardware={hw}"]
    cache = tmp_path / "cache"
    # The predictions the parent calibrates (one epoch repays no trial: nothing is measured).
    first = train(tmp_path / "first", cache, "--set", "train.num_epochs=1", args=base)
    predicted = first["mode_predicted_s"]
    assert first["mode_measured_s"] == {}
    wanted = {  # mode: (expected step, error)
        "leo": (EXPECTED, 0.0),
        "fine-grained": (EXPECTED, 0.9),
        "blocking": (1.02 * EXPECTED, 0.16),
        "shared-memory": (3 * EXPECTED, 0.0),
    }
    model = load_config(tmp_path / "first" / "resolved_config.yaml").model.name
    add_samples(calibration_path(cache), [
        Sample(mode, predicted[mode], step * k, {"model": model})
        for mode, (step, error) in wanted.items() for k in (1 - error, 1.0, 1 + error)
    ])  # fmt: skip
    long = [*base, "--set", "train.num_epochs=30"]
    s = train(tmp_path / "measured", cache, args=long)
    assert s["mode_calibrated_s"] == pytest.approx({m: t for m, (t, _) in wanted.items()})
    tried = s["mode_measured_s"]
    assert {"leo", "fine-grained"} <= set(tried) and "blocking" not in tried
    why = s["mode_notes"]["blocking"]
    assert why.startswith(NOT_REPAID) and "over 30 epochs" in why
    # its trial's cost in measured seconds: less than one step the parent expected
    assert float(why.split("costs about ")[1].split(" s")[0]) < EXPECTED
    assert s["mode_notes"]["shared-memory"].startswith("not tried: calibrated")
    resolved = load_config(tmp_path / "measured" / "resolved_config.yaml").pipeline
    by_name = train(tmp_path / "by-name", cache, "--set", f"pipeline.mode={resolved.mode}",
                    "--set", f"pipeline.levels={resolved.levels}", args=long)  # fmt: skip
    assert (by_name["mode"], by_name["mode_levels"]) == (s["mode"], s["mode_levels"])
    assert losses(tmp_path / "by-name") == losses(tmp_path / "measured")
