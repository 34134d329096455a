"""Readers for line-based files: JSON lines, JSON arrays, OpenAI batch files, Mooncake traces
and plain text, streamed: each record comes with where its line starts (a byte offset) and a
digest of its bytes, so that a job is checked in one pass that keeps no prompt and read again,
a window at a time, while it runs (`LineInput.read`).

Line numbers are 1-based file lines; items of a JSON array are 0-based positions (an array is
read whole, each time: its items have no line of their own to seek to).
"""

from __future__ import annotations

import io
import json
import math
import re
import zlib
from collections.abc import Collection, Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any, Literal, overload

from neuron_batch.inputs.json_requests import (
    record_from_batch_request,
    record_from_object,
    request_id,
)
from neuron_batch.inputs.mooncake import is_mooncake, record_from_mooncake
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
    PromptRecord,
    Scanned,
    describe_value,
    field_problem,
    file_stamp,
)
from neuron_batch.storage.urls import open_binary, suffix_of

_BOM = b"\xef\xbb\xbf"

#: A JSON line of nothing but a prompt_len (and max_tokens after it), as json.dumps writes one
#: (or without its spaces): both at least 1, below 10**9, no leading zero (JSON has none).
_PLAIN_JSON = rb'\{"prompt_len": ?([1-9][0-9]{0,8})(?:, ?"max_tokens": ?([1-9][0-9]{0,8}))?\}'
_PLAIN_LINE = re.compile(_PLAIN_JSON + rb"\r?\n?")
#: One such line among others (`LineInput._lines` reads a chunk of them at once), with its
#: newline: itself, its prompt_len, its max_tokens.
_PLAIN_FOUND = re.compile(rb"(" + _PLAIN_JSON + rb"\r?\n)")
#: Bytes `LineInput._lines` reads at once where lines may be plain (and the rest of a line).
_PLAIN_CHUNK = 1 << 16


