"""Tables stay readable in narrow terminals and in logs: no cell is cut to "34…"."""

from __future__ import annotations

import io

from mig_batch.cli.output import Table, TableConsole

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
