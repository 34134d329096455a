"""What a job asks beyond its tokens, learnt in a pass over its requests and kept: what it
asks of the sampler (the engine's and the plugin's settings follow from it), the OpenAI
endpoint its lines name (batch.json), whether any request has stop strings (the simulated
device then detokenizes). Each was a pass of its own over the job, reading every line again
(at 10M requests, a minute or more each before the first step); a run learns them in the pass
that writes (or compares) its requests' rows (job/resume_check.py), anything else in one pass
of their own (`job_facts`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from neuron_batch.engine.sampling_params import request_spec, spec_asks
from neuron_batch.runtimes.sampling import JobSampling, SamplingTally
from neuron_batch.settings import RunSettings


@dataclass(frozen=True)
class JobFacts:
    sampling: JobSampling
    endpoint: str | None        # OpenAI's url (several: comma-separated); None other inputs
    stop_strings: bool          # some request has stop strings


class FactsTally:
    """`JobFacts` a request at a time, from each request and its spec (request_spec)."""

    def __init__(self) -> None:
        self._sampling = SamplingTally()
        self._urls: set[str] = set()
        self._stops = False

    def add(self, request, spec: dict[str, Any], times: int = 1) -> None:
        """`request`, or `times` requests that ask what it asks (a trace's plain rows)."""
        record = request.record
        if record.openai is not None:
            self._urls.add(record.openai["url"])
        self._stops = self._stops or bool(record.stop)
        key = _asks_key(spec)
        if key is None:
            for _ in range(times):
                self._sampling.add(spec_asks(spec))
        else:
            self._sampling.add_keyed(key, lambda: spec_asks(spec), times)

    def merge(self, other: FactsTally) -> None:
        """`other`'s requests counted here too (a part of a split check's)."""
        self._sampling.merge(other._sampling)
        self._urls |= other._urls
        self._stops = self._stops or other._stops

    def result(self) -> JobFacts:
        return JobFacts(self._sampling.result(), ",".join(sorted(self._urls)) or None,
                        self._stops)


#: Spec keys each request has its own value of, which no sampler reads (sampler_asks).
_PER_REQUEST = frozenset({"max_tokens", "seed"})


def _asks_key(spec: dict[str, Any]) -> tuple | None:
    """The rest of the spec as a key, or None where a value is not hashable (stop strings,
    a grammar, logit_bias: such a request is read on its own)."""
    key = tuple(item for item in spec.items() if item[0] not in _PER_REQUEST)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def job_facts(settings: RunSettings, requests: Iterable) -> JobFacts:
    """`JobFacts` of these prepared requests, in one pass (each request's spec as the engine
    gets it under `settings`)."""
    tally = FactsTally()
    for request in requests:
        tally.add(request, request_spec(request, settings))
    return tally.result()


def sampling_key(settings: RunSettings) -> tuple:
    """The settings a request's spec depends on (request_spec): facts learnt under one
    serve any settings with the same key (a sweep's configurations, a split's parts)."""
    return (settings.temperature, settings.seed, settings.simulated, settings.ignore_eos)
