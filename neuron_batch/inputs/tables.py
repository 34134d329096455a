"""Readers for tables: CSV/TSV, Parquet and Hugging Face data sets share one column layout
(a prompt column, or a request trace's token counts).

Line numbers of CSV files are 1-based file lines (the header is line 1); rows of Parquet files
and data sets are 0-based positions, as pandas and `datasets` count them.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from neuron_batch.inputs.prompt_records import (
    PROMPT_FIELDS,
    FieldError,
    InputError,
    InputProblem,
    Item,
    ParsedInput,
    PromptRecord,
    check_id,
    check_int,
    check_number,
    check_stop,
    describe_value,
    field_problem,
    set_prefix,
    set_prompt,
)
from neuron_batch.storage.urls import open_binary, open_text

#: Request-trace columns: (prompt tokens, generated tokens, arrival); the first pair found wins.
TRACE_COLUMNS = (
    ("num_prefill_tokens", "num_decode_tokens", "arrived_at"),  # Azure, as vidur keeps it: seconds
    ("ContextTokens", "GeneratedTokens", "TIMESTAMP"),         # Azure's raw trace: datetimes
)
_DATETIME_ARRIVAL_COLUMNS = {"TIMESTAMP"}

# csv's default 128 KiB field limit would reject a long prompt as a malformed file.
_CSV_FIELD_LIMIT = 1 << 30


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
    # a prompt_len row's shared prefix, as in JSON lines (records.py set_prefix)
    prefix_id_column: str | None = None
    prefix_len_column: str | None = None

    def columns(self) -> list[str]:
        names = (self.prompt_column, self.max_tokens_column, self.arrival_column,
                 self.id_column, self.temperature_column, self.stop_column,
                 self.prefix_id_column, self.prefix_len_column)
        return list(dict.fromkeys(name for name in names if name))


def choose_layout(columns: list[str], prompt_column: str, label: str) -> TableLayout:
    """The prompt column, else `messages`/`prompt_token_ids`/`prompt_len`, else a trace pair."""
    present = set(columns)

    def optional(name: str) -> str | None:
        return name if name in present else None

    shared = dict(id_column=optional("id") or optional("custom_id"),
                  temperature_column=optional("temperature"), stop_column=optional("stop"),
                  prefix_id_column=optional("prefix_id"), prefix_len_column=optional("prefix_len"))
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
        prompt_column = layout.prompt_column
        value = row.get(prompt_column)
        if from_text and isinstance(value, str) and layout.prompt_field in ("messages",
                                                                            "prompt_token_ids"):
            value = _json_cell(value, prompt_column)
        set_prompt(record, layout.prompt_field, value, prompt_column, from_text=from_text)
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
        prefix_id, prefix_len = (_cell(row, layout.prefix_id_column),
                                 _cell(row, layout.prefix_len_column))
        if prefix_id is not None or prefix_len is not None:
            set_prefix(record, prefix_id, prefix_len, from_text=from_text)
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


def _cell(row: Mapping[str, Any], column: str | None) -> Any:
    """A cell's value; None for no such column or a missing value (a table with gaps in a
    numeric column holds NaN there, as pandas writes it)."""
    value = row.get(column) if column else None
    return None if isinstance(value, float) and value != value else value


def _json_cell(text: str, column: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise FieldError(column, f"expected a JSON array in this cell, got {text[:40]!r}") from None


def read_csv(path: Path | str, label: str, prompt_column: str, *, delimiter: str = ","
             ) -> ParsedInput:
    if csv.field_size_limit() < _CSV_FIELD_LIMIT:
        csv.field_size_limit(_CSV_FIELD_LIMIT)
    with ExitStack() as stack:
        try:    # (a local path or a URL: storage/urls.py)
            handle = stack.enter_context(open_text(path, encoding="utf-8-sig"))  # -sig: BOM
        except OSError as exc:
            raise InputError(f"{label}: cannot read: {exc.strerror or exc}") from exc
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
            items.append(field_problem(source, error))
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
            items.append(field_problem(source, error))
    return items


def read_parquet(path: Path | str, label: str, prompt_column: str) -> ParsedInput:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as exc:
        raise InputError(f"{label}: reading Parquet needs pyarrow: "
                         "pip install 'neuron-batch[data]'") from exc
    unreadable = (OSError, ValueError, pyarrow.ArrowException)
    try:
        with open_binary(path) as handle:   # (a local path or a URL: storage/urls.py)
            names = pyarrow.parquet.read_schema(handle).names
    except unreadable as exc:
        raise InputError(f"{label}: not a readable Parquet file ({exc})") from exc
    layout = choose_layout(names, prompt_column, label)
    try:
        with open_binary(path) as handle:
            table = pyarrow.parquet.read_table(handle, columns=layout.columns())
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
