"""The shared output helpers: numbers rounded for people, tables that fit, TSV and JSON."""

from __future__ import annotations

import csv
import io
import json

import pytest
from rich.console import Console

from warmfleet.display import (
    Column,
    Grid,
    OutputFormat,
    emit,
    fixed,
    num,
    output_console,
    pct,
    short_ids,
    size,
)


def test_num_rounds_to_three_significant_digits_without_exponents() -> None:
    assert num(0.06939999999999999) == "0.0694"
    assert num(12.345) == "12.3"
    assert num(1234.5) == "1234"  # never 1.23e+03
    assert num(0.0) == "0"
    assert num(-0.00001234) == "-0.0000123"
    assert num(7) == "7"
    assert num(0.030000000000000002) == "0.03"  # no trailing zeros
    assert num(100.0) == "100"
    assert num(None) == "-"


def test_fixed_pct_and_size() -> None:
    assert fixed(-0.0001, 2) == "0.00"  # never "-0.00"
    assert fixed(3.14159, 1) == "3.1"
    assert pct(0.0694) == "6.9%"
    assert pct(None) == "-"
    assert size(30_000_003) == "30.0 MB"
    assert size(512) == "512 B"
    assert size(999_960) == "1.0 MB"  # not "1000.0 kB"
    assert size(2_500_000_000) == "2.5 GB"


def test_short_ids_are_unique_prefixes_of_at_least_the_minimum() -> None:
    ids = ["abcdef0123", "abcdef0999", "ffff000000"]
    short = short_ids(ids, min_chars=6)
    assert short == {"abcdef0123": "abcdef01", "abcdef0999": "abcdef09", "ffff000000": "ffff00"}
    for ident, prefix in short.items():
        assert [i for i in ids if i.startswith(prefix)] == [ident]


def _grid() -> Grid:
    columns = (
        Column("name", left=True),
        Column("a figure", drop=0),
        Column("a long optional column", drop=1),
        Column("another optional one", drop=2),
        Column("wraps", left=True, wrap=True, drop=3),
    )
    grid = Grid("a table that says what was run", columns)
    for i in range(4):
        grid.add(f"row-{i}", num(0.123456 * i), "x" * 30, "y" * 25, "some words " * 6)
    return grid


def _render(grid: Grid, width: int, *, wide: bool = False) -> str:
    out = io.StringIO()
    emit(grid, OutputFormat.table, wide=wide, console=Console(file=out, width=width))
    return out.getvalue()


def test_table_fits_the_console_by_dropping_optional_columns() -> None:
    assert "wraps" in _render(_grid(), 100)  # every column fits exactly 100
    text = _render(_grid(), 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    table = text.split("hidden:")[0]
    assert "another optional one" not in table  # highest drop rank went first
    assert "a long optional column" in table
    assert "wraps" in table  # dropped first, but fits again once the wider one is gone
    assert "hidden: another optional one (--wide shows all)" in " ".join(text.split())
    assert "…" not in text  # what is shown is never cut
    narrow = _render(_grid(), 40).split("hidden:")[0]
    assert "a long optional column" not in narrow
    assert "row-3" in narrow


def test_wide_shows_every_column() -> None:
    text = _render(_grid(), 100, wide=True)
    for header in ("a long optional column", "another optional one", "wraps"):
        assert header in text
    assert "hidden" not in text


def test_tsv_and_json_parse_with_every_column(capsys: pytest.CaptureFixture[str]) -> None:
    grid = _grid()
    grid.add("[red]marked[/red]", "1", "2", "3", "two\nlines")
    emit(grid, OutputFormat.tsv, console=Console(width=40))
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out), delimiter="\t"))
    assert rows[0] == [c.header for c in grid.columns]
    assert rows[-1] == ["marked", "1", "2", "3", "two, lines"]
    emit(grid, OutputFormat.json, console=Console(width=40))
    doc = json.loads(capsys.readouterr().out)
    assert doc[1]["a figure"] == "0.123"
    assert len(doc) == 5
    emit(grid, OutputFormat.json, console=Console(width=40), document={"own": 1})
    assert json.loads(capsys.readouterr().out) == {"own": 1}


def test_piped_console_honours_columns_else_100(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "123")
    assert output_console().width == 123
    monkeypatch.delenv("COLUMNS")
    assert output_console().width == 100
