"""The records every prompt source becomes, the problems that name file, line and field, and the
field checks every reader shares.

What each input may hold (readers in `line_files.py`, `csv_file.py` and `tables.py`, chosen in
`load.py`):

- `.jsonl` / `.json`: one object a line with one of `prompt`, `messages`, `prompt_token_ids`,
  `prompt_len`; optional `id`/`custom_id`, the request's fields (request_fields.py: sampling,
  logprobs, structured outputs; any other field is refused), and with `prompt_len` a shared
  prefix (`prefix_id`, `prefix_len`). A `.json` file that starts with `[`
  is read as one JSON array of such objects.
- Mooncake traces (JSON lines with `input_length`, `output_length`, `hash_ids`; mooncake.py).
- OpenAI batch files (JSON lines with `custom_id` and `body`), completions or chat.
- `.csv` / `.tsv` / `.parquet`: a prompt column, or request-trace token counts.
- `hf:NAME[:CONFIG]` and directories written by `save_to_disk`: Hugging Face data sets.
- anything else: plain text, one prompt a line.

A line that cannot become a record is reported as an `InputProblem` and left out; an input that
cannot be used at all raises `InputError`. Pure Python at import time: `datasets` and `pyarrow`
are imported only by the readers that need them.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from neuron_batch.errors import EXIT_FAILED, RunError

#: The fields that each make a record's prompt; a JSON line gives exactly one of them.
PROMPT_FIELDS = ("prompt", "messages", "prompt_token_ids", "prompt_len")


@dataclass(slots=True)
class PromptRecord:
    """One request to run, in input order."""

    index: int                      # 0-based position across all inputs, in output order
    id: str                         # `id`/`custom_id`, else str(read_order): bad lines count
    source: str                     # "path:LINE", "path:row N", "hf:name[split] row N"
    prompt: str | None = None
    messages: list[dict] | None = None
    prompt_token_ids: list[int] | None = None
    prompt_len: int | None = None   # synthetic prompt of this many tokens
    max_tokens: int | None = None
    temperature: float | None = None
    stop: list[str] | None = None
    # The rest of what it asks for, under SamplingParams' names (request_fields.py), only
    # the fields given; None: nothing more.
    sampling: dict[str, Any] | None = None
    arrival_s: float | None = None  # traces: arrival offset in seconds
    # A synthetic prompt's shared parts (inputs/prepare.py SyntheticTokens makes their tokens):
    # a Mooncake trace's ids of its 512-token blocks, or the first prefix_len tokens of the
    # prefix named prefix_id. The same id is the same tokens in any request.
    hash_ids: list[int] | None = None
    prefix_id: str | None = None
    prefix_len: int | None = None
    openai: dict | None = None      # OpenAI batch: {"custom_id", "url", "model"}, for its output
    # Where the record came from, not what it asks (so left out of ==): the field or column the
    # prompt came from, as the input names it ("num_prefill_tokens", "body.messages"), so that
    # a problem found after reading names what the user wrote; and its position in reading
    # order across inputs (before --shuffle), so that problems are listed in line order.
    prompt_field: str | None = field(default=None, compare=False)
    sampling_fields: dict[str, str] | None = field(default=None, compare=False)  # key -> field
    read_order: int = field(default=-1, compare=False)
    # Whether `id` is the default one (str(read_order)), not the line's: a check split into
    # parts (job/check_parts.py) numbers each part from 0 and shifts such ids after.
    default_id: bool = field(default=False, compare=False)


class InputError(ValueError):
    """An input that cannot be used at all; the message names it and says what to do."""


class Uncut(InputError):
    """A part of a file cut at line starts (job/check_parts.py) that cannot be read on its own
    (a CSV row whose quoted value goes on past its line): the file is read in one pass."""


class InputChanged(InputError, RunError):
    """An input read again while the job runs is not what the check before it read (its size
    or time, or a line's bytes): the run stops (exit 1) rather than run requests nobody
    checked; what finished is kept, and --resume finishes the job once the input is as it was
    (or refuses, naming the requests that differ, while it is not)."""

    def __init__(self, message: str):
        RunError.__init__(self, message, EXIT_FAILED)


@dataclass(slots=True)
class InputProblem:
    """One line (or row) that could not become a record."""

    source: str                     # "path:LINE" or "path:row N"
    field: str | None               # the offending field or column; None for the line as a whole
    message: str
    # (`dataclasses.field` below, not `field`: in this class body the name is the attribute
    # above to a type checker.)
    # Where its line was read (PromptRecord.read_order): problems found at different stages
    # are listed in line order. And whether a longer --max-model-len fixes it (a prompt too
    # long), for the one fix of them all. Neither is part of what the problem says.
    read_order: int = dataclasses.field(default=-1, compare=False)
    too_long: bool = dataclasses.field(default=False, compare=False)
    # The request's own id where the line gave one (`custom_id`/`id`), for its error record
    # (job/outputs.py): a consumer joins the error file to its input by it. And what kind of
    # problem it is, as the error record's `code` (None: "invalid_request").
    custom_id: str | None = dataclasses.field(default=None, compare=False)
    code: str | None = dataclasses.field(default=None, compare=False)

    def __str__(self) -> str:
        if self.field is None:
            return f"{self.source}: {self.message}"
        return f"{self.source}: field '{self.field}': {self.message}"


#: The most line numbers one listed problem names; the rest are counted.
MAX_LINES_NAMED = 10


def said_once(problems: Iterable[InputProblem]) -> list[str]:
    """The problems as lines to print, one per distinct (field, message), in the order each
    first comes: what several lines share (a field their path refuses) is said once, naming
    the lines ("in.jsonl:1, 2, 7: field 'seed': ..."), not once per line."""
    groups: dict[tuple[str | None, str], list[str]] = {}
    for problem in problems:
        groups.setdefault((problem.field, problem.message), []).append(problem.source)
    return [str(InputProblem(_sources(sources), field_name, message))
            for (field_name, message), sources in groups.items()]


def _sources(sources: list[str]) -> str:
    """"in.jsonl:1, 2, 7" for lines of one file, else the sources as they are; the first
    MAX_LINES_NAMED named and the rest counted."""
    named, more = sources[:MAX_LINES_NAMED], len(sources) - MAX_LINES_NAMED
    words, last_file = [], None
    for source in named:
        file, _, line = source.rpartition(":")
        same_file = line.isdigit() and file == last_file
        words.append(line if same_file else source)
        last_file = file if line.isdigit() else None
    return ", ".join(words) + (f" and {more} more lines" if more > 0 else "")


@dataclass(slots=True)
class LoadedPrompts:
    """What `load_prompts` read: the usable records and the lines it left out."""

    records: list[PromptRecord]
    problems: list[InputProblem]
    kind: str                       # jsonl|openai-batch|mooncake|csv|parquet|text|hf|trace|mixed
    inputs: list[str] = field(default_factory=list)  # the inputs as given, for messages


class FieldError(Exception):
    """Raised by the field checks; the reader turns it into an `InputProblem` for its line."""

    def __init__(self, field_name: str | None, message: str):
        super().__init__(message)
        self.field = field_name
        self.message = message


# ---------------------------------------------------------------------------------------------
# Field checks, shared by every format. `from_text` accepts numbers written as strings (CSV).


def describe_value(value: Any) -> str:
    """A short rendering of a bad value with its JSON type, for problem messages."""
    type_names = {str: "string", bool: "boolean", int: "integer", float: "number",
                  list: "array", dict: "object", type(None): "null"}
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return f"{shown} ({type_names.get(type(value), type(value).__name__)})"


def _expected(field_name: str, what: str, value: Any) -> FieldError:
    return FieldError(field_name, f"expected {what}, got {describe_value(value)}")


def check_int(value: Any, field_name: str, *, minimum: int, from_text: bool = False) -> int:
    if value is None:
        raise FieldError(field_name, f"missing value; expected an integer >= {minimum}")
    if from_text and isinstance(value, str):
        value = _number_from_text(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 128.0 from a pandas export means 128
    if isinstance(value, bool) or not isinstance(value, int):
        raise _expected(field_name, f"an integer >= {minimum}", value)
    if value < minimum:
        raise FieldError(field_name, f"must be >= {minimum}, got {value}")
    return value


def check_number(value: Any, field_name: str, *, minimum: float,
                 from_text: bool = False) -> float:
    if value is None:
        raise FieldError(field_name, f"missing value; expected a number >= {minimum:g}")
    if from_text and isinstance(value, str):
        value = _number_from_text(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _expected(field_name, f"a number >= {minimum:g}", value)
    if value < minimum:
        raise FieldError(field_name, f"must be >= {minimum:g}, got {value}")
    return float(value)


def _number_from_text(text: str) -> int | float | str:
    """"12" -> 12, "0.5" -> 0.5; anything else is returned as is for the caller to reject."""
    if "." not in text and "e" not in text and "E" not in text:
        try:
            return int(text)
        except ValueError:
            pass
    # (int() takes none of ".eE": a trace's arrival column skips a failed int() a row)
    try:
        return float(text)
    except ValueError:
        return text


def check_prompt_text(value: Any, field_name: str) -> str:
    if value is None:
        raise FieldError(field_name, "missing prompt")
    if not isinstance(value, str):
        raise _expected(field_name, "a string", value)
    if not value.strip():
        raise FieldError(field_name, "empty prompt")
    return value


def check_messages(value: Any, field_name: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise _expected(field_name, "a non-empty array of {role, content} objects", value)
    messages = []
    for position, message in enumerate(value):
        where = f"{field_name}[{position}]"
        if not isinstance(message, dict):
            raise _expected(where, "an object with role and content", message)
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise _expected(f"{where}.{key}", "a string", message.get(key))
        if not message["role"]:
            raise FieldError(f"{where}.role", "empty role")
        # Struct columns (Parquet, datasets) fill keys a message lacks with None; drop them.
        messages.append({key: item for key, item in message.items() if item is not None})
    return messages


def check_token_ids(value: Any, field_name: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise _expected(field_name, "a non-empty array of token ids", value)
    for position, token_id in enumerate(value):
        if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
            raise _expected(f"{field_name}[{position}]", "a token id (integer >= 0)", token_id)
    return value


def check_stop(value: Any, field_name: str) -> list[str] | None:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(stop, str) and stop for stop in stops):
        raise _expected(field_name, "a non-empty string or an array of them", value)
    return stops or None


def check_id(value: Any, field_name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise _expected(field_name, "a non-empty string or an integer", value)
    return str(value)


def set_prompt(record: PromptRecord, prompt_field: str, value: Any, field_name: str,
               *, from_text: bool = False) -> None:
    """Fill the one prompt field `prompt_field` (one of PROMPT_FIELDS) of `record`, read from
    the field or column `field_name`."""
    record.prompt_field = field_name
    if prompt_field == "prompt":
        record.prompt = check_prompt_text(value, field_name)
    elif prompt_field == "messages":
        record.messages = check_messages(value, field_name)
    elif prompt_field == "prompt_token_ids":
        record.prompt_token_ids = check_token_ids(value, field_name)
    else:
        record.prompt_len = check_int(value, field_name, minimum=1, from_text=from_text)


def set_prefix(record: PromptRecord, prefix_id: Any, prefix_len: Any, *,
               from_text: bool = False) -> None:
    """A `prompt_len` record's shared prefix: its first `prefix_len` tokens are those of the
    prefix `prefix_id` (the same in every record that names it). `from_text`: a CSV cell's
    string."""
    if record.prompt_len is None:
        field_name = "prefix_id" if prefix_id is not None else "prefix_len"
        raise FieldError(field_name, "a shared prefix is for prompt_len records; text, "
                                     "messages and token ids share by their tokens as they are")
    if prefix_id is None:
        raise FieldError("prefix_id", "missing: prefix_len needs the prefix_id it is the "
                                      "length of")
    record.prefix_id = check_id(prefix_id, "prefix_id")
    if prefix_len is None:
        raise FieldError("prefix_len", "missing: prefix_id needs prefix_len, how many of the "
                                       "prompt's first tokens are the prefix's")
    record.prefix_len = check_int(prefix_len, "prefix_len", minimum=1, from_text=from_text)
    if record.prefix_len > record.prompt_len:
        raise FieldError("prefix_len", f"{record.prefix_len} is longer than the prompt "
                                       f"(prompt_len {record.prompt_len})")


Item = tuple[PromptRecord, str] | InputProblem  # (record, the field its id came from) or problem


def field_problem(source: str, error: FieldError, custom_id: str | None = None) -> InputProblem:
    return InputProblem(source, error.field, error.message, custom_id=custom_id)


#: What a reader streams for each line or row: (where it lies: a line's byte offset or a
#: table's row; its line number or row, for its source; a digest of its bytes, 0 where the
#: reader keeps none; the record or problem).
Scanned = tuple[int, int, int, Item]


class InputReader(Protocol):
    """One input read as a stream (line_files.py LineInput, csv_file.py CsvInput, tables.py's
    readers): checked in one pass that keeps no prompt (`scan`), read again a window at a time
    as the job runs (`read`, its spots in ascending order)."""

    kind: str | None

    def scan(self) -> Iterator[Scanned]: ...

    def read(self, spots: Sequence[tuple[int, int]]) -> Iterator[tuple[int, Item | None]]: ...

    def stamp(self) -> tuple | None: ...


def file_stamp(path: Path | str) -> tuple | None:
    """A local file's (size, modification time), or a folder's files' together; None for a URL
    (its lines' digests are checked instead)."""
    if "://" in str(path):
        return None
    try:
        target = Path(path)
        if target.is_dir():
            return tuple(sorted((entry.name, *_stat(entry)) for entry in target.rglob("*")
                                if entry.is_file()))
        return _stat(target)
    except OSError:
        return None


def _stat(path: Path) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns
