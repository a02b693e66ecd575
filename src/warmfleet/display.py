"""What the commands show people: numbers rounded for reading, tables that fit the terminal.

A command that prints a table builds a ``Grid`` (a title, ``Column``s, rows of display strings)
and hands it to ``emit`` with the user's ``--format`` and ``--wide``:

- ``table``: a rich table as wide as the console (on a terminal its width; piped, ``$COLUMNS``,
  else 100). Columns that do not fit are left out, highest ``drop`` rank first, and a line under
  the table names them; ``--wide`` shows every column however wide.
- ``tsv``: every column, tab-separated, a header line first, no markup (several tables: each
  after a ``# title`` line, separated by a blank line).
- ``json``: the command's own document when it has one (``cache ls``, ``status``, the reports),
  else each table's rows as objects keyed by column header.

A shell helper below every shell and CLI (import-linter layers): it imports only rich and typer.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from warmfleet.core.progress import format_bytes

PIPED_WIDTH = 100  # columns of piped output when $COLUMNS is not set
NA = "-"  # a figure that was not measured
WRAP_MIN = 20  # a wrapping column (long words folded) is never squeezed below this


class OutputFormat(StrEnum):
    table = "table"
    tsv = "tsv"
    json = "json"


class CommandGroup(TyperGroup):
    """A command group whose list of commands shows each one's first paragraph as one line of
    text, rewrapped to the terminal (typer's rich mode keeps a docstring's line breaks there)."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:  # click's Context and Command
        command = super().get_command(ctx, cmd_name)
        if command is not None and command.short_help is None and command.help:
            command.short_help = " ".join(command.help.split("\n\n")[0].split())
        return command


class LogLevel(StrEnum):
    """The commands' ``--log-level`` (a ``logging`` level name: ``level=log_level.upper()``)."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


FormatOpt = Annotated[
    OutputFormat,
    typer.Option(
        "--format",
        help="table (fits the terminal; piped: $COLUMNS, else 100 columns), tsv or json",
    ),
]
WideOpt = Annotated[bool, typer.Option("--wide", help="Show every column of tables, however wide")]


# ----- numbers ----------------------------------------------------------------------------


def num(value: float | None, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, never in exponent form for people
    (0.06939999 -> 0.0694, 1234.5 -> 1234, 12.345 -> 12.3, 0.030000000000000002 -> 0.03);
    integers as they are."""
    if value is None:
        return NA
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    text = fixed(value, max(digits - 1 - magnitude, 0))
    return text.rstrip("0").rstrip(".") if "." in text else text


def fixed(value: float | None, decimals: int) -> str:
    """``value`` with ``decimals`` decimals (a unit's fixed precision); never "-0.0"."""
    if value is None:
        return NA
    text = f"{value:.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def pct(fraction: float | None, decimals: int = 1) -> str:
    """A fraction as a percentage: 0.0694 -> 6.9%."""
    return NA if fraction is None else f"{fixed(100 * fraction, decimals)}%"


def size(n_bytes: int | None) -> str:
    """Bytes in decimal units with one decimal: 30000003 -> 30.0 MB, 512 -> 512 B."""
    return NA if n_bytes is None else format_bytes(n_bytes)


def short_ids(ids: Iterable[str], min_chars: int = 8) -> dict[str, str]:
    """Each id's shortest prefix of at least ``min_chars`` that no other id starts with (like
    git's short hashes); an id that is a prefix of another is shown whole."""
    ordered = sorted(set(ids))
    out = {}
    for i, ident in enumerate(ordered):
        neighbours = ordered[max(i - 1, 0) : i] + ordered[i + 1 : i + 2]
        shared = max((_common_chars(ident, other) for other in neighbours), default=0)
        out[ident] = ident[: max(min_chars, shared + 1)]
    return out


def _common_chars(a: str, b: str) -> int:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


# ----- tables -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """``drop``: 0 is always shown; when the table is too wide, the column with the highest
    rank goes first (the rightmost of equal ranks). ``wrap``: long text may wrap (a long word
    fold) onto more lines instead of widening the table; otherwise a cell is never cut."""

    header: str
    left: bool = False
    drop: int = 0
    wrap: bool = False


@dataclass(frozen=True)
class Grid:
    title: str
    columns: tuple[Column, ...]
    rows: list[tuple[str, ...]] = field(default_factory=list)

    def add(self, *cells: str) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(cells)


def plain(cell: str) -> str:
    """A cell's text without rich markup."""
    return Text.from_markup(cell).plain


