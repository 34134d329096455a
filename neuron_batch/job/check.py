"""The pass before the run (`Scan`): every input read once, each record checked as a run would
check it (the fields its path refuses, what the engine would refuse, stop strings, the OpenAI
defaults, its tokens and lengths), CHECK_CHUNK at a time; only its place, id, lengths and
digest kept (inputs/job_columns.py `JobColumns`), every problem kept. One process reads the
whole job, or each of several reads a part and the parts are joined (job/check_parts.py):
either way `number` then gives the job its order (job/workload.py `load_workload`)."""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from neuron_batch.engine.sampling_params import request_spec
from neuron_batch.errors import RunError
from neuron_batch.inputs.job_columns import JobColumns
from neuron_batch.inputs.job_requests import JobRequests
from neuron_batch.inputs.load import InputScan, describe_job, job_order, prompt_token_count
from neuron_batch.inputs.plain_rows import PlainRows
from neuron_batch.inputs.prepare import prepare_requests
from neuron_batch.inputs.prompt_records import InputProblem, PromptRecord
from neuron_batch.inputs.request_fields import (
    apply_openai_defaults,
    defaults_words,
    openai_defaults,
)
from neuron_batch.inputs.request_paths import refusals, request_path, stop_refusals
from neuron_batch.inputs.skipped import name_problems
from neuron_batch.job.plain_check import PlainCheck, based_row, numbering_of
from neuron_batch.job.request_spec import spec_problems
from neuron_batch.job.resume_check import REQUEST_FIELDS, request_row
from neuron_batch.job.rows_spool import RowsSpool
from neuron_batch.settings import RunSettings

if TYPE_CHECKING:
    from neuron_batch.inputs.prefix_bound import PrefixBound

#: Records checked at once (refusals, defaults, tokenization).
CHECK_CHUNK = 2048
#: Items read between two words to the check's progress bar.
PROGRESS_ITEMS = 8192


@dataclass(frozen=True)
class ModelSource:
    """The run's model, where its tokenizer comes from (None: a token-count job needs none
    and has none), the tokenizer's name for the report, the vocabulary size: resolved once,
    handed to each part of a split check."""

    model: Any
    source: Any
    tokenizer_name: str | None
    vocab_size: int | None


class Scan:
    """One pass over inputs (`read`), then the job numbered (`number`). `spool`: the request
    rows are made as each request is checked (job/rows_spool.py; at `rows_path` for a part of
    a split check); `block`: the job's prefix bound is counted as its prompts are tokenized."""

    def __init__(self, settings: RunSettings, model: ModelSource, *, spool: bool = False,
                 block: int | None = None, rows_path: Path | None = None,
                 readers: Sequence[Any] = (), tokenizers: dict[str, Any] | None = None,
                 loader: Callable[[Any], Any] | None = None):
        self.settings = settings
        # (tokenizers loaded before, by source: a process of a split check keeps the one its
        # first part loaded for the parts after it, ~0.5 s each; made by `loader` there:
        # inputs/rust_tokenizer.py)
        self._tokenizers, self._loader = tokenizers, loader
        self.rows = (RowsSpool(None if rows_path else ["id", *REQUEST_FIELDS], path=rows_path)
                     if spool else None)
        # (rows whose id or seed is the part's numbering: shifted once the parts are joined)
        self.numbered_rows = bytearray() if rows_path is not None else None
        # What a part's rows add to those numbers, its guess of the items and records before
        # it (job/check_parts.py): a good guess leaves its rows as they are once joined.
        self.row_base = (0, 0)
        self.path = request_path(str(settings.device), settings.resolve_runtime())
        self.model, self._source = model.model, model.source
        self.tokenizer_name = model.tokenizer_name
        # The job's prefix bound (inputs/prefix_bound.py), counted as each prompt's tokens are
        # made here: auto's decision and the report then tokenize no text again for it (a
        # text job's start took twice its tokenizing). Given up at the first prompt whose
        # tokens are not made here (a trace's synthetic ones: their own pass, or none where
        # they share nothing); only for a job in input order (the check's requests are then
        # the job's).
        self.bound: PrefixBound | None = None
        if block is not None:
            from neuron_batch.inputs.prefix_bound import PrefixBound

            self.bound = PrefixBound(block)
        self.columns = columns = JobColumns(readers)
        self.tokenizer_asked = False
        vocab_size = model.vocab_size
        if vocab_size is None:      # (no config.json with it: the tokenizer's, else Llama's)
            tokenizer = self.tokenizer()
            vocab_size = len(tokenizer) if tokenizer is not None else 32_000
        columns.vocab_size = vocab_size
        self.defaults, self._defaults_from = openai_defaults(self.model.path)
        if settings.temperature is not None:
            self.defaults = {k: v for k, v in self.defaults.items() if k != "temperature"}
        self.took_defaults = 0
        self.longest_request = self.longest_prompt = 0
        self.graph = longest_prompt_graph(settings)
        self.parse_problems: list[InputProblem] = []
        self.checked: list[tuple[int, InputProblem]] = []  # (position, problem) by the checks
        self.ok = bytearray()
        self.known = array("i")         # prompt lengths known without a tokenizer
        self.early: list[int] = []      # positions of problems found before tokenizing
        self.facts: Any = None
        self.plain = PlainCheck(self)   # (a trace's plain rows: job/plain_check.py)

    def read(self, inputs: InputScan, progress: Callable[[int], None] | None = None) -> None:
        """Every item of `inputs` read, checked CHECK_CHUNK records at a time; `progress`
        told of the items read, PROGRESS_ITEMS at a time (job/check_bar.py)."""
        columns, settings = self.columns, self.settings
        # --limit without --shuffle: the records past it are not the job's (their lines are
        # still read, so that a malformed one is named)
        upto = settings.limit if settings.limit is not None and not settings.shuffle else None
        chunk: list[PromptRecord] = []
        read = 0
        for src, where, line, digest, item in inputs:
            read += 1
            if progress is not None and read >= PROGRESS_ITEMS:
                progress(read)
                read = 0
            if isinstance(item, PlainRows):
                self.check_records(chunk)      # (rows are spooled in input order)
                chunk = []
                self.plain.block(src, item, upto)
                read += len(item) - 1
                continue
            if isinstance(item, InputProblem):
                self.parse_problems.append(item)
                continue
            columns.add(src, where, line, digest, None if item.default_id else item.id,
                        item.read_order)
            self.ok.append(0)
            if upto is not None and item.index >= upto:
                continue
            chunk.append(item)
            if len(chunk) >= CHECK_CHUNK:
                self.check_records(chunk)
                chunk = []
        self.check_records(chunk)
        if progress is not None:
            progress(read)
        self.plain.forget()              # (what only the check needed: not held while the job runs)
        self.facts = self.rows.close() if self.rows is not None else None

    def number(self, inputs: InputScan, log: Callable[[str], None]) -> None:
        """The job read: its order (--shuffle, --limit), its requests, its problems in line
        order, what it is said to be."""
        settings, columns = self.settings, self.columns
        self.kind = inputs.kind
        order = job_order(len(columns), shuffle=settings.shuffle, seed=settings.seed,
                          limit=settings.limit)
        self.requests = JobRequests(columns, columns.number(order, self.ok))
        chosen = [(p, problem) for p, problem in self.checked if columns.index[p] >= 0]
        early = sum(1 for p in self.early if columns.index[p] >= 0)
        count = (len(columns) if order is None else len(order)) - early
        log(describe_job(count, self.kind, inputs.specs, _sorted(self.known),
                         len(self.parse_problems) + early))
        if self.took_defaults:
            log(f"{self.took_defaults:,} OpenAI batch line(s) run with "
                f"{defaults_words(self.defaults, self._defaults_from)} where they give none")
        self.problems = sorted(self.parse_problems + [problem for _, problem in chosen],
                               key=lambda problem: problem.read_order)
        columns.finish = self._finish
        self._inputs = inputs
        # (what only the check needed: not held while the job runs)
        inputs.id_hashes = array("q")
        self.ok, self.known, self.early, self.checked = bytearray(), array("i"), [], []

    def drop_rows(self) -> None:
        """This pass's rows are not the job's (a pass with every id held reads it again)."""
        if self.rows is not None:
            self.rows.discard()
            self.rows = None

    def _finish(self, record: PromptRecord, position: int, index: int) -> None:
        """A record read again, given what the check gave it."""
        self._inputs.finish(record, position, self.columns.id_of(position))
        record.index = index
        apply_openai_defaults([record], self.defaults, run_temperature=self.settings.temperature,
                              honours=self.path.honours)

    def tokenizer(self) -> Any:
        """The tokenizer, loaded the first time a record needs it (a token-count job: never)."""
        from neuron_batch.engine.models import load_tokenizer

        if not self.tokenizer_asked:
            self.tokenizer_asked = True
            if self._source is not None:
                held, key = self._tokenizers, str(self._source.path)
                if held is None:
                    self.columns.tokenizer = load_tokenizer(self._source)
                else:
                    if key not in held:
                        held[key] = (self._loader or load_tokenizer)(self._source)
                    self.columns.tokenizer = held[key]
            if self.columns.tokenizer is None:
                self.tokenizer_name = None
            self.columns.tokenizer_name = self.tokenizer_name
        return self.columns.tokenizer

    def check_records(self, chunk: list[PromptRecord]) -> None:
        """`chunk`'s records checked as a run would check them, each request's columns and
        row kept, each problem kept with its position."""
        if not chunk:
            return
        settings, columns = self.settings, self.columns
        position_of = {record.read_order: record.index for record in chunk}
        records, refused = refusals(chunk, self.path)
        records, unsampled = spec_problems(records, settings)
        self.early += [position_of[p.read_order] for p in refused + unsampled]
        self.known.extend(n for r in records if (n := prompt_token_count(r)) is not None)
        # (where a request has stop strings: they are matched in the detokenized text)
        if any((r.prompt_token_ids is None and r.prompt_len is None) or r.stop for r in records):
            self.tokenizer()
        records, unmatched = stop_refusals(
            records, has_tokenizer=columns.tokenizer is not None, simulated=settings.simulated,
            on_ray=settings.uses_ray)
        self.took_defaults += apply_openai_defaults(
            records, self.defaults, run_temperature=settings.temperature,
            honours=self.path.honours)
        prepared = prepare_requests(records, tokenizer=columns.tokenizer,
                                    tokenizer_name=self.tokenizer_name,
                                    vocab_size=columns.vocab_size,
                                    max_model_len=settings.max_model_len,
                                    default_max_tokens=settings.max_tokens,
                                    longest_prompt_graph=self.graph)
        name_problems(prepared.problems, chunk)
        self.longest_request = max(self.longest_request, prepared.longest_request)
        self.longest_prompt = max(self.longest_prompt, prepared.longest_prompt)
        rows, numbered = self.rows, self.numbered_rows
        for request in prepared.requests:
            position = request.record.index
            columns.prepared(position, request)
            self.ok[position] = 1
            if rows is not None:
                spec = request_spec(request, settings)
                row = request_row(request, spec)
                if numbered is not None:
                    mark = numbering_of(request.record, spec)
                    numbered.append(mark)
                    if mark and self.row_base != (0, 0):
                        row = based_row(row, mark, *self.row_base)
                rows.add(row, request, spec)
        if self.bound is not None:
            tokens = [ids for request in prepared.requests
                      if (ids := request.token_ids) is not None]
            if len(tokens) < len(prepared.requests):
                self.bound = None   # (synthetic tokens: not made here)
            else:       # (the chunk's prompts hashed together: PrefixBound.add_all)
                self.bound.add_all(tokens)
        self.checked += [(position_of[p.read_order], p)
                         for p in refused + unsampled + unmatched + prepared.problems]

def longest_prompt_graph(settings: RunSettings) -> tuple[int, str] | None:
    """(the longest prompt the runtime's context-encoding graphs take, the flag that sets it)
    where that is below max_model_len (an optimum-neuron export's max_context_length), else
    None: the max_model_len check covers it."""
    shapes = settings.shapes()
    if shapes.longest_prompt >= settings.max_model_len:
        return None
    return shapes.longest_prompt, shapes.runtime.prefill.flag


def _sorted(values: array) -> Sequence[int]:
    import numpy as np

    # (in place, in the array's own buffer: a sorted copy was 4 bytes a request more at the
    # check's peak; nothing reads them in their order after)
    held = np.frombuffer(values, dtype=np.int32)
    held.sort()
    return cast(Sequence[int], held)


def model_source(settings: RunSettings, log) -> ModelSource:
    """The model, where its tokenizer comes from (loaded only once a record's prompt is text
    or messages: a token-count trace needs none, and loading one takes seconds), the
    tokenizer's name for the report, and the vocabulary size from its config.json (None: the
    tokenizer's)."""
    from neuron_batch.engine.models import ModelError, resolve_model

    try:
        model = resolve_model(settings.model, progress=log)
    except ModelError as error:
        raise RunError(str(error)) from None
    source = model if model.has_tokenizer else None
    tokenizer_name = model.name if source is not None else None
    if source is None and settings.simulated:
        # The simulated device needs no weights, but text must still become tokens: use the
        # built-in model's tokenizer and say so in the report.
        builtin = resolve_model(None, progress=log)
        source = builtin
        tokenizer_name = f"{builtin.name} (built-in, standing in for {model.name})"
    return ModelSource(model, source, tokenizer_name, _vocab_size(model.path))


def _vocab_size(model_path: str) -> int | None:
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
        return int(config["vocab_size"])
    except (OSError, KeyError, ValueError):
        return None
