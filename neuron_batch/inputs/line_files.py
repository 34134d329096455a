"""Readers for line-based files: JSON lines, JSON arrays, OpenAI batch files, Mooncake traces
and plain text.

Line numbers are 1-based file lines; items of a JSON array are 0-based positions.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from neuron_batch.inputs.json_requests import (
    record_from_batch_request,
    record_from_object,
    request_id,
)
from neuron_batch.inputs.mooncake import is_mooncake, record_from_mooncake
from neuron_batch.inputs.prompt_records import (
    FieldError,
    InputError,
    InputProblem,
    Item,
    ParsedInput,
    PromptRecord,
    describe_value,
    field_problem,
)
from neuron_batch.storage.urls import read_bytes, suffix_of


def _read_text_bytes(path: Path | str, label: str) -> bytes:
    try:
        data = read_bytes(path)     # (a local path or a URL: storage/urls.py)
    except OSError as exc:
        raise InputError(f"{label}: cannot read: {exc.strerror or exc}") from exc
    if b"\0" in data[:8192]:
        raise InputError(f"{label}: looks like a binary file (NUL bytes); expected UTF-8 text "
                         "(Parquet files need the .parquet extension)")
    return data


def _text_lines(data: bytes) -> Sequence[str | UnicodeDecodeError]:
    """The lines of a file, split on "\\n" only (str.splitlines() would also split on U+2028
    inside JSON strings); a line that is not UTF-8 comes back as its decoding error."""
    try:
        return data.decode("utf-8-sig").split("\n")  # one decode for the whole file is fastest
    except UnicodeDecodeError:
        pass
    lines: list[str | UnicodeDecodeError] = []
    for line in data.removeprefix(b"\xef\xbb\xbf").split(b"\n"):
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            lines.append(exc)
    return lines


def _not_utf8(source: str, error: UnicodeDecodeError) -> InputProblem:
    return InputProblem(source, None, f"not valid UTF-8 ({error.reason} at byte {error.start + 1})")


# ---------------------------------------------------------------------------------------------
# JSON lines, JSON arrays and OpenAI batch files


def read_json_lines(path: Path | str, label: str, ignored: Collection[str] = ()) -> ParsedInput:
    """Every object of a JSON-lines file (or JSON array) as a record or a problem; the fields
    `ignored` names (--ignore-field) are dropped, any other unknown field is a problem."""
    data = _read_text_bytes(path, label)
    if suffix_of(path) == ".json" and data.lstrip()[:1] == b"[":
        objects = _json_array_objects(data, label)
    else:
        objects = _json_line_objects(data, label)
    kind = None
    items: list[Item] = []
    for source, obj in objects:
        if isinstance(obj, InputProblem):
            items.append(obj)
            continue
        if kind is None:  # the first object decides, so one stray line cannot flip the format
            kind = ("openai-batch" if "custom_id" in obj and "body" in obj
                    else "mooncake" if is_mooncake(obj) else "jsonl")
        try:
            if kind == "openai-batch":
                items.append(record_from_batch_request(obj, source, ignored))
            elif kind == "mooncake":
                items.append(record_from_mooncake(obj, source))
            else:
                items.append(record_from_object(obj, source, ignored))
        except FieldError as error:
            items.append(field_problem(source, error, request_id(obj)))
    return ParsedInput(kind or "jsonl", items)


def _json_line_objects(data: bytes, label: str) -> Iterator[tuple[str, dict | InputProblem]]:
    decode = json.JSONDecoder().decode
    for number, line in enumerate(_text_lines(data), 1):
        source = f"{label}:{number}"
        if isinstance(line, UnicodeDecodeError):
            yield source, _not_utf8(source, line)
            continue
        if not line or line.isspace():
            continue
        try:
            obj = decode(line)
        except json.JSONDecodeError as exc:
            message = f"malformed JSON: {exc.msg} (column {exc.colno})"
            yield source, InputProblem(source, None, message)
            continue
        yield source, _expect_object(obj, source)


def _json_array_objects(data: bytes, label: str) -> Iterator[tuple[str, dict | InputProblem]]:
    try:
        array = json.loads(data)
    except ValueError as exc:
        raise InputError(f"{label}: malformed JSON array: {exc}") from exc
    if not isinstance(array, list):
        raise InputError(f"{label}: expected a JSON array or one JSON object a line")
    for position, obj in enumerate(array):
        source = f"{label}:item {position}"
        yield source, _expect_object(obj, source)


def _expect_object(obj: Any, source: str) -> dict | InputProblem:
    if isinstance(obj, dict):
        return obj
    return InputProblem(source, None, f"expected a JSON object, got {describe_value(obj)}")


# ---------------------------------------------------------------------------------------------
# Plain text


def read_text(path: Path | str, label: str) -> ParsedInput:
    """One prompt a line, kept as written; blank and whitespace-only lines are skipped."""
    items: list[Item] = []
    for number, line in enumerate(_text_lines(_read_text_bytes(path, label)), 1):
        source = f"{label}:{number}"
        if isinstance(line, UnicodeDecodeError):
            items.append(_not_utf8(source, line))
        elif line.strip():
            record = PromptRecord(index=-1, id="", source=source, prompt=line.removesuffix("\r"))
            items.append((record, "id"))
    return ParsedInput("text", items)
