"""The plan stage: a probe taken under load stays in the run folder and serves other runs only
while the machine is busy too, --force probes and plans again whatever is on disk, and a plan
edited past its run's bounds is refused."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch

from leo_cli import kernels
from leo_cli.config import load_config
from leo_cli.errors import CacheError
from leo_cli.graph.partition_cache import ensure_partitions
from leo_cli.launch import stages as plan_stage
from leo_cli.launch.allocator import allocator_of
from leo_cli.launch.elastic import worker_threads
from leo_cli.planner.plan import PLAN
from leo_cli.planner.profile.hardware import HARDWARE_FILE, HardwareProfile, ProbeLoad
from leo_cli.util.timing import RunTimer

SMALL = ["data.synthetic.num_nodes=600", "data.synthetic.num_features=16"]


def here(hw: HardwareProfile, load: ProbeLoad | None) -> HardwareProfile:
    """The profile as if probed on this machine now, with what else ran."""
    return hw.model_copy(
        update={
            "hostname": socket.gethostname(),
            "torch_version": torch.__version__,
            "kernels_backend": kernels.backend_name(),
            "threads_per_worker": int(worker_threads(2)),
            "allocator": allocator_of("auto").name,
            "load": load,
        }
    )


@pytest.fixture
def probes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, hw_profile: HardwareProfile
) -> list[Path]:
    """Replace the probe by a busy-machine profile; lists the run folders probed."""
    done: list[Path] = []

    def fake(cfg: object, run_dir: Path, quick: bool = False) -> HardwareProfile:
        done.append(run_dir)
        measured = hw_profile.model_copy(update={"quick": quick})
        hw = here(measured, ProbeLoad(load_avg_1m=5.0, other_cpu=1.4, num_cpus=2))
        hw.write(run_dir / HARDWARE_FILE)
        return hw

    monkeypatch.setattr(plan_stage, "run_probe", fake)
    monkeypatch.setenv("LEO_HARDWARE_CACHE", str(tmp_path / "machine"))
    return done


def test_probe_under_load_is_kept_as_a_busy_profile_beside_the_quiet_one(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    probes: list[Path],
) -> None:
    monkeypatch.delenv("LEO_PROBE_LOAD_LIMIT")  # the rule itself: other load > 1/4 of cores
    run = tmp_path / "run"
    cfg = load_config(None, [f"run.out_dir={run}"])
    hw = plan_stage.hardware_profile(cfg, run, None, num_workers=2)
    assert hw.load is not None and (run / HARDWARE_FILE).is_file()
    saved = [p.name for p in (tmp_path / "machine").iterdir()]
    assert len(saved) == 1 and saved[0].endswith("-busy.json")  # not the machine's profile
    err = " ".join(capsys.readouterr().err.split())
    assert "1.4 of 2 cores busy" in err and str(run / HARDWARE_FILE) in err and "--force" in err
    monkeypatch.setenv("LEO_PROBE_LOAD_LIMIT", "1.0")  # a machine always shared accepts it
    monkeypatch.setattr(plan_stage, "busy_now", lambda: None)  # whatever this host runs now
    plan_stage.hardware_profile(cfg, tmp_path / "other", None, num_workers=2)
    assert len(list((tmp_path / "machine").iterdir())) == 2


def test_a_busy_profile_serves_later_runs_while_the_machine_stays_busy(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    probes: list[Path],
) -> None:
    """Probed under load, a profile is kept beside the machine's store: a later run reuses it
    while other processes keep the machine busy (the same profile, so the same plan and the
    trials' wisdom), and probes again on a quiet machine."""
    monkeypatch.delenv("LEO_PROBE_LOAD_LIMIT")
    busy = ProbeLoad(load_avg_1m=4.0, other_cpu=1.2, num_cpus=2)
    monkeypatch.setattr(plan_stage, "busy_now", lambda: busy)
    cfg = load_config(None, [f"run.out_dir={tmp_path / 'a'}"])
    first = plan_stage.hardware_profile(cfg, tmp_path / "a", None, num_workers=2)
    capsys.readouterr()
    again = plan_stage.hardware_profile(cfg, tmp_path / "b", None, num_workers=2)
    assert probes == [tmp_path / "a"] and again.fingerprint() == first.fingerprint()
    err = " ".join(capsys.readouterr().err.split())
    assert "1.2 of 2 cores busy" in err and "measured under load too" in err
    assert (tmp_path / "b" / HARDWARE_FILE).is_file()
    monkeypatch.setattr(plan_stage, "busy_now", lambda: None)  # quiet now: measured again
    plan_stage.hardware_profile(cfg, tmp_path / "c", None, num_workers=2)
    assert probes == [tmp_path / "a", tmp_path / "c"]
    assert [p.name.endswith("-busy.json") for p in (tmp_path / "machine").iterdir()] == [True]


def test_force_probes_again_despite_saved_profiles(
    tmp_path: Path, probes: list[Path], hw_profile: HardwareProfile
) -> None:
    run = tmp_path / "run"
    cfg = load_config(None, [f"run.out_dir={run}"])
    plan_stage.hardware_profile(cfg, run, None, num_workers=2)
    plan_stage.hardware_profile(cfg, run, None, num_workers=2)
    assert probes == [run]  # the second run reused the run folder's profile
    plan_stage.hardware_profile(cfg, run, None, num_workers=2, reprobe=True)
    assert probes == [run, run]


def test_a_quick_profile_serves_only_quick_runs(
    tmp_path: Path, probes: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`LEO_PROBE_QUICK=1` (the suite's setting) probes with the tiny sizes; a run without it
    never reuses such a profile (machine-wide or in its run folder), and another value is
    one sentence."""
    monkeypatch.setenv("LEO_PROBE_LOAD_LIMIT", "1.0")
    cfg = load_config(None, [f"run.out_dir={tmp_path / 'a'}"])
    runs = [tmp_path / name for name in "abcd"]
    for run in runs[:2]:
        plan_stage.hardware_profile(cfg, run, None, num_workers=2)
    assert probes == runs[:1]  # the second reused the machine's quick profile
    monkeypatch.setenv("LEO_PROBE_QUICK", "0")
    assert not plan_stage.hardware_profile(cfg, runs[2], None, num_workers=2).quick
    # Nor is a run folder's quick profile: the machine's full one replaces it.
    assert not plan_stage.hardware_profile(cfg, runs[0], None, num_workers=2).quick
    assert probes == [runs[0], runs[2]]
    assert len(list((tmp_path / "machine").iterdir())) == 2  # the full one beside, not over
    monkeypatch.setenv("LEO_PROBE_QUICK", "yes")
    with pytest.raises(CacheError, match="LEO_PROBE_QUICK='yes' must be 1"):
        plan_stage.hardware_profile(cfg, runs[3], None, num_workers=2)


def test_older_profiles_and_other_placements_are_probed_again(
    tmp_path: Path, probes: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A format-2 profile (one rate per machine) is measured again, never misread; so is a
    profile measured under another `launch.cpu_affinity`."""
    monkeypatch.setenv("LEO_PROBE_LOAD_LIMIT", "1.0")
    run = tmp_path / "run"
    cfg = load_config(None, [f"run.out_dir={run}"])
    plan_stage.hardware_profile(cfg, run, None, num_workers=2)
    old = json.loads((run / HARDWARE_FILE).read_text())
    old["format_version"] = 2
    (run / HARDWARE_FILE).write_text(json.dumps(old))
    for path in (tmp_path / "machine").iterdir():
        path.write_text(json.dumps(old))
    plan_stage.hardware_profile(cfg, run, None, num_workers=2)
    assert probes == [run, run]
    pinned = load_config(None, [f"run.out_dir={run}", "launch.cpu_affinity=[[0],[0]]"])
    plan_stage.hardware_profile(pinned, run, None, num_workers=2)
    assert probes == [run, run, run]


@pytest.fixture
def run_with_plan(tmp_path: Path, hw_profile: HardwareProfile) -> tuple[Path, list[str]]:
    """Partitions, a given hardware profile and a fresh plan (no probe)."""
    run = tmp_path / "run"
    given = tmp_path / "given.json"
    hw_profile.write(given)
    overrides = [*SMALL, f"run.out_dir={run}", f"cache.hardware={given}"]
    cfg = load_config(None, overrides)
    ensure_partitions(cfg.data, cfg.partition, cfg.run.seed, run)
    assert plan_stage.ensure_plan(cfg, run) is not None
    return run, overrides


def test_plan_edited_past_its_run_is_refused(run_with_plan: tuple[Path, list[str]]) -> None:
    run, overrides = run_with_plan
    data = json.loads((run / PLAN).read_text())
    halo = json.loads((run / "partitions" / "META.json").read_text())["stats"]["halo_nodes"]
    data["ranks"][1]["l3_rows"] = [halo[1]]  # one past rank 1's last halo row
    (run / PLAN).write_text(json.dumps(data))
    with pytest.raises(CacheError, match=rf"ranks\.1\.l3_rows\.0: row {halo[1]} is not among"):
        plan_stage.ensure_plan(load_config(None, overrides), run)


@pytest.mark.slow
def test_force_replaces_an_unreadable_plan(run_with_plan: tuple[Path, list[str]]) -> None:
    run, overrides = run_with_plan
    (run / PLAN).write_bytes(b"\xff\xfe not a plan")
    plan = plan_stage.ensure_plan(load_config(None, overrides), run, force=True)
    assert plan is not None and json.loads((run / PLAN).read_text())["key"] == plan.key


def test_reach_is_computed_inside_a_pinned_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers compute the plan's digests after pinning themselves: the reach must not check
    the placement against the cores the worker now sees (it did, and every placed run
    failed in its workers)."""
    from leo_cli.harness import placement
    from leo_cli.planner.reach import reach_of

    monkeypatch.setattr(placement, "machine_cores", lambda: {0})
    cfg = load_config(None, ["partition.num_parts=3", "launch.cpu_affinity=[[0],[1],[1]]"])
    published = reach_of(cfg, 3).published
    assert published.tolist() == [[False, True, True], [True, False, True], [True, True, False]]


@pytest.mark.parametrize("field", ["hostname", "torch_version"])
def test_a_run_folders_profile_of_another_host_or_torch_is_probed_again(
    tmp_path: Path, probes: list[Path], monkeypatch: pytest.MonkeyPatch, field: str
) -> None:
    """Keyed like the machine-wide store: a run folder copied from another machine (or kept
    across a torch upgrade) does not lend its rates to this one."""
    monkeypatch.setenv("LEO_PROBE_LOAD_LIMIT", "1.0")
    run = tmp_path / "run"
    cfg = load_config(None, [f"run.out_dir={run}"])
    plan_stage.hardware_profile(cfg, run, None, num_workers=2)
    for path in [run / HARDWARE_FILE, *(tmp_path / "machine").iterdir()]:
        elsewhere = json.loads(path.read_text())
        elsewhere[field] = "elsewhere"
        path.write_text(json.dumps(elsewhere))
    hw = plan_stage.hardware_profile(cfg, run, None, num_workers=2)
    assert probes == [run, run] and getattr(hw, field) != "elsewhere"


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        (["partition.part_weights=measured"], True),
        (["partition.part_weights=measured", "launch.cpu_affinity=[[0],[1]]"], False),
        (["partition.part_weights=[2,1]"], False),
    ],
)
def test_measured_weights_without_pinning_warn(
    tmp_path: Path,
    probes: list[Path],
    capsys: pytest.CaptureFixture[str],
    overrides: list[str],
    warned: bool,
) -> None:
    run = tmp_path / "run"
    cfg = load_config(None, [f"run.out_dir={run}", *overrides])
    assert plan_stage.part_weigher(cfg, run) is not None
    err = " ".join(capsys.readouterr().err.split())
    assert ("measured with launch.cpu_affinity=null" in err) == warned, err


@pytest.mark.slow
def test_runs_sharing_a_cache_plan_once(tmp_path: Path, hw_profile: HardwareProfile) -> None:
    """Run folders with one `run.cache_dir` take a plan made for the same inputs from it (with
    its plot and recorded `plan_s`, reported as reused); other inputs plan anew beside it; an
    unreadable entry is made again and written over."""
    given, cache = tmp_path / "given.json", tmp_path / "cache"
    hw_profile.write(given)

    def plan_in(name: str, *more: str) -> tuple[Path, RunTimer, str]:
        run = tmp_path / name
        given_keys = [f"cache.hardware={given}", f"run.cache_dir={cache}"]
        cfg = load_config(None, [*SMALL, f"run.out_dir={run}", *given_keys, *more])
        ensure_partitions(cfg.data, cfg.partition, cfg.run.seed, run, cache_dir=cache)
        timer = RunTimer()
        plan = plan_stage.ensure_plan(cfg, run, timer=timer)
        assert plan is not None and json.loads((run / PLAN).read_text())["key"] == plan.key
        return run, timer, plan.key

    first, timer, key = plan_in("a")
    assert "plan_s" in timer.parts and (first / "cache-plan.png").is_file()
    second, timer, again = plan_in("b")
    assert (
        again == key and timer.reused["plan_s"] == json.loads((first / PLAN).read_text())["plan_s"]
    )
    assert (second / PLAN).read_bytes() == (first / PLAN).read_bytes()
    assert (second / "cache-plan.png").is_file()
    _, timer, wider = plan_in("c", "model.hidden_channels=32")
    assert wider != key and "plan_s" in timer.parts
    entries = sorted((cache / "plans").iterdir())
    assert len(entries) == 2
    for entry in entries:
        (entry / PLAN).write_bytes(b"\xff not a plan")
    _, timer, remade = plan_in("d")
    assert remade == key and "plan_s" in timer.parts
    assert json.loads((cache / "plans" / key[:24] / PLAN).read_text())["key"] == key
    # Rebuilt parts (`shared=False`) plan anew over the entry.
    cfg = load_config(None, [*SMALL, f"run.out_dir={first}", f"cache.hardware={given}",
                             f"run.cache_dir={cache}"])  # fmt: skip
    (first / PLAN).unlink()
    timer = RunTimer()
    assert plan_stage.ensure_plan(cfg, first, timer=timer, shared=False) is not None
    assert "plan_s" in timer.parts


def test_run_cache_dir_keeps_the_machines_profiles(
    tmp_path: Path, probes: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `run.cache_dir` set, this machine's profiles live in its `hardware/` (not in the
    home folder): a second run folder there reuses the first one's probe."""
    monkeypatch.setenv("LEO_PROBE_LOAD_LIMIT", "1.0")
    monkeypatch.delenv("LEO_HARDWARE_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = load_config(None, [f"run.cache_dir={tmp_path / 'cache'}"])
    for name in "ab":
        plan_stage.hardware_profile(cfg, tmp_path / name, None, num_workers=2)
    assert probes == [tmp_path / "a"]
    assert len(list((tmp_path / "cache" / "hardware").iterdir())) == 1
    assert not (tmp_path / "home").exists()


def test_parts_are_profiled_once_while_accesses_are_kept(
    run_with_plan: tuple[Path, list[str]],
) -> None:
    """`leo train` under auto plans twice from the same parts: inside `accesses_kept` the
    second plan takes the first one's profiles; new part files (another META) or a verified
    read are profiled again; outside, nothing is kept."""
    run, _ = run_with_plan
    with plan_stage.accesses_kept():
        first = plan_stage.part_accesses(run, 2, verify=False)
        assert plan_stage.part_accesses(run, 2, verify=False) is first
        assert plan_stage.part_accesses(run, 2, verify=True) is not first
    assert plan_stage.part_accesses(run, 2, verify=False) is not first


def test_new_part_files_are_profiled_again_while_kept(
    run_with_plan: tuple[Path, list[str]],
) -> None:
    """The kept profiles are keyed by META.json's bytes (its checksums): parts rewritten in
    between are profiled again."""
    run, _ = run_with_plan
    meta = run / "partitions" / "META.json"
    with plan_stage.accesses_kept():
        first = plan_stage.part_accesses(run, 2, verify=False)
        meta.write_text(meta.read_text() + "\n")
        assert plan_stage.part_accesses(run, 2, verify=False) is not first


@pytest.mark.parametrize(
    ("case", "want"),
    [
        ({"given": True, "saved": True, "fits": True}, "none"),
        ({"hardware_key": True, "saved": True, "fits": True}, "none"),
        ({"needs": False, "saved": True, "fits": True}, "none"),
        ({"needs": False, "always": True}, "full"),  # profile-cache plans whatever the policy
        ({}, "full"),  # nothing saved
        ({"saved": True, "fits": False}, "full"),
        ({"saved": True, "fits": True}, "check"),
        ({"saved": True, "fits": True, "force": True}, "full"),
    ],
)
def test_nodes_decide_the_probe_alike(
    case: dict[str, bool], want: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 0's check launch and the other nodes' join follow one decision."""
    overrides = ["launch.nnodes=2", *SMALL]
    if case.get("hardware_key"):
        overrides.append(f"cache.hardware={tmp_path / 'hw.json'}")
    cfg = load_config(None, overrides)
    monkeypatch.setattr(plan_stage, "needs_profile", lambda c: case.get("needs", True))
    saved = object() if case.get("saved") else None
    monkeypatch.setattr(plan_stage, "saved_profile", lambda path: saved)
    monkeypatch.setattr(plan_stage, "fits_nodes", lambda hw, c, n: case.get("fits", False))
    given = tmp_path / "given.json" if case.get("given") else None
    got = plan_stage.nodes_probe(
        cfg, tmp_path, case.get("always", False), case.get("force", False), given
    )
    assert got == want
    launched: list[bool] = []
    monkeypatch.setattr(
        plan_stage,
        "run_probe",
        lambda c, d, quick, keep: launched.append(keep) or quicks.add(quick),
    )
    quicks: set[bool] = set()
    plan_stage.join_probe(cfg, tmp_path, case.get("always", False), case.get("force", False), given)
    plan_stage.check_nodes_profile(
        cfg, tmp_path, case.get("always", False), case.get("force", False), given
    )
    # The others join every launch node 0 runs: node 0's check here, its full probe later.
    assert launched == {"none": [], "check": [True, True], "full": [False]}[want]
    assert quicks <= {True}  # the suite's tiny sizes (LEO_PROBE_QUICK=1), whatever the nodes
