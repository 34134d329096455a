"""The parts of a check split across processes (job/check_parts.py) joined, in order, into
what one pass would have left (`Join`): each part's columns, problems, lengths, facts, prefix
bound and ids' hashes shifted by the parts before it; its request rows made whole in the
pool once those shifts are known (`rows_part`); the texts its Rust tokenizer encoded and the
chat template it rendered with compared with the model's transformers tokenizer
(inputs/rust_tokenizer.py: any difference is `Disagrees`, and the job goes to one pass)."""

from __future__ import annotations

import dataclasses
import json
import threading
from array import array
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from json.decoder import scanstring  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any, Protocol, cast

from neuron_batch.errors import RunError
from neuron_batch.inputs.load import InputScan, no_prompts
from neuron_batch.inputs.prompt_records import InputError, InputProblem
from neuron_batch.job.check import Scan
from neuron_batch.job.facts import FactsTally
from neuron_batch.job.folder import REQUESTS_LEVEL
from neuron_batch.job.plain_check import DEFAULT_ID, RUN_SEED
from neuron_batch.job.resume_check import REQUEST_FIELDS
from neuron_batch.job.rows_spool import RowsSpool


class JoinedTask(Protocol):
    """What the join reads of a part's task (check_parts.py `_Task`)."""

    number: int                 # its input
    reader: Any                 # (its label names the input in problems)
    rows_path: Path | None
    base: tuple[int, int]       # (items, records) before the part, as guessed


@dataclass
class Part:
    """What one part's check found, numbered from its own start."""

    columns: Any                # (JobColumns)
    parse_problems: list[InputProblem]
    checked: list[tuple[int, InputProblem]]
    early: list[int]
    ok: bytearray
    known: array
    took_defaults: int
    longest: tuple[int, int]    # (request, prompt)
    bound: Any                  # (PrefixBound | None)
    tokenizer_asked: bool
    numbered_rows: bytearray | None
    items: int
    records: int
    lines: int
    id_hashes: array
    numeric_ids: bool
    default_ids: bool
    tally: FactsTally | None
    #: texts its Rust tokenizer encoded, with their ids, for the parent to compare with the
    #: transformers tokenizer's (inputs/rust_tokenizer.py)
    samples: list[tuple[str, bool, list[int]]]
    #: the chat template and named special tokens its Rust tokenizer rendered chats with
    chat: tuple[str, dict[str, str]] | None


@dataclass
class Failed:
    """An error a part raised, carried back as its words (an exception's own arguments do not
    always survive the trip between processes)."""

    message: str
    exit_code: int | None       # None: an InputError


class Join:
    """The parts, in order, into one `Scan` (`base`) and the job's `InputScan`; each part's
    rows given to the `pool` to be made whole once its shifts are known."""

    def __init__(self, base: Scan, inputs: InputScan, block: int | None, pool: Executor,
                 load_beside: bool = False):
        self.base, self.inputs, self.pool = base, inputs, pool
        self.load_beside = load_beside
        # the job's prefix bound, merged part by part; None once a part has none
        self.bound: Any = None
        self.counting = block is not None
        self.tally = FactsTally()
        self.items = self.records = 0
        self.lines = 0              # lines of the current input read so far
        self.number = -1            # the current input
        self.input_items = 0        # items of the current input
        self.tokenizer = False
        self.id_hashes = array("q")
        self.numeric_ids = self.default_ids = False
        self.rows: list[Future] = []
        self.samples: list[tuple[str, bool, list[int]]] = []
        self.chats: set[str] = set()    # (each part's `chat`, as JSON: one, or none)
        # the job's tokenizer, loaded beside the join once a part needed one (transformers'
        # import, ~5 s, was this process's last step after the parts); what it raised
        self._loading: threading.Thread | None = None
        self._load_failed: BaseException | None = None

    def add(self, task: JoinedTask, part: Part) -> None:
        base = self.base
        if task.number != self.number:
            self._input_done()
            self.number, self.lines, self.input_items = task.number, 0, 0
        items, records, lines = self.items, self.records, self.lines
        base.columns.extend(part.columns, items, lines)
        label = task.reader.label
        base.parse_problems += [shifted(p, label, lines, items) for p in part.parse_problems]
        base.checked += [(position + records, shifted(p, label, lines, items))
                         for position, p in part.checked]
        base.early += [position + records for position in part.early]
        base.ok += part.ok
        base.known.extend(part.known)
        base.took_defaults += part.took_defaults
        base.longest_request = max(base.longest_request, part.longest[0])
        base.longest_prompt = max(base.longest_prompt, part.longest[1])
        if self.counting:
            if part.bound is None:
                self.counting, self.bound = False, None     # (synthetic prompts: not here)
            elif self.bound is None:
                self.bound = part.bound
            else:
                self.bound.merge(part.bound)
        if part.tally is not None:
            self.tally.merge(part.tally)
        self.id_hashes.extend(part.id_hashes)
        self.numeric_ids = self.numeric_ids or part.numeric_ids
        self.default_ids = self.default_ids or part.default_ids
        self.tokenizer = self.tokenizer or part.tokenizer_asked
        self.samples += part.samples
        if part.chat is not None:
            self.chats.add(json.dumps(part.chat, sort_keys=True))
        if self.tokenizer and self.load_beside and self._loading is None:
            self._loading = threading.Thread(target=self._load, daemon=True,
                                             name="neuron-batch-tokenizer")
            self._loading.start()
        if task.rows_path is not None:      # (its shifts are known: its rows made whole)
            self.rows.append(self.pool.submit(rows_part, task.rows_path, part.numbered_rows,
                                              items - task.base[0], records - task.base[1]))
        self.items += part.items
        self.records += part.records
        self.lines += part.lines
        self.input_items += part.items

    def _load(self) -> None:
        try:
            self.base.tokenizer()
        except BaseException as error:     # (raised where the join ends: `done`)
            self._load_failed = error

    def loaded(self) -> None:
        """The job's tokenizer loaded (`_load`) and what its load raised raised here."""
        if self._loading is not None:
            self._loading.join()
            if self._load_failed is not None:
                raise self._load_failed
        elif self.tokenizer:    # (the job's text is tokenized again as it runs)
            self.base.tokenizer()

    def settle(self) -> None:
        """The tokenizer's load beside the join ended, whatever it raised (the join has ended
        too, joined or given up)."""
        if self._loading is not None:
            self._loading.join()

    def _input_done(self) -> None:
        if self.number >= 0 and not self.input_items:
            raise no_prompts(self.inputs.specs[self.number])

    def done(self) -> None:
        self._input_done()
        base, inputs = self.base, self.inputs
        self.loaded()
        if self.samples or self.chats:   # (before `inputs` is touched: one pass reads it)
            from neuron_batch.inputs.rust_tokenizer import chat_disagrees, disagree

            tokenizer = base.tokenizer()
            if disagree(tokenizer, self.samples) is not None or any(
                    chat_disagrees(tokenizer, tuple(json.loads(chat))) for chat in self.chats):
                raise Disagrees
        # (only now: a job given back to one pass is read by the same `inputs`, untouched)
        inputs.records, inputs.items = self.records, self.items
        inputs.id_hashes = self.id_hashes
        inputs.took(self.numeric_ids, self.default_ids)
        base.bound = self.bound
        if not self.rows:
            return
        made = [future.result() for future in self.rows]
        for failed in made:
            if isinstance(failed, Failed):
                _raise(failed)
        base.rows = RowsSpool.joined(["id", *REQUEST_FIELDS], cast(list[Path], made),
                                     self.tally)
        base.facts = self.tally.result()


