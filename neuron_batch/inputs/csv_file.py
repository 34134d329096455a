"""CSV and TSV files as streams (`CsvInput`): each row by the byte offset of its first line and
a CRC-32 of its cells, read again at that offset as the job runs; cut at line starts for the
check in parts (job/check_parts.py). A request trace's rows of plain digits come as blocks
(`PlainRows`, inputs/plain_rows.py), read without the csv module. The columns a row's cells
go to are tables.py's (`choose_layout`, `RowMapper`), shared with Parquet and data sets.

Line numbers are 1-based file lines (the header is line 1).
"""

from __future__ import annotations

import csv
import re
import zlib
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from functools import cache
from operator import attrgetter
from pathlib import Path
from typing import Any, BinaryIO, Literal, overload

from neuron_batch.inputs.line_files import reach
from neuron_batch.inputs.plain_rows import (
    BLOCK_ROWS,
    PlainBlock,
    PlainColumns,
    PlainRows,
    line_starts,
)
from neuron_batch.inputs.prompt_records import (
    FieldError,
    InputError,
    InputProblem,
    Item,
    Scanned,
    Uncut,
    field_problem,
    file_stamp,
)
from neuron_batch.inputs.tables import DATETIME_ARRIVAL_COLUMNS, RowMapper, choose_layout
from neuron_batch.storage.urls import open_binary

# csv's default 128 KiB field limit would reject a long prompt as a malformed file.
_CSV_FIELD_LIMIT = 1 << 30


