"""`leo config keys` / `leo config show`, the suggestions of config errors, docs/config.md kept
in step with the schema, and help texts that print every character they hold."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from leo_cli.cli.app import app
from leo_cli.cli.config import keys_markdown
from leo_cli.config import LeoConfig, load_config
from leo_cli.config.keys import allowed_values, closest_key, config_keys
from leo_cli.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def leaves(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += leaves(value, f"{prefix}{key}.")
        else:
            out.append(prefix + key)
    return out


def test_keys_lists_every_setting_with_its_type_default_and_meaning() -> None:
    names = {k.name for k in config_keys()}
    assert set(leaves(LeoConfig().model_dump(mode="json"))) <= names
    assert {"launch.emulate.nodes", "launch.emulate.link", "bench.variants[].set"} <= names
    by_name = {k.name: k for k in config_keys()}
    assert by_name["partition.method"].type == "one of: metis, random, range, file"
    assert by_name["partition.num_parts"].type == "int >= 1, <= 4096"
    assert by_name["partition.num_parts"].default == "2"
    assert by_name["pipeline.mode"].type.startswith("one of: auto, leo, blocking")
    assert by_name["launch.emulate.nodes"].default == "(required)"
    assert all(k.description for k in config_keys()), "every key has a description"


def test_keys_command_prints_a_section_and_refuses_an_unknown_one() -> None:
    res = runner.invoke(app, ["config", "keys", "train"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "train.lr" in res.output and "Adam learning rate" in res.output
    assert "partition.num_parts" not in res.output
    res = runner.invoke(app, ["config", "keys", "trian"])
    assert res.exit_code == 2 and "did you mean train?" in res.output


NO_TERMINAL = {"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "FORCE_TERMINAL": None}


def test_keys_off_a_terminal_are_one_line_each() -> None:
    """Piped, `leo config keys` prints plain lines (no table wrapped at 80 columns): every key
    starts a line with its type, default and meaning after tabs."""
    res = runner.invoke(app, ["config", "keys"], env=NO_TERMINAL)
    assert res.exit_code == 0, res.output
    assert not re.search("[\u2500-\u257f]", res.stdout), "box characters in a pipe"
    lines = {line.split("\t")[0]: line.split("\t") for line in res.stdout.splitlines()}
    for k in config_keys():
        assert lines[k.name] == [k.name, k.type, k.default, k.description], k.name


def test_keys_as_tsv_list_every_key_show_prints() -> None:
    """`leo config keys --format tsv | cut -f1` holds every leaf key of `leo config show`."""
    res = runner.invoke(app, ["config", "keys", "--format", "tsv"])
    assert res.exit_code == 0, res.output
    first = [line.split("\t")[0] for line in res.stdout.splitlines()]
    assert first[0] == "key" and first.count("key") == 1  # one header: the sections continue
    shown = leaves(yaml.safe_load(runner.invoke(app, ["config", "show"]).stdout))
    assert set(shown) <= set(first[1:]), set(shown) - set(first)
    rows = runner.invoke(app, ["config", "keys", "train", "--format", "json"]).stdout
    assert {json.loads(line)["key"] for line in rows.splitlines()} == {
        k.name for k in config_keys("train")
    }


def test_show_as_lines_or_json_holds_every_value() -> None:
    tree = LeoConfig().model_dump(mode="json")
    res = runner.invoke(app, ["config", "show", "--format", "json", "--set", "train.lr=0.125"])
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    tree["train"]["lr"] = 0.125
    assert {r["key"]: r["value"] for r in rows} == dict(flat(tree))
    tsv = runner.invoke(app, ["config", "show", "--format", "tsv"]).stdout.splitlines()
    assert tsv[0] == "key\tvalue" and "run.out_dir\tnull" in tsv and "model.name\tgcn" in tsv
    assert len(tsv) == len(rows) + 1


def flat(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += flat(value, f"{prefix}{key}.")
        else:
            out.append((prefix + key, value))
    return out


def test_show_prints_the_resolved_config_loadable_again(tmp_path: Path) -> None:
    res = runner.invoke(app, ["config", "show", "--set", "train.lr=0.125", "-s", "model.name=sage"])
    assert res.exit_code == 0, res.output
    path = tmp_path / "shown.yaml"
    path.write_text(res.output)
    cfg = load_config(path)
    assert cfg.train.lr == 0.125 and cfg.model.name == "sage"
    assert cfg == load_config(None, ["train.lr=0.125", "model.name=sage"])
    assert yaml.safe_load(res.output)["partition"]["num_parts"] == 2


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("train.lrr=1", "did you mean train.lr?"),
        ("partiton.num_parts=2", "did you mean partition?"),
        ("partition.method=metsi", "did you mean metis?"),
        ("pipeline.mode=blockng", "did you mean blocking?"),
        ("bench.modes=[leo, blokcing]", "did you mean blocking?"),
        ("model.name=gcm", "did you mean gcn?"),
        ("launch.emulate={nodes: 2, nodez: 2}", "did you mean launch.emulate.nodes?"),
    ],
)
def test_errors_suggest_the_closest_key_or_value(override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert needle in str(err.value) and "leo config keys" in str(err.value)


def test_nothing_close_is_not_guessed() -> None:
    assert closest_key("zzzz.qqqq") is None
    with pytest.raises(ConfigError) as err:
        load_config(None, ["zzzz=1"])
    assert "did you mean" not in str(err.value) and "`leo config keys`" in str(err.value)
    assert allowed_values("launch.device") == ["auto", "cpu", "cuda"]
    assert allowed_values("train.lr") == []


def test_config_page_is_generated_from_the_schema() -> None:
    page = (ROOT / "docs" / "config.md").read_text()
    assert page == keys_markdown(config_keys()), (
        "docs/config.md is stale: leo config keys --markdown > docs/config.md"
    )


def commands(group: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    """Every (sub)command of a click group typer built, with its path."""
    out: list[tuple[list[str], Any]] = []
    for name, cmd in group.commands.items():
        out.append(([*path, name], cmd))
        if hasattr(cmd, "commands"):
            out += commands(cmd, [*path, name])
    return out


def test_help_prints_every_bracket_its_texts_hold() -> None:
    root = typer.main.get_command(app)
    checked = 0
    for path, cmd in commands(root, []):
        texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "100"})
        assert res.exit_code == 0, res.output
        shown = " ".join(res.output.split())
        for text in texts:
            for bracket in re.findall(r"\[[^\]\n]*\]", " ".join(text.split())):
                assert bracket in shown, f"leo {' '.join(path)} --help lost {bracket}"
                checked += 1
    assert checked >= 3  # e.g. --set's [w0,w1,...] and [[0],[1],[1]]
