"""A run of a request trace's rows that hold nothing but token counts written as plain digits
(`PlainRows`), read as columns, not as one `PromptRecord` each: a 10M-line trace's check before
the run made and checked 10M records, ~15 us each on one core (issue 48: "a 10M-line file
starts within seconds").

The reader (csv_file.py `CsvInput`) puts a row here only when the row path would read it as a
plain record: the two counts as digits, at least 1, an arrival as digits with at most one
point (or a date and time of the first row's kind), every column where the header puts it.
Any other row (a quote, a gap, a sign, a letter, non-ASCII bytes) goes the row path, which
names its problem as it always did. Rows
alike in their two counts are alike to every check (job/check.py `Scan`), which checks one
real record of each pair (`record`) and gives its outcome to the others. Pure logic.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Rows a block holds at most (the reader yields a block when it is full).
BLOCK_ROWS = 4096


@dataclass(slots=True)
class PlainRows:
    """Consecutive plain rows of one input: each one's byte offset, line, digest (as the row
    path digests it) and counts. Numbered by `load.InputScan` (`read_order`, `position`: the
    first row's, the rest following by one) before anything reads a record of it."""

    where: array = field(default_factory=lambda: array("q"))
    line: array = field(default_factory=lambda: array("q"))
    digest: array = field(default_factory=lambda: array("I"))
    prompt_len: array = field(default_factory=lambda: array("q"))
    max_tokens: array = field(default_factory=lambda: array("q"))
    texts: list[bytes] = field(default_factory=list)  # each row's line (`record` reads one)
    #: (a row's line as read, its line number, its offset) -> the row path's item for it
    make: Callable[[bytes, int, int], Any] | None = None
    read_order: int = 0
    position: int = 0
    #: load.InputScan.finish: what numbering gives the record at a position
    finish: Callable[..., None] | None = None

    def __len__(self) -> int:
        return len(self.digest)

    def record(self, i: int) -> Any:
        """The `i`th row's record as the row path makes and numbers it."""
        assert self.make is not None and self.finish is not None
        item = self.make(self.texts[i], self.line[i], self.where[i])
        record, _ = item                # (a plain row is a record: the reader made sure)
        record.read_order = self.read_order + i
        self.finish(record, self.position + i)
        return record
