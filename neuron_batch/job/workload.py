"""A run's workload: every input read, checked and tokenized before anything slow happens,
so a bad file fails in a second, before any model loads; and kept as compact arrays, the
requests read again a window at a time as they run (inputs/job_requests.py)."""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from neuron_batch.engine.sampling_params import request_spec
from neuron_batch.errors import RunError
from neuron_batch.inputs.job_columns import JobColumns
from neuron_batch.inputs.job_requests import JobRequests
from neuron_batch.inputs.load import InputScan, describe_job, job_order, prompt_token_count
from neuron_batch.inputs.prepare import Prepared, max_model_len_fix, prepare_requests
from neuron_batch.inputs.prompt_records import (
    InputError,
    InputProblem,
    PromptRecord,
    said_once,
)
from neuron_batch.inputs.request_fields import (
    apply_openai_defaults,
    defaults_words,
    openai_defaults,
)
from neuron_batch.inputs.request_paths import refusals, request_path, stop_refusals
from neuron_batch.inputs.skipped import name_problems
from neuron_batch.job.facts import JobFacts, job_facts, sampling_key
from neuron_batch.job.request_spec import spec_problems
from neuron_batch.job.resume_check import REQUEST_FIELDS, request_row
from neuron_batch.job.rows_spool import RowsSpool
from neuron_batch.settings import RunSettings

if TYPE_CHECKING:
    from neuron_batch.device.target import Target
    from neuron_batch.inputs.prefix_bound import PrefixBound

MAX_PROBLEMS_SHOWN = 20


@dataclass
class Workload:
    """Prompts read, checked and tokenized: what a run (or every configuration of a sweep) runs."""

    model: Any
    prepared: Any
    problems: list[InputProblem]
    input_kind: str
    tokenizer: Any
    _facts: dict[tuple, JobFacts] = field(default_factory=dict, repr=False)
    #: The whole job's prefix bound by KV block size, where prefix caching's auto decision
    #: counted it (a pass over every prompt's tokens): the report's, when every request
    #: finished (run/folder_report.py).
    prefix_bounds: dict[int, Any] = field(default_factory=dict, repr=False)
    #: The request rows the check made on its way (job/rows_spool.py): a run whose order is
    #: the input's; None otherwise (job/resume_check.py makes them in a pass of their own).
    rows_spool: RowsSpool | None = field(default=None, repr=False)

    def facts(self, settings: RunSettings) -> JobFacts:
        """What the whole job asks beyond its tokens (job/facts.py), learnt in one pass the
        first time it is asked under these settings: an attempt that runs part of the job
        (a resume, a split's part) sets its engine up as the whole job needs."""
        key = sampling_key(settings)
        if key not in self._facts:
            self._facts[key] = job_facts(settings, self.prepared.requests)
        return self._facts[key]

    def learnt(self, settings: RunSettings, facts: JobFacts) -> None:
        """What a pass over the whole job for something else learnt of it (job/facts.py)."""
        self._facts.setdefault(sampling_key(settings), facts)

    def prompt_lengths(self) -> Sequence[int]:
        requests = self.prepared.requests
        if isinstance(requests, JobRequests):
            return requests.prompt_lengths()    # (from its arrays: nothing read again)
        return [r.prompt_len for r in requests]


def load_workload(settings: RunSettings, log: Callable[[str], None], *,
                  command: str = "run", target: Target | None = None,
                  resolve: Callable[[RunSettings, str], Target | None] | None = None
                  ) -> Workload:
    """Read every input once and check it before anything slow happens: a bad line anywhere
    fails in a second, before any model loads. The check keeps no prompt: the job's requests
    (`JobRequests`) are read again, a window at a time, as the engine takes them. `command`
    is what runs the workload: only `run` has --on-error, so only its error suggests it. The
    run's device (`target`, or what `resolve` makes of the model once it is known) checks the
    --max-model-len a too-long prompt's fix names against its static KV cache."""
    spool = command == "run" and not settings.shuffle

    def block_of(model) -> int:
        """The run's KV block (engine/engine.py run_block_size), for the check's bound."""
        from neuron_batch.engine.engine import run_block_size

        device = target
        if device is None and resolve is not None:
            try:
                device = resolve(settings, model.path)
            except RunError:     # (refused as it is: that error comes once the inputs are right)
                device = None
        return run_block_size(settings, device)

    try:
        scan = _Scan(settings, log, spool=spool, block_of=block_of if spool else None)
        if scan.duplicates:     # (rare: ids hashed alike) read again, every id held, to name them
            scan.drop_rows()
            scan = _Scan(settings, log, exact_ids=True, spool=spool,
                         block_of=block_of if spool else None)
    except InputError as error:
        raise RunError(str(error)) from None
    requests, problems = scan.requests, scan.problems
    prepared = Prepared(requests, [p for p in problems if p.too_long], scan.tokenizer_name,
                        scan.longest_request, scan.longest_prompt)
    if problems:
        fix = max_model_len_fix(problems, prepared, **_model_context(settings, scan.model),
                                layout=_static_layout(settings, target, resolve, scan.model))
        _show_problems(problems, settings, fix, log)
        if command != "run":
            raise RunError(f"{len(problems)} input problem(s); nothing was run. "
                           + (f"{_sentence(fix)}." if fix else "Fix those lines or leave them "
                              f"out: `{command}` needs every request to run"))
        if settings.on_error == "fail":
            raise RunError(f"{len(problems)} input problem(s); nothing was run. "
                           + (f"{_sentence(fix)}; or pass" if fix else "Fix them, or pass")
                           + " --on-error skip to run the rest and report them")
    if not requests:
        raise RunError("no runnable prompts in the input")
    workload = Workload(scan.model, prepared, problems, scan.kind, scan.columns.tokenizer,
                        rows_spool=scan.rows)
    if scan.facts is not None:     # (tallied as the rows were made)
        workload.learnt(settings, scan.facts)
    if scan.bound is not None:      # (counted as the check tokenized: auto and the report's)
        workload.prefix_bounds[scan.bound.block] = scan.bound
    return workload


#: Records checked at once by the pass before the run (refusals, defaults, tokenization).
CHECK_CHUNK = 2048


class _Scan:
    """The pass before the run: every input read once, each record checked as a run would
    (the fields its path refuses, what the engine would refuse, stop strings, the OpenAI
    defaults, its tokens and lengths) CHECK_CHUNK at a time, and only its place, id, lengths
    and digest kept (inputs/job_columns.py `JobColumns`); every problem kept."""

    def __init__(self, settings: RunSettings, log: Callable[[str], None], *,
                 exact_ids: bool = False, spool: bool = False,
                 block_of: Callable[[Any], int] | None = None):
        self.settings, self.log = settings, log
        # (the request rows, made as each request is checked: job/rows_spool.py)
        self.rows = RowsSpool(["id", *REQUEST_FIELDS]) if spool else None
        inputs = InputScan(settings.inputs, prompt_column=settings.prompt_column,
                           split=settings.dataset_split, default_max_tokens=settings.max_tokens,
                           ignored=settings.ignore_field, exact_ids=exact_ids)
        self.path = request_path(str(settings.device), settings.resolve_runtime())
        self.model, self._source, self.tokenizer_name, vocab_size = _model_and_source(
            settings, log)
        # The job's prefix bound (inputs/prefix_bound.py), counted as each prompt's tokens are
        # made here: auto's decision and the report then tokenize no text again for it (a
        # text job's start took twice its tokenizing). Given up at the first prompt whose
        # tokens are not made here (a trace's synthetic ones: their own pass, or none where
        # they share nothing); only for a job in input order (the check's requests are then
        # the job's).
        self.bound: PrefixBound | None = None
        if block_of is not None:
            from neuron_batch.inputs.prefix_bound import PrefixBound

            self.bound = PrefixBound(block_of(self.model))
        self.columns = columns = JobColumns(inputs.readers)
        self._tokenizer_asked = False
        if vocab_size is None:      # (no config.json with it: the tokenizer's, else Llama's)
            tokenizer = self._tokenizer()
            vocab_size = len(tokenizer) if tokenizer is not None else 32_000
        columns.vocab_size = vocab_size
        self._defaults, self._defaults_from = openai_defaults(self.model.path)
        if settings.temperature is not None:
            self._defaults = {k: v for k, v in self._defaults.items() if k != "temperature"}
        self.took_defaults = 0
        self.longest_request = self.longest_prompt = 0
        self._graph = _longest_prompt_graph(settings)
        # --limit without --shuffle: the records past it are not the job's (their lines are
        # still read, so that a malformed one is named)
        upto = settings.limit if settings.limit is not None and not settings.shuffle else None
        parse_problems: list[InputProblem] = []
        self._checked: list[tuple[int, InputProblem]] = []  # (position, problem) by the checks
        self._ok = bytearray()
        self._known = array("i")        # prompt lengths known without a tokenizer
        self._early: list[int] = []     # positions of problems found before tokenizing
        chunk: list[PromptRecord] = []
        for src, where, line, digest, item in inputs:
            if isinstance(item, InputProblem):
                parse_problems.append(item)
                continue
            columns.add(src, where, line, digest, item.id, item.read_order)
            self._ok.append(0)
            if upto is not None and item.index >= upto:
                continue
            chunk.append(item)
            if len(chunk) >= CHECK_CHUNK:
                self._check(chunk)
                chunk = []
        self._check(chunk)
        self.facts = self.rows.close() if self.rows is not None else None
        self.duplicates = not exact_ids and inputs.has_duplicates()
        self.kind = inputs.kind
        order = job_order(len(columns), shuffle=settings.shuffle, seed=settings.seed,
                          limit=settings.limit)
        self.requests = JobRequests(columns, columns.number(order, self._ok))
        chosen = [(p, problem) for p, problem in self._checked if columns.index[p] >= 0]
        early = sum(1 for p in self._early if columns.index[p] >= 0)
        count = (len(columns) if order is None else len(order)) - early
        log(describe_job(count, self.kind, inputs.specs, _sorted(self._known),
                         len(parse_problems) + early))
        if self.took_defaults:
            log(f"{self.took_defaults:,} OpenAI batch line(s) run with "
                f"{defaults_words(self._defaults, self._defaults_from)} where they give none")
        self.problems = sorted(parse_problems + [problem for _, problem in chosen],
                               key=lambda problem: problem.read_order)
        columns.finish = self._finish
        self._inputs = inputs
        # (what only the check needed: not held while the job runs)
        inputs.id_hashes = array("q")
        self._ok, self._known, self._early, self._checked = bytearray(), array("i"), [], []

    def drop_rows(self) -> None:
        """This pass's rows are not the job's (a pass with every id held reads it again)."""
        if self.rows is not None:
            self.rows.discard()
            self.rows = None

    def _finish(self, record: PromptRecord, position: int, index: int) -> None:
        """A record read again, given what the check gave it."""
        self._inputs.finish(record, position, self.columns.id_of(position))
        record.index = index
        apply_openai_defaults([record], self._defaults, run_temperature=self.settings.temperature,
                              honours=self.path.honours)

    def _tokenizer(self) -> Any:
        """The tokenizer, loaded the first time a record needs it (a token-count job: never)."""
        from neuron_batch.engine.models import load_tokenizer

        if not self._tokenizer_asked:
            self._tokenizer_asked = True
            if self._source is not None:
                self.columns.tokenizer = load_tokenizer(self._source)
            if self.columns.tokenizer is None:
                self.tokenizer_name = None
            self.columns.tokenizer_name = self.tokenizer_name
        return self.columns.tokenizer

    def _check(self, chunk: list[PromptRecord]) -> None:
        if not chunk:
            return
        settings, columns = self.settings, self.columns
        position_of = {record.read_order: record.index for record in chunk}
        records, refused = refusals(chunk, self.path)
        records, unsampled = spec_problems(records, settings)
        self._early += [position_of[p.read_order] for p in refused + unsampled]
        self._known.extend(n for r in records if (n := prompt_token_count(r)) is not None)
        # (where a request has stop strings: they are matched in the detokenized text)
        if any((r.prompt_token_ids is None and r.prompt_len is None) or r.stop for r in records):
            self._tokenizer()
        records, unmatched = stop_refusals(
            records, has_tokenizer=columns.tokenizer is not None, simulated=settings.simulated,
            on_ray=settings.uses_ray)
        self.took_defaults += apply_openai_defaults(
            records, self._defaults, run_temperature=settings.temperature,
            honours=self.path.honours)
        prepared = prepare_requests(records, tokenizer=columns.tokenizer,
                                    tokenizer_name=self.tokenizer_name,
                                    vocab_size=columns.vocab_size,
                                    max_model_len=settings.max_model_len,
                                    default_max_tokens=settings.max_tokens,
                                    longest_prompt_graph=self._graph)
        name_problems(prepared.problems, chunk)
        self.longest_request = max(self.longest_request, prepared.longest_request)
        self.longest_prompt = max(self.longest_prompt, prepared.longest_prompt)
        rows = self.rows
        for request in prepared.requests:
            position = request.record.index
            columns.prepared(position, request)
            self._ok[position] = 1
            if rows is not None:
                spec = request_spec(request, settings)
                rows.add(request_row(request, spec), request, spec)
            if self.bound is not None:
                if request.token_ids is None:
                    self.bound = None   # (synthetic tokens: not made here)
                else:
                    self.bound.add(request.token_ids)
        self._checked += [(position_of[p.read_order], p)
                          for p in refused + unsampled + unmatched + prepared.problems]


