"""Output helpers shared by the CLI commands: rich for people, JSON for scripts.

Tables never cut a cell: on a terminal of at least ``WIDE_COLUMNS`` columns they are drawn by rich with
long cells folded; in a narrower terminal, or when stdout is not a terminal (a pipe, a log file), they
switch to a compact layout: plain aligned columns, one row per line, when that fits (always in a file,
where lines may be long and grep finds a row whole), else one ``column: value`` block per row.

rich costs ~40 ms to import, more than the light commands' whole work, so it is imported only when it
draws something: a table or styled text on a terminal, or text whose plain form this module cannot
work out for certain (then rich decides, and the output is rich's own). Commands build tables with
:class:`Table` below, rich's API in small; rich renders it when wide.

rich is optional (the `controller` and `sim` extras bring it): where it is not installed (a GPU node with
mig_batch alone), every console writes plain text, markup dropped, tables in the compact layout.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable

TYPE_CHECKING = False  # typing costs ~2 ms at every start; annotations here are strings
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

WIDE_COLUMNS = 100  # narrower terminals get the compact layout: rich would squeeze cells to "34…"

# rich's markup tag syntax: "[" then a letter, "#", "/" or "@", then anything but "[" up to "]"
_TAG = re.compile(r"\[([a-z#/@][^\[]*?)\]")
_ESCAPED_OR_TAG = re.compile(r"(\\)?\[[a-z#/@][^\[]*?\]")
# styles our commands put in markup; any other tag (links, handlers, colours by number) goes to rich
_PLAIN_STYLES = frozenset({"bold", "dim", "italic", "underline", "red", "green", "yellow", "blue", "cyan",
                           "magenta", "white", "bold red", "bold green", "bold yellow"})  # fmt: skip
# rich replaces ":name:" by an emoji when name is one; every emoji name is made of these characters
# (tests/test_output.py checks rich's table), so text with no such ":name:" has no emoji in it
_EMOJI_NAME = re.compile(r":([a-z0-9_+\-.!#&()*\u2019ãåçéíô]+?)(?:-(?:emoji|text))?:", re.IGNORECASE)


def plain_markup(text: str, markup: bool = True) -> str | None:
    """``text`` as rich prints it without colour, when that is certain: markup tags dropped (with
    ``markup``), no emoji code in it. None when rich must decide (escapes, other tags, a tag that
    does not close, a possible emoji)."""
    if _EMOJI_NAME.search(text):
        return None
    if not markup or "[" not in text:
        return text
    if "\\" in text:
        return None
    pieces, open_tags, position = [], [], 0
    for match in _TAG.finditer(text):
        name = match.group(1)
        if name.startswith("/"):
            if name == "/" and open_tags:
                open_tags.pop()
            elif name[1:] in open_tags:
                open_tags.reverse()
                open_tags.remove(name[1:])  # rich closes the most recent tag of that name
                open_tags.reverse()
            else:
                return None  # rich raises MarkupError here
        elif name in _PLAIN_STYLES:
            open_tags.append(name)
        else:
            return None
        pieces.append(text[position : match.start()])
        position = match.end()
    pieces.append(text[position:])
    return "".join(pieces)


_RICH: list[bool] = []  # whether rich is installed, once looked up


def rich_installed() -> bool:
    """Whether rich can be imported (looked up without importing it)."""
    if not _RICH:
        from importlib.util import find_spec

        _RICH.append("rich" in sys.modules or find_spec("rich") is not None)
    return _RICH[0]


def without_markup(text: str, markup: bool = True) -> str:
    """``text`` without its markup tags, where rich is not installed to say for certain."""
    if not markup:
        return text
    return _ESCAPED_OR_TAG.sub(lambda m: m.group(0)[1:] if m.group(1) else "", text)  # \[x]: the text [x]


class Literal(str):
    """A cell or text shown exactly as it is: brackets in it are not rich markup (a reason, a path)."""

    @property
    def plain(self) -> str:
        return str(self)


def cell_text(cell: Any) -> str:
    """What rich would show in a cell, as plain text on one line."""
    if isinstance(cell, Literal):
        text = str(cell)
    elif isinstance(cell, str):
        text = plain_markup(cell)
        if text is None and not rich_installed():
            text = without_markup(cell)
        elif text is None:
            from rich.errors import MarkupError
            from rich.text import Text

            try:
                text = Text.from_markup(cell).plain
            except MarkupError:
                text = cell
    elif hasattr(cell, "plain"):  # a rich Text: its characters are the cell
        text = cell.plain
    else:
        text = "" if cell is None else str(cell)
    return " ".join(text.split("\n"))


class Table:
    """A table for :class:`TableConsole`: headers, rows of cells (strings with rich markup, or rich
    Text), a title. Keyword options (``justify``, ``title_justify``...) are rich's, used when rich draws."""

    def __init__(self, *headers: str, title: str | None = None, **options: Any):
        self.title = title
        self.options = options
        self.headers: list[str] = []
        self.column_options: list[dict[str, Any]] = []
        self.rows: list[tuple[Any, ...]] = []
        self.row_options: list[dict[str, Any]] = []  # rich's per-row options (style=...): drawn on a terminal only
        for header in headers:
            self.add_column(header)

    def add_column(self, header: str, **options: Any) -> None:
        self.headers.append(header)
        self.column_options.append(options)

    def add_row(self, *cells: Any, **options: Any) -> None:
        if len(cells) > len(self.headers):
            raise ValueError(f"a row of {len(cells)} cells in a table of {len(self.headers)} columns")
        self.rows.append((*cells, *[""] * (len(self.headers) - len(cells))))
        self.row_options.append(options)

    def to_rich(self) -> Any:
        """The same table as a rich Table, long cells folded onto more lines instead of cut."""
        from rich.table import Table as RichTable
        from rich.text import Text

        table = RichTable(title=self.title, **self.options)
        for header, options in zip(self.headers, self.column_options, strict=True):
            table.add_column(header, **options)
        for row, options in zip(self.rows, self.row_options, strict=True):
            table.add_row(*(Text(c) if isinstance(c, Literal) else c for c in row), **options)
        for column in table.columns:
            column.overflow = "fold"
        return table


