"""A run's workload: every input read, checked and tokenized before anything slow happens,
so a bad file fails in a second, before any model loads; and kept as compact arrays, the
requests read again a window at a time as they run (inputs/job_requests.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_batch.errors import RunError
from neuron_batch.inputs.job_requests import JobRequests
from neuron_batch.inputs.load import InputScan
from neuron_batch.inputs.prepare import Prepared, max_model_len_fix
from neuron_batch.inputs.prompt_records import (
    InputError,
    InputProblem,
    said_once,
)
from neuron_batch.job.check import ModelSource, Scan, model_source
from neuron_batch.job.check_bar import check_bar
from neuron_batch.job.check_bar import wanted as bar_wanted
from neuron_batch.job.check_parts import job_sizes, read_in_parts
from neuron_batch.job.facts import JobFacts, job_facts, sampling_key
from neuron_batch.job.rows_spool import RowsSpool
from neuron_batch.settings import RunSettings

if TYPE_CHECKING:
    from neuron_batch.device.target import Target

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
    #: The whole job in a submission order (run/runner.py `submission_order`), by (order, KV
    #: block, longest first): auto prefix caching weighs the order the run then submits, and
    #: a prefix order over a long trace takes a pass over every prompt to make.
    orders: dict[tuple, Sequence] = field(default_factory=dict, repr=False)

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
                  resolve: Callable[[RunSettings, str], Target | None] | None = None,
                  meanwhile: Callable[[], None] | None = None) -> Workload:
    """Read every input once and check it before anything slow happens: a bad line anywhere
    fails in a second, before any model loads. The check keeps no prompt: the job's requests
    (`JobRequests`) are read again, a window at a time, as the engine takes them. `command`
    is what runs the workload: only `run` has --on-error, so only its error suggests it. The
    run's device (`target`, or what `resolve` makes of the model once it is known) checks the
    --max-model-len a too-long prompt's fix names against its static KV cache. `meanwhile`:
    what this process does while a split check's processes read the job (check_parts.py)."""
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
        model = model_source(settings, log)
        block = block_of(model.model) if spool else None
        scan, inputs = _scanned(settings, model, spool=spool, block=block, exact_ids=False,
                                meanwhile=meanwhile)
        if inputs.has_duplicates():     # (rare: ids hashed alike) read again, every id held
            scan.drop_rows()
            scan, inputs = _scanned(settings, model, spool=spool, block=block, exact_ids=True)
        scan.number(inputs, log)
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


def _scanned(settings: RunSettings, model: ModelSource, *, spool: bool, block: int | None,
             exact_ids: bool, meanwhile: Callable[[], None] | None = None
             ) -> tuple[Scan, InputScan]:
    """The check's pass over the job: in parts, one a process, where the job is big enough
    and its inputs can be cut (job/check_parts.py); else in this process."""
    inputs = InputScan(settings.inputs, prompt_column=settings.prompt_column,
                       split=settings.dataset_split, default_max_tokens=settings.max_tokens,
                       ignored=settings.ignore_field, exact_ids=exact_ids, plain=True)
    # (each input's size and lines, read once: the bar's total and the split's cut)
    sizes = job_sizes(inputs.readers) if bar_wanted(settings) else None
    bar = check_bar(sizes)
    progress = bar.add if bar is not None else None
    try:
        if not exact_ids:
            scan = read_in_parts(settings, model, inputs, spool=spool, block=block,
                                 meanwhile=meanwhile, progress=progress, sizes=sizes)
            if scan is not None:
                return scan, inputs
            if bar is not None:     # (given back to one pass: read from the start)
                bar.restart()
        scan = Scan(settings, model, spool=spool, block=block, readers=inputs.readers)
        scan.read(inputs, progress=progress)
        return scan, inputs
    finally:
        if bar is not None:
            bar.close()


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
