"""A run of a request trace's rows that hold nothing but token counts written as plain digits
(`PlainRows`), read as columns, not as one `PromptRecord` each: a 10M-line trace's check before
the run made and checked 10M records, ~15 us each on one core (issue 48: "a 10M-line file
starts within seconds").

A reader puts a row here only when its row path would read it as a plain record: a CSV trace's
(csv_file.py `CsvInput`: the two counts as digits, at least 1, an arrival as digits with at
most one point or a date and time of the first row's kind, every column where the header
puts it), or a JSON line of nothing but a prompt_len and max_tokens (line_files.py). Any other
row (a quote, a gap, a sign, a letter, non-ASCII bytes) goes the row path, which names its
problem as it always did. Rows alike in their two counts are alike to every check
(job/plain_check.py `PlainCheck`), which checks one real record of each pair (`record`) and
gives its outcome to the others. Pure logic.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

#: A chunk's rows as columns, as a reader reads them at once for `PlainBlock.extend`: offsets,
#: lines (numpy arrays), digests, prompt counts, generated counts, texts.
PlainColumns = tuple[Any, Any, list[int], Any, Any, list[bytes]]


def line_starts(data: bytes, offset: int, newlines: Any = None) -> Any:
    """Where each line of `data` (lines that each end with a newline, read from `offset`)
    starts in the file: after the newline before it, a carriage return before that counted.
    `newlines`: their positions in `data`, where the reader has them already."""
    import numpy as np

    if newlines is None:
        newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord("\n"))
    return np.concatenate(([offset], newlines[:-1] + (offset + 1)))


#: Rows a block holds at most (the reader yields a block when it is full).
BLOCK_ROWS = 4096


@dataclass(slots=True)
class PlainRows:
    """Consecutive plain rows of one input: each one's byte offset, line, digest (as the row
    path digests it) and counts. Numbered by `load.InputScan` (`read_order`, `position`: the
    first row's, the rest following by one) before anything reads a record of it."""

    where: array
    line: array
    digest: array
    prompt_len: array
    max_tokens: array               # (0: none given, the run's default)
    texts: list[bytes]              # each row's line (`record` reads one)
    #: (a row's line as read, its line number, its offset) -> the row path's item for it
    make: Callable[[bytes, int, int], Any]
    read_order: int = 0
    position: int = 0
    #: load.InputScan.finish: what numbering gives the record at a position
    finish: Callable[..., None] | None = None

    def __len__(self) -> int:
        return len(self.digest)

    def record(self, i: int) -> Any:
        """The `i`th row's record as the row path makes and numbers it."""
        assert self.finish is not None
        item = self.make(self.texts[i], self.line[i], self.where[i])
        record, _ = item                # (a plain row is a record: the reader made sure)
        record.read_order = self.read_order + i
        self.finish(record, self.position + i)
        return record


class PlainBlock:
    """A block's columns as a reader reads them, made a `PlainRows` by `take`, which starts
    the next block: rows added one at a time in lists (the fastest to append to), rows added
    at once (`extend`: numpy arrays or lists) as pieces, kept in their order."""

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self._pieces: list[tuple[Any, ...]] = []    # (each: the six columns of its rows)
        self._held = 0                              # (the rows of `_pieces`)
        self._lists()

    def _lists(self) -> None:
        self.wheres: list[int] = []
        self.lines: list[int] = []
        self.digests: list[int] = []
        self.counts: list[int] = []
        self.asked: list[int] = []      # (0: none given, the run's default)
        self.texts: list[bytes] = []

    def add(self, where: int, line: int, digest: int, prompt_len: int, max_tokens: int,
            text: bytes) -> None:
        self.wheres.append(where)
        self.lines.append(line)
        self.digests.append(digest)
        self.counts.append(prompt_len)
        self.asked.append(max_tokens)
        self.texts.append(text)

    def __len__(self) -> int:
        return self._held + len(self.texts)

    def extend(self, wheres: Sequence[int], lines: Sequence[int], digests: Sequence[int],
               counts: Sequence[int], asked: Sequence[int], texts: Sequence[bytes],
               make: Callable[[bytes, int, int], Any]) -> Iterator[PlainRows]:
        """Rows given as columns (a reader's chunk of plain lines read at once), added as
        `add` adds them one at a time: each block they fill taken (`take`) as it fills, so
        that the blocks and where they end are the ones a row at a time makes."""
        given = (wheres, lines, digests, counts, asked, texts)
        done, total = 0, len(texts)
        while done < total:
            self._piece()               # (the rows added one at a time before them)
            room = BLOCK_ROWS - len(self)
            self._pieces.append(tuple(values[done:done + room] for values in given))
            self._held += min(room, total - done)
            done += room
            if len(self) >= BLOCK_ROWS:
                yield self.take(make)

    def _piece(self) -> None:
        """The rows in the lists made a piece (so that rows added at once come after them)."""
        if self.texts:
            self._pieces.append((self.wheres, self.lines, self.digests, self.counts,
                                 self.asked, self.texts))
            self._held += len(self.texts)
            self._lists()

    def take(self, make: Callable[[bytes, int, int], Any]) -> PlainRows:
        """The rows added, as a block whose records `make` makes (`PlainRows.make`)."""
        if not self._pieces:
            rows = PlainRows(array("q", self.wheres), array("q", self.lines),
                             array("I", self.digests), array("q", self.counts),
                             array("q", self.asked), self.texts, make=make)
        else:
            import numpy as np

            self._piece()
            pieces = self._pieces

            def joined(k: int, typecode: str) -> array:
                # (an array's bytes: no int made of each value, as array(typecode, list) does)
                return array(typecode, np.concatenate(
                    [np.asarray(piece[k], dtype=typecode) for piece in pieces]).tobytes())

            rows = PlainRows(joined(0, "q"), joined(1, "q"), joined(2, "I"), joined(3, "q"),
                             joined(4, "q"), [text for piece in pieces for text in piece[5]],
                             make=make)
        self._start()
        return rows
