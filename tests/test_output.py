"""Tables stay readable in narrow terminals and in logs: no cell is cut to "34…"."""

from __future__ import annotations

import io
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.errors import MarkupError
from rich.text import Text

from mig_batch.cli.output import _EMOJI_NAME, Table, TableConsole, plain_markup
from mig_batch.entry import terminal_columns

UUID = "MIG-5f0c2a1e-9b7d-5c3e-8a41-0123456789ab"


def wide_table() -> Table:
    table = Table(title="MIG slices per GPU")
    for column in ("node", "GPU", "model", "slices", "jobs"):
        table.add_column(column)
    table.add_row("gpu-node-017", "0", "A100-80GB", "aabb····", f"a=1234 3g.40gb@0 (running) {UUID}")
    table.add_row("gpu-node-018", "1", "[red]A30-24GB[/]", "····", "")
    return table


def printed(console: TableConsole, table: Table) -> str:
    console.print(table)
    return console.file.getvalue()


def test_a_log_file_gets_one_aligned_line_per_row_whole():
    out = printed(TableConsole(file=io.StringIO(), width=80), wide_table())
    lines = out.splitlines()
    assert lines[0] == "# MIG slices per GPU"
    assert lines[1].split() == ["node", "GPU", "model", "slices", "jobs"]
    assert UUID in lines[2] and lines[2].startswith("gpu-node-017") and "…" not in out
    assert "A30-24GB" in lines[3] and "[red]" not in out  # markup is styling, not text


def test_a_narrow_terminal_gets_one_block_per_row():
    out = printed(TableConsole(file=io.StringIO(), width=80, force_terminal=True), wide_table())
    assert "…" not in out and f"  jobs: a=1234 3g.40gb@0 (running) {UUID}" in out
    assert "  node: gpu-node-018" in out


def test_a_narrow_terminal_keeps_columns_that_fit():
    table = Table()
    table.add_column("a")
    table.add_row("short")
    out = printed(TableConsole(file=io.StringIO(), width=80, force_terminal=True), table)
    assert out.splitlines() == ["a", "short"]


def test_a_wide_terminal_draws_the_table_and_folds_long_cells():
    table = wide_table()
    table.add_row("n", "0", "m", "s", "x" * 150)
    out = printed(TableConsole(file=io.StringIO(), width=100, force_terminal=True, color_system=None), table)
    assert "┃" in out and "…" not in out
    assert sum(line.count("x") for line in out.splitlines()) == 150


def test_a_row_style_is_drawn_on_a_terminal_and_dropped_in_a_log():
    table = wide_table()
    table.add_row("gpu-node-019", "2", "H100-80GB", "········", "", style="bold green")
    drawn = printed(TableConsole(file=io.StringIO(), width=160, force_terminal=True, color_system="standard"), table)
    assert "gpu-node-019" in drawn and "\x1b[1;32m" in drawn  # bold green, as rich draws a styled row
    logged = printed(TableConsole(file=io.StringIO(), width=160), table)
    assert "\x1b" not in logged and any(line.startswith("gpu-node-019") for line in logged.splitlines())


# --- the plain path (no rich import) prints what rich prints -------------------------------------------

# markup-ish text: tags our commands use, tags they do not, escapes, emoji codes, long words
PIECES = st.sampled_from(["[bold]", "[/bold]", "[/]", "[red]", "[yellow]", "[bold red]", "[/red]", "[link=x]",
                          "[1]", "[========]", "[", "]", "\\[", ":", ":smile:", ":mig:", "x" * 30, " ", "\n",
                          "3g.40gb", "é", "\t", "A100-40GB: "])  # fmt: skip
MARKUP = st.lists(PIECES, max_size=12).map("".join)


def rich_plain(text: str) -> str | None:
    try:
        return Text.from_markup(text).plain
    except MarkupError:
        return None


@given(MARKUP)
def test_plain_markup_agrees_with_rich_whenever_it_answers(text):
    ours = plain_markup(text)
    if ours is not None:
        assert ours == rich_plain(text)


def test_plain_markup_answers_for_what_our_commands_print():
    assert plain_markup("[bold]3g.40gb[/] on [red]none fits[/]") == "3g.40gb on none fits"
    assert plain_markup("[========][====]") == "[========][====]"
    assert plain_markup("[link=https://x]x[/link]") is None and plain_markup("a :smile: b") is None


def test_every_rich_emoji_name_is_caught_by_the_emoji_check():
    from rich._emoji_codes import EMOJI

    missed = [name for name in EMOJI if not _EMOJI_NAME.fullmatch(f":{name}:") or
              not _EMOJI_NAME.fullmatch(f":{name.upper()}-emoji:")]  # fmt: skip
    assert missed == []


@given(MARKUP, st.sampled_from([{}, {"highlight": False}, {"soft_wrap": True}, {"markup": False},
                                {"highlight": False, "soft_wrap": True, "markup": False}]),
       st.sampled_from([20, 80]))  # fmt: skip
def test_printing_text_off_a_terminal_matches_rich(text, options, width):
    ours = TableConsole(file=io.StringIO(), width=width)
    theirs = Console(file=io.StringIO(), width=width)
    try:
        theirs.print(text, **options)
    except MarkupError:
        return  # rich refuses it; ours hands it to rich, which refuses it the same way
    ours.print(text, **options)
    assert ours.file.getvalue() == theirs.file.getvalue()


def test_plain_text_off_a_terminal_does_not_make_a_rich_console():
    console = TableConsole(file=io.StringIO())
    console.print("[bold]A100-40GB[/]: 3g.20gb", highlight=False)
    console.print(wide_table())
    assert console._rich is None and console.file.getvalue().startswith("A100-40GB: 3g.20gb\n# MIG slices")


@pytest.mark.parametrize("columns", [None, "132", "0", "junk"])
def test_terminal_columns_is_shutils(monkeypatch, columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert terminal_columns() == shutil.get_terminal_size().columns
