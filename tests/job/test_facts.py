"""What a job asks beyond its tokens, tallied a request at a time (job/facts.py): requests
whose specs differ only in what no sampler reads are read once, and count as if each was."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.engine.sampling_params import spec_asks
from neuron_batch.job.facts import FactsTally
from neuron_batch.runtimes.sampling import job_sampling

SPEC = st.fixed_dictionaries(
    {"max_tokens": st.integers(1, 50), "temperature": st.sampled_from([0.0, 0.7, 1.0]),
     "stop": st.sampled_from([None, ["\n"]]), "seed": st.one_of(st.none(), st.integers(0, 9))},
    optional={"n": st.integers(1, 3), "logprobs": st.integers(0, 3),
              "presence_penalty": st.sampled_from([0.0, 0.5]),
              "logit_bias": st.sampled_from([{"5": 1.0}, {}]),
              "top_k": st.sampled_from([1, 20]), "embed": st.just({"dimensions": 8}),
              "tools": st.sampled_from([None, ("f",)])})


def request(spec):
    return SimpleNamespace(record=SimpleNamespace(openai=None, stop=spec["stop"]))


@given(st.lists(SPEC, max_size=30), st.integers(0, 3))
def test_the_tally_is_each_request_read_on_its_own(specs, keys):
    tally = FactsTally()
    tally._sampling.KEYS = keys     # (past its keys, requests are read one by one again)
    for spec in specs:
        tally.add(request(spec), spec)
    facts = tally.result()
    assert facts.sampling == job_sampling(spec_asks(spec) for spec in specs)
    assert facts.stop_strings == any(spec["stop"] for spec in specs)
