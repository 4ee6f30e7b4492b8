"""Tables of the operator tools (``stats``, ``dlq list``) that never cut or
wrap a header or an id: plain aligned lines when stdout is not a terminal
(or the table is wider than it), a borderless rich table on a terminal."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text


@dataclass(frozen=True)
class Column:
    """A column of ``print_table``: numbers are ``right``-aligned; only a
    ``wrap`` column (free text, never an id) may wrap on a terminal."""

    name: str
    right: bool = False
    wrap: bool = False


@dataclass(frozen=True)
class Table:
    """What ``print_table`` prints: a title, the columns, rows of cell texts."""

    title: str
    columns: list[Column]
    rows: list[list[str]]


#: The narrowest a wrapping column gets on a terminal before the table is
#: printed plain instead.
WRAP_MIN = 12


def _cell(text: str) -> str:
    """One line, never empty (so plain columns stay apart)."""
    return " ".join(text.split()) or "-"


def print_table(console: Console, title: str, columns: list[Column], rows: list[list[str]]) -> None:
    """A table that never cuts or wraps a header or an id.

    Not on a terminal (a pipe, a file): plain lines, the title as a ``#``
    line, then the header and the rows, columns aligned with two spaces or
    more between them. On a terminal: a table without borders, wrapping
    only the ``wrap`` columns; plain lines when even then it is wider than
    the terminal (the terminal folds long lines, ids stay whole)."""
    cells = [[_cell(text) for text in row] for row in rows]
    widths = [max([len(col.name), *(len(row[i]) for row in cells)])
              for i, col in enumerate(columns)]
    needed = sum(min(width, WRAP_MIN) if col.wrap else width
                 for col, width in zip(columns, widths, strict=True))
    if not console.is_terminal or needed + 2 * (len(columns) - 1) > console.width:
        _print_plain(console, title, columns, cells, widths)
        return
    table = RichTable(title=title, title_justify="left", box=None, pad_edge=False,
                      header_style="bold underline")
    for col, width in zip(columns, widths, strict=True):
        if col.wrap:
            table.add_column(col.name, overflow="fold", min_width=min(width, WRAP_MIN))
        else:
            table.add_column(col.name, justify="right" if col.right else "left", no_wrap=True,
                             min_width=width)
    for row in cells:
        table.add_row(*(Text(text) for text in row))
    console.print(table)


def _print_plain(
    console: Console, title: str, columns: list[Column], cells: list[list[str]], widths: list[int]
) -> None:
    def line(row: list[str]) -> Text:
        return Text("  ".join(
            text.rjust(width) if col.right else text.ljust(width)
            for col, text, width in zip(columns, row, widths, strict=True)).rstrip())

    console.print(Text(f"# {title}"), soft_wrap=True)
    for row in [[col.name for col in columns], *cells]:
        console.print(line(row), soft_wrap=True)
