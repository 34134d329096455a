"""Tables: CSV/TSV (csv_file.py), Parquet and Hugging Face data sets share one column layout
(a prompt column, or a request trace's token counts: `choose_layout`, `RowMapper`). Parquet
files and data sets are read as streams (prompt_records.py `InputReader`), ROWS_AT_ONCE rows
at a time (the hub's with `datasets`' streaming=True).

Rows of Parquet files and data sets are 0-based positions, as pandas and `datasets` count them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, overload

from neuron_batch.inputs.plain_rows import PlainRows
from neuron_batch.inputs.plain_tables import plain_block, plain_columns
from neuron_batch.inputs.prompt_records import (
    PROMPT_FIELDS,
    FieldError,
    InputError,
    Item,
    PromptRecord,
    Scanned,
    check_id,
    check_int,
    check_number,
    check_stop,
    describe_value,
    field_problem,
    file_stamp,
    set_prefix,
    set_prompt,
)
from neuron_batch.inputs.table_spill import SpilledRows, spill
from neuron_batch.storage.urls import open_binary

#: Request-trace columns: (prompt tokens, generated tokens, arrival); the first pair found wins.
TRACE_COLUMNS = (
    ("num_prefill_tokens", "num_decode_tokens", "arrived_at"),  # Azure, as vidur keeps it: seconds
    ("ContextTokens", "GeneratedTokens", "TIMESTAMP"),         # Azure's raw trace: datetimes
)
DATETIME_ARRIVAL_COLUMNS = {"TIMESTAMP"}



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

    def take_origin(self, row: Mapping[str, Any]) -> None:
        """Time zero taken from `row` (the table's first) where its arrival is a date and
        time, as reading it first would take it: a part of the table read on its own (job/
        check_parts.py) then times its rows as one pass would."""
        column = self.layout.arrival_column
        if column in DATETIME_ARRIVAL_COLUMNS and self.time_origin is None:
            try:
                self._arrival_s(row.get(column), column)
            except FieldError:
                pass    # (no time zero: the table is read in one pass, which names the row)

    def _arrival_s(self, value: Any, column: str) -> float:
        if column not in DATETIME_ARRIVAL_COLUMNS:
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


#: Rows of a Parquet file or data set decoded at once.
ROWS_AT_ONCE = 4096


class _RowInput:
    """A table read a batch of rows at a time (Parquet, data sets): rows come again in order
    from where the last read ended; from the first read of an earlier row, from a spilled
    copy (or, where there is none, from the top again)."""

    kind: str | None
    _columns: list[str]     # (the columns the job reads)

    def __init__(self, label: str, source_prefix: str):
        self.label, self.source_prefix = label, source_prefix
        self._mapper: RowMapper | None = None
        self._rows: Iterator[tuple[int, dict[str, Any]]] | None = None
        # the next row the open stream gives, and its cells
        self._next: tuple[int, dict[str, Any]] = (-1, {})
        self._spilled: SpilledRows | Literal[False] | None = None    # (False: not spilled)
        self._zero_looked = False
        self.span_lines = 0     # (the rows `scan(span)` read: the next span's line shift)

    def layout(self, names: list[str], prompt_column: str, kind: str) -> TableLayout:
        layout = choose_layout(names, prompt_column, self.label)
        self.kind = "trace" if layout.is_trace else kind
        self._mapper = RowMapper(layout, from_text=False)
        return layout

    def batches(self) -> Iterator[dict[str, list]]:
        raise NotImplementedError

    def _time_zero(self) -> bool:
        """Whether the rows' arrivals can be timed: a TIMESTAMP column's time zero is the
        table's first row's, taken from it here where nothing has read it yet (rows read
        again out of order, or a part of the table read on its own, would each take their
        first row's)."""
        mapper = self._mapper
        assert mapper is not None
        if mapper.layout.arrival_column not in DATETIME_ARRIVAL_COLUMNS:
            return True
        if mapper.time_origin is None and not self._zero_looked:
            self._zero_looked = True    # (a first row without a time: looked at once)
            for _, row in self._all_rows():
                mapper.take_origin(row)
                break
        return mapper.time_origin is not None

    # -- parts: a check split across processes (job/check_parts.py) reads rows `span`
    # [start, end) of the table in each; its rows keep their own numbers (where and source),
    # their lines counted from the part's start as a line file's are.

    def group_rows(self) -> list[int]:
        """The rows of each group a part decodes from the start of ([] where unknown)."""
        return []

    def counts_only(self) -> bool:
        """Whether, by its columns' types, the table's rows are token counts its check reads
        as blocks (inputs/plain_tables.py), ~2 us a row: about what a split check's join
        takes a row, so such a table is not worth cutting (job/check_parts.py)."""
        import pyarrow as pa

        assert self._mapper is not None
        at, schema = plain_columns(self._mapper.layout), self._schema()
        return at is not None and schema is not None and all(
            pa.types.is_integer(schema.field(name).type) for name in at[:2] if name)

    def _schema(self) -> Any:
        """The table's Arrow schema (None where unknown)."""
        return None

    def cuttable(self) -> bool:
        """Whether a part read on its own (`scan(span)`) reads its rows as one pass would:
        its rows can be found where they lie, and a TIMESTAMP column's time zero
        (`_time_zero`) is known."""
        return bool(self.group_rows()) and self._time_zero()

    def spans(self, parts: int, *, whole_groups: bool) -> list[tuple[int, int]]:
        """The rows cut into about `parts` spans of as many rows; `whole_groups`: cut only
        between row groups (a part then reads only its own groups' bytes: an object in
        storage is fetched once, not once a part of a group)."""
        groups = self.group_rows()
        total = sum(groups)
        if whole_groups:
            cuts, before = [0], 0
            for rows in groups[:-1]:
                before += rows
                if before - cuts[-1] >= total / parts:
                    cuts.append(before)
        else:
            cuts = sorted({total * k // parts for k in range(parts)})
        return [(start, end) for start, end in zip(cuts, [*cuts[1:], total]) if end > start]

    @overload
    def scan(self, span: tuple[int, int] | None = None, *, plain: Literal[False] = False
             ) -> Iterator[Scanned]: ...

    @overload
    def scan(self, span: tuple[int, int] | None = None, *, plain: bool) -> Iterator[
            Scanned | PlainRows]: ...

    def scan(self, span: tuple[int, int] | None = None, *, plain: bool = False
             ) -> Iterator[Scanned | PlainRows]:
        """Every row; given `span`, the rows in it, their lines from its start (`span_lines`
        then the span's rows). `plain`: a batch of rows of nothing but token counts comes as
        one `PlainRows` block (inputs/plain_tables.py)."""
        start, end = span if span is not None else (0, -1)
        self.span_lines = 0
        assert self._mapper is not None
        layout = self._mapper.layout
        at = plain_columns(layout) if plain else None
        if at is None:
            rows = self._all_rows() if span is None else self._rows_in(start, end)
            for number, row in rows:
                yield number, number - start, 0, self._row(row, number)
        else:   # (rows of nothing but counts: a batch at a time, as a block where it can be)
            dated = layout.arrival_column in DATETIME_ARRIVAL_COLUMNS
            timed = dated and self._time_zero()
            for first, batch in self._arrow_rows(span):
                block = plain_block(batch, first, start, at, gaps=not layout.is_trace,
                                    dated=dated, timed=timed, row=self._row)
                if block is not None:
                    yield block
                    continue
                for number, row in _rows_of(batch, first, self._columns):
                    yield number, number - start, 0, self._row(row, number)
        if span is not None:
            self.span_lines = end - start

    def _arrow_rows(self, span: tuple[int, int] | None) -> Iterator[tuple[int, Any]]:
        """The table's rows (or `span`'s) as Arrow batches, each with its first row's
        number."""
        if span is not None:
            yield from self._arrow_span(*span)
            return
        number = 0
        for batch in self._arrow_batches() or ():
            yield number, batch
            number += len(batch)

    def _arrow_span(self, start: int, end: int) -> Iterator[tuple[int, Any]]:
        """Rows [start, end) as Arrow batches, each with its first row's number."""
        raise NotImplementedError

    def _rows_in(self, start: int, end: int) -> Iterator[tuple[int, dict[str, Any]]]:
        """Rows [start, end) with their numbers."""
        for first, batch in self._arrow_span(start, end):
            yield from _rows_of(batch, first, self._columns)

    def _goes_back(self, number: int) -> bool:
        """Whether `read` would start the table from the top again for row `number`."""
        return self._rows is not None and not -1 < self._next[0] <= number

    def stamp(self) -> tuple | None:
        return None

    def read(self, spots: Sequence[tuple[int, int]]) -> Iterator[tuple[int, Item | None]]:
        # A table's rows decode only from the start of a row group (commonly the whole file):
        # read from the top each time a window went back, the reads grew with the square of
        # the job. From the first read that goes back, every row is read where it lies in a
        # spilled copy (inputs/table_spill.py), where the table gives Arrow batches and the
        # disk has room.
        self._time_zero()
        if self._spilled is None and spots and self._goes_back(spots[0][0]):
            batches = self._arrow_batches()
            self._spilled = (spill(batches) if batches is not None else None) or False
        if self._spilled:
            found = dict(self._spilled.rows([number for number, _ in spots]))
            for number, _ in spots:
                row = found.get(number)
                yield (0, self._row(row, number)) if row is not None else (0, None)
            return
        for number, _ in spots:
            if self._rows is None or self._next[0] > number:
                self._rows = self._all_rows()
                self._next = next(self._rows, (-1, {}))
            while -1 < self._next[0] < number:
                self._next = next(self._rows, (-1, {}))
            yield (0, self._row(self._next[1], number)) if self._next[0] == number else (0, None)

    def _arrow_batches(self) -> Iterator[Any] | None:
        """The table's chosen columns as pyarrow record batches or tables, in row order; None
        where it cannot give them (then it is never spilled)."""
        return None

    def _all_rows(self) -> Iterator[tuple[int, dict[str, Any]]]:
        number = 0
        for columns in self.batches():
            names = list(columns)
            for values in zip(*columns.values()):
                yield number, dict(zip(names, values))
                number += 1

    def _row(self, row: dict[str, Any], number: int) -> Item:
        source = f"{self.source_prefix}{number}"
        assert self._mapper is not None
        try:
            return self._mapper.record(row, source)
        except FieldError as error:
            return field_problem(source, error)


def _rows_of(batch: Any, first: int, names: list[str]
             ) -> Iterator[tuple[int, dict[str, Any]]]:
    """An Arrow batch's rows as cells by column, numbered from `first`."""
    columns = [batch.column(name).to_pylist() for name in names]
    for k, values in enumerate(zip(*columns)):
        yield first + k, dict(zip(names, values))


class ParquetInput(_RowInput):
    def __init__(self, path: Path | str, label: str, prompt_column: str):
        super().__init__(label, f"{label}:row ")
        self.path, self.prompt_column = path, prompt_column
        try:
            import pyarrow
            import pyarrow.parquet
        except ImportError as exc:
            raise InputError(f"{label}: reading Parquet needs pyarrow: "
                             "pip install 'neuron-batch[data]'") from exc
        self._unreadable = (OSError, ValueError, pyarrow.ArrowException)
        try:
            with open_binary(path) as handle:   # (a local path or a URL: storage/urls.py)
                meta = pyarrow.parquet.ParquetFile(handle).metadata
                self._arrow_schema = meta.schema.to_arrow_schema()
                names = self._arrow_schema.names
                # (each row group's rows, from the one footer read: a split check's parts)
                self._groups = [meta.row_group(k).num_rows
                                for k in range(meta.num_row_groups)]
        except self._unreadable as exc:
            raise InputError(f"{label}: not a readable Parquet file ({exc})") from exc
        self._columns = self.layout(names, prompt_column, "parquet").columns()

    def stamp(self) -> tuple | None:
        return file_stamp(self.path)

    def group_rows(self) -> list[int]:
        """The rows of each row group, as the file's footer counts them."""
        return self._groups

    def _schema(self) -> Any:
        return self._arrow_schema

    def _arrow_span(self, start: int, end: int) -> Iterator[tuple[int, Any]]:
        """Rows [start, end), decoded from the start of the row group that holds `start`
        (a row decodes only from there) and only in the groups the span touches."""
        import pyarrow.parquet

        firsts, chosen = [0], []    # (each group's first row)
        for k, rows in enumerate(self.group_rows()):
            if firsts[-1] < end and firsts[-1] + rows > start:
                chosen.append(k)
            firsts.append(firsts[-1] + rows)
        if not chosen:
            return
        number = firsts[chosen[0]]
        try:
            with open_binary(self.path) as handle:
                table = pyarrow.parquet.ParquetFile(handle)
                for batch in table.iter_batches(batch_size=ROWS_AT_ONCE, row_groups=chosen,
                                                columns=self._columns):
                    if number + len(batch) > start:
                        low = max(start - number, 0)
                        yield number + low, batch.slice(
                            low, max(0, min(end - number, len(batch)) - low))
                    number += len(batch)
                    if number >= end:
                        return
        except self._unreadable as exc:
            raise InputError(f"{self.label}: not a readable Parquet file ({exc})") from exc

    def batches(self) -> Iterator[dict[str, list]]:
        for batch in self._arrow_batches():
            yield {name: batch.column(name).to_pylist() for name in self._columns}

    def _arrow_batches(self) -> Iterator[Any]:
        import pyarrow.parquet

        try:
            with open_binary(self.path) as handle:
                table = pyarrow.parquet.ParquetFile(handle)
                yield from table.iter_batches(batch_size=ROWS_AT_ONCE, columns=self._columns)
        except self._unreadable as exc:
            raise InputError(f"{self.label}: not a readable Parquet file ({exc})") from exc


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


def read_hub_dataset(spec: str, prompt_column: str, split: str) -> DatasetInput:
    """`hf:NAME[:CONFIG]`, streamed (`datasets`' streaming=True): never downloaded or held
    whole."""
    name, config = parse_hub_spec(spec)
    datasets = _import_datasets(spec)
    try:
        dataset = datasets.load_dataset(name, config, split=split, streaming=True)
        names = list(dataset.column_names or next(iter(dataset), {}))
    except Exception as exc:  # noqa: BLE001 - hub, network and builder errors: all unusable
        raise InputError(f"{spec}: cannot load split {split!r}: "
                         f"{type(exc).__name__}: {exc}") from exc
    return DatasetInput(dataset, spec, prompt_column, f"{spec}[{split}] row ", names=names)


def read_saved_dataset(path: Path, label: str, prompt_column: str, split: str) -> DatasetInput:
    markers = ("dataset_dict.json", "dataset_info.json", "state.json")
    if not any((path / marker).is_file() for marker in markers):
        raise InputError(f"{label}: a directory, but not a data set saved with save_to_disk "
                         "(no dataset_dict.json, dataset_info.json or state.json in it); "
                         "give a file instead")
    datasets = _import_datasets(label)
    try:
        loaded = datasets.load_from_disk(str(path))     # (memory-mapped Arrow: not read whole)
    except Exception as exc:  # noqa: BLE001 - any failure here means the directory is unusable
        raise InputError(f"{label}: cannot load the saved data set: "
                         f"{type(exc).__name__}: {exc}") from exc
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            splits = ", ".join(loaded) or "none"
            raise InputError(f"{label}: no split {split!r} (splits: {splits}); "
                             "choose one with --split")
        return DatasetInput(loaded[split], label, prompt_column, f"{label}[{split}] row ",
                            folder=path)
    return DatasetInput(loaded, label, prompt_column, f"{label}:row ", folder=path)


class DatasetInput(_RowInput):
    """A data set (saved with save_to_disk, or the hub's, streamed) ROWS_AT_ONCE rows at a
    time."""

    def __init__(self, dataset, label: str, prompt_column: str, source_prefix: str, *,
                 names: list[str] | None = None, folder: Path | None = None):
        super().__init__(label, source_prefix)
        self._folder = folder
        names = list(dataset.column_names) if names is None else names
        self._columns = self.layout(names, prompt_column, "hf").columns()
        self._dataset = dataset.select_columns(self._columns)

    def stamp(self) -> tuple | None:
        return file_stamp(self._folder) if self._folder is not None else None

    def read(self, spots: Sequence[tuple[int, int]]) -> Iterator[tuple[int, Item | None]]:
        if self._folder is None:    # (the hub's, streamed: in order)
            yield from super().read(spots)
            return
        # A saved data set is memory-mapped Arrow: its rows are read where they are.
        self._time_zero()
        rows = [number for number, _ in spots if number < len(self._dataset)]
        columns = self._dataset[rows] if rows else {}
        found = {number: {name: columns[name][k] for name in self._columns}
                 for k, number in enumerate(rows)}
        for number, _ in spots:
            row = found.get(number)
            yield (0, self._row(row, number)) if row is not None else (0, None)

    def _schema(self) -> Any:
        return self._dataset.data.schema if self._folder is not None else None

    def group_rows(self) -> list[int]:
        # (a saved data set is memory-mapped Arrow: a part reads its rows where they lie; the
        # hub's, streamed, has no rows but in order)
        return [len(self._dataset)] if self._folder is not None else []

    def _arrow_span(self, start: int, end: int) -> Iterator[tuple[int, Any]]:
        rows = self._dataset.select(range(start, end)).with_format("arrow")
        for batch in rows.iter(batch_size=ROWS_AT_ONCE):
            yield start, batch
            start += len(batch)

    def batches(self) -> Iterator[dict[str, list]]:
        for batch in self._dataset.iter(batch_size=ROWS_AT_ONCE):
            yield {name: batch[name] for name in self._columns}

    def _arrow_batches(self) -> Iterator[Any] | None:
        # (the hub's, streamed: read from the top again, it streamed the data set again)
        return self._dataset.with_format("arrow").iter(batch_size=ROWS_AT_ONCE)