def _longest_prompt_graph(settings: RunSettings) -> tuple[int, str] | None:
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


def _model_and_source(settings: RunSettings, log):
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
    return model, source, tokenizer_name, _vocab_size(model.path)


def _vocab_size(model_path: str) -> int | None:
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
        return int(config["vocab_size"])
    except (OSError, KeyError, ValueError):
        return None


def _model_context(settings: RunSettings, model) -> dict[str, Any]:
    """The longest max_model_len the model takes (max_position_embeddings; on the simulated
    device the architecture's, read as its Target will read it) and its name, for the fix of
    too-long prompts; None unknown."""
    from neuron_batch.device.model_dir import architecture_of

    try:
        if settings.simulated:
            arch = architecture_of(settings.architecture or model.path)[0]
            return {"context": arch.max_position_embeddings, "context_name": arch.name}
        config = json.loads((Path(model.path) / "config.json").read_text())
        return {"context": int(config["max_position_embeddings"]), "context_name": model.name}
    except (OSError, KeyError, TypeError, ValueError):
        return {"context": None}


def _static_layout(settings: RunSettings, target: Target | None, resolve, model):
    """For a max_model_len, the flags the run's static KV cache needs beside it to load
    (device/static_kv.py layout_that_fits), or None (no device known, or a paged cache)."""
    if target is None and resolve is not None:
        try:
            target = resolve(settings, model.path)
        except RunError:     # (refused as it is: that error comes once the inputs are right)
            target = None
    if target is None or not target.runtime.static_kv:
        return None
    from neuron_batch.device.static_kv import layout_that_fits

    return lambda max_model_len: layout_that_fits(
        target.instance, target.arch, target.tp, target.weight_dtype, max_model_len,
        settings.max_num_seqs, other_layouts=target.simulated)


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:]


def _show_problems(problems: list[InputProblem], settings: RunSettings, fix: str | None,
                   log) -> None:
    if settings.quiet and settings.on_error == "skip":
        return  # kept in the run folder's skipped.jsonl; the run's one closing line names it
    verb = "skipped" if settings.on_error == "skip" else "found"
    # Under --quiet (the error that follows) the list keeps its heading: `log` says nothing.
    heading = f"{len(problems)} input problem(s) {verb}:"
    if settings.quiet:
        print(heading, file=sys.stderr)
    else:
        log(heading)
    lines = said_once(problems)     # (the lines that share a refusal: said once)
    for line in lines[:MAX_PROBLEMS_SHOWN]:
        print(f"  {line}", file=sys.stderr)
    if len(lines) > MAX_PROBLEMS_SHOWN:
        print(f"  ... and {len(lines) - MAX_PROBLEMS_SHOWN} more", file=sys.stderr)
    if fix and settings.on_error == "skip":
        print(f"  ({fix})", file=sys.stderr)
