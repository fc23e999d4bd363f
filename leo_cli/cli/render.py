"""What commands print: `Sheet`s (a command's tables before any format) and the formats of
`--format` that render them (Rich tables on a terminal; plain lines, TSV or JSON lines
elsewhere), stage progress, and the partition tables.

A command builds its sheets and hands them to the `Format` that `output(--format)` returns;
no command asks which format it prints in.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from leo_cli.cli.common import console
from leo_cli.errors import ConfigError

if TYPE_CHECKING:
    from leo_cli.graph.layout import ProgressFn

FORMATS = ("auto", "table", "plain", "tsv", "json")
FORMAT_HELP = (
    "How tables print: auto (Rich tables when stdout is a terminal, plain otherwise), table, "
    "plain (each table's title, then its rows one per line with tab-separated cells, then its "
    "notes; never wrapped), tsv (a header line and tab-separated rows only; titles, notes and "
    'progress go to stderr), json (one JSON object per row, its table\'s name under "table"; '
    "the rest to stderr)."
)
FormatOpt = Annotated[
    str, typer.Option("--format", metavar="FORMAT", help=FORMAT_HELP, show_default=True)
]


@dataclass(frozen=True)
class Sheet:
    """One table of a command's output: cells as text, in no particular format.

    `name` is the table's stable name (JSON's `table` field); `notes` are sentences under the
    table; `records` are the rows as JSON values where the command has them typed (default:
    each cell under its column's name, numbers as numbers, `-` as null). `header`, `right`,
    `styles` and `lines` (a rule between rows) only shape the terminal table.
    """

    name: str
    title: str
    columns: tuple[str, ...]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)
    records: list[dict[str, Any]] | None = None
    header: bool = True
    right: tuple[str, ...] = ()
    styles: dict[str, str] = field(default_factory=dict)
    lines: bool = False

    def json_rows(self) -> list[dict[str, Any]]:
        """The rows as JSON objects, each naming its table first."""
        if self.records is not None:
            return [{"table": self.name, **r} for r in self.records]
        keys = [json_key(c) for c in self.columns]
        return [
            {"table": self.name, **{k: json_value(c) for k, c in zip(keys, row, strict=True)}}
            for row in self.rows
        ]


def json_key(column: str) -> str:
    """A column's name as a JSON key: `step s` -> `step_s`."""
    return re.sub(r"[^0-9a-z]+", "_", column.lower()).strip("_") or "value"


def json_value(cell: str) -> Any:
    """A cell as a JSON value: a finite number as a number, `-` as null, else the text."""
    if cell == "-":
        return None
    for kind in (int, float):
        try:
            value = kind(cell)
        except ValueError:
            continue
        return value if math.isfinite(value) else cell
    return cell


def line(cells: list[str] | tuple[str, ...]) -> str:
    """Cells joined by tabs, each on one line (tabs and line breaks inside become spaces)."""
    return "\t".join(re.sub(r"[\t\r\n]+", " ", c) for c in cells)


class Format(Protocol):
    """How a command's output prints: its sheets, and sentences beside them.

    `console` takes what is not data (progress bars, notes): the terminal, or stderr where
    stdout holds data only.
    """

    console: Console

    def sheet(self, sheet: Sheet) -> None: ...

    def say(self, text: str) -> None: ...


class TableFormat:
    """Rich tables, for a terminal (wrapped to its width)."""

    def __init__(self, shown_on: Console = console) -> None:
        self.console = shown_on

    def sheet(self, sheet: Sheet) -> None:
        table = Table(title=escape(sheet.title), show_header=sheet.header, show_lines=sheet.lines)
        for name in sheet.columns:
            table.add_column(
                escape(name),
                justify="right" if name in sheet.right else "left",
                style=sheet.styles.get(name, ""),
            )
        for row in sheet.rows:
            table.add_row(*(escape(c) for c in row))
        table.caption = escape("\n".join(sheet.notes)) or None
        self.console.print(table)

    def say(self, text: str) -> None:
        self.console.print(escape(text))


class PlainFormat:
    """Lines for a log or grep, never wrapped: a sheet's title, its header and rows with
    tab-separated cells, its notes, a blank line."""

    def __init__(self) -> None:
        self.console = Console(soft_wrap=True)

    def sheet(self, sheet: Sheet) -> None:
        lines = [sheet.title] + [line(sheet.columns)] * sheet.header
        lines += [line(r) for r in sheet.rows] + sheet.notes
        sys.stdout.write("\n".join(lines) + "\n\n")
        sys.stdout.flush()

    def say(self, text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


class TsvFormat:
    """Data only on stdout: a header line and tab-separated rows (a sheet with the previous
    sheet's columns continues its rows; another sheet starts after a blank line with its own
    header); titles, notes and sentences go to stderr."""

    def __init__(self) -> None:
        self.console = Console(stderr=True, soft_wrap=True)
        self.columns: tuple[str, ...] | None = None

    def sheet(self, sheet: Sheet) -> None:
        lines = [line(r) for r in sheet.rows]
        if sheet.columns != self.columns:
            lines.insert(0, line(sheet.columns))
            if self.columns is not None:
                lines.insert(0, "")
        self.columns = sheet.columns
        sys.stdout.write("".join(f"{x}\n" for x in lines))
        sys.stdout.flush()
        for text in sheet.notes:
            self.say(text)

    def say(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False)


class JsonFormat(TsvFormat):
    """Data only on stdout: one JSON object per row (JSON Lines), its table's name under
    `table`; titles, notes and sentences go to stderr."""

    def sheet(self, sheet: Sheet) -> None:
        rows = sheet.json_rows()
        sys.stdout.write("".join(json.dumps(r, default=str) + "\n" for r in rows))
        sys.stdout.flush()
        for text in sheet.notes:
            self.say(text)


def output(name: str) -> Format:
    """The format `--format NAME` asks for; `auto`: Rich tables when stdout is a terminal,
    plain lines otherwise.

    Raises:
        ConfigError: NAME is not a format.
    """
    if name not in FORMATS:
        raise ConfigError(f"--format {name} is not a format; choose one of {', '.join(FORMATS)}.")
    if name == "auto":
        name = "table" if Console().is_terminal else "plain"
    kinds: dict[str, type[Format]] = {
        "table": TableFormat,
        "plain": PlainFormat,
        "tsv": TsvFormat,
        "json": JsonFormat,
    }
    return kinds[name]()


STAGE_LABELS = {
    "load": "load dataset",
    "partition": "assign parts",
    "layout": "build + write parts",
    "write": "write parts",
    "probe": "hardware probe",
    "plan": "cache plan",
}


@contextmanager
def stage_progress(shown_on: Console = console) -> Iterator[ProgressFn]:
    """A Rich progress display fed by `(stage, done, total)` callbacks (shown on a terminal
    only: off one, the bars would print as lines of box characters)."""
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description:<24}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=shown_on,
        transient=False,
        disable=not shown_on.is_terminal,
    )
    tasks: dict[str, Any] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = progress.add_task(STAGE_LABELS.get(stage, stage), total=total)
        progress.update(tasks[stage], completed=done, total=total)

    with progress:
        yield update


