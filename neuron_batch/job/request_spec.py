"""The requests whose spec the engine would refuse once the run's defaults are in (the spec
itself: engine/sampling_params.py `request_spec`)."""

from __future__ import annotations

from neuron_batch.inputs.prompt_records import InputProblem
from neuron_batch.inputs.request_fields import (
    PLAIN_TEMPERATURE,
    apply_openai_defaults,
    default_temperature,
    defaults_words,
    openai_defaults,
)
from neuron_batch.settings import RunSettings


def spec_problems(records, settings: RunSettings) -> tuple[list, list[InputProblem]]:
    """(the records whose spec the engine takes, a problem for each it would refuse once the
    run's defaults are in: n > 1 needs sampling, and greedy decoding (temperature 0, the
    request's or --temperature's) has one answer)."""
    kept, problems = [], []
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


def report_defaults(settings: RunSettings, records, model_path: str | None) -> dict:
    """The report config's words on what lines that give no sampling fields ran with:
    `temperature`, the run's for lines of other formats (--temperature, else greedy), and
    where OpenAI batch lines ran without --temperature, `defaults`: theirs."""
    out: dict = {"temperature": settings.temperature if settings.temperature is not None
                 else PLAIN_TEMPERATURE}
    if settings.temperature is None and any(r.openai is not None for r in records):
        out["defaults"] = "OpenAI batch lines: " + defaults_words(*openai_defaults(model_path))
    return out
