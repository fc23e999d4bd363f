"""cache-plan.json is untrusted input: every edit that would train wrong numbers, index out of
a part or hang a rank is refused in one sentence naming the file and the field."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from leo_cli.config.schema import MAX_CHUNKS
from leo_cli.errors import CacheError
from leo_cli.planner.plan import PLAN, CachePlan, RankCache, read_plan, write_plan
from leo_cli.registry import priced_names

HALO = [6, 4]  # halo rows of rank 0 and rank 1


def plan() -> CachePlan:
    """A valid two-rank plan for a two-layer model."""
    stages = {"forward_s": 0.1, "backward_s": 0.2, "comm_wait_s": 0.0}
    level = {
        "L1_replica_bytes": 8,
        "L1s_static_bytes": 0,
        "L2_bytes_per_step": 64,
        "L3_bytes_per_step": 0,
    }
    return CachePlan(
        "a" * 64, "b" * 64, "c" * 64, "leo",
        [RankCache(False, np.array([0, 5]), np.array([], dtype=np.int64)),
         RankCache(False, np.array([], dtype=np.int64), np.array([3]))],
        [2, 1], dict.fromkeys(priced_names(), 0.5), {m: dict(stages) for m in priced_names()},
        [level, level],
        [{"replica_share": 0.0, "replica_budget_mb": 0.0, "predicted_epoch_time_s": 0.5,
          "within_budget": True}], 1.0, 2.5,
    )  # fmt: skip


def edited(tmp_path: Path, edit: str) -> Path:
    """Write the valid plan, apply `edit` (Python on `d`, the JSON data) and save it."""
    d: dict[str, Any] = plan().to_json()
    exec(edit, {"math": math}, {"d": d})
    (tmp_path / PLAN).write_text(json.dumps(d))
    return tmp_path


# 2: before predicted_run_s (pipeline.mode=auto); 3: before every_row_from (transport per pair);
# 4: before predicted_buffer_bytes (auto_margin)
@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_an_earlier_format_is_made_again(tmp_path: Path, version: int) -> None:
    (tmp_path / PLAN).write_text(json.dumps({"format_version": version, "ranks": "whatever"}))
    assert read_plan(tmp_path) is None


def test_valid_plan_round_trips(tmp_path: Path) -> None:
    made = plan()
    made.predicted_run = {"leo": 0.5, "blocking": 0.4, "shared-memory": None}
    made.buffer_bytes = {"leo": 3 << 20, "blocking": 5 << 20}
    made.every_row = [[1], []]  # rank 0 reads every row of rank 1 in place, rank 1 L3 rows
    write_plan(tmp_path, made)
    back = read_plan(tmp_path)
    assert back is not None and back.every_row == [[1], []]
    assert back is not None and back.num_chunks == [2, 1] and back.plan_s == 2.5
    assert back.predicted_run == made.predicted_run  # what pipeline.mode=auto chooses from
    assert back.buffer_bytes == made.buffer_bytes  # ... and weighs
    assert back.caches[0].replica_rows.tolist() == [0, 5]
    back.check_fits(tmp_path / PLAN, HALO, num_layers=2, attention=False)


BAD: dict[str, tuple[str, str]] = {
    "zero chunks": ("d['num_chunks'] = [0, 1]", "num_chunks.0"),
    "negative chunks": ("d['num_chunks'] = [2, -3]", "num_chunks.1"),
    "too many chunks": (f"d['num_chunks'] = [{MAX_CHUNKS + 1}, 1]", "num_chunks.0"),
    "huge chunks": ("d['num_chunks'] = [10**12, 1]", "num_chunks.0"),
    "true as chunks": ("d['num_chunks'] = [True, 1]", "num_chunks.0"),
    "fractional chunks": ("d['num_chunks'] = [2.0, 1]", "num_chunks.0"),
    "no chunks": ("d['num_chunks'] = []", "num_chunks"),
    "negative row": ("d['ranks'][0]['replica_rows'][0] = -1", "ranks.0.replica_rows.0"),
    "fractional row": ("d['ranks'][0]['replica_rows'][1] = 1.5", "ranks.0.replica_rows.1"),
    "row 2**63": ("d['ranks'][1]['l3_rows'][0] = 2**63", "ranks.1.l3_rows.0"),
    "row twice": ("d['ranks'][0]['replica_rows'] = [5, 5]", "lists row 5 twice"),
    "owner twice": (
        "d['ranks'][0]['every_row_from'] = [1, 1]",
        "every_row_from lists owner 1 twice",
    ),
    "itself as owner": ("d['ranks'][1]['every_row_from'] = [1]", "not a peer of rank 1"),
    "no such owner": ("d['ranks'][0]['every_row_from'] = [7]", "not a peer of rank 0"),
    "'no' as a boolean": ("d['ranks'][0]['static_aggregate'] = 'no'", "static_aggregate"),
    "1 as a boolean": ("d['ranks'][0]['static_aggregate'] = 1", "static_aggregate"),
    "static on one rank": ("d['ranks'][1]['static_aggregate'] = True", "true for ranks [1] only"),
    "ranks out of order": ("d['ranks'][0]['rank'] = 1", "ranks.0.rank"),
    "missing field": ("del d['ranks'][1]['l3_rows']", "ranks.1.l3_rows"),
    "unknown field": ("d['extra'] = 1", "extra"),
    "NaN prediction": ("d['predicted_epoch_time_s']['leo'] = math.nan", "predicted_epoch_time_s"),
    "no stages": ("d['predicted_stages_s'] = {}", "predicted_stages_s.leo"),
    "short digest": ("d['key'] = 'abc'", "key"),
    "other version": ("d['format_version'] = 6", "format_version"),
    "negative buffers": ("d['predicted_buffer_bytes'] = {'leo': -1}", "predicted_buffer_bytes"),
    "text as a run prediction": ("d['predicted_run_s'] = {'leo': 'fast'}", "predicted_run_s"),
    "negative plan_s": ("d['plan_s'] = -1", "plan_s"),
    "'yes' within budget": (
        "d['replica_budget_sweep'][0]['within_budget'] = 'yes'",
        "replica_budget_sweep.0.within_budget",
    ),
    "ranks not a list": ("d['ranks'] = 5", "ranks"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_edited_plan_is_refused_naming_the_field(tmp_path: Path, case: str) -> None:
    edit, field = BAD[case]
    with pytest.raises(CacheError) as info:
        read_plan(edited(tmp_path, edit))
    message = str(info.value)
    assert str(tmp_path / PLAN) in message and field in message, message
    assert "leo profile-cache" in message and "\n" not in message


FIT: dict[str, tuple[dict[str, Any], str]] = {
    "row past the halo": ({"halo": [6, 3]}, "ranks.1.l3_rows.0: row 3 is not among rank 1's 3"),
    "replica past the halo": ({"halo": [5, 4]}, "ranks.0.replica_rows.1: row 5"),
    "chunks per layer": ({"num_layers": 3}, "num_chunks: 2 counts for a model of 3 layers"),
    "another world size": ({"halo": [6, 4, 4]}, "3 workers"),
    "replicas for gat": ({"attention": True}, "attention models"),
    "replicas for rounded rows": ({"rounded": True}, "pipeline.halo_dtype use no replicas"),
}


@pytest.mark.parametrize("case", sorted(FIT))
def test_plan_that_does_not_fit_the_run_is_refused(tmp_path: Path, case: str) -> None:
    change, expected = FIT[case]
    args: dict[str, Any] = {"halo": HALO, "num_layers": 2, "attention": False, "rounded": False}
    args |= change
    with pytest.raises(CacheError, match="not a cache plan LEO can use") as info:
        plan().check_fits(
            tmp_path / PLAN, args["halo"], args["num_layers"], args["attention"], args["rounded"]
        )
    assert expected in str(info.value)


def test_binary_file_and_folder_are_one_sentence(tmp_path: Path) -> None:
    (tmp_path / PLAN).write_text("[1, 2]")
    with pytest.raises(CacheError, match="valid dictionary"):
        read_plan(tmp_path)
    (tmp_path / PLAN).write_bytes(bytes(range(256)))
    with pytest.raises(CacheError, match="not UTF-8 JSON"):
        read_plan(tmp_path)
    (tmp_path / PLAN).unlink()
    (tmp_path / PLAN).mkdir()
    with pytest.raises(CacheError, match="is not a file"):
        read_plan(tmp_path)
    with pytest.raises(CacheError, match="cannot write"):
        write_plan(tmp_path, plan())
    assert sorted(p.name for p in tmp_path.iterdir()) == [PLAN]  # no temporary file left


def test_chunk_choices_stay_within_the_bound() -> None:
    from leo_cli.comm.modes import AUTO_MAX_CHUNKS
    from leo_cli.planner.policy import CHUNK_CHOICES

    assert max(CHUNK_CHOICES) <= MAX_CHUNKS and AUTO_MAX_CHUNKS <= MAX_CHUNKS


def test_a_plan_made_by_other_planner_code_is_not_read_as_this_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plan's key (which only the launcher reads) names the planner's sources: a changed
    cost model makes the cached plan stale (made again) instead of serving its old
    predictions; the inputs the workers check their plan by do not change with it."""
    from leo_cli.planner import make
    from leo_cli.planner.profile.hardware import HardwareProfile

    assert len(make.planner_code()) == 64
    hw = HardwareProfile.model_construct()
    monkeypatch.setattr(HardwareProfile, "fingerprint", lambda self: "hw")
    one = make.plan_key("inputs", hw)
    assert make.plan_key("inputs", hw) == one
    monkeypatch.setattr(make, "planner_code", lambda: "another cost model")
    assert make.plan_key("inputs", hw) != one


def test_the_plan_key_covers_the_modules_the_cost_model_reads() -> None:
    """The cost model sizes buffers by the transports' constants (`NUM_COPIES` of the
    published rows, `GRAD_COPIES` of the gradients' segment) and the schema's bounds: a change
    to those modules makes cached plans stale, as a change to the planner's own does."""
    from leo_cli.planner import make

    package = Path(make.__file__).resolve().parents[1]
    listed = {p.relative_to(package).as_posix() for p in make.planner_sources()}
    read = {"comm/published.py", "comm/shm.py", "config/schema.py", "registry.py"}
    assert read <= listed and "planner/cost.py" in listed
    assert "worker/trainer.py" not in listed  # only what a plan is made from


def test_a_parenthesised_import_still_lists_its_module() -> None:
    from leo_cli.planner import make

    text = "from leo_cli.comm.shm import (\n    GRAD_COPIES,\n)\nfrom leo_cli.comm import segments"
    assert make.IMPORT.findall(text) == [("leo_cli.comm.shm", ""), ("leo_cli.comm", "segments")]