class CsvInput:
    """A CSV/TSV file as a stream of rows (line_files.LineInput's shape): each row with the
    byte offset of its first line and a digest of its cells."""

    def __init__(self, path: Path | str, label: str, prompt_column: str, *,
                 delimiter: str = ","):
        self.path, self.label, self.prompt_column = path, label, prompt_column
        self.delimiter = delimiter
        self.kind: str | None = None
        self._wanted: list[tuple[str, int]] = []
        self.span_lines = 0     # (the lines `scan(span)` read: the next span's line shift)
        self._width = 0
        self._mapper: RowMapper | None = None

    def stamp(self) -> tuple | None:
        return file_stamp(self.path)

    def cuttable(self) -> bool:
        """Whether `scan(span)` can read its parts: once its header is read (`scan`), and
        where rows read on their own need nothing an earlier row set (a TIMESTAMP column's
        time zero: the first row's, known here only once it is read)."""
        mapper = self._mapper
        return mapper is not None and (mapper.layout.arrival_column not in
                                       DATETIME_ARRIVAL_COLUMNS or mapper.time_origin is not None)

    @overload
    def scan(self, span: tuple[int, int] | None = None, *, plain: Literal[False] = False
             ) -> Iterator[Scanned]: ...

    @overload
    def scan(self, span: tuple[int, int] | None = None, *, plain: bool) -> Iterator[
            Scanned | PlainRows]: ...

    def scan(self, span: tuple[int, int] | None = None, *, plain: bool = False
             ) -> Iterator[Scanned | PlainRows]:
        """Every row from the start; or, given `span` (inputs/line_files.py `cut_spans`; the
        header read first by a `scan` of the whole), the rows that start in that byte range,
        numbered from 1 at its first line. A part with a line of an odd number of quotes (a
        quoted value that goes on past its line: the cut may have landed inside it) raises
        `Uncut`. `plain`: a trace's plain rows come as `PlainRows` blocks (`_plain`)."""
        if csv.field_size_limit() < _CSV_FIELD_LIMIT:
            csv.field_size_limit(_CSV_FIELD_LIMIT)
        if span is not None:
            yield from self._span(*span, plain=plain)
            return
        with self._open() as handle:
            lines = _Lines(handle)
            reader = csv.reader(lines, delimiter=self.delimiter)
            with self._readable(lines):
                header = next(reader, None)
                if header is None:
                    self.kind = "csv"
                    return
                layout = choose_layout(header, self.prompt_column, self.label)
                self.kind = "trace" if layout.is_trace else "csv"
                position_by_column: dict[str, int] = {}
                for position, name in enumerate(header):
                    position_by_column.setdefault(name, position)  # a repeated name: the first
                self._wanted = [(name, position_by_column[name]) for name in layout.columns()]
                self._width = len(header)
                self._mapper = RowMapper(layout, from_text=True)
            yield from self._after(handle, lines.offset, lines.line, None, plain)

    def _span(self, start: int, end: int, *, plain: bool) -> Iterator[Scanned | PlainRows]:
        with self._open() as handle:
            handle.seek(start)
            self.span_lines, line = 0, 0
            if start == 0:          # (the header: read by the `scan` of the whole)
                header = handle.readline()
                if header.count(b'"') % 2:
                    raise Uncut("the header holds a quoted value that goes on past its line")
                start, line = len(header), 1
            self.span_lines = yield from self._after(handle, start, line, end, plain)

    def _after(self, handle: BinaryIO, offset: int, line: int, end: int | None, plain: bool
               ) -> Generator[Scanned | PlainRows, None, int]:
        """The rows from `offset` (after line `line`) to `end` (None: the end of the file):
        plain ones as blocks while they come (`_plain`), the rest by the csv module; returns
        the last line read."""
        at = self._plain_at() if plain else None
        if at is not None:
            offset, line, done = yield from self._plain(handle, offset, line, end, at)
            if done:
                return line
            handle.seek(offset)
        lines = _Lines(handle, line, offset, end=end)
        reader = csv.reader(lines, delimiter=self.delimiter)
        with self._readable(lines):
            yield from self._rows(reader, lines)
        return lines.line

    def _rows(self, reader, lines: _Lines) -> Iterator[Scanned]:
        """The rows `reader` reads from `lines` (their first line and where it starts)."""
        last_line = lines.line
        for cells in reader:
            # the csv module reads no line ahead: `lines.line` is the line a row ends on; a
            # quoted value may span lines, so a row starts on the line after the last ended
            first_line, last_line = last_line + 1, lines.line
            where = lines.start_of(first_line)
            if cells:   # (not a blank line)
                yield where, first_line, _digest(cells), self._row(cells, first_line)

    def _plain_at(self) -> tuple[int, int, int | None, bool] | None:
        """Where a row's prompt count, generated count and arrival (None: no such column) lie,
        and whether arrivals are dates and times, for a trace of nothing else (its rows may
        be plain: `_plain`); None for any other table."""
        assert self._mapper is not None
        layout = self._mapper.layout
        wanted = dict(self._wanted)
        arrival = layout.arrival_column
        if (not layout.is_trace or len(wanted) != (3 if arrival else 2)
                or layout.max_tokens_column is None):
            return None
        return (wanted[layout.prompt_column], wanted[layout.max_tokens_column],
                wanted[arrival] if arrival else None, arrival in DATETIME_ARRIVAL_COLUMNS)

    def _plain_time(self, cell: bytes) -> bool:
        """A date and time the row path reads as it is, against a time zero of the same kind
        (with or without a time zone); none before the first row set time zero."""
        assert self._mapper is not None
        origin = self._mapper.time_origin
        if origin is None:
            return False
        try:
            value = datetime.fromisoformat(cell.decode("ascii"))
        except ValueError:
            return False
        return (value.tzinfo is None) == (origin.tzinfo is None)

    def _plain(self, handle: BinaryIO, offset: int, line: int, end: int | None,
               at: tuple[int, int, int | None, bool]
               ) -> Generator[Scanned | PlainRows, None, tuple[int, int, bool]]:
        """The rows from `offset` (after line `line`) to `end`, read a chunk of lines at a
        time without the csv module: each plain one (inputs/plain_rows.py) into a block, any
        other through the row path (`_row`, its cells split at the delimiter: what the csv
        module reads of a line without quotes); a chunk of nothing but plain rows, all at once
        (`_plain_columns`). Stops before a chunk that holds a quote, a carriage return inside
        a line or a byte that is not ASCII, which the csv module then reads; returns (where it
        stopped, the last line read, whether that was the end)."""
        prompt_at, max_at, arrival_at, dated = at
        delimiter, width = self.delimiter.encode(), self._width
        block = PlainBlock()
        crc32 = zlib.crc32
        whole = _plain_lines(at, width, delimiter).fullmatch
        rest, done = b"", True
        while True:
            chunk = handle.read(_PLAIN_CHUNK)
            data = rest + chunk
            if not data:
                break
            cut = data.rfind(b"\n") + 1 if chunk else len(data)
            if not cut:             # (a line longer than a chunk: read on)
                rest = data
                continue
            data, rest = data[:cut], data[cut:]
            if b'"' in data or not data.isascii() or data.count(b"\r") != data.count(b"\r\n"):
                done = False
                break
            # A chunk of nothing but plain rows (most of a trace's), wholly before `end`: read
            # as columns, all at once (a row at a time was ~1.4 us a row, most of the check's
            # time); any other chunk a row at a time below, as the same rows would be.
            if ((end is None or offset + len(data) <= end) and whole(data)
                    and (columns := self._plain_columns(data, offset, line, at)) is not None):
                yield from block.extend(*columns, make=self._plain_item)
                offset += len(data)
                line += len(columns[-1])
                continue
            rows = data.split(b"\n")
            if not rows[-1]:
                rows.pop()
            for raw in rows:
                start = offset
                if end is not None and start >= end:
                    break
                offset += len(raw) + 1
                line += 1
                if raw.endswith(b"\r"):
                    raw = raw[:-1]
                if not raw:
                    continue        # (a blank line: no row)
                cells = raw.split(delimiter)
                if len(cells) == width:
                    prompt, most = cells[prompt_at], cells[max_at]
                    arrival = cells[arrival_at] if arrival_at is not None else b"0"
                    # (token counts as digits, >= 1, below 10**9; seconds as digits with at
                    # most one point among them: what the row path reads as they are)
                    if (prompt.isdigit() and most.isdigit() and len(prompt) < 10
                            and len(most) < 10
                            and (self._plain_time(arrival) if dated
                                 else arrival.replace(b".", b"", 1).isdigit())
                            and (count := int(prompt)) and (most_tokens := int(most))):
                        block.add(start, line, crc32(raw.replace(delimiter, b"\x1f")), count,
                                  most_tokens, raw)
                        if len(block) >= BLOCK_ROWS:
                            yield block.take(self._plain_item)
                        continue
                if len(block):
                    yield block.take(self._plain_item)
                text = [cell.decode("ascii") for cell in cells]
                yield start, line, _digest(text), self._row(text, line)
            else:
                continue
            break               # (past `end`)
        if len(block):
            yield block.take(self._plain_item)
        return offset, line, done

    def _plain_columns(self, data: bytes, offset: int, line: int,
                       at: tuple[int, int, int | None, bool]) -> PlainColumns | None:
        """The rows of `data` (lines from `offset`, after line `line`, each of them plain but
        for what `_plain_lines` cannot see: a count of 0, a date the row path reads its own
        way) as `PlainBlock.add`'s columns, each as `_plain` makes it a row at a time; None
        where a row is not plain after all."""
        import numpy as np

        prompt_at, max_at, arrival_at, dated = at
        delimiter, width = self.delimiter.encode(), self._width
        text = data.replace(b"\r\n", b"\n") if b"\r" in data else data
        view = np.frombuffer(text, dtype=np.uint8)
        ends = np.flatnonzero((view == delimiter[0]) | (view == ord("\n")))  # (each cell's)
        counts, asked = _numbers(view, ends, width, prompt_at), _numbers(view, ends, width,
                                                                           max_at)
        if not (counts.all() and asked.all()):
            return None
        if dated:
            assert arrival_at is not None
            cells = text.replace(b"\n", delimiter).split(delimiter)
            if not self._plain_times(cells[arrival_at:-1:width]):
                return None
        texts = text.split(b"\n")
        texts.pop()                 # (after the last newline)
        digests = list(map(zlib.crc32, text.replace(delimiter, b"\x1f").split(b"\n")))
        digests.pop()
        # (without carriage returns, each row's last cell ends at its newline)
        starts = line_starts(data, offset, ends[width - 1::width] if text is data else None)
        return (starts, np.arange(line + 1, line + 1 + len(texts), dtype=np.int64), digests,
                counts, asked, texts)

    def _plain_times(self, cells: list[bytes]) -> bool:
        """`_plain_time` of every cell, all at once."""
        assert self._mapper is not None
        origin = self._mapper.time_origin
        if origin is None:
            return False
        try:
            times = list(map(datetime.fromisoformat, b"\n".join(cells).decode("ascii")
                             .split("\n")))
        except ValueError:
            return False
        # (fromisoformat's time zone is a datetime.timezone, never false: with none, None)
        zones = map(attrgetter("tzinfo"), times)
        return not any(zones) if origin.tzinfo is None else all(zones)

    def _plain_item(self, raw: bytes, line: int, where: int) -> Item:
        """A plain row's item by the row path (`PlainRows.record`)."""
        return self._row([cell.decode("ascii") for cell in raw.split(self.delimiter.encode())],
                         line)

    def read(self, spots: Sequence[tuple[int, int]]) -> Iterator[tuple[int, Item | None]]:
        with self._open(reach(spots)) as handle:
            for where, number in spots:
                handle.seek(where)
                lines = _Lines(handle, number - 1, where)
                reader = csv.reader(lines, delimiter=self.delimiter)
                with self._readable(lines):
                    cells = next(reader, None)
                yield (_digest(cells), self._row(cells, number)) if cells else (0, None)

    @contextmanager
    def _open(self, lines: tuple[int, int] | None = None) -> Iterator[BinaryIO]:
        opened = open_binary(self.path, lines)      # (a local path or a URL: storage/urls.py)
        try:
            handle = opened.__enter__()
        except OSError as exc:
            raise InputError(f"{self.label}: cannot read: {exc.strerror or exc}") from exc
        try:
            yield handle
        finally:
            opened.__exit__(None, None, None)

    @contextmanager
    def _readable(self, lines: _Lines) -> Iterator[None]:
        try:
            yield
        except UnicodeDecodeError as exc:
            raise InputError(f"{self.label}: not UTF-8 text near line {lines.line} "
                             f"({exc.reason}); save it as UTF-8") from exc
        except csv.Error as exc:
            raise InputError(f"{self.label}:{lines.line}: unreadable CSV: {exc}") from exc

    def _row(self, cells: list[str], first_line: int) -> Item:
        source = f"{self.label}:{first_line}"
        if len(cells) > self._width:
            separator = "tab" if self.delimiter == "\t" else "comma"
            return InputProblem(source, None, f"{len(cells)} values but the header has "
                                f"{self._width} columns (an unquoted {separator}?)")
        # An empty cell, or one a short row lacks, is a missing value (as pandas reads it).
        row = {name: (cells[position] if position < len(cells) else "") or None
               for name, position in self._wanted}
        assert self._mapper is not None     # (set by scan, before any row)
        try:
            return self._mapper.record(row, source)
        except FieldError as error:
            return field_problem(source, error)


