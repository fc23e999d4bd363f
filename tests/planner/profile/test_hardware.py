"""The hardware profile: rate lookups on a hand-made profile, JSON round trip, and one clear
CacheError naming the file for every kind of bad file."""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import rank_rates

from leo_cli.errors import CacheError, LeoError
from leo_cli.planner.profile import store
from leo_cli.planner.profile.hardware import (
    FORMAT_VERSION,
    HardwareProfile,
    LinkFit,
    ProbeLoad,
    interpolate,
    per_row_rate,
)
from leo_cli.planner.profile.rates import Rates, settled


def link(bandwidth: float, latency: float, pairs: list[tuple[float, float]]) -> dict[str, Any]:
    ranks = [(0, 1), (0, 2), (1, 2)]
    return {
        "concurrent": {"bandwidth_bytes_per_s": bandwidth, "latency_s": latency},
        "pairs": [
            {"ranks": list(r), "bandwidth_bytes_per_s": b, "latency_s": t}
            for r, (b, t) in zip(ranks, pairs, strict=True)
        ],
    }


COMPUTE: dict[str, Any] = {
    "widths": [8, 32],
    "spmm_bytes": [1000, 4000],
    "spmm_edges_per_s": [[100.0, 25.0], [10.0, 2.5]],
    "spmm_t_edges_per_s": [[200.0, 50.0], [20.0, 5.0]],
    "gemm_flop_per_s": [1e9, 4e9],
    "gemm_narrow_bytes_per_s": [1e8, 4e8],
    "mask_rows_per_s": [1000.0, 250.0],
    "mask_backward_rows_per_s": [2000.0, 500.0],
    "gather_rows_per_s": [4000.0, 1000.0],
    "scatter_add_rows_per_s": [2000.0, 500.0],
    "pass_bytes": [100, 10000],
    "pass_bytes_per_s": [1e4, 1e3],
}


def in_place_dict(world: int) -> dict[str, Any]:
    """Reads in place measured at widths 8 and 32: rank r's mapped rows at 1 / (r + 1) of
    its local rate at width 8, as fast as local ones at width 32."""
    return {
        "widths": [8, 32],
        "working_bytes": 1 << 20,
        "local_edges_per_s": [[100.0, 100.0]] * world,
        "mapped_edges_per_s": [[100.0 / (r + 1), 100.0] for r in range(world)],
    }


def profile_dict() -> dict[str, Any]:
    """Three workers; every rate chosen so that lookups give round numbers."""
    return {
        "format_version": FORMAT_VERSION,
        "created_utc": "2026-12-01T00:00:00+00:00",
        "hostname": "test",
        "device": "cpu",
        "torch_version": "2.13.0",
        "kernels_backend": "reference",
        "dtype": "float32",
        "world_size": 3,
        "threads_per_worker": 1,
        "quick": False,
        "probe_s": 10.0,
        "sizes": {"widths": [8, 32]},
        "compute": json.loads(json.dumps(COMPUTE)),
        "ranks": rank_rates(COMPUTE, 3),
        "links": {
            "gloo": link(1e9, 1e-4, [(2e9, 5e-5), (1e9, 1e-4), (3e9, 2e-4)]),
            "shm": link(4e9, 2e-4, [(8e9, 3e-4), (8e9, 3e-4), (8e9, 3e-4)]),
            "barrier_s": 3e-4,
            "alltoall": {"bandwidth_bytes_per_s": 1e6, "latency_s": 1e-3},
            "overlap": 0.25,
            "in_place": in_place_dict(3),
        },
    }


@pytest.fixture
def hw() -> HardwareProfile:
    return HardwareProfile.model_validate(profile_dict())


@pytest.fixture
def profile(hw: HardwareProfile) -> HardwareProfile:
    return hw


