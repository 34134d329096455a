"""The requests whose spec the engine would refuse once the run's defaults are in (the spec
itself: engine/sampling_params.py `request_spec`)."""

from __future__ import annotations

from neuron_batch.inputs.prompt_records import InputProblem
from neuron_batch.settings import RunSettings


def spec_problems(records, settings: RunSettings) -> tuple[list, list[InputProblem]]:
    """(the records whose spec the engine takes, a problem for each it would refuse once the
    run's defaults are in: n > 1 needs sampling, and greedy decoding (temperature 0, the
    request's or --temperature's) has one answer)."""
    kept, problems = [], []
    for record in records:
        n = (record.sampling or {}).get("n", 1)
        temperature = settings.temperature if record.temperature is None else record.temperature
        if n > 1 and temperature == 0:
            where = (record.sampling_fields or {}).get("n", "n")
            source = "" if record.temperature is not None else ", --temperature's"
            problems.append(InputProblem(
                record.source, where, f"{n} samples need sampling, but the request decodes "
                f"greedily (temperature 0{source}), which gives one answer: give it a "
                "temperature above 0 (or pass --temperature), or n 1", record.read_order,
                custom_id=record.id))
            continue
        kept.append(record)
    return kept, problems