def _digest(cells: list[str]) -> int:
    return zlib.crc32("\x1f".join(cells).encode("utf-8", "surrogatepass"))


#: Bytes a plain read (`CsvInput._plain`) takes at once (its lines, split, are ~4x that).
_PLAIN_CHUNK = 1 << 16


def _numbers(view: Any, ends: Any, width: int, column: int) -> Any:
    """Each row's cell in `column` (1 to 9 digits: `_plain_lines` saw to it) as a number, read
    by numpy from the chunk's bytes (`view`) and where each cell ends (`ends`, `width` a row):
    int() of each was a fifth of the read."""
    import numpy as np

    last = ends[column::width]
    first = (ends[column - 1::width] + 1 if column else
             np.concatenate(([0], ends[width - 1:-1:width] + 1)))
    # (the 9 bytes up to each cell's end, those before its start as 0)
    at = last[:, None] + np.arange(-9, 0)
    digits = view[np.maximum(at, 0)].astype(np.int64) - ord("0")
    digits[at < first[:, None]] = 0
    return digits @ 10 ** np.arange(8, -1, -1, dtype=np.int64)


@cache
def _plain_lines(at: tuple[int, int, int | None, bool], width: int, delimiter: bytes
                 ) -> re.Pattern[bytes]:
    """Lines (each ending with a newline) of rows `CsvInput._plain` reads as plain, but for a
    count of 0 and a date (`_plain_columns` sees to them): `width` cells, the token counts
    1 to 9 digits, seconds digits with at most one point among them, any other cell anything
    but the delimiter (a chunk with a quote or a stray carriage return never gets here)."""
    prompt_at, max_at, arrival_at, dated = at
    split = re.escape(delimiter)
    count, seconds = rb"[0-9]{1,9}", rb"(?:[0-9]+\.?[0-9]*|\.[0-9]+)"
    other = rb"[^" + split + rb"\n]*"
    cells = [count if k in (prompt_at, max_at)
             else seconds if k == arrival_at and not dated else other for k in range(width)]
    return re.compile(rb"(?:" + split.join(cells) + rb"\r?\n)*")


class _Lines:
    """A binary file's lines as text for the csv module, remembering where each line starts
    (only since the last row asked: `start_of` forgets the rest)."""

    def __init__(self, handle: BinaryIO, line: int = 0, offset: int = 0,
                 end: int | None = None):
        self._handle, self._line, self._offset = handle, line, offset
        self._starts: dict[int, int] = {}
        # a part's (CsvInput._span): where it ends, and every line checked for its quotes
        self._end = end

    @property
    def line(self) -> int:
        return self._line

    @property
    def offset(self) -> int:
        return self._offset

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        if self._end is not None and self._offset >= self._end:
            raise StopIteration
        raw = self._handle.readline()
        if not raw:
            raise StopIteration
        if self._end is not None and raw.count(b'"') % 2:
            raise Uncut(f"line {self._line + 1} of a part holds a quoted value that goes on "
                        "past it")
        self._line += 1
        self._starts[self._line] = at = self._offset
        self._offset += len(raw)
        if at == 0:
            raw = raw.removeprefix(b"\xef\xbb\xbf")
        return raw.decode("utf-8")

    def start_of(self, line: int) -> int:
        where = self._starts.get(line, self._offset)
        self._starts.clear()
        return where