def test_interpolation_is_log_log_and_clamped() -> None:
    widths, rates = [8, 32], [100.0, 25.0]
    assert interpolate(widths, rates, 16) == pytest.approx(50.0, rel=1e-12)
    assert interpolate(widths, rates, 8) == 100.0
    assert interpolate(widths, rates, 2) == 100.0  # narrower: the narrowest rate
    assert interpolate(widths, rates, 512) == 25.0
    # Per row: above the widest width, elements per second stay the widest one's.
    assert per_row_rate(widths, rates, 64) == pytest.approx(12.5, rel=1e-12)
    assert per_row_rate(widths, rates, 4) == 100.0
    assert interpolate([8, 16, 64], [10.0, 20.0, 5.0], 32) == pytest.approx(10.0, rel=1e-12)


def test_compute_lookups(profile: HardwareProfile) -> None:
    hw = Rates(profile)
    assert hw.spmm_seconds(1000, 16) == pytest.approx(20.0, rel=1e-12)
    assert hw.spmm_seconds(1000, 16, backward=True) == pytest.approx(10.0, rel=1e-12)
    assert hw.spmm_seconds(1000, 64) == pytest.approx(80.0, rel=1e-12)
    assert hw.spmm_seconds(0, 16) == 0.0
    # Working sets: 10x slower at 4000 B, log-log between (2000 B: sqrt(10)x), clamped.
    assert hw.spmm_seconds(1000, 8, working_bytes=4000) == pytest.approx(100.0, rel=1e-12)
    assert hw.spmm_seconds(1000, 8, working_bytes=2000) == pytest.approx(10**1.5, rel=1e-12)
    assert hw.spmm_seconds(1000, 8, working_bytes=10**9) == pytest.approx(100.0, rel=1e-12)
    assert hw.spmm_seconds(1000, 8, True, 10) == pytest.approx(5.0, rel=1e-12)
    # Roofline: sqrt(8 x 32) = 16 -> 2e9 FLOP/s; 2 x 10 x 8 x 32 FLOP take 2.56e-6 s, while
    # 10 x 40 x 4 B at 4e8 B/s (the narrow rate at width 32) take 4e-6 s: memory bound.
    assert hw.gemm_seconds(10, 8, 32) == pytest.approx(1600 / 4e8, rel=1e-12)
    assert hw.gemm_seconds(10**6, 256, 256) == pytest.approx(2 * 10**6 * 256**2 / 4e9, rel=1e-12)
    assert hw.gemm_seconds(0, 8, 8) == 0.0
    assert hw.mask_seconds(500, 8) == pytest.approx(0.5, rel=1e-12)
    assert hw.mask_seconds(500, 16) == pytest.approx(1.0, rel=1e-12)
    assert hw.mask_seconds(500, 8, backward=True) == pytest.approx(0.25, rel=1e-12)
    assert hw.gather_seconds(2000, 32) == pytest.approx(2.0, rel=1e-12)
    assert hw.scatter_add_seconds(2000, 32) == pytest.approx(4.0, rel=1e-12)
    # Passes: the rate of the largest measured size not above the output's (a step).
    assert hw.pass_seconds(2, 8) == pytest.approx(64 / 1e4, rel=1e-12)  # below 100 B
    assert hw.pass_seconds(100, 8) == pytest.approx(3200 / 1e4, rel=1e-12)
    assert hw.pass_seconds(1000, 8) == pytest.approx(32000 / 1e3, rel=1e-12)
    assert hw.pass_seconds(0, 8) == 0.0
    # Fresh memory: what a pass costs beyond the fastest measured one (1e4 B/s).
    assert hw.fresh_seconds(1000, 8) == pytest.approx(32000 / 1e3 - 32000 / 1e4, rel=1e-12)
    assert hw.fresh_seconds(100, 8) == 0.0
    assert profile.dtype_bytes == 4


