"""The report's `sampling` section: what the requests asked of the sampler as the engine saw
them (constrained, sampled `n` times, logprobs) and what the simulated device charged for it
(the step records' `sampling_s`). Absent for a job that asks none of it and was charged
nothing, so such a report stays as it was (tests/run/golden)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from neuron_batch.runtimes.sampling import SamplingPath
from neuron_batch.scheduler.records import RequestRecord, StepRecord


def sampling_section(steps: Sequence[StepRecord], requests: Sequence[RequestRecord],
                     path: SamplingPath | None = None) -> dict[str, Any] | None:
    """The section; `path`: the run's runtime's (`Runtime.sampling`), for the graphs its
    plugin compiles more for constrained requests (Beta/GA: one, ~8.4 s; not in the elapsed
    time nor yet in the start-up estimate)."""
    return sampling_figures(
        sum(s.sampling_s for s in steps),
        sum(s.t_end - s.t_start for s in steps if s.t_end is not None),
        sum(1 for r in requests if r.constrained), sum(1 for r in requests if r.logprobs),
        Counter(r.sample_of for r in requests if r.sample_of is not None), path)


def sampling_figures(charged: float, step_s: float, constrained: int, logprobs: int,
                     children: Counter[str], path: SamplingPath | None = None
                     ) -> dict[str, Any] | None:
    """The section from its sums: the steps' sampling and step seconds, the requests that
    asked for a grammar or logprobs, the children per fanned-out request."""
    sampled = sum(1 for count in children.values() if count > 1)
    if not (charged or constrained or logprobs or sampled):
        return None
    return {
        "constrained_requests": constrained,
        "n_sampled_requests": sampled,
        # the sequences those requests ran as (vLLM's children, each a request to the device)
        "n_sampled_sequences": sum(c for c in children.values() if c > 1),
        "logprob_requests": logprobs,
        "sampling_s": charged,
        "share_of_step_time": charged / step_s if step_s > 0 else 0.0,
        "extra_graphs": path.structured_graphs if path is not None and constrained else 0,
        "extra_compile_s": path.structured_compile_s if path is not None and constrained
        else 0.0,
    }
