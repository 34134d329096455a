"""Readers for each prompt format, used by `prompts.load_prompts`.

A reader turns one input into a `ParsedInput`: in input order, records (index not yet set, id ""
when the input gave none) paired with the field their id came from, and an `InputProblem` for
each line that could not become one. `load_prompts` numbers the records and checks ids.

Line numbers are 1-based file lines (a CSV header is line 1); rows of Parquet files and data
sets, and items of a JSON array, are 0-based positions, as pandas and `datasets` count them.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from neuron_batch.inputs.prompts import (
    PROMPT_FIELDS,
    FieldError,
    InputError,
    InputProblem,
    PromptRecord,
    check_id,
    check_int,
    check_messages,
    check_number,
    check_prompt_text,
    check_stop,
    check_token_ids,
    describe_value,
    record_from_object,
    set_prompt,
)

Item = tuple[PromptRecord, str] | InputProblem  # (record, the field its id came from) or problem

OPENAI_BATCH_URLS = ("/v1/completions", "/v1/chat/completions")

#: Request-trace columns: (prompt tokens, generated tokens, arrival); the first pair found wins.
TRACE_COLUMNS = (
    ("num_prefill_tokens", "num_decode_tokens", "arrived_at"),  # Azure, as vidur keeps it: seconds
    ("ContextTokens", "GeneratedTokens", "TIMESTAMP"),         # Azure's raw trace: datetimes
)
_DATETIME_ARRIVAL_COLUMNS = {"TIMESTAMP"}

# csv's default 128 KiB field limit would reject a long prompt as a malformed file.
_CSV_FIELD_LIMIT = 1 << 30


@dataclass(slots=True)
class ParsedInput:
    kind: str                       # jsonl|openai-batch|csv|parquet|text|hf|trace
    items: list[Item]


def read_input(spec: str, *, prompt_column: str, split: str) -> ParsedInput:
    """Pick the reader by `hf:` prefix, directory or extension (other extensions are text)."""
    if spec.startswith("hf:"):
        return read_hub_dataset(spec, prompt_column, split)
    path = Path(spec)
    if not path.exists():
        raise InputError(f"{spec}: no such file or directory")
    if path.is_dir():
        return read_saved_dataset(path, spec, prompt_column, split)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return read_json_lines(path, spec)
    if suffix in (".csv", ".tsv"):
        return read_csv(path, spec, prompt_column, delimiter="\t" if suffix == ".tsv" else ",")
    if suffix in (".parquet", ".pq"):
        return read_parquet(path, spec, prompt_column)
    return read_text(path, spec)


def _problem(source: str, error: FieldError) -> InputProblem:
    return InputProblem(source, error.field, error.message)


def _read_text_bytes(path: Path, label: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{label}: cannot read: {exc.strerror or exc}") from exc
    if b"\0" in data[:8192]:
        raise InputError(f"{label}: looks like a binary file (NUL bytes); expected UTF-8 text "
                         "(Parquet files need the .parquet extension)")
    return data


def _text_lines(data: bytes) -> list[str | UnicodeDecodeError]:
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


def read_json_lines(path: Path, label: str) -> ParsedInput:
    data = _read_text_bytes(path, label)
    if path.suffix.lower() == ".json" and data.lstrip()[:1] == b"[":
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
            kind = "openai-batch" if "custom_id" in obj and "body" in obj else "jsonl"
        try:
            if kind == "openai-batch":
                items.append(record_from_batch_request(obj, source))
            else:
                items.append(record_from_object(obj, source))
        except FieldError as error:
            items.append(_problem(source, error))
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


def record_from_batch_request(obj: dict, source: str) -> tuple[PromptRecord, str]:
    """One request of an OpenAI batch input file -> (record, "custom_id")."""
    if obj.get("custom_id") is None:
        raise FieldError("custom_id", "missing; every request in an OpenAI batch file needs one")
    custom_id = check_id(obj["custom_id"], "custom_id")
    method = obj.get("method", "POST")
    if method != "POST":
        raise FieldError("method", f'expected "POST", got {describe_value(method)}')
    url = obj.get("url")
    if url not in OPENAI_BATCH_URLS:
        raise FieldError("url", f"expected one of {', '.join(OPENAI_BATCH_URLS)}, "
                                f"got {describe_value(url)}")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise FieldError("body", f"expected an object, got {describe_value(body)}")

    record = PromptRecord(index=-1, id=custom_id, source=source)
    if url == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], str):
            record.prompt_token_ids = check_token_ids(prompt, "body.prompt")
        else:
            record.prompt = check_prompt_text(prompt, "body.prompt")
    else:
        record.messages = check_messages(body.get("messages"), "body.messages")
    for name in ("max_completion_tokens", "max_tokens"):  # chat's newer name wins over the old
        if body.get(name) is not None:
            record.max_tokens = check_int(body[name], f"body.{name}", minimum=1)
            break
    if body.get("temperature") is not None:
        record.temperature = check_number(body["temperature"], "body.temperature", minimum=0.0)
    if body.get("stop") is not None:
        record.stop = check_stop(body["stop"], "body.stop")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise FieldError("body.model", f"expected a string, got {describe_value(model)}")
    record.openai = {"custom_id": custom_id, "url": url, "model": model}
    return record, "custom_id"


# ---------------------------------------------------------------------------------------------
# Tables: CSV, Parquet and data sets share one column layout


@dataclass(slots=True)
class TableLayout:
    """Which columns of a table hold what."""

    prompt_field: str               # one of PROMPT_FIELDS
    prompt_column: str
    max_tokens_column: str | None
    arrival_column: str | None
    id_column: str | None
    temperature_column: str | None
    stop_column: str | None
    is_trace: bool                  # token counts only: prompt_len and max_tokens from a trace

    def columns(self) -> list[str]:
        names = (self.prompt_column, self.max_tokens_column, self.arrival_column,
                 self.id_column, self.temperature_column, self.stop_column)
        return list(dict.fromkeys(name for name in names if name))


def choose_layout(columns: list[str], prompt_column: str, label: str) -> TableLayout:
    """The prompt column, else `messages`/`prompt_token_ids`/`prompt_len`, else a trace pair."""
    present = set(columns)

    def optional(name: str) -> str | None:
        return name if name in present else None

    shared = dict(id_column=optional("id") or optional("custom_id"),
                  temperature_column=optional("temperature"), stop_column=optional("stop"))
    named_field = prompt_column if prompt_column in PROMPT_FIELDS else "prompt"
    candidates = [(prompt_column, named_field)] + [(name, name) for name in PROMPT_FIELDS[1:]]
    for column, prompt_field in candidates:
        if column in present:
            return TableLayout(prompt_field, column, optional("max_tokens"), None,
                               is_trace=False, **shared)
    for prompt_tokens, generated_tokens, arrival in TRACE_COLUMNS:
        if prompt_tokens in present and generated_tokens in present:
            return TableLayout("prompt_len", prompt_tokens, generated_tokens, optional(arrival),
                               is_trace=True, **shared)
    found = ", ".join(repr(name) for name in columns) or "none"
    raise InputError(
        f"{label}: no {prompt_column!r} column and no trace columns "
        "(num_prefill_tokens,num_decode_tokens or ContextTokens,GeneratedTokens); "
        f"columns found: {found}. Use --prompt-column to name the column that holds the prompts.")


class RowMapper:
    """Turns a table's rows into records; the first datetime arrival is time zero."""

    def __init__(self, layout: TableLayout, *, from_text: bool):
        self.layout = layout
        self.from_text = from_text  # CSV: every cell is a string, numbers and JSON included
        self.time_origin: datetime | None = None

    def record(self, row: Mapping[str, Any], source: str) -> tuple[PromptRecord, str]:
        layout, from_text = self.layout, self.from_text
        record = PromptRecord(index=-1, id="", source=source)
        column = layout.prompt_column
        value = row.get(column)
        if from_text and isinstance(value, str) and layout.prompt_field in ("messages",
                                                                            "prompt_token_ids"):
            value = _json_cell(value, column)
        set_prompt(record, layout.prompt_field, value, column, from_text=from_text)
        # A trace's generated-token count is required; a max_tokens column may have gaps.
        column = layout.max_tokens_column
        if column and (layout.is_trace or row.get(column) is not None):
            record.max_tokens = check_int(row.get(column), column, minimum=1, from_text=from_text)
        if column := layout.arrival_column:
            record.arrival_s = self._arrival_s(row.get(column), column)
        if (column := layout.id_column) and row.get(column) is not None:
            record.id = check_id(row[column], column)
        if (column := layout.temperature_column) and row.get(column) is not None:
            record.temperature = check_number(row[column], column, minimum=0.0, from_text=from_text)
        if (column := layout.stop_column) and row.get(column) is not None:
            record.stop = check_stop(row[column], column)
        return record, layout.id_column or "id"

    def _arrival_s(self, value: Any, column: str) -> float:
        if column not in _DATETIME_ARRIVAL_COLUMNS:
            return check_number(value, column, minimum=0.0, from_text=self.from_text)
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value.strip())
            except ValueError:
                raise FieldError(column, "expected a date and time such as "
                                         f"2023-11-16 18:15:46.68, got {value!r}") from None
        if not isinstance(value, datetime):
            raise FieldError(column, f"expected a date and time, got {describe_value(value)}")
        if self.time_origin is None:
            self.time_origin = value
        try:
            return (value - self.time_origin).total_seconds()
        except TypeError:
            raise FieldError(column, "mixes times with and without a time zone") from None