def test_a_larger_working_set_is_not_priced_faster() -> None:
    """Past the fastest measured size a rate does not rise again (one noisy timing, as a pass
    at 32 MiB seen 2x faster than at 16 MiB on this machine, must not price big tensors
    cheap); below it, small sizes keep their per-call overheads."""
    assert settled([28.5, 28.4, 14.9, 12.4, 5.0, 11.0, 2.1]) == [
        28.5, 28.4, 14.9, 12.4, 5.0, 5.0, 2.1
    ]  # fmt: skip
    assert settled([38.6, 47.6, 22.6, 29.4]) == [38.6, 47.6, 22.6, 22.6]
    assert settled([5.0]) == [5.0]
    spiky = setitem(profile_dict(), [1e4, 1e3, 1e4], "compute", "pass_bytes_per_s")
    spiky = setitem(spiky, [100, 10000, 20000], "compute", "pass_bytes")
    spiky = setitem(spiky, [[100.0, 25.0], [10.0, 2.5], [50.0, 12.5]], "compute",
                    "spmm_edges_per_s")  # fmt: skip
    spiky = setitem(spiky, [[200.0, 50.0], [20.0, 5.0], [20.0, 5.0]], "compute",
                    "spmm_t_edges_per_s")  # fmt: skip
    spiky = setitem(spiky, [1000, 4000, 8000], "compute", "spmm_bytes")
    spiky["ranks"] = rank_rates(spiky["compute"], 3)
    rates = Rates(HardwareProfile.model_validate(spiky))
    assert rates.pass_seconds(1000, 8) == pytest.approx(32000 / 1e3, rel=1e-12)  # 32 kB
    assert rates.spmm_seconds(1000, 8, working_bytes=10**9) == pytest.approx(100.0, rel=1e-12)


def test_link_lookups(profile: HardwareProfile) -> None:
    hw = Rates(profile)
    assert hw.transfer_seconds(1e6, 2) == pytest.approx(1e-3 + 2e-4, rel=1e-12)
    assert hw.transfer_seconds(8e6, 1, "shm") == pytest.approx(2e-3 + 2e-4, rel=1e-12)
    # One pair alone, either order; without a pair, the median pair (2e9 B/s, 1e-4 s).
    alone = hw.transfer_seconds(2e6, 1, pair=(1, 0))
    assert alone == pytest.approx(1e-3 + 5e-5, rel=1e-12)
    median = hw.transfer_seconds(2e6, 1, concurrent=False)
    assert median == pytest.approx(1e-3 + 1e-4, rel=1e-12)
    assert hw.link_fit("gloo", concurrent=False) == LinkFit(
        bandwidth_bytes_per_s=2e9, latency_s=1e-4
    )
    assert hw.transfer_seconds(0, 0) == 0.0
    assert hw.barrier_seconds() == 3e-4
    assert hw.alltoall_seconds(2e6) == pytest.approx(1e-3 + 2.0, rel=1e-12)
    assert hw.overlap_share() == 0.25
    with pytest.raises(CacheError, match="no pair"):
        hw.transfer_seconds(1, 1, pair=(0, 5))


def test_in_place_lookups(profile: HardwareProfile) -> None:
    """Each rank's slowdown of reading in place: the median over widths of local over
    mapped rates; the machine's (no rank) the largest; never below 1; 1 where the profile has
    no such measurement."""
    assert Rates(profile, 2).in_place_slowdown() == pytest.approx(2.0, rel=1e-12)  # (3 + 1) / 2
    assert Rates(profile, 1).in_place_slowdown() == pytest.approx(1.5, rel=1e-12)
    assert Rates(profile).in_place_slowdown() == pytest.approx(2.0, rel=1e-12)
    data = profile_dict()
    data["links"]["in_place"]["mapped_edges_per_s"][0] = [200.0, 200.0]  # noise: mapped faster
    assert Rates(HardwareProfile.model_validate(data), 0).in_place_slowdown() == 1.0
    without = profile.model_copy(
        update={"links": profile.links.model_copy(update={"in_place": None})}
    )
    assert Rates(without, 2).in_place_slowdown() == 1.0


