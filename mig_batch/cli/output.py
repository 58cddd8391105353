"""Output helpers shared by the CLI commands: rich for people, JSON for scripts.

Tables never cut a cell: on a terminal of at least ``WIDE_COLUMNS`` columns they are drawn by rich with
long cells folded; in a narrower terminal, or when stdout is not a terminal (a pipe, a log file), they
switch to a compact layout: plain aligned columns, one row per line, when that fits (always in a file,
where lines may be long and grep finds a row whole), else one ``column: value`` block per row.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from rich.console import Console, RenderableType
from rich.errors import MarkupError
from rich.table import Table
from rich.text import Text

WIDE_COLUMNS = 100  # narrower terminals get the compact layout: rich would squeeze cells to "34…"


def cell_text(cell: RenderableType) -> str:
    """What rich would show in a cell, as plain text on one line."""
    if isinstance(cell, Text):
        text = cell.plain
    elif isinstance(cell, str):
        try:
            text = Text.from_markup(cell).plain
        except MarkupError:
            text = cell
    else:
        text = str(cell)
    return " ".join(text.split("\n"))


def table_rows(table: Table) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of ``table`` as plain text."""
    headers = [cell_text(c.header) for c in table.columns]
    columns = [[cell_text(cell) for cell in c._cells] for c in table.columns]
    return headers, [list(row) for row in zip(*columns, strict=True)]


def aligned_lines(table: Table) -> list[str]:
    """The table as plain aligned columns: a header line, then one line per row; nothing cut."""
    headers, rows = table_rows(table)
    widths = [max(len(text) for text in column) for column in zip(headers, *rows, strict=True)]
    lines = ["  ".join(text.ljust(w) for text, w in zip(line, widths, strict=True)).rstrip()
             for line in [headers, *rows]]  # fmt: skip
    title = [f"# {cell_text(table.title)}"] if table.title else []
    return [*title, *lines]


def record_lines(table: Table) -> list[str]:
    """The table as one ``column: value`` block per row (for terminals too narrow for its columns)."""
    headers, rows = table_rows(table)
    pad = max((len(h) for h in headers), default=0)
    out = [f"# {cell_text(table.title)}"] if table.title else []
    for n, row in enumerate(rows):
        if n:
            out.append("")
        out += [f"{h.rjust(pad)}: {value}" for h, value in zip(headers, row, strict=True)]
    return out


class TableConsole(Console):
    """A rich console whose tables stay readable at any width and in log files (see the module's text)."""

    def wide(self) -> bool:
        return self.is_terminal and self.width >= WIDE_COLUMNS

    def print(self, *objects: Any, **kwargs: Any) -> None:
        tables = [o for o in objects if isinstance(o, Table)]
        if not tables:
            super().print(*objects, **kwargs)
            return
        for obj in objects:
            if not isinstance(obj, Table):
                super().print(obj, **kwargs)
            elif self.wide():
                for column in obj.columns:
                    column.overflow = "fold"  # a long cell wraps onto more lines instead of ending in "…"
                super().print(obj, **kwargs)
            else:
                self.print_compact(obj)

    def print_compact(self, table: Table) -> None:
        lines = aligned_lines(table)
        if self.is_terminal and max((len(line) for line in lines), default=0) > self.width:
            lines = record_lines(table)
        self.file.write("".join(f"{line}\n" for line in lines))
        self.file.flush()


console = TableConsole()
err_console = Console(stderr=True)


def emit(data: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """Print ``data`` as JSON (``--json``) or let ``render`` draw it for a person."""
    if as_json:
        json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
        sys.stdout.write("\n")
    else:
        render(data)


def fail(message: str, code: int = 2) -> int:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return code
