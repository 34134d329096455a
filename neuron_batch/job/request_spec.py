"""What one prepared request asks the engine for, with the run's defaults filled in: the one
spec every engine loop (one engine, Ray replicas, a split's parts) submits and a run folder's
request digests record (inputs/request_fields.py `sampling_spec`)."""

from __future__ import annotations

from typing import Any

from neuron_batch.config import RunSettings
from neuron_batch.inputs.records import InputProblem
from neuron_batch.inputs.request_fields import sampling_spec


def request_spec(request, settings: RunSettings) -> dict[str, Any]:
    """The spec of a PreparedRequest: its max_tokens after the default and the clamp; the
    run's --temperature where the request gives none; --seed + its position as its seed where
    it samples and gives none; ignore_eos with --ignore-eos and always on the simulated device
    (which does not sample its tokens)."""
    record = request.record
    return sampling_spec(record, max_tokens=request.max_tokens,
                         temperature=settings.temperature, seed=settings.seed + record.index,
                         ignore_eos=settings.simulated or settings.ignore_eos)


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
                "temperature above 0 (or pass --temperature), or n 1", record.read_order))
            continue
        kept.append(record)
    return kept, problems