def _width(column: Column, cells: Sequence[str]) -> int:
    lines = [line for text in (column.header, *cells) for line in plain(text).splitlines()]
    natural = max((cell_len(line) for line in lines), default=0)
    return natural if not column.wrap else min(natural, WRAP_MIN)


def table_width(grid: Grid, shown: Sequence[int]) -> int:
    """Columns of a rich table (default box: one space of padding each side, edges) showing the
    columns ``shown``: the narrowest it can be without cutting a cell."""
    widths = [_width(grid.columns[i], [row[i] for row in grid.rows]) for i in shown]
    return sum(w + 2 for w in widths) + len(widths) + 1


def fitting_columns(grid: Grid, width: int) -> list[int]:
    """Indexes of the columns shown in ``width`` columns (see ``Column.drop``)."""
    shown = list(range(len(grid.columns)))
    dropped = []
    while table_width(grid, shown) > width:
        droppable = [i for i in shown if grid.columns[i].drop > 0]
        if not droppable:
            break
        column = max(reversed(droppable), key=lambda i: grid.columns[i].drop)
        shown.remove(column)
        dropped.append(column)
    for column in reversed(dropped):  # a narrow column dropped early may fit after all
        if table_width(grid, sorted([*shown, column])) <= width:
            shown = sorted([*shown, column])
    return shown


def rich_table(grid: Grid, shown: Sequence[int]) -> Table:
    table = Table(title=grid.title or None)
    for i in shown:
        column = grid.columns[i]
        table.add_column(
            column.header,
            justify="left" if column.left else "right",
            no_wrap=not column.wrap,
            overflow="fold" if column.wrap else "ellipsis",
        )
    for row in grid.rows:
        table.add_row(*(row[i] for i in shown))
    return table


def output_console(*, stderr: bool = False) -> Console:
    """On a terminal, the terminal's width; piped, ``$COLUMNS``, else ``PIPED_WIDTH``."""
    console = Console(stderr=stderr)
    if console.is_terminal:
        return console
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) > 0 else PIPED_WIDTH
    return Console(stderr=stderr, width=width)


def print_table(grid: Grid, console: Console, *, wide: bool = False) -> None:
    """``grid`` as a rich table fitting ``console`` (every column when ``wide``)."""
    shown = list(range(len(grid.columns))) if wide else fitting_columns(grid, console.width)
    table = rich_table(grid, shown)
    if not wide:
        console.print(table)
    else:
        saved = console.width
        console.width = max(saved, table_width(grid, shown))
        try:
            console.print(table)
        finally:
            console.width = saved
    hidden = [c.header for i, c in enumerate(grid.columns) if i not in shown]
    if hidden:
        console.print(f"[dim]hidden: {', '.join(hidden)} (--wide shows all)[/dim]")


def tsv(grids: Sequence[Grid]) -> str:
    """Every column of each grid, tab-separated, without markup."""
    parts = []
    for grid in grids:
        lines = [f"# {grid.title}"] if len(grids) > 1 else []
        for cells in (tuple(c.header for c in grid.columns), *grid.rows):
            lines.append("\t".join(_tsv_cell(cell) for cell in cells))
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def _tsv_cell(cell: str) -> str:
    return ", ".join(plain(cell).replace("\t", " ").splitlines())


def rows_json(grids: Sequence[Grid]) -> Any:
    """Each grid's rows as objects keyed by header (a list, or ``{title: list}`` for several)."""
    docs = {
        grid.title: [
            {c.header: plain(cell) for c, cell in zip(grid.columns, row, strict=True)}
            for row in grid.rows
        ]
        for grid in grids
    }
    return next(iter(docs.values())) if len(grids) == 1 else docs


def emit(
    grids: Grid | Sequence[Grid],
    fmt: OutputFormat = OutputFormat.table,
    *,
    wide: bool = False,
    console: Console | None = None,
    document: Any = None,
) -> None:
    """Print ``grids`` in ``fmt``; ``document`` is the JSON output when given."""
    many = [grids] if isinstance(grids, Grid) else list(grids)
    out = console or output_console()
    if fmt == OutputFormat.table:
        for grid in many:
            print_table(grid, out, wide=wide)
    elif fmt == OutputFormat.tsv:
        out.file.write(tsv(many))
    else:
        doc = rows_json(many) if document is None else document
        out.file.write(json.dumps(doc, indent=1, default=str) + "\n")


def chatter_console(fmt: OutputFormat) -> Console:
    """Where a command's other lines go ("wrote ...", notes): stdout beside a table, stderr
    when stdout carries TSV or JSON for a program."""
    return output_console(stderr=fmt != OutputFormat.table)
