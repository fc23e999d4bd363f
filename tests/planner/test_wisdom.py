"""Wisdom (planner/wisdom.py): kept trials read back, refused when edited or foreign, and a
key that changes with what decides the trials."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from leo_cli.config import load_config
from leo_cli.errors import CacheError
from leo_cli.planner.wisdom import (
    CALIBRATION_KEEP,
    CALIBRATION_RECENT,
    ERROR_SAMPLES,
    PAIR_SAMPLES,
    Sample,
    Wisdom,
    add_samples,
    calibrated,
    calibration_path,
    content_digest,
    errors,
    factors,
    pair_factors,
    read_samples,
    read_wisdom,
    wisdom_key,
    wisdom_path,
    write_wisdom,
)

NAMES = ["leo", "blocking"]


def key(*overrides: str, names: list[str] = NAMES, inputs: str = "parts") -> str:
    return wisdom_key(load_config(None, list(overrides)), [inputs], "reference", names)


def kept(tmp_path: Path) -> Path:
    path = wisdom_path(tmp_path, key())
    write_wisdom(path, Wisdom(key(), "leo", "measured fastest", {"leo": 0.1, "blocking": None}, {}))
    return path


def test_wisdom_reads_back(tmp_path: Path) -> None:
    path = kept(tmp_path)
    assert path.parent == tmp_path / "wisdom"
    got = read_wisdom(path, NAMES)
    assert got is not None and (got.winner, got.measured_s["leo"]) == ("leo", 0.1)
    assert read_wisdom(tmp_path / "wisdom" / "missing.json", NAMES) is None


def test_the_key_follows_what_decides_the_trials() -> None:
    same = key()
    assert key() == same
    for other in (
        key("model.hidden_channels=32"),
        key("pipeline.halo_dtype=bfloat16"),
        key("partition.num_parts=4"),
        key("launch.cpu_affinity=[[0],[1]]"),
        key("train.dtype=float64"),
        key(inputs="other parts"),
        key(names=["leo", "blocking", "shared-memory"]),
    ):
        assert other != same
    # the SpMM set by name: a ranking measured under one SpMM is not another's
    spmms = [key(f"pipeline.spmm={s}") for s in ("auto", "leo", "torch", "torch-slabs")]
    assert len(set(spmms)) == 4
    for other in spmms[1:]:
        assert other != same
    assert key(names=["blocking", "leo"]) == same  # the set of candidates, in any order
    # not what only names the run or its length
    assert key("train.num_epochs=7", "run.name=x") == same


def signed(data: dict[str, object]) -> dict[str, object]:
    """An edit as a writer would make it, digest and all (what the other checks catch)."""
    return {**data, "digest": content_digest(data)}


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: "not json", "is not readable wisdom (JSONDecodeError)"),
        (lambda d: {**d, "winner": "blocking"}, "was edited after it was written"),
        (lambda d: {**d, "measured_s": {"leo": 0.2}}, "was edited after it was written"),
        (lambda d: signed({**d, "format_version": 99}), "another key or by another LEO"),
        (lambda d: signed({**d, "key": "0" * 64}), "another key or by another LEO"),
        (lambda d: signed({**d, "winner": "compute-only"}), "names a winner ('compute-only')"),
        (lambda d: signed({**d, "winner": "blocking"}), "that was not measured here"),
        (lambda d: {k: v for k, v in d.items() if k != "measured_s"}, "(KeyError)"),
        (lambda d: {**d, "measured_s": {"leo": "fast"}}, "(ValueError)"),
        (lambda d: signed({**d, "measured_s": {"leo": float("nan")}}), "not a positive number"),
        (lambda d: signed({**d, "measured_s": {"leo": 0.1, "blocking": -1}}), "not a positive"),
    ],
)
def test_edited_or_foreign_wisdom_is_refused_in_one_sentence(
    tmp_path: Path, edit: object, needle: str
) -> None:
    path = kept(tmp_path)
    data = edit(json.loads(path.read_text()))  # type: ignore[operator]
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    with pytest.raises(CacheError, match="^" + str(path).replace(".", r"\.")) as err:
        read_wisdom(path, NAMES)
    assert needle in str(err.value) and "\n" not in str(err.value)


def sample(mode: str, predicted: float, measured: float) -> Sample:
    return Sample(mode, predicted, measured, {"workers": 2})


def test_calibration_scales_each_mode_by_its_newest_samples(tmp_path: Path) -> None:
    path = calibration_path(tmp_path)
    assert path.parent == tmp_path / "wisdom" and read_samples(path) == []
    add_samples(path, [sample("leo", 0.1, 0.2), sample("blocking", 0.1, 0.15)])
    add_samples(path, [sample("leo", 0.1, 0.3), sample("leo", 0.2, 0.2)])
    scale = factors(read_samples(path))
    assert scale == {"leo": pytest.approx(2.0), "blocking": pytest.approx(1.5)}  # median 1, 2, 3
    assert calibrated({"leo": 0.05, "blocking": None, "fine-grained": 0.1}, scale) == {
        "leo": pytest.approx(0.1)
    }
    # only the newest samples count, and the file keeps a bounded number
    add_samples(path, [sample("leo", 1.0, 5.0)] * (CALIBRATION_KEEP + 5))
    kept = read_samples(path)
    assert len(kept) == CALIBRATION_KEEP and factors(kept)["leo"] == pytest.approx(5.0)


def test_calibration_prefers_the_closest_setting_with_samples() -> None:
    """The same setting first, then the same model across the same links (any worker count),
    then the same model anywhere; never another model's samples; without a setting, all of
    them."""

    def at(mode: str, ratio: float, **setting: Any) -> Sample:
        return Sample(mode, 1.0, ratio, {"workers": 2, "nodes": 1, "link": None, **setting})

    kept = [
        at("leo", 2.0, model="gcn"),
        at("leo", 3.0, model="gcn", workers=4),
        at("leo", 5.0, model="sage"),
        at("blocking", 7.0, model="sage", nodes=2, link="1gbit"),
        at("leo", 11.0, model="gat", nodes=2, link="1gbit"),
    ]
    gcn2 = {"workers": 2, "nodes": 1, "link": None, "model": "gcn"}
    assert factors(kept, gcn2) == {"leo": 2.0}
    assert factors(kept, {**gcn2, "workers": 3}) == {"leo": 2.5}
    assert factors(kept, {**gcn2, "nodes": 2, "link": "1gbit"}) == {"leo": 2.5}
    assert factors(kept, {**gcn2, "model": "gat"}) == {"leo": 11.0}  # the same model anywhere
    assert factors(kept, {**gcn2, "model": "sage", "nodes": 2, "link": "1gbit"}) == {
        "leo": 5.0,
        "blocking": 7.0,
    }
    assert factors(kept, {**gcn2, "model": "gin", "nodes": 2, "link": "1gbit"}) == {}
    assert factors(kept) == {"leo": 4.0, "blocking": 7.0}


@pytest.mark.parametrize(
    "text",
    ["[]", '{"format_version": 1}', '{"format_version": 1, "samples": [{"mode": "leo"}]}',
     '{"format_version": 1, "samples": [{"mode": "leo", "predicted_s": 0, "measured_s": 1}]}',
     '{"format_version": 1, "samples": [{"mode": "leo", "predicted_s": 1, "measured_s": "x"}]}',
     '{"format_version": 2, "samples": []}'],
)  # fmt: skip
def test_a_calibration_file_without_samples_is_refused_and_replaced(
    tmp_path: Path, text: str
) -> None:
    path = calibration_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(CacheError, match="calibration|positive number"):
        read_samples(path)
    add_samples(path, [sample("leo", 0.1, 0.2)])  # the next trials start it afresh
    assert [s.mode for s in read_samples(path)] == ["leo"]


def test_the_spmm_variant_reads_back_and_is_checked(tmp_path: Path) -> None:
    path = wisdom_path(tmp_path, key())
    steps = {"leo": 0.2, "torch": 0.1, "torch-slabs": None}
    wisdom = Wisdom(key(), "leo", "one worker", {}, {}, "torch", "measured fastest", steps)
    write_wisdom(path, wisdom)
    got = read_wisdom(path, [], list(steps))
    assert got is not None and (got.spmm, got.spmm_measured_s) == ("torch", steps)
    for edit, needle in (
        ({"spmm": "torch-slabs"}, "names an SpMM ('torch-slabs') that was not measured here"),
        ({"spmm": "mkl"}, "names an SpMM ('mkl')"),
        ({"spmm_measured_s": {"torch": 0.0}}, "not a positive number"),
    ):
        data = {k: v for k, v in json.loads(path.read_text()).items() if k != "digest"}
        path.write_text(json.dumps(signed({**data, **edit})))
        with pytest.raises(CacheError, match=re.escape(needle)):
            read_wisdom(path, [], list(steps))
        write_wisdom(path, wisdom)
    # A step without a CPU SpMM (GAT's heads) measured no variant: the setting is kept as is.
    write_wisdom(path, replace(wisdom, spmm="auto", spmm_rule="", spmm_measured_s={}))
    got = read_wisdom(path, [], list(steps))
    assert got is not None and (got.spmm, got.spmm_measured_s) == ("auto", {})


def test_a_factors_error_is_how_far_its_own_samples_stray_from_it() -> None:
    """The error a calibrated prediction carries (`errors`): the largest relative distance of
    the samples its factor is the median of, from that median; none under ERROR_SAMPLES."""
    gcn = {"workers": 4, "nodes": 1, "link": None, "model": "gcn"}

    def at(mode: str, ratio: float) -> Sample:
        return Sample(mode, 1.0, ratio, gcn)

    kept = [at("leo", 0.5), at("leo", 0.6), at("leo", 0.45), at("blocking", 0.7)]
    assert factors(kept, gcn) == {"leo": 0.5, "blocking": 0.7}
    assert ERROR_SAMPLES == 3
    got = errors(kept, gcn)
    assert list(got) == ["leo"]  # blocking has one sample: no error to tell
    assert got["leo"] == pytest.approx(0.2)  # 0.6 is 20% over the median 0.5
    assert errors(kept[:2], gcn) == {}


def test_a_pairs_factor_is_its_ratio_measured_in_the_same_runs() -> None:
    """Two modes measured in the same run make a sample of their ratio (measured over
    predicted); the host's load that slows both alike cancels, so the pair's error is far
    smaller than each mode's own; samples without a run id, or of one mode in a run, make
    none."""
    gcn = {"workers": 4, "nodes": 1, "link": None, "model": "gcn"}

    def at(mode: str, predicted: float, measured: float, run: str) -> Sample:
        return Sample(mode, predicted, measured, gcn, run)

    load = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 2.0, "e": 1.5}  # scales a run's modes alike
    kept = [
        s
        for run, x in load.items()
        for s in (
            at("leo", 0.1, 0.2 * x, run),
            at("blocking", 0.2, 0.6 * x * (1.1 if run == "c" else 1), run),
        )
    ]
    assert errors(kept, gcn)["leo"] == pytest.approx(0.5)  # 2 to 6 against their median 4
    kept += [at("leo", 0.1, 0.9, ""), at("fine-grained", 0.1, 0.9, "f")]  # no pair: no sample
    pairs = pair_factors(kept, gcn)
    assert set(pairs) == {("leo", "blocking"), ("blocking", "leo")}
    factor, error = pairs[("leo", "blocking")]  # measured 1/3 (1/3.3 in c) over predicted 1/2
    assert factor == pytest.approx(2 / 3) and error == pytest.approx(1 - 1 / 1.1)
    assert pairs[("blocking", "leo")][0] == pytest.approx(1.5)
    fewer = kept[: 2 * (PAIR_SAMPLES - 1)]  # two samples a run
    assert pair_factors(fewer, gcn) == {}


def test_a_pairs_factor_comes_from_its_own_setting_only() -> None:
    """Runs at another worker count do not stand in for a pair this setting never measured
    (a mode they left out here would never be measured here)."""
    four, eight = ({"workers": w, "nodes": 1, "link": None, "model": "gcn"} for w in (4, 8))
    kept = [
        Sample(mode, 0.1, measured, eight, f"r{i}")
        for i in range(PAIR_SAMPLES)
        for mode, measured in (("leo", 0.1), ("blocking", 0.3))
    ]
    assert ("blocking", "leo") in pair_factors(kept, eight)
    kept += [Sample("leo", 0.1, 0.1, four, f"s{i}") for i in range(20)]
    assert pair_factors(kept, four) == {}


def test_a_pair_counts_the_newest_runs_of_its_setting_only() -> None:
    """Runs that left a mode out add no sample of its pairs: once fewer than `PAIR_SAMPLES`
    of the newest `CALIBRATION_RECENT` runs of the setting measured the pair, its factor is
    gone and the mode is tried again; another setting's runs do not push them out."""
    gcn = {"workers": 4, "nodes": 1, "link": None, "model": "gcn"}
    sage = {**gcn, "model": "sage"}

    def run(i: int, modes: tuple[str, ...], setting: dict[str, Any] = gcn) -> list[Sample]:
        return [Sample(m, 1.0, 1.0, setting, f"r{i}") for m in modes]

    both = [s for i in range(5) for s in run(i, ("leo", "blocking"))]
    alone = [s for i in range(5, CALIBRATION_RECENT) for s in run(i, ("leo",))]
    others = [s for i in range(100, 120) for s in run(i, ("leo", "blocking"), sage)]
    kept = both + alone + others
    assert ("blocking", "leo") in pair_factors(kept, gcn)  # 5 of the newest 10 gcn runs
    later = run(99, ("leo",))
    assert ("blocking", "leo") not in pair_factors(kept + later, gcn)


def test_a_samples_run_id_reads_back(tmp_path: Path) -> None:
    path = calibration_path(tmp_path)
    add_samples(path, [Sample("leo", 0.1, 0.2, {"workers": 2}, "r1"), sample("leo", 0.1, 0.3)])
    assert [s.run for s in read_samples(path)] == ["r1", ""]


def test_wisdom_of_a_run_that_measured_no_mode_names_a_candidate_still(tmp_path: Path) -> None:
    """A run whose mode trials would not repay themselves (the cost model's pick trained
    untried) but whose SpMM variants were measured: its winner has no median, yet must be one
    of the candidates."""
    path = wisdom_path(tmp_path, key())
    steps = {"torch": 0.1, "leo": 0.2}
    untried = Wisdom(key(), "leo", "expected fastest, untried", {}, {}, "torch", "measured", steps)
    write_wisdom(path, untried)
    assert read_wisdom(path, NAMES, list(steps)) is not None
    write_wisdom(path, replace(untried, winner="compute-only"))
    with pytest.raises(CacheError, match="names a winner"):
        read_wisdom(path, NAMES, list(steps))
