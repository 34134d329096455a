"""The summary's text layout: indented tables, titled rows wrapped at MAX_WIDTH, cells as
text. Pure; report/summary.py lays its sections out with these."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

#: The summary is laid out in this many columns (a terminal cuts it at its own width only).
MAX_WIDTH = 100


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
           first_left: bool = True) -> list[str]:
    """Indented columns: the first left-aligned (a name) unless told otherwise, the rest right;
    an empty last header marks a free-text note column, left-aligned."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    note_column = len(headers) - 1 if headers and headers[-1] == "" else None

    def render(cells: Sequence[str]) -> str:
        parts = []
        for index, (cell, width) in enumerate(zip(cells, widths)):
            if index == note_column:
                parts.append(str(cell))
            elif index == 0 and first_left:
                parts.append(str(cell).ljust(width))
            else:
                parts.append(str(cell).rjust(width))
        return ("  " + "   ".join(parts)).rstrip()

    return [render(headers), *(render(row) for row in rows)]


def title_row(title: str, items: Sequence[str]) -> str:
    return f"{title:<12}" + "   ".join(items)


def title_rows(title: str, items: Sequence[str]) -> list[str]:
    """`title_row`, continued on lines of its own (under the first item) where it would pass
    MAX_WIDTH; an item longer than a line goes on at its spaces."""
    lines = [title_row(title, items[:1])]
    for item in items[1:]:
        if len(lines[-1]) + 3 + len(item) > MAX_WIDTH:
            lines.append(" " * 12 + item)
        else:
            lines[-1] += "   " + item
    return [part for line in lines for part in
            textwrap.wrap(line, MAX_WIDTH, subsequent_indent=" " * 12, break_long_words=False,
                          break_on_hyphens=False) or [line]]


def wrap_pairs(pairs: Sequence[tuple[str, Any]]) -> list[str]:
    lines, current = [], ""
    for key, value in pairs:
        item = f"{key}={value}"
        if current and len(current) + 3 + len(item) > MAX_WIDTH:
            lines.append(current)
            current = ""
        current = f"{current}   {item}" if current else item
    if current:
        lines.append(current)
    return lines


def clip(line: str, width: int | None) -> str:
    return line if width is None or len(line) <= width else line[:width - 3] + "..."


def int_text(value: Any) -> str:
    return "-" if value is None else f"{int(value):,}"


def float_text(value: Any, digits: int) -> str:
    return "-" if value is None else f"{float(value):,.{digits}f}"


def ms_text(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.1f}"


def percent_text(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.1f}%"