def partition_table(meta: dict[str, Any]) -> Table:
    """Per-part nodes, edges and halo sizes; with unequal part weights, each part's target
    share and the share it got of the measure its nodes were weighed in."""
    stats = meta["stats"]
    table = Table(title=f"{meta['dataset']['name']}: {meta['num_parts']} parts ({meta['method']})")
    table.add_column("part", justify="right")
    for name in ("nodes", "edges", "halo nodes"):
        table.add_column(name, justify="right")
    targets, achieved = meta.get("part_weights"), meta.get("achieved_shares")
    shares = list(zip(targets, achieved, strict=True)) if targets and achieved else None
    if shares:
        rule = (meta.get("vertex_weights") or {}).get("rule", "degree")
        table.add_column("target share", justify="right")
        table.add_column(f"share ({rule})", justify="right")
    for r in range(meta["num_parts"]):
        cells = [f"{stats[k][r]:,}" for k in ("nodes", "edges", "halo_nodes")]
        if shares:
            cells += [f"{shares[r][0]:.3f}", f"{shares[r][1]:.3f}"]
        table.add_row(str(r), *cells)
    return table


def stats_table(meta: dict[str, Any]) -> Table:
    """Graph-level partition quality."""
    stats, ds = meta["stats"], meta["dataset"]
    table = Table(show_header=False, title="partition quality")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("nodes / undirected edges", f"{ds['num_nodes']:,} / {stats['num_undirected_edges']:,}"),
        ("edge cut", f"{stats['edge_cut']:,} ({100 * stats['edge_cut_fraction']:.2f}%)"),
        ("edge balance (max/mean)", f"{stats['balance']:.3f}"),
        ("node balance (max/mean)", f"{stats['node_balance']:.3f}"),
        ("replication factor", f"{stats['replication_factor']:.3f}"),
    ]
    plan = meta.get("metis")
    if plan:
        limit = plan["memory_limit_gb"]
        rows.append(
            (
                "METIS edges seen",
                f"{plan['edge_fraction']:.0%} (projected {plan['projected_gb']:.3g} GB, "
                + ("no limit" if limit is None else f"limit {limit:g} GB")
                + ")",
            )
        )
    rows += [(f"time: {k}", f"{v:.2f} s") for k, v in meta.get("timings_s", {}).items()]
    rows += [
        (f"peak memory after {k}", f"{v:.2f} GB") for k, v in meta.get("peak_rss_gb", {}).items()
    ]
    for row in rows:
        table.add_row(*row)
    return table