def test_single_worker_profile_has_no_links() -> None:
    data = profile_dict()
    data["world_size"] = 1
    data["ranks"] = data["ranks"][:1]
    data["links"] = {
        "gloo": None, "shm": None, "barrier_s": None, "alltoall": None, "overlap": None
    }  # fmt: skip
    single = HardwareProfile.model_validate(data)
    assert Rates(single).barrier_seconds() == 0.0
    assert Rates(single).alltoall_seconds(1e6) == 0.0 and Rates(single).overlap_share() == 0.0
    with pytest.raises(CacheError, match="no gloo link"):
        Rates(single).transfer_seconds(1, 1)


def test_round_trip_and_fingerprint(tmp_path: Path, hw: HardwareProfile) -> None:
    path = tmp_path / "sub" / "hardware.json"
    hw.write(path)
    assert [p.name for p in path.parent.iterdir()] == ["hardware.json"]  # no temp file left
    back = HardwareProfile.read(path)
    assert back == hw
    assert back.fingerprint() == hw.fingerprint()
    assert len(hw.fingerprint()) == 64
    data = profile_dict()
    data["compute"]["mask_rows_per_s"][0] = 999.0
    assert HardwareProfile.model_validate(data).fingerprint() != hw.fingerprint()


def drop(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    node = data
    for key in keys[:-1]:
        node = node[key]
    del node[keys[-1]]
    return data


def setitem(data: dict[str, Any], value: Any, *keys: str) -> dict[str, Any]:
    node = data
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return data


BAD_CONTENTS: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "not valid JSON"),
    "truncated": (json.dumps(profile_dict()).encode()[:-40], "not valid JSON"),
    "not utf-8": (b"\xff\xfe{", "not UTF-8"),
    "a list": (b"[1, 2]", "JSON object"),
    "old version": (
        json.dumps(setitem(profile_dict(), 0, "format_version")).encode(),
        "format_version 0",
    ),
    "no version": (json.dumps(drop(profile_dict(), "format_version")).encode(), "format_version"),
    "missing section": (json.dumps(drop(profile_dict(), "compute")).encode(), "compute"),
    "missing rate": (
        json.dumps(drop(profile_dict(), "compute", "mask_rows_per_s")).encode(),
        "compute.mask_rows_per_s",
    ),
    "missing link": (
        json.dumps(drop(profile_dict(), "links", "gloo", "concurrent")).encode(),
        "links.gloo.concurrent",
    ),
    "short rate list": (
        json.dumps(setitem(profile_dict(), [1.0], "compute", "gather_rows_per_s")).encode(),
        "one rate per width",
    ),
    "negative rate": (
        json.dumps(setitem(profile_dict(), [-1.0, 2.0], "compute", "gemm_flop_per_s")).encode(),
        "compute.gemm_flop_per_s.0",
    ),
    "short size table": (
        json.dumps(setitem(profile_dict(), [[1.0, 2.0]], "compute", "spmm_edges_per_s")).encode(),
        "one rate per size and width",
    ),
    "unsorted sizes": (
        json.dumps(setitem(profile_dict(), [9, 3], "compute", "pass_bytes")).encode(),
        "pass_bytes must be a non-empty increasing list",
    ),
    "overlap above one": (
        json.dumps(setitem(profile_dict(), 1.5, "links", "overlap")).encode(),
        "links.overlap",
    ),
    "alltoall missing": (
        json.dumps(setitem(profile_dict(), None, "links", "alltoall")).encode(),
        "measured iff world_size > 1",
    ),
    "nan latency": (
        json.dumps(setitem(profile_dict(), math.nan, "links", "barrier_s")).encode(),
        "links.barrier_s",
    ),
    "unknown key": (json.dumps(setitem(profile_dict(), 1, "extra")).encode(), "extra"),
    "pairs missing": (
        json.dumps(setitem(profile_dict(), [], "links", "shm", "pairs")).encode(),
        "one pair fit per pair",
    ),
    # Physical bounds (hardware.py): rates of 1e-300 made every predicted time NaN.
    "rate below physical": (
        json.dumps(setitem(profile_dict(), [1e-300, 4e9], "compute", "gemm_flop_per_s")).encode(),
        "compute.gemm_flop_per_s.0",
    ),
    "rate above physical": (
        json.dumps(setitem(profile_dict(), [1e20, 1e3], "compute", "gather_rows_per_s")).encode(),
        "compute.gather_rows_per_s.0",
    ),
    "infinite bandwidth": (
        json.dumps(
            setitem(profile_dict(), math.inf, "links", "alltoall", "bandwidth_bytes_per_s")
        ).encode(),
        "links.alltoall.bandwidth_bytes_per_s",
    ),
    "latency of an hour": (
        json.dumps(setitem(profile_dict(), 3600.0, "links", "barrier_s")).encode(),
        "links.barrier_s",
    ),
    "true as a rate": (
        json.dumps(setitem(profile_dict(), [True, 250.0], "compute", "mask_rows_per_s")).encode(),
        "not true/false",
    ),
    "true as world size": (
        json.dumps(setitem(profile_dict(), True, "world_size")).encode(),
        "world_size: must be a number, not true/false",
    ),
    "unknown dtype": (json.dumps(setitem(profile_dict(), "int7", "dtype")).encode(), "dtype"),
    "in-place rates of two ranks": (
        json.dumps(setitem(profile_dict(), in_place_dict(2), "links", "in_place")).encode(),
        "rates of each of the 3 workers",
    ),
    "in-place rate per width missing": (
        json.dumps(
            setitem(profile_dict(), [[1.0]] * 3, "links", "in_place", "mapped_edges_per_s")
        ).encode(),
        "one rate per rank and width",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CONTENTS))