class Disagrees(Exception):
    """A part's Rust tokenizer gave other ids than the model's transformers tokenizer."""


def rows_part(path: Path, marks: bytearray | None, items: int, records: int
               ) -> Path | Failed:
    """A part's rows (plain JSON lines) as a gzip member, its numbered rows' default ids
    shifted by `items` and run seeds by `records` (what its guess missed of the items and
    records before it) in a process of the pool: compressed once, the rows' JSON read again
    only where a number moves."""
    import gzip

    whole = path.with_suffix(".gz")
    shift = marks is not None and (items or records) and any(marks)
    try:
        with open(path, "rb") as rows, open(whole, "wb") as raw, \
                gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=REQUESTS_LEVEL) as out:
            if not shift:
                while chunk := rows.read(1 << 20):
                    out.write(chunk)
            else:
                assert marks is not None
                batch: list[bytes] = []     # (gzip's own work a write: a batch at a time)
                for mark, line in zip(marks, rows):
                    batch.append(_shifted_row(line, mark, items, records) if mark else line)
                    if len(batch) >= 1024:
                        out.write(b"".join(batch))
                        batch.clear()
                out.write(b"".join(batch))
        path.unlink()
    except OSError as error:
        return Failed(f"{whole}: cannot write the check's rows: {error.strerror or error}", 1)
    return whole


def _shifted_row(line: bytes, mark: int, items: int, records: int) -> bytes:
    """A row (json.dumps of [id, prompt, max_tokens, temperature, seed, stop, sampling],
    job/resume_check.py request_row) with its default id shifted by `items` and its run seed
    by `records`, as `mark` says: only those numbers rewritten."""
    text = line.decode("utf-8", "surrogatepass")
    if mark & DEFAULT_ID:   # (digits: nothing JSON escapes)
        end = text.index('"', 2) + 1
        head = f'["{int(text[2:end - 1]) + items}"'
    else:
        end = scanstring(text, 2)[1]
        head = text[:end]
    rest = text[end:]
    if mark & RUN_SEED:     # (", prompt, max_tokens, temperature, seed, ...": the 5th piece)
        pieces = rest.split(", ", 5)
        pieces[4] = str(int(pieces[4]) + records)
        rest = ", ".join(pieces)
    return (head + rest).encode("utf-8", "surrogatepass")


def raised(part: Part | Failed) -> Part:
    if isinstance(part, Failed):
        _raise(part)
    assert isinstance(part, Part)
    return part


def _raise(failed: Failed) -> None:
    if failed.exit_code is None:
        raise InputError(failed.message)
    raise RunError(failed.message, failed.exit_code)


def shifted(problem: InputProblem, label: str, lines: int, items: int) -> InputProblem:
    """A part's problem as the whole job's: its line (in `source`, "label:LINE") and its
    reading order shifted by the parts before."""
    source = problem.source
    prefix = f"{label}:"
    if lines and source.startswith(prefix) and source[len(prefix):].isdigit():
        source = f"{prefix}{int(source[len(prefix):]) + lines}"
    return dataclasses.replace(problem, source=source, read_order=problem.read_order + items)