class LineInput:
    """One line-based file as a stream of (where, line, digest, item): `scan` reads it from
    the start, `read` reads the items at given offsets again."""

    def __init__(self, path: Path | str, label: str, ignored: Collection[str] = (), *,
                 text: bool = False):
        self.path, self.label, self.ignored = path, label, ignored
        # JSON: the first object decides the format, so one stray line cannot flip it
        self.kind: str | None = "text" if text else None
        self.array = False
        self.span_lines = 0     # (the lines `scan(span)` read: the next span's line shift)

    def stamp(self) -> tuple | None:
        return file_stamp(self.path)

    def cuttable(self) -> bool:
        """Whether `scan(span)` reads it (`cut_spans`): every line file but a JSON array (one
        item a whole file's parse)."""
        return suffix_of(self.path) != ".json"

    @overload
    def scan(self, span: tuple[int, int] | None = None, *, plain: Literal[False] = False
             ) -> Iterator[Scanned]: ...

    @overload
    def scan(self, span: tuple[int, int] | None = None, *, plain: bool) -> Iterator[
            Scanned | PlainRows]: ...

    def scan(self, span: tuple[int, int] | None = None, *, plain: bool = False
             ) -> Iterator[Scanned | PlainRows]:
        """Every item from the start; or, given `span` (`cut_spans`), those whose lines start
        in that byte range, numbered from 1 at its first line (the caller shifts them).
        `plain`: JSON lines of nothing but a prompt_len (and max_tokens), written as
        json.dumps writes them, come as `PlainRows` blocks (inputs/plain_rows.py)."""
        start, end = span if span is not None else (0, math.inf)
        try:
            with open_binary(self.path) as handle:
                if start == 0:
                    head = handle.read(8192)
                    if b"\0" in head:
                        raise InputError(f"{self.label}: looks like a binary file (NUL bytes); "
                                         "expected UTF-8 text (Parquet files need the .parquet "
                                         "extension)")
                    if (span is None and self.kind is None
                            and suffix_of(self.path) == ".json" and head.lstrip()[:1] == b"["):
                        handle.seek(0)
                        self.array = True
                        for position, each in enumerate(self._array_items(handle.read())):
                            yield position, position, 0, each
                        return
                handle.seek(start)
                yield from self._lines(handle, start, end, plain)
        except OSError as exc:
            raise InputError(f"{self.label}: cannot read: {exc.strerror or exc}") from exc
        if self.kind is None:
            self.kind = "jsonl"

    def _lines(self, handle, offset: int, end: float, plain: bool = False
               ) -> Iterator[Scanned | PlainRows]:
        """The items of the lines from `offset` (a line's start) to the first that starts at
        or past `end`; `span_lines` the lines read. `plain`: once the file is known to be
        JSON lines (its first object), a line `_PLAIN_LINE` matches goes into a block; read
        a chunk of lines at a time, a chunk of nothing but such lines all at once."""
        self.span_lines = number = 0
        block = PlainBlock()
        match = _PLAIN_LINE.fullmatch
        for data in _chunks(handle) if plain else [None]:
            # (a chunk of plain lines wholly before `end`: as columns, at once; a line at a
            # time was most of a token-count job's read)
            if (data is not None and self.kind == "jsonl" and offset + len(data) <= end
                    and (columns := _plain_columns(data, offset, number)) is not None):
                yield from block.extend(*columns, make=self._plain_item)
                offset += len(data)
                number = self.span_lines = number + len(columns[-1])
                continue
            for raw in handle if data is None else io.BytesIO(data):
                if offset >= end:
                    break
                number += 1
                where, offset = offset, offset + len(raw)
                self.span_lines = number
                if plain and self.kind == "jsonl" and (found := match(raw)):
                    block.add(where, number, zlib.crc32(raw), int(found[1]),
                              int(found[2] or 0), raw)
                    if len(block) >= BLOCK_ROWS:
                        yield block.take(self._plain_item)
                    continue
                item = self._item(raw, number, where)
                if item is not None:
                    if len(block):
                        yield block.take(self._plain_item)
                    yield where, number, zlib.crc32(raw), item
            else:
                continue
            break               # (past `end`)
        if len(block):
            yield block.take(self._plain_item)

    def _plain_item(self, raw: bytes, line: int, where: int) -> Item:
        """A plain line's item by the line path (`PlainRows.record`)."""
        item = self._item(raw, line, where)
        assert item is not None
        return item

    def read(self, spots: Sequence[tuple[int, int]]) -> Iterator[tuple[int, Item | None]]:
        """(digest, item) of the lines at `spots` ((offset, line number), as `scan` gave
        them), in that order; item None where the line is blank now."""
        try:
            lines = reach(spots) if not self.array else None
            with open_binary(self.path, lines) as handle:
                if self.array:
                    items = self._array_items(handle.read())
                    for position, _ in spots:
                        yield 0, items[position] if position < len(items) else None
                    return
                for where, number in spots:
                    if handle.tell() != where:
                        handle.seek(where)
                    raw = handle.readline()
                    yield zlib.crc32(raw), self._item(raw, number, where)
        except OSError as exc:
            raise InputError(f"{self.label}: cannot read: {exc.strerror or exc}") from exc

    def _item(self, raw: bytes, number: int, where: int) -> Item | None:
        line = raw[:-1] if raw.endswith(b"\n") else raw
        if where == 0:
            line = line.removeprefix(_BOM)
        source = f"{self.label}:{number}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            return _not_utf8(source, exc)
        if self.kind == "text":     # one prompt a line, kept as written; blank lines skipped
            if not text.strip():
                return None
            return PromptRecord(index=-1, id="", source=source,
                                prompt=text.removesuffix("\r")), "id"
        if not text or text.isspace():
            return None
        try:
            obj = json.JSONDecoder().decode(text)
        except json.JSONDecodeError as exc:
            return InputProblem(source, None, f"malformed JSON: {exc.msg} (column {exc.colno})")
        return self._record(_expect_object(obj, source), source)

    def _record(self, obj: dict | InputProblem, source: str) -> Item:
        if isinstance(obj, InputProblem):
            return obj
        if self.kind is None:
            self.kind = ("openai-batch" if "custom_id" in obj and "body" in obj
                         else "mooncake" if is_mooncake(obj) else "jsonl")
        try:
            if self.kind == "openai-batch":
                return record_from_batch_request(obj, source, self.ignored)
            if self.kind == "mooncake":
                return record_from_mooncake(obj, source)
            return record_from_object(obj, source, self.ignored)
        except FieldError as error:
            return field_problem(source, error, request_id(obj))

    def _array_items(self, data: bytes) -> list[Item]:
        try:
            array = json.loads(data)
        except ValueError as exc:
            raise InputError(f"{self.label}: malformed JSON array: {exc}") from exc
        if not isinstance(array, list):
            raise InputError(f"{self.label}: expected a JSON array or one JSON object a line")
        return [self._record(_expect_object(obj, f"{self.label}:item {position}"),
                             f"{self.label}:item {position}")
                for position, obj in enumerate(array)]


