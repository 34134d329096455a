"""Every prompt source -> numbered `PromptRecord`s: pick the reader for each input, number the
records across all inputs, check ids, shuffle and limit; and a one-line description for humans.

Inputs, chosen by prefix, extension or what a directory holds, each read as a stream
(`InputReader`: one pass that keeps no prompt, and the lines read again at their offsets):

- `.jsonl` / `.json`, OpenAI batch files, Mooncake traces, plain text (`line_files.py`);
- `.csv` / `.tsv` (`csv_file.py`), `.parquet`, `hf:NAME[:CONFIG]` and `save_to_disk` folders
  (`tables.py`).
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path

from neuron_batch.inputs.csv_file import CsvInput
from neuron_batch.inputs.line_files import LineInput
from neuron_batch.inputs.plain_rows import PlainRows
from neuron_batch.inputs.prompt_records import (
    InputError,
    InputProblem,
    InputReader,
    LoadedPrompts,
    PromptRecord,
    Scanned,
)
from neuron_batch.inputs.tables import (
    DatasetInput,
    ParquetInput,
    read_hub_dataset,
    read_saved_dataset,
)
from neuron_batch.storage.urls import expand, is_url, suffix_of


def open_input(spec: str, *, prompt_column: str, split: str,
               ignored: Collection[str] = ()) -> InputReader:
    """The reader of one input, by `hf:` prefix, directory or extension (other extensions
    are text). Nothing is read yet but what the format needs to be known (a table's columns)."""
    if spec.startswith("hf:"):
        return read_hub_dataset(spec, prompt_column, split)
    if is_url(spec):    # one object (load_prompts expanded globs and prefixes)
        return _file_input(spec, spec, suffix_of(spec), prompt_column, ignored)
    path = Path(spec)
    if not path.exists():
        raise InputError(f"{spec}: no such file or directory")
    if path.is_dir():
        return read_saved_dataset(path, spec, prompt_column, split)
    return _file_input(path, spec, path.suffix.lower(), prompt_column, ignored)


def _file_input(path: Path | str, spec: str, suffix: str, prompt_column: str,
                ignored: Collection[str]) -> InputReader:
    if suffix in (".jsonl", ".json"):
        return LineInput(path, spec, ignored)
    if suffix in (".csv", ".tsv"):
        return CsvInput(path, spec, prompt_column, delimiter="\t" if suffix == ".tsv" else ",")
    if suffix in (".parquet", ".pq"):
        return ParquetInput(path, spec, prompt_column)
    return LineInput(path, spec, text=True)


def expand_inputs(inputs: Sequence[str | Path]) -> list[str]:
    """The inputs as read: a URL's glob (`s3://b/in/*.jsonl`) or prefix (`s3://b/in/`) as the
    objects it names, in a stable order; anything else as given. A URL that names nothing, or
    cannot be listed, is refused here (StorageError: the URL and the service's error code)."""
    out: list[str] = []
    for spec in inputs:
        out.extend(expand(str(spec)) if is_url(str(spec)) else [str(spec)])
    return out


#: The readers whose parts `scan(span)` reads, each on its own, where `cuttable()` says so
#: (job/check_parts.py): line files and CSVs by byte ranges at line starts, Parquet files and
#: saved data sets by rows (`ROW_READERS`).
ROW_READERS = (ParquetInput, DatasetInput)
CUT_READERS = (LineInput, CsvInput, *ROW_READERS)
CutReader = LineInput | CsvInput | ParquetInput | DatasetInput


# ---------------------------------------------------------------------------------------------
# Numbering: one pass over every input


#: (the input's number, where the item lies in it, its line or row, its digest, the item; a
#: block of plain rows: -1, -1, 0, the block)
ScannedItem = tuple[int, int, int, int, PromptRecord | InputProblem | PlainRows]


class InputScan:
    """Every input read in order, one item at a time: each record numbered across all of them
    (`PromptRecord.index` is its position here, before --shuffle; `read_order` its place among
    all items), given its default id and max_tokens; each line that is not one a problem.

    `exact_ids`: duplicate ids are found here, each a problem (a dict of every id: what a job
    held in memory reads). Else only each given id's hash is kept (`id_hashes`, 8 bytes a
    record that gives one) and the caller asks `has_duplicates` after the pass, and reads again
    exactly if so.

    `plain`: a trace's rows that hold nothing but plain numbers come as blocks
    (inputs/plain_rows.py `PlainRows`), numbered here (only without `exact_ids`: a block's ids
    are its default ones, which no given id can take where only hashes are kept)."""

    def __init__(self, inputs: Sequence[str | Path], *, prompt_column: str = "prompt",
                 split: str = "train", default_max_tokens: int | None = None,
                 ignored: Collection[str] = (), exact_ids: bool = True, plain: bool = False):
        if isinstance(inputs, (str, Path)):
            inputs = [inputs]  # one path, not a sequence of one-character "paths"
        if default_max_tokens is not None and default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
        if not inputs:
            raise InputError("no inputs given; name at least one prompt file or data set")
        self.specs = expand_inputs(inputs)
        self.readers = [open_input(spec, prompt_column=prompt_column, split=split,
                                   ignored=ignored) for spec in self.specs]
        self._numbering(default_max_tokens, exact_ids, None, plain)

    def _numbering(self, default_max_tokens: int | None, exact_ids: bool,
                   span: tuple[int, tuple[int, int]] | None, plain: bool) -> None:
        self.default_max_tokens = default_max_tokens
        self.exact_ids = exact_ids
        self.plain = plain and not exact_ids
        # the hashes of the ids lines give: a default id (the record's reading order) is
        # unique by construction, and only a given id that is a number can be one
        self.id_hashes = array("q")
        self._numeric_ids = self._default_ids = False
        self.records = 0        # records numbered so far
        self.items = 0          # items (records and problems) read so far
        self._span = span

    @classmethod
    def of_span(cls, reader: InputReader, spec: str, number: int, span: tuple[int, int], *,
                default_max_tokens: int | None, plain: bool = False) -> InputScan:
        """One part of a check split across processes (job/check_parts.py): the items whose
        lines start in `span` of input `number`, numbered (lines, reading order, positions)
        from the part's own start: the caller shifts them by the parts before. Ids hashed for
        the duplicate check, never held (`exact_ids` False)."""
        scan = cls.__new__(cls)
        scan.specs, scan.readers = [spec], [reader]
        scan._numbering(default_max_tokens, False, (number, span), plain)
        return scan

    @property
    def numeric_ids(self) -> bool:
        return self._numeric_ids

    @property
    def default_ids(self) -> bool:
        return self._default_ids

    def took(self, numeric_ids: bool, default_ids: bool) -> None:
        """What a part's ids were (`of_span`), for `has_duplicates` here."""
        self._numeric_ids = self._numeric_ids or numeric_ids
        self._default_ids = self._default_ids or default_ids

    @property
    def kind(self) -> str:
        kinds = {reader.kind or "jsonl" for reader in self.readers}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    def __iter__(self) -> Iterator[ScannedItem]:
        first_source_by_id: dict[str, str] = {}  # id -> source of the record that holds it
        read_order = -1
        for number, (spec, reader) in enumerate(zip(self.specs, self.readers)):
            empty = True
            items: Iterator[Scanned | PlainRows]
            if isinstance(reader, CUT_READERS):   # (what can be cut, and blocks)
                items = reader.scan(self._span[1] if self._span else None, plain=self.plain)
            else:
                assert self._span is None
                items = reader.scan()
            if self._span is not None:
                number = self._span[0]
            for scanned in items:
                empty = False
                if isinstance(scanned, PlainRows):
                    rows = len(scanned)
                    scanned.read_order, scanned.position = read_order + 1, self.records
                    scanned.finish = self.finish
                    read_order += rows
                    self.items += rows
                    self.records += rows
                    self._default_ids = True
                    yield number, -1, -1, 0, scanned
                    continue
                where, line, digest, item = scanned
                read_order += 1
                self.items += 1
                if isinstance(item, InputProblem):
                    item.read_order = read_order
                    yield number, where, line, digest, item
                    continue
                record, id_field = item
                record.read_order = read_order
                given_id = bool(record.id)
                self.finish(record, self.records)
                if self.exact_ids:
                    first_source = first_source_by_id.get(record.id)
                    if first_source is not None:
                        yield number, where, line, digest, _duplicate_id_problem(
                            record, id_field, given_id, first_source)
                        continue
                    first_source_by_id[record.id] = record.source
                elif given_id:
                    self.id_hashes.append(hash(record.id))
                    self._numeric_ids = self._numeric_ids or record.id.isdecimal()
                else:
                    self._default_ids = True
                self.records += 1
                yield number, where, line, digest, record
            if empty and self._span is None:    # (a part's: the parts' sum tells)
                raise no_prompts(spec)

    def finish(self, record: PromptRecord, position: int, default_id: str | None = None
               ) -> None:
        """What numbering gives a record read at `position`: its default id (`default_id`,
        else its place in reading order, bad lines counted: a skipped line before it does not
        shift its id, so a resume after the line is fixed finds the same ids) and max_tokens;
        `index` the position until --shuffle and --limit number it anew."""
        record.index = position
        if not record.id:
            record.id = default_id if default_id is not None else str(record.read_order)
            record.default_id = True
        if record.max_tokens is None and record.openai is None:
            # (an OpenAI batch line without max_tokens runs up to the context, as there)
            record.max_tokens = self.default_max_tokens

    def has_duplicates(self) -> bool:
        """Whether two records' ids hash alike (a pass without `exact_ids`): then a pass with
        them names the duplicates (or finds it was a collision of the hash). Asked once, after
        the pass: it sorts `id_hashes` where they lie."""
        import numpy as np

        if self._numeric_ids and self._default_ids:
            return True     # (a given "7" may be line 7's default id: the exact pass tells)
        if len(self.id_hashes) < 2:
            return False
        # sorted in place, in the array's own buffer (np.unique made two copies: 160 MB more
        # at the peak of a 10M-line check); nothing reads the hashes in their order after
        hashes = np.frombuffer(self.id_hashes, dtype=np.int64)
        hashes.sort()
        return bool((hashes[1:] == hashes[:-1]).any())


def no_prompts(spec: str) -> InputError:
    return InputError(f"{spec}: no prompts found: the input is empty or holds only blank lines")


def job_order(count: int, *, shuffle: bool, seed: int, limit: int | None) -> list[int] | None:
    """The positions of the job's records in run order: --shuffle (seeded) before --limit;
    None for all of them as read."""
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if not shuffle:
        return None if limit is None or limit >= count else list(range(limit))
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return order[:limit] if limit is not None else order


def load_prompts(inputs: Sequence[str | Path], *, prompt_column: str = "prompt",
                 split: str = "train", limit: int | None = None, shuffle: bool = False,
                 seed: int = 0, default_max_tokens: int | None = None,
                 ignored: Collection[str] = ()) -> LoadedPrompts:
    """Read every input, in order, into records numbered 0..n-1 across all of them, held in
    memory (a run streams its job instead: job/workload.py).

    Lines that cannot become records land in `problems` (the caller decides whether to go on);
    inputs that cannot be used at all raise `InputError`. `shuffle` (seeded) comes before
    `limit`; ids given by default are positions before the shuffle, so they do not change with it.
    `ignored`: the fields --ignore-field drops from JSON requests (any other unknown field is a
    problem of its line).
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    scan = InputScan(inputs, prompt_column=prompt_column, split=split,
                     default_max_tokens=default_max_tokens, ignored=ignored)
    records: list[PromptRecord] = []
    problems: list[InputProblem] = []
    for *_, item in scan:
        if isinstance(item, InputProblem):
            problems.append(item)
        else:
            assert isinstance(item, PromptRecord)   # (no `plain`: no blocks)
            records.append(item)
    order = job_order(len(records), shuffle=shuffle, seed=seed, limit=limit)
    if order is not None:
        records = [records[position] for position in order]
    for index, record in enumerate(records):
        record.index = index
    return LoadedPrompts(records, problems, scan.kind, inputs=list(scan.specs))


def _duplicate_id_problem(record: PromptRecord, id_field: str, given_id: bool,
                          first_source: str) -> InputProblem:
    if given_id:
        message = f"duplicate id {record.id!r} (first used at {first_source}); ids must be unique"
    else:
        # A record without an id gets its place in the input; an explicit id already took it.
        message = (f"this record has no id and its default id {record.id!r} (its place in the "
                   f"input) is "
                   f"already used at {first_source}; give it an explicit id")
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
    lengths = sorted(length for record in loaded.records
                     if (length := prompt_token_count(record)) is not None)
    return describe_job(len(loaded.records), loaded.kind, loaded.inputs, lengths,
                        len(loaded.problems))


def describe_job(count: int, kind: str, inputs: Sequence[str], lengths: Sequence[int],
                 problems: int) -> str:
    """`describe_input` from counts: `lengths` sorted, those known without a tokenizer."""
    label = _KIND_LABELS.get(kind, kind)
    if len(inputs) == 1:
        spec = inputs[0]
        where = f"{label} {spec if spec.startswith('hf:') else Path(spec).name}"
    elif kind == "mixed":
        where = f"{len(inputs)} inputs"
    else:
        where = f"{len(inputs)} {label} inputs"
    text = f"{count:,} prompt{'' if count == 1 else 's'} from {where}"
    if len(lengths):
        median = int(lengths[(len(lengths) - 1) // 2])
        text += f" (prompt lengths p50 {median:,} / max {int(lengths[-1]):,} tokens)"
    if problems:
        text += f"; {problems:,} line{'' if problems == 1 else 's'} with problems left out"
    return text