def _json_cell(text: str, column: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise FieldError(column, f"expected a JSON array in this cell, got {text[:40]!r}") from None


def read_csv(path: Path, label: str, prompt_column: str, *, delimiter: str = ",") -> ParsedInput:
    if csv.field_size_limit() < _CSV_FIELD_LIMIT:
        csv.field_size_limit(_CSV_FIELD_LIMIT)
    try:
        handle = open(path, newline="", encoding="utf-8-sig")  # -sig: Excel writes a BOM
    except OSError as exc:
        raise InputError(f"{label}: cannot read: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.reader(handle, delimiter=delimiter)
        try:
            header = next(reader, None)
            if header is None:
                return ParsedInput("csv", [])
            layout = choose_layout(header, prompt_column, label)
            items = _csv_items(reader, header, layout, label, delimiter)
        except UnicodeDecodeError as exc:
            raise InputError(f"{label}: not UTF-8 text near line {reader.line_num + 1} "
                             f"({exc.reason}); save it as UTF-8") from exc
        except csv.Error as exc:
            raise InputError(f"{label}:{reader.line_num}: unreadable CSV: {exc}") from exc
    return ParsedInput("trace" if layout.is_trace else "csv", items)


def _csv_items(reader, header: list[str], layout: TableLayout, label: str,
               delimiter: str) -> list[Item]:
    position_by_column: dict[str, int] = {}
    for position, name in enumerate(header):
        position_by_column.setdefault(name, position)  # a repeated column name: the first wins
    wanted = [(name, position_by_column[name]) for name in layout.columns()]
    mapper = RowMapper(layout, from_text=True)
    separator = "tab" if delimiter == "\t" else "comma"
    items: list[Item] = []
    last_line = reader.line_num
    for cells in reader:
        # line_num is the line a row ends on; a quoted value may span lines, so a row starts
        # on the line after the previous row ended.
        first_line, last_line = last_line + 1, reader.line_num
        if not cells:
            continue  # a blank line
        source = f"{label}:{first_line}"
        if len(cells) > len(header):
            message = (f"{len(cells)} values but the header has {len(header)} columns "
                       f"(an unquoted {separator}?)")
            items.append(InputProblem(source, None, message))
            continue
        # An empty cell, or one a short row lacks, is a missing value (as pandas reads it).
        row = {name: (cells[position] if position < len(cells) else "") or None
               for name, position in wanted}
        try:
            items.append(mapper.record(row, source))
        except FieldError as error:
            items.append(_problem(source, error))
    return items


def _table_items(columns: dict[str, list], num_rows: int, layout: TableLayout,
                 source_prefix: str) -> list[Item]:
    mapper = RowMapper(layout, from_text=False)
    items: list[Item] = []
    for row_number in range(num_rows):
        source = f"{source_prefix}{row_number}"
        row = {name: values[row_number] for name, values in columns.items()}
        try:
            items.append(mapper.record(row, source))
        except FieldError as error:
            items.append(_problem(source, error))
    return items


def read_parquet(path: Path, label: str, prompt_column: str) -> ParsedInput:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise InputError(f"{label}: reading Parquet needs pyarrow: "
                         "pip install 'neuron-batch[data]'") from exc
    unreadable = (OSError, ValueError, pyarrow.ArrowException)
    try:
        names = pyarrow.parquet.read_schema(path).names
    except unreadable as exc:
        raise InputError(f"{label}: not a readable Parquet file ({exc})") from exc
    layout = choose_layout(names, prompt_column, label)
    try:
        table = pyarrow.parquet.read_table(path, columns=layout.columns())
    except unreadable as exc:
        raise InputError(f"{label}: not a readable Parquet file ({exc})") from exc
    columns = {name: table.column(name).to_pylist() for name in layout.columns()}
    items = _table_items(columns, table.num_rows, layout, f"{label}:row ")
    return ParsedInput("trace" if layout.is_trace else "parquet", items)


# ---------------------------------------------------------------------------------------------
# Hugging Face data sets


def _import_datasets(label: str):
    try:
        import datasets
    except ImportError as exc:
        raise InputError(f"{label}: reading data sets needs `datasets`: "
                         "pip install 'neuron-batch[data]'") from exc
    return datasets


def parse_hub_spec(spec: str) -> tuple[str, str | None]:
    """"hf:NAME" or "hf:NAME:CONFIG" -> (NAME, CONFIG or None)."""
    parts = spec.removeprefix("hf:").split(":")
    if len(parts) > 2 or not all(parts):
        raise InputError(f"{spec}: expected hf:NAME or hf:NAME:CONFIG (e.g. hf:tatsu-lab/alpaca)")
    return parts[0], parts[1] if len(parts) == 2 else None


def read_hub_dataset(spec: str, prompt_column: str, split: str) -> ParsedInput:
    name, config = parse_hub_spec(spec)
    datasets = _import_datasets(spec)
    try:
        dataset = datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # noqa: BLE001 - hub, network and builder errors: all unusable
        raise InputError(f"{spec}: cannot load split {split!r}: "
                         f"{type(exc).__name__}: {exc}") from exc
    return _dataset_input(dataset, spec, prompt_column, f"{spec}[{split}] row ")


def read_saved_dataset(path: Path, label: str, prompt_column: str, split: str) -> ParsedInput:
    markers = ("dataset_dict.json", "dataset_info.json", "state.json")
    if not any((path / marker).is_file() for marker in markers):
        raise InputError(f"{label}: a directory, but not a data set saved with save_to_disk "
                         "(no dataset_dict.json, dataset_info.json or state.json in it); "
                         "give a file instead")
    datasets = _import_datasets(label)
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # noqa: BLE001 - any failure here means the directory is unusable
        raise InputError(f"{label}: cannot load the saved data set: "
                         f"{type(exc).__name__}: {exc}") from exc
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            splits = ", ".join(loaded) or "none"
            raise InputError(f"{label}: no split {split!r} (splits: {splits}); "
                             "choose one with --split")
        return _dataset_input(loaded[split], label, prompt_column, f"{label}[{split}] row ")
    return _dataset_input(loaded, label, prompt_column, f"{label}:row ")


def _dataset_input(dataset, label: str, prompt_column: str, source_prefix: str) -> ParsedInput:
    layout = choose_layout(list(dataset.column_names), prompt_column, label)
    columns = dataset.select_columns(layout.columns()).to_dict()
    items = _table_items(columns, len(dataset), layout, source_prefix)
    return ParsedInput("trace" if layout.is_trace else "hf", items)


# ---------------------------------------------------------------------------------------------
# Plain text


def read_text(path: Path, label: str) -> ParsedInput:
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
