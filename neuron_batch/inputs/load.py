"""Every prompt source -> numbered `PromptRecord`s: pick the reader for each input, number the
records across all inputs, check ids, shuffle and limit; and a one-line description for humans.

Inputs, chosen by prefix, extension or what a directory holds:

- `.jsonl` / `.json`, OpenAI batch files, Mooncake traces, plain text (`line_files.py`);
- `.csv` / `.tsv` / `.parquet`, `hf:NAME[:CONFIG]` and `save_to_disk` folders (`tables.py`).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from pathlib import Path

from neuron_batch.inputs.line_files import read_json_lines, read_text
from neuron_batch.inputs.prompt_records import (
    InputError,
    InputProblem,
    LoadedPrompts,
    ParsedInput,
    PromptRecord,
)
from neuron_batch.inputs.tables import (
    read_csv,
    read_hub_dataset,
    read_parquet,
    read_saved_dataset,
)
from neuron_batch.storage.urls import expand, is_url, suffix_of


def read_input(spec: str, *, prompt_column: str, split: str,
               ignored: Collection[str] = ()) -> ParsedInput:
    """Pick the reader by `hf:` prefix, directory or extension (other extensions are text)."""
    if spec.startswith("hf:"):
        return read_hub_dataset(spec, prompt_column, split)
    if is_url(spec):    # one object (load_prompts expanded globs and prefixes)
        return _read_file(spec, spec, suffix_of(spec), prompt_column, ignored)
    path = Path(spec)
    if not path.exists():
        raise InputError(f"{spec}: no such file or directory")
    if path.is_dir():
        return read_saved_dataset(path, spec, prompt_column, split)
    return _read_file(path, spec, path.suffix.lower(), prompt_column, ignored)


def _read_file(path: Path | str, spec: str, suffix: str, prompt_column: str,
               ignored: Collection[str]) -> ParsedInput:
    if suffix in (".jsonl", ".json"):
        return read_json_lines(path, spec, ignored)
    if suffix in (".csv", ".tsv"):
        return read_csv(path, spec, prompt_column, delimiter="\t" if suffix == ".tsv" else ",")
    if suffix in (".parquet", ".pq"):
        return read_parquet(path, spec, prompt_column)
    return read_text(path, spec)


def expand_inputs(inputs: Sequence[str | Path]) -> list[str]:
    """The inputs as read: a URL's glob (`s3://b/in/*.jsonl`) or prefix (`s3://b/in/`) as the
    objects it names, in a stable order; anything else as given. A URL that names nothing, or
    cannot be listed, is refused here (StorageError: the URL and the service's error code)."""
    out: list[str] = []
    for spec in inputs:
        out.extend(expand(str(spec)) if is_url(str(spec)) else [str(spec)])
    return out



# ---------------------------------------------------------------------------------------------
# Loading


def load_prompts(inputs: Sequence[str | Path], *, prompt_column: str = "prompt",
                 split: str = "train", limit: int | None = None, shuffle: bool = False,
                 seed: int = 0, default_max_tokens: int | None = None,
                 ignored: Collection[str] = ()) -> LoadedPrompts:
    """Read every input, in order, into records numbered 0..n-1 across all of them.

    Lines that cannot become records land in `problems` (the caller decides whether to go on);
    inputs that cannot be used at all raise `InputError`. `shuffle` (seeded) comes before
    `limit`; ids given by default are positions before the shuffle, so they do not change with it.
    `ignored`: the fields --ignore-field drops from JSON requests (any other unknown field is a
    problem of its line).
    """
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]  # one path, not a sequence of one-character "paths"
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if default_max_tokens is not None and default_max_tokens < 1:
        raise ValueError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
    if not inputs:
        raise InputError("no inputs given; name at least one prompt file or data set")

    records: list[PromptRecord] = []
    problems: list[InputProblem] = []
    kinds: list[str] = []
    first_source_by_id: dict[str, str] = {}  # id -> source of the record that holds it
    read_order = -1
    inputs = expand_inputs(inputs)
    for spec in inputs:
        parsed = read_input(str(spec), prompt_column=prompt_column, split=split,
                            ignored=ignored)
        if not parsed.items:
            raise InputError(f"{spec}: no prompts found: the input is empty or holds only "
                             "blank lines")
        kinds.append(parsed.kind)
        for item in parsed.items:
            read_order += 1
            if isinstance(item, InputProblem):
                item.read_order = read_order
                problems.append(item)
                continue
            record, id_field = item
            record.read_order = read_order
            given_id = bool(record.id)
            if not given_id:
                # Its place in reading order, bad lines counted: a skipped line before it does
                # not shift its id (a resume after the line is fixed finds the same ids).
                record.id = str(read_order)
            first_source = first_source_by_id.get(record.id)
            if first_source is not None:
                problems.append(_duplicate_id_problem(record, id_field, given_id, first_source))
                continue
            first_source_by_id[record.id] = record.source
            if record.max_tokens is None and record.openai is None:
                # (an OpenAI batch line without max_tokens runs up to the context, as there)
                record.max_tokens = default_max_tokens
            records.append(record)

    if shuffle:
        random.Random(seed).shuffle(records)
    if limit is not None:
        del records[limit:]
    for index, record in enumerate(records):
        record.index = index
    kind = kinds[0] if len(set(kinds)) == 1 else "mixed"
    return LoadedPrompts(records, problems, kind, inputs=[str(spec) for spec in inputs])


def _duplicate_id_problem(record: PromptRecord, id_field: str, given_id: bool,
                          first_source: str) -> InputProblem:
    if given_id:
        message = f"duplicate id {record.id!r} (first used at {first_source}); ids must be unique"
    else:
        # A record without an id gets its place in the input; an explicit id already took it.
        message = (f"this record has no id and its default id {record.id!r} (its place in the "
                   f"input) is already used at {first_source}; give it an explicit id")
    return InputProblem(record.source, id_field, message, record.read_order)


# ---------------------------------------------------------------------------------------------
# Summary

_KIND_LABELS = {"jsonl": "JSONL", "openai-batch": "OpenAI batch", "mooncake": "Mooncake trace",
                "csv": "CSV", "parquet": "Parquet", "text": "text", "hf": "data set",
                "trace": "trace"}


def prompt_token_count(record: PromptRecord) -> int | None:
    """The prompt's length in tokens when known without a tokenizer, else None."""
    if record.prompt_len is not None:
        return record.prompt_len
    if record.prompt_token_ids is not None:
        return len(record.prompt_token_ids)
    return None


def describe_input(loaded: LoadedPrompts) -> str:
    """One line for humans, e.g. "19,366 prompts from trace conv.csv (prompt lengths p50 1,020 /
    max 14,050 tokens)"."""
    count = len(loaded.records)
    label = _KIND_LABELS.get(loaded.kind, loaded.kind)
    if len(loaded.inputs) == 1:
        spec = loaded.inputs[0]
        where = f"{label} {spec if spec.startswith('hf:') else Path(spec).name}"
    elif loaded.kind == "mixed":
        where = f"{len(loaded.inputs)} inputs"
    else:
        where = f"{len(loaded.inputs)} {label} inputs"
    text = f"{count:,} prompt{'' if count == 1 else 's'} from {where}"
    lengths = sorted(length for record in loaded.records
                     if (length := prompt_token_count(record)) is not None)
    if lengths:
        median = lengths[(len(lengths) - 1) // 2]
        text += f" (prompt lengths p50 {median:,} / max {lengths[-1]:,} tokens)"
    if loaded.problems:
        bad = len(loaded.problems)
        text += f"; {bad:,} line{'' if bad == 1 else 's'} with problems left out"
    return text
