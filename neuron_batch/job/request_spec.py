"""The requests whose spec the engine would refuse once the run's defaults are in (the spec
itself: engine/sampling_params.py `request_spec`)."""

from __future__ import annotations

from neuron_batch.inputs.embeddings_body import is_embedding
from neuron_batch.inputs.prompt_records import InputProblem
from neuron_batch.inputs.request_fields import (
    PLAIN_TEMPERATURE,
    apply_openai_defaults,
    default_temperature,
    defaults_words,
    openai_defaults,
)
from neuron_batch.inputs.tool_calls import TOOLS, parser_for, tools_of
from neuron_batch.settings import RunSettings


def spec_problems(records, settings: RunSettings) -> tuple[list, list[InputProblem]]:
    """(the records whose spec the engine takes, a problem for each it would refuse once the
    run's defaults are in: n > 1 needs sampling, and greedy decoding (temperature 0, the
    request's or --temperature's) has one answer; the lines of the other kind where
    embeddings and generation are mixed: `one_kind`; tools without a parser: `tool_problems`)."""
    records, problems = one_kind(records)
    records, unparsed = tool_problems(records, settings)
    problems += unparsed
    kept = []
    for record in records:
        n = (record.sampling or {}).get("n", 1)
        temperature = default_temperature(record, settings.temperature)
        if n > 1 and temperature == 0:
            where = (record.sampling_fields or {}).get("n", "n")
            source = ("" if record.temperature is not None else ", --temperature's"
                      if settings.temperature is not None else ", the default for this input")
            problems.append(InputProblem(
                record.source, where, f"{n} samples need sampling, but the request decodes "
                f"greedily (temperature 0{source}), which gives one answer: give it a "
                "temperature above 0 (or pass --temperature), or n 1", record.read_order,
                custom_id=record.id))
            continue
        kept.append(record)
    return kept, problems


def format_defaults(records, settings: RunSettings, model_path: str | None, path,
                    log=None) -> str | None:
    """OpenAI batch lines given what their bodies leave out (inputs/request_fields.py
    apply_openai_defaults; `path`: the run's RequestPath, whose refusals a default respects);
    returns the words for the run's log and report, None where no line took a default."""
    defaults, source = openai_defaults(model_path)
    if settings.temperature is not None:
        defaults = {key: value for key, value in defaults.items() if key != "temperature"}
    took = apply_openai_defaults(records, defaults, run_temperature=settings.temperature,
                                 honours=path.honours)
    if not took:
        return None
    words = defaults_words(defaults, source)
    if log is not None:
        log(f"{took:,} OpenAI batch line(s) run with {words} where they give none")
    return words


def report_defaults(settings: RunSettings, any_openai: bool, model_path: str | None) -> dict:
    """The report config's words on what lines that give no sampling fields ran with:
    `temperature`, the run's for lines of other formats (--temperature, else greedy), and
    where OpenAI batch lines ran without --temperature, `defaults`: theirs."""
    out: dict = {"temperature": settings.temperature if settings.temperature is not None
                 else PLAIN_TEMPERATURE}
    if settings.temperature is None and any_openai:
        out["defaults"] = "OpenAI batch lines: " + defaults_words(*openai_defaults(model_path))
    return out


def one_kind(records) -> tuple[list, list[InputProblem]]:
    """(the records of the run's kind, a problem for each line of the other kind).

    A run loads one model, with one of vLLM's runners: pooling for embeddings, generate for
    the rest; vLLM's engine runs one of them (its `runner`), and OpenAI's Batch API also takes
    one endpoint a batch. So where embeddings and generation lines are mixed, the kind with
    more lines runs (generation on a tie) and each line of the other is refused, naming it
    and why: a batch of its own runs it."""
    records = list(records)
    embeddings = sum(is_embedding(record) for record in records)
    if not embeddings or embeddings == len(records):
        return records, []
    embed_runs = embeddings > len(records) - embeddings
    runs = "embeddings" if embed_runs else "generation (chat, completions, responses)"
    other = "generation" if embed_runs else "embeddings"
    kept, problems = [], []
    for record in records:
        if is_embedding(record) == embed_runs:
            kept.append(record)
            continue
        problems.append(InputProblem(
            record.source, "url",
            f"a {other} line in a run of {runs} lines: a run loads one model with one of "
            f"vLLM's runners (pooling for embeddings, generate for the rest), and the "
            f"{max(embeddings, len(records) - embeddings):,} {runs.split()[0]} lines are the "
            f"more; run the {other} lines as a batch of their own",
            record.read_order, custom_id=record.id))
    return kept, problems


def tool_problems(records, settings: RunSettings) -> tuple[list, list[InputProblem]]:
    """(the records whose tools a parser reads, a problem for each line giving tools where no
    tool-call parser is known: --tool-call-parser, else the one the model's chat template names;
    inputs/tool_calls.py)."""
    records = list(records)
    if not any(tools_of(record) for record in records):
        return records, []
    if parser_for(settings.tool_call_parser, settings.model) is not None:
        return records, []
    model = settings.model or "the built-in model"
    kept, problems = [], []
    for record in records:
        if not tools_of(record):
            kept.append(record)
            continue
        where = (record.sampling_fields or {}).get(TOOLS, "body.tools")
        problems.append(InputProblem(
            record.source, where,
            f"tool calls are read from the output by vLLM's tool-call parser for the model's "
            f"format, and none is known for {model} (its chat template names none): pass "
            f"--tool-call-parser NAME (vLLM's: hermes, llama3_json, mistral, ...), or "
            f"--ignore-field {where} to run the line without tools",
            record.read_order, custom_id=record.id, code="unsupported_field"))
    return kept, problems