def test_bad_file_names_the_file(tmp_path: Path, case: str) -> None:
    content, expected = BAD_CONTENTS[case]
    path = tmp_path / "hardware.json"
    path.write_bytes(content)
    with pytest.raises(CacheError) as info:
        HardwareProfile.read(path)
    message = str(info.value)
    assert str(path) in message and expected in message
    assert "leo profile-cache" in message and "\n" not in message
    error = info.value  # rendered alone, no chained traceback
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    assert isinstance(info.value, LeoError)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.json"
    with pytest.raises(CacheError, match="does not exist") as info:
        HardwareProfile.read(missing)
    assert str(missing) in str(info.value)
    with pytest.raises(CacheError, match="Cannot read") as info:
        HardwareProfile.read(tmp_path)  # a folder
    assert str(tmp_path) in str(info.value)


def test_load_is_recorded_and_judged(tmp_path: Path, hw: HardwareProfile) -> None:
    quiet = ProbeLoad(load_avg_1m=2.1, other_cpu=0.1, num_cpus=2)
    busy = ProbeLoad(load_avg_1m=6.0, other_cpu=1.5, num_cpus=2)
    assert not quiet.high() and busy.high() and not busy.high(share=1.0)
    assert ProbeLoad(load_avg_1m=3.0, other_cpu=None, num_cpus=2).high()  # no /proc/stat
    path = tmp_path / "hardware.json"
    hw.model_copy(update={"load": busy}).write(path)
    assert HardwareProfile.read(path).load == busy
    assert HardwareProfile.read(path).fingerprint() != hw.fingerprint()


@pytest.mark.parametrize("served", ["reference", "cpu", "cuda", "cuda+cpu"])
def test_a_profile_is_reused_only_with_the_kernels_it_measured(
    hw_profile: HardwareProfile, monkeypatch: pytest.MonkeyPatch, served: str
) -> None:
    # LEO's CPU SpMM aggregates at other rates than the reference: a profile of one (here
    # measured with the reference) is not reused for the other, and each has its own file.
    monkeypatch.setattr(store, "backend_name", lambda: served)
    here = hw_profile.model_copy(
        update={"hostname": socket.gethostname(), "torch_version": torch.__version__}
    )
    threads = store.placement_of(here)
    with_cpu = "cpu" in served  # the CUDA kernels do not change what the probe measures
    assert store.matches(here, 2, threads) == (not with_cpu)
    name = store.machine_cache(2, threads, Path("/c")).name
    assert name.endswith(".json") and ("-cpu" in name) == with_cpu