def _chunks(handle) -> Iterator[bytes]:
    """`handle`'s bytes from where it is, a chunk of whole lines at a time: _PLAIN_CHUNK and
    the rest of the line it ends in (read by `readline`: a line longer than a chunk is read
    once, not again with each chunk after it)."""
    while data := handle.read(_PLAIN_CHUNK):
        if not data.endswith(b"\n"):
            data += handle.readline()
        yield data


def _plain_columns(data: bytes, offset: int, number: int) -> PlainColumns | None:
    """`PlainBlock.add`'s columns of `data`'s lines (from `offset`, after line `number`), as
    `LineInput._lines` makes them a line at a time; None unless each is a plain one."""
    import numpy as np

    # (a chunk whose first line is not one is not looked through: a job of prompts pays
    # nothing for plain lines it has none of)
    if not data.startswith(b'{"prompt_len":') or not (found := _PLAIN_FOUND.findall(data)):
        return None
    # (itemgetter mapped: zip(*found) took as long as the findall)
    texts, prompts, most = (list(map(itemgetter(k), found)) for k in range(3))
    # (lines found one after another, none overlapping, that add up to the chunk: they are
    # all of it, one after another; a second pass to match the whole was a third of this)
    if sum(map(len, texts)) != len(data):
        return None
    return (line_starts(data, offset),
            np.arange(number + 1, number + 1 + len(texts), dtype=np.int64),
            list(map(zlib.crc32, texts)), list(map(int, prompts)),
            list(map(int, most)) if b"" not in most else [int(m) if m else 0 for m in most],
            texts)


def cut_spans(path: Path | str, label: str, parts: int) -> list[tuple[int, int]]:
    """A file's bytes cut into about `parts` ranges, each starting at a line's start, for a
    check split across processes (job/check_parts.py)."""
    try:
        with open_binary(path) as handle:
            size = handle.seek(0, 2)
            starts = [0]
            for part in range(1, parts):
                handle.seek(max(size * part // parts - 1, starts[-1]))
                handle.readline()       # (to the end of the line it lands in)
                at = handle.tell()
                if at >= size:
                    break
                if at > starts[-1]:
                    starts.append(at)
    except OSError as exc:
        raise InputError(f"{label}: cannot read: {exc.strerror or exc}") from exc
    return list(zip(starts, [*starts[1:], size]))


def reach(spots: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    """The first and last line starts of `spots` ((offset, line number) pairs): the bytes a
    read of them needs (storage/urls.py `open_binary`)."""
    if not spots:
        return None
    offsets = [where for where, _ in spots]
    return min(offsets), max(offsets)


_BLANKS = re.compile(rb"\n\n+")


def count_items(path: Path | str, start: int, end: int | None, *, header: bool = False
                ) -> tuple[int, int]:
    """(bytes read, items) of a local file from byte `start` (a line's start) to `end` (its
    end: None), as lines count them: each line but blank ones, and but the file's first where
    it is a `header` and `start` is 0. Bad lines are items too; a CR-LF blank line, or a value
    over two lines, is counted as an item: callers take this for a guess."""
    lines = blank = read = 0
    last = b"\n"
    with open(path, "rb") as handle:
        handle.seek(start)
        while end is None or start + read < end:
            chunk = handle.read((1 << 22) if end is None else min(1 << 22, end - start - read))
            if not chunk:
                break
            read += len(chunk)
            lines += chunk.count(b"\n")
            # (each newline right after another ends a blank line: runs of them are rare)
            blank += sum(len(run) - 1 for run in _BLANKS.findall(chunk))
            blank += last == b"\n" and chunk[:1] == b"\n"
            last = chunk[-1:]
    if end is None and last != b"\n":
        lines += 1      # (a last line without its newline)
    first = 1 if header and start == 0 and lines else 0
    return read, max(0, lines - blank - first)


def _not_utf8(source: str, error: UnicodeDecodeError) -> InputProblem:
    return InputProblem(source, None, f"not valid UTF-8 ({error.reason} at byte {error.start + 1})")


def _expect_object(obj: Any, source: str) -> dict | InputProblem:
    if isinstance(obj, dict):
        return obj
    return InputProblem(source, None, f"expected a JSON object, got {describe_value(obj)}")
