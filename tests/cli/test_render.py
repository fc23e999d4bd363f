"""The formats of `--format`: one `Sheet` printed as Rich tables, plain lines, TSV or JSON
lines; the commands' output off a terminal parses line by line."""

from __future__ import annotations

import json
import re

import pytest
from helpers.cli import leo_here

from leo_cli.cli.render import JsonFormat, PlainFormat, Sheet, TsvFormat, output
from leo_cli.errors import ConfigError

BOX = re.compile("[\u2500-\u257f]")  # box-drawing characters (Rich's borders and bars)


def sheets() -> list[Sheet]:
    ranks = Sheet("plan", "cache plan", ("rank", "step s"), [["0", "0.031"], ["1", "-"]])
    more = Sheet("plan", "cache plan, more", ("rank", "step s"), [["2", "0.5"]], ["spread 1.2"])
    modes = Sheet("modes", "per mode", ("mode", "MB/step"), [["leo\tx", "1.5"]], ["a note"])
    return [ranks, more, modes]


def test_plain_prints_titles_rows_and_notes_one_per_line(capsys: pytest.CaptureFixture) -> None:
    shown = PlainFormat()
    for sheet in sheets():
        shown.sheet(sheet)
    shown.say("Wrote x")
    out = capsys.readouterr().out
    assert out.split("\n\n")[0] == "cache plan\nrank\tstep s\n0\t0.031\n1\t-"
    assert "leo x\t1.5\na note\n" in out and out.endswith("Wrote x\n")  # a tab in a cell: a space


def test_tsv_prints_data_only_and_continues_a_sheet_of_the_same_columns(
    capsys: pytest.CaptureFixture,
) -> None:
    shown = TsvFormat()
    for sheet in sheets():
        shown.sheet(sheet)
    shown.say("Wrote x")
    got = capsys.readouterr()
    assert got.out == "rank\tstep s\n0\t0.031\n1\t-\n2\t0.5\n\nmode\tMB/step\nleo x\t1.5\n"
    assert got.err == "spread 1.2\na note\nWrote x\n"


def test_json_prints_a_typed_object_per_row(capsys: pytest.CaptureFixture) -> None:
    shown = JsonFormat()
    for sheet in sheets():
        shown.sheet(sheet)
    typed = Sheet("t", "typed", ("a",), [["1.0"]], records=[{"a": 1.0, "b": None}])
    shown.sheet(typed)
    got = capsys.readouterr()
    rows = [json.loads(line) for line in got.out.splitlines()]
    assert rows[0] == {"table": "plan", "rank": 0, "step_s": 0.031}
    assert rows[1] == {"table": "plan", "rank": 1, "step_s": None}
    assert rows[3] == {"table": "modes", "mode": "leo\tx", "mb_step": 1.5}
    assert rows[4] == {"table": "t", "a": 1.0, "b": None}
    assert got.err == "spread 1.2\na note\n"


def test_a_bad_format_is_one_sentence() -> None:
    with pytest.raises(ConfigError, match=r"^--format xml is not a format; choose one of auto, "):
        output("xml")
    for command in (["config", "keys"], ["config", "show"], ["train"], ["bench"],
                    ["profile-cache"]):  # fmt: skip
        res = leo_here(*command, "--format", "xml")
        assert res.returncode == 2, command
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
        assert "--format xml is not a format" in res.stderr, res.stderr


def test_help_explains_the_formats() -> None:
    for command in (["config", "keys"], ["config", "show"], ["train"], ["bench"],
                    ["profile-cache"]):  # fmt: skip
        text = " ".join(leo_here(*command, "--help").stdout.split())
        assert "--format" in text and "tsv" in text and "json" in text, command
