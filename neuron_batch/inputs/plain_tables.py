"""A table's rows of plain token counts read as blocks (inputs/plain_rows.py `PlainRows`) from
its Arrow columns, as a line file's and a CSV's plain rows are from their bytes: a Parquet
trace's check made a record of every row, ~20 us each (1M rows: 19.7 s on one core, against
2.2 s for the same rows as JSON lines of prompt_len).

A batch of rows is one block where every row of it is a record the row path (tables.py
`RowMapper`) reads from nothing but its counts: a layout of `prompt_len` rows, or a trace's
token counts, with no other column the job reads but an arrival; counts as integers from 1
to below 10**9 (a max_tokens column that is not a trace's may have gaps: the run's default);
an arrival a finite number >= 0, or a TIMESTAMP of Arrow's timestamp type once time zero is
known. Any batch with another row goes the row path, row by row, naming its problems as it
always did. Pure logic over pyarrow."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

from neuron_batch.inputs.plain_rows import PlainRows

#: Token counts at most (as a CSV's plain rows: below 10**9), so that a pair's two counts make
#: one key (job/plain_check.py).
COUNT_LIMIT = 10**9


def plain_columns(layout: Any) -> tuple[str, str | None, str | None] | None:
    """(prompt count column, max_tokens column, arrival column) of a table `layout`
    (tables.py `TableLayout`) whose rows may be plain; None where no row can be."""
    if layout.prompt_field != "prompt_len":
        return None
    read = set(layout.columns())
    plain = {layout.prompt_column, layout.max_tokens_column, layout.arrival_column}
    if not read <= plain or (layout.is_trace and layout.max_tokens_column is None):
        return None
    return layout.prompt_column, layout.max_tokens_column, layout.arrival_column


def plain_block(batch: Any, first: int, line_base: int, at: tuple[str, str | None, str | None],
                *, gaps: bool, dated: bool, timed: bool,
                row: Callable[[dict[str, Any], int], Any]) -> PlainRows | None:
    """The rows of an Arrow `batch` (rows `first` on; their lines less `line_base`) as one
    block, or None where any of them is not plain. `gaps`: a max_tokens cell may be empty (not
    a trace's); `dated`: the arrival is a TIMESTAMP, plain only as Arrow's timestamps and once
    time zero is known (`timed`). `row(cells, number)`: the row path's item, for the record a
    block makes of a row (`PlainRows.make`)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    prompt_column, max_column, arrival_column = at
    if not len(batch):
        return None

    def counts(name: str, empty_ok: bool) -> Any:
        column = batch.column(name)
        if not pa.types.is_integer(column.type) or (column.null_count and not empty_ok):
            return None
        if column.null_count == len(column):
            return np.zeros(len(column), dtype=np.int64)
        low, high = pc.min_max(column).values()
        if low.as_py() < 1 or high.as_py() >= COUNT_LIMIT:
            return None
        return np.asarray(column.fill_null(0) if column.null_count else column,
                          dtype=np.int64)

    prompts = counts(prompt_column, False)
    if prompts is None:
        return None
    asked: Any = (np.zeros(len(batch), dtype=np.int64) if max_column is None
                  else counts(max_column, gaps))
    if asked is None:
        return None
    if arrival_column is not None and not _plain_arrivals(batch.column(arrival_column),
                                                          dated, timed):
        return None
    names = [name for name in at if name is not None]

    def make(_text: bytes, line: int, where: int) -> Any:
        cells = {name: batch.column(name)[where - first].as_py() for name in names}
        return row(cells, where)

    numbers: Any = np.arange(first, first + len(batch), dtype=np.int64)
    # (a table's rows have no digest, as the row path gives them; no line of text either)
    return PlainRows(array("q", numbers.tobytes()), array("q", (numbers - line_base).tobytes()),
                     array("I", bytes(4 * len(batch))), array("q", prompts.tobytes()),
                     array("q", asked.tobytes()), [b""] * len(batch), make=make)


def _plain_arrivals(column: Any, dated: bool, timed: bool) -> bool:
    """Whether every arrival of `column` is one the row path reads as it is."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.null_count:
        return False
    if dated:
        return timed and pa.types.is_timestamp(column.type)
    if pa.types.is_floating(column.type):
        if not pc.all(pc.is_finite(column)).as_py():
            return False
    elif not pa.types.is_integer(column.type):
        return False
    return pc.min(column).as_py() >= 0
