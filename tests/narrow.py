"""A command run as a new user's log would show it: no TTY, 80 columns.

:func:`invoke_narrow` runs an ``opro`` command through typer's CliRunner (its output is never a
terminal) with ``COLUMNS=80``, and checks every boxed rich table the command printed: it was laid
out at 80 columns, no line of it is wider, and no row (the header included) is taller than 3 lines.
A boxless grid (``Table.grid``) is layout, not a table: a listing below a table may wrap its texts.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner, Result

from opro.cli import app

WIDTH = 80
MAX_ROW_LINES = 3
#: The first character of a rule line of a rich box (top, header separator, row separator, bottom).
_RULES = set("┏┡├└┌╞╟┣┗╭╰╔╠╚+")
#: The first character of a line inside a row.
_CELLS = set("┃│║|")


def row_heights(table: Table, *, width: int = WIDTH) -> list[int]:
    """Lines per row of ``table`` laid out at ``width`` (the header first, when shown).

    Rendered again with a rule between rows (``show_lines``), which changes no column's width, so
    each row is the run of lines between two rules.
    """
    shown_lines = table.show_lines
    table.show_lines = True
    try:
        console = Console(file=io.StringIO(), width=width, color_system=None)
        console.print(table)
        text = console.file.getvalue()  # type: ignore[attr-defined]
    finally:
        table.show_lines = shown_lines
    heights, run, inside = [], 0, False
    for line in text.splitlines():
        first = line.lstrip()[:1]
        if first in _RULES:
            if inside:
                heights.append(run)
            run, inside = 0, True
        elif inside and first in _CELLS:
            run += 1
    return heights


def invoke_narrow(args: Sequence[str], monkeypatch: pytest.MonkeyPatch, *, min_tables: int = 1) -> Result:
    """``opro ARGS`` at 80 columns without a TTY; fails the test on a table wider than 80 or a row
    taller than 3 lines. Returns the result for the caller's own checks."""
    printed: list[tuple[Table, int]] = []
    real_print = Console.print

    def capture(self: Console, *objects: Any, **kwargs: Any) -> None:
        printed.extend((o, self.width) for o in objects if isinstance(o, Table) and o.box is not None)
        real_print(self, *objects, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(Console, "print", capture)
        m.setenv("COLUMNS", str(WIDTH))
        result = CliRunner().invoke(app, list(args))
    assert len(printed) >= min_tables, f"expected {min_tables}+ tables, printed {len(printed)}:\n{result.output}"
    boxed = set("┏┃┡│└┗━─")
    wide = [line for line in result.output.splitlines() if boxed & set(line) and len(line) > WIDTH]
    assert not wide, "table lines wider than 80 columns:\n" + "\n".join(wide)
    for table, width in printed:
        assert width == WIDTH, f"a table was laid out at {width} columns, not {WIDTH}: {table.title!r}"
        heights = row_heights(table)
        tall = [i for i, h in enumerate(heights) if h > MAX_ROW_LINES]
        assert not tall, (f"table {table.title!r}: rows {tall} (0 = header) are {[heights[i] for i in tall]} lines "
                          f"tall at {WIDTH} columns (at most {MAX_ROW_LINES}):\n{result.output}")
    return result
