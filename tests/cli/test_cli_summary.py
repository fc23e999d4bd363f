"""summary.json and the `leo train` summary table: the run's name (`run.name`), and `exact`
over every epoch of a resumed run."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from leo_cli.cli.render import TableFormat
from leo_cli.cli.train import SETUP_LABELS, progress_of, setup_lines, summary_sheet
from leo_cli.planner.auto_mode import ModeChoice
from leo_cli.run_dir import RunDir
from leo_cli.util.timing import WORKER_PARTS, Laps
from leo_cli.worker.report import setup_progress, summarize

ROWS = [
    {"epoch": 1, "loss": 2.0, "epoch_time_s": 0.5, "comm_bytes": 10, "cold": True},
    {
        "epoch": 2,
        "loss": 1.5,
        "val_acc": 0.5,
        "test_acc": 0.4,
        "epoch_time_s": 0.2,
        "comm_bytes": 10,
    },
]


def test_summary_and_table_name_the_run() -> None:
    summary = summarize(ROWS, 2, "blocking", "[bold]cora-4")
    assert summary["name"] == "[bold]cora-4"
    assert summary["final_loss"] == 1.5 and summary["mean_epoch_time_s"] == 0.2
    console = Console(record=True, width=100)
    TableFormat(console).sheet(summary_sheet(summary))
    assert "training summary: [bold]cora-4" in console.export_text()  # shown, not markup


def test_a_run_resumed_after_inexact_epochs_is_not_exact() -> None:
    """`exact` covers every epoch: compute-only epochs 1-2 then blocking ones stay inexact."""
    rows = [dict(r, exact=False) for r in ROWS] + [dict(ROWS[1], epoch=3, exact=True)]
    assert summarize(rows, 2, "blocking", "r")["exact"] is False
    assert summarize(rows[2:], 2, "blocking", "r")["exact"] is True
    assert summarize(ROWS, 2, "compute-only", "r")["exact"] is False  # rows from before the key
    assert summarize(ROWS, 1, "compute-only", "r")["exact"] is True


def test_table_says_which_mode_auto_ran_and_why() -> None:
    summary = summarize(ROWS, 2, "leo", "r")
    summary.update(
        ModeChoice("auto", "leo", "predicted fastest", {"leo": 0.053, "blocking": 0.062}).to_json()
    )
    console = Console(record=True, width=120)
    TableFormat(console).sheet(summary_sheet(summary))
    text = console.export_text()
    assert "leo (auto: predicted fastest, 0.053 s vs blocking 0.062 s)" in text, text
    older = summarize(ROWS, 2, "blocking", "r")  # a summary without the choice: the mode
    TableFormat(console).sheet(summary_sheet(older))
    assert "blocking" in console.export_text()


def test_progress_bar_shows_rows_and_passes_over_what_is_not_one() -> None:
    """The bar of `leo train` reads metrics.jsonl while workers write it: an edited row (the
    workers refuse it in one sentence) or a row without validation nodes leaves no traceback."""
    assert progress_of({"epoch": 3, "loss": 0.5, "val_acc": 0.25}) == (3, "loss 0.5000  val 0.250")
    assert progress_of({"epoch": 3, "loss": 0.5, "val_acc": None}) == (3, "loss 0.5000")
    for bad in ({"epoch": "x"}, {"epoch": 1, "loss": "?"}, [1], None):
        assert progress_of(bad) is None


def test_worker_set_up_shows_a_line_per_slow_stage(tmp_path: Path) -> None:
    """Rank 0 writes its finished set-up stages to status.json (`setup_progress`, through
    `Laps`); the parent prints each stage of a second or more once and names the one that
    runs now; a status outside set-up, or one edited into something else, shows nothing."""
    run = RunDir(tmp_path)
    laps = Laps(on_lap=setup_progress(run))
    laps.lap("process_group_s")
    status = run.read_status()
    assert status["state"] == "setup" and list(status["stages"]) == ["process_group_s"]
    status = {"state": "setup", "stages": {"process_group_s": 0.2, "read_part_s": 1.25}}
    printed: set[str] = set()
    lines, current = setup_lines(status, printed)
    assert (
        lines == ["worker set-up (rank 0): part files 1.2 s"]
        and current == "set-up: local graph..."
    )
    # where the workers try auto's candidates first, that is what runs after the part files
    assert setup_lines(status, printed, trials=True) == (
        [],
        "set-up: trials of auto's candidates...",
    )
    status["stages"] |= {"choose_s": 3.0}
    assert setup_lines(status, printed, trials=True)[1] == "set-up: local graph..."
    printed.discard("choose_s")
    status["stages"].pop("choose_s")
    status["stages"] |= {"graph_s": 19.0, "levels_s": 77.0}
    lines, current = setup_lines(status, printed)
    assert [line.split(": ")[1] for line in lines] == ["local graph 19.0 s", "cache levels 77.0 s"]
    assert current == "set-up: aggregator..."
    assert setup_lines(status, printed)[0] == []  # each once
    every = dict.fromkeys(WORKER_PARTS, 0.0)
    assert setup_lines({"state": "setup", "stages": every}, set())[1] == "set-up: first step..."
    # Training started: rank 0's last stages are still shown (the parent may not have seen
    # them while the state was `setup`).
    every["aggregator_s"] = 18.5
    lines, current = setup_lines({"state": "running", "stages": every}, printed)
    assert lines == ["worker set-up (rank 0): aggregator 18.5 s"]
    assert current == "set-up: first step..."
    assert set(SETUP_LABELS) == set(WORKER_PARTS)
    for other in ({"state": "running"}, {"state": "done"}, {"state": "setup", "stages": [1]}, {}):
        assert setup_lines(other, set()) == ([], None)
