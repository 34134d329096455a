"""A run's workload: every input read, checked and tokenized before anything slow happens,
so a bad file fails in a second, before any model loads."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_batch.errors import RunError
from neuron_batch.inputs.load import describe_input, load_prompts
from neuron_batch.inputs.prepare import max_model_len_fix, prepare_requests
from neuron_batch.inputs.prompt_records import InputError, InputProblem, said_once
from neuron_batch.inputs.request_paths import refusals, request_path, stop_refusals
from neuron_batch.inputs.skipped import name_problems
from neuron_batch.job.request_spec import format_defaults, spec_problems
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

    def prompt_lengths(self) -> list[int]:
        return [r.prompt_len for r in self.prepared.requests]


def load_workload(settings: RunSettings, log: Callable[[str], None], *,
                  command: str = "run", target: Target | None = None,
                  resolve: Callable[[RunSettings, str], Target | None] | None = None
                  ) -> Workload:
    """Read every input and tokenize it before anything slow happens: a bad file fails in a
    second, before any model loads. `command` is what runs the workload: only `run` has
    --on-error, so only its error suggests it. The run's device (`target`, or what `resolve`
    makes of the model once it is known) checks the --max-model-len a too-long prompt's fix
    names against its static KV cache."""
    try:
        loaded = load_prompts(settings.inputs, prompt_column=settings.prompt_column,
                              split=settings.dataset_split, limit=settings.limit,
                              shuffle=settings.shuffle, seed=settings.seed,
                              default_max_tokens=settings.max_tokens,
                              ignored=settings.ignore_field)
    except InputError as error:
        raise RunError(str(error)) from None
    # What the run's path cannot honour is refused here, with the other input problems.
    path = request_path(str(settings.device), settings.resolve_runtime())
    loaded.records, refused = refusals(loaded.records, path)
    loaded.records, unsampled = spec_problems(loaded.records, settings)
    loaded.problems += refused + unsampled
    log(describe_input(loaded))
    model, tokenizer, tokenizer_name, vocab_size = _model_and_tokenizer(settings, log,
                                                                        loaded.records)
    loaded.records, unmatched = stop_refusals(
        loaded.records, has_tokenizer=tokenizer is not None, simulated=settings.simulated,
        on_ray=settings.uses_ray)
    loaded.problems += unmatched
    format_defaults(loaded.records, settings, model.path, path, log)
    prepared = prepare_requests(loaded.records, tokenizer=tokenizer, tokenizer_name=tokenizer_name,
                                vocab_size=vocab_size, max_model_len=settings.max_model_len,
                                default_max_tokens=settings.max_tokens,
                                longest_prompt_graph=_longest_prompt_graph(settings))
    name_problems(prepared.problems, loaded.records)
    # Problems are found while reading and while tokenizing (after --shuffle): in line order.
    problems = sorted(loaded.problems + prepared.problems, key=lambda p: p.read_order)
    if problems:
        fix = max_model_len_fix(problems, prepared, **_model_context(settings, model),
                                layout=_static_layout(settings, target, resolve, model))
        _show_problems(problems, settings, fix, log)
        if command != "run":
            raise RunError(f"{len(problems)} input problem(s); nothing was run. "
                           + (f"{_sentence(fix)}." if fix else "Fix those lines or leave them "
                              f"out: `{command}` needs every request to run"))
        if settings.on_error == "fail":
            raise RunError(f"{len(problems)} input problem(s); nothing was run. "
                           + (f"{_sentence(fix)}; or pass" if fix else "Fix them, or pass")
                           + " --on-error skip to run the rest and report them")
    if not prepared.requests:
        raise RunError("no runnable prompts in the input")
    return Workload(model, prepared, problems, loaded.kind, tokenizer)


def _longest_prompt_graph(settings: RunSettings) -> tuple[int, str] | None:
    """(the longest prompt the runtime's context-encoding graphs take, the flag that sets it)
    where that is below max_model_len (an optimum-neuron export's max_context_length), else
    None: the max_model_len check covers it."""
    shapes = settings.shapes()
    if shapes.longest_prompt >= settings.max_model_len:
        return None
    return shapes.longest_prompt, shapes.runtime.prefill.flag


def _model_and_tokenizer(settings: RunSettings, log, records=()):
    """The model, its tokenizer (loaded only where a record's prompt is text or messages: a
    token-count trace needs none, and loading one takes seconds), the tokenizer's name for the
    report, and the vocabulary size synthetic tokens and token ids are checked against."""
    from neuron_batch.engine.models import ModelError, load_tokenizer, resolve_model

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
    # (and where a request has stop strings: they are matched in the detokenized text)
    needs_text = any((r.prompt_token_ids is None and r.prompt_len is None) or r.stop
                     for r in records)
    tokenizer = None
    if source is not None and needs_text:
        tokenizer = load_tokenizer(source)
        if tokenizer is None:
            tokenizer_name = None
    vocab_size = _vocab_size(model.path)
    if vocab_size is None:      # (no config.json with it: the tokenizer's, else Llama's)
        if tokenizer is None and source is not None:
            tokenizer = load_tokenizer(source)
        vocab_size = len(tokenizer) if tokenizer is not None else 32_000
    return model, tokenizer, tokenizer_name, vocab_size


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