def table_rows(table: Table) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of ``table`` as plain text."""
    return [cell_text(h) for h in table.headers], [[cell_text(c) for c in row] for row in table.rows]


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


_PLAIN_PRINT_OPTIONS = frozenset({"highlight", "soft_wrap", "markup"})  # no colour anyway off a terminal


class PlainConsole:
    """What stands in for rich's Console where rich is not installed: plain text, markup dropped, no colour,
    no spinner; never a terminal, so tables take the compact layout."""

    is_terminal = False

    def __init__(self, options: dict[str, Any]):
        self._options = options

    @property
    def file(self) -> Any:  # looked up at each write, as rich does: tests and callers swap sys.stdout
        chosen = self._options.get("file")
        return chosen if chosen is not None else sys.stderr if self._options.get("stderr") else sys.stdout

    @property
    def width(self) -> int:
        from mig_batch.entry import terminal_columns

        return int(self._options.get("width") or terminal_columns())

    def print(self, *objects: Any, sep: str = " ", end: str = "\n", markup: bool | None = None, **_: Any) -> None:
        markup = self._options.get("markup", True) if markup is None else markup
        texts = [str(obj) if isinstance(obj, Literal) else without_markup(obj, markup) if isinstance(obj, str)
                 else obj.plain if hasattr(obj, "plain") else str(obj) for obj in objects]  # fmt: skip
        self.file.write(sep.join(texts) + end)
        self.file.flush()

    def status(self, *_: Any, **__: Any) -> Any:
        import contextlib

        return contextlib.nullcontext()


class TableConsole:
    """A console whose tables stay readable at any width and in log files (see the module's text).

    Takes rich Console's keyword arguments; the rich Console itself is made on first need."""

    def __init__(self, **console_options: Any):
        self._options = console_options
        self._rich: Any = None

    @property
    def rich(self) -> Any:
        """The rich Console behind this one (imports rich)."""
        if self._rich is None and not rich_installed():
            self._rich = PlainConsole(self._options)
        if self._rich is None:
            from rich.console import Console

            self._rich = Console(**self._options)
        return self._rich

    def __getattr__(self, name: str) -> Any:  # status(), width, ...: rich's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.rich, name)

    @property
    def file(self) -> Any:
        if self._rich is not None:
            return self._rich.file
        chosen = self._options.get("file")
        return chosen if chosen is not None else sys.stderr if self._options.get("stderr") else sys.stdout

    def plainly_not_a_terminal(self) -> bool:
        """True when rich too would find no terminal: a file or pipe, nothing forcing colour; or no rich."""
        if self._rich is not None:
            return not self._rich.is_terminal
        if "force_terminal" in self._options or "force_jupyter" in self._options or "IPython" in sys.modules:
            return not rich_installed()
        if "TTY_COMPATIBLE" in os.environ or "FORCE_COLOR" in os.environ:
            return not rich_installed()
        try:
            return not self.file.isatty() or not rich_installed()  # a pipe: no need to look rich up
        except (AttributeError, ValueError):
            return not rich_installed()

    @property
    def is_terminal(self) -> bool:
        return False if self.plainly_not_a_terminal() else self.rich.is_terminal

    def wide(self) -> bool:
        return self.is_terminal and self.rich.width >= WIDE_COLUMNS

    def _plain_width(self) -> int:
        """rich's width when it writes to no terminal."""
        if self._options.get("width") is not None:
            return int(self._options["width"])
        columns = os.environ.get("COLUMNS", "")
        if columns.isdigit():
            return int(columns)
        for descriptor in (0, 1, 2):
            try:
                width = os.get_terminal_size(descriptor).columns
            except (AttributeError, ValueError, OSError):
                continue
            return width or 80
        return 80

    def _plain_text(self, obj: Any, options: dict[str, Any]) -> str | None:
        """``obj`` as rich would print it to a file, when that is certain; else None."""
        if not isinstance(obj, str) or not set(options) <= _PLAIN_PRINT_OPTIONS or not self.plainly_not_a_terminal():
            return None
        text = plain_markup(obj, markup=options.get("markup", self._options.get("markup", True)))
        if text is None or not all(" " <= ch <= "~" for line in text.split("\n") for ch in line):
            return None  # tabs, control or wide characters: rich's rules
        soft_wrap = options.get("soft_wrap", self._options.get("soft_wrap", False))
        if not soft_wrap and any(len(line) > self._plain_width() for line in text.split("\n")):
            return None  # rich would wrap it
        return text

    def print(self, *objects: Any, **options: Any) -> None:
        if not any(isinstance(o, Table) for o in objects):
            self._print_text(objects, options)
            return
        for obj in objects:
            if not isinstance(obj, Table):
                self._print_text((obj,), options)
            elif self.wide():
                self.rich.print(obj.to_rich(), **options)
            else:
                self.print_compact(obj)

    def _print_text(self, objects: tuple[Any, ...], options: dict[str, Any]) -> None:
        if any(isinstance(o, Literal) for o in objects):
            options = {**options, "markup": False}  # brackets in it are text
        text = self._plain_text(objects[0], options) if len(objects) == 1 else None
        if text is None:
            self.rich.print(*objects, **options)
        else:
            self.file.write(text + "\n")
            self.file.flush()

    def print_compact(self, table: Table) -> None:
        lines = aligned_lines(table)
        if self.is_terminal and max((len(line) for line in lines), default=0) > self.rich.width:
            lines = record_lines(table)
        self.file.write("".join(f"{line}\n" for line in lines))
        self.file.flush()


console = TableConsole()
err_console = TableConsole(stderr=True)


def emit(data: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """Print ``data`` as JSON (``--json``) or let ``render`` draw it for a person."""
    if as_json:
        import json

        json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
        sys.stdout.write("\n")
    else:
        render(data)


def fail(message: str, code: int = 2) -> int:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return code


def make_out_dir(path: Path) -> None:
    """Create the output folder up front, so a bad --out fails before the simulation, not after it."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {path} is a file; give a folder (it is created if missing)")
    path.mkdir(parents=True, exist_ok=True)
    if not os.access(path, os.W_OK):
        raise ValueError(f"--out {path} is not writable; give a folder you can write to")
