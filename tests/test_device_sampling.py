"""What a request asks of the sampler, read from vLLM's own SamplingParams, and where each
Neuron runtime samples it (neuron_batch/runtimes/sampling.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.runtimes.runtime import NXDI, RUNTIMES, VLLM_NEURON
from neuron_batch.runtimes.sampling import (
    DEVICE_SAMPLING,
    NXDI_SAMPLING,
    JobSampling,
    job_sampling,
    sampler_asks,
)

sp = pytest.importorskip("vllm.sampling_params")


def params(**given):
    structured = given.pop("structured", None)
    if structured is not None:
        given["structured_outputs"] = sp.StructuredOutputsParams(**structured)
    return sp.SamplingParams(**given)


def test_plain_requests_ask_nothing_of_the_host():
    job = job_sampling([params(max_tokens=4), params(max_tokens=9, n=3)])   # (temperature 1)
    assert job == JobSampling(num_requests=2, n_sampled_requests=1)
    assert NXDI_SAMPLING.host_reasons(job) == []


def test_what_each_field_asks():
    asks = sampler_asks(params(structured={"json": {"type": "object"}}, logprobs=2, n=2,
                               presence_penalty=0.5, logit_bias={3: 1.0}, min_p=0.1))
    assert asks.constrained and asks.logprobs and asks.n == 2
    assert asks.host_only == ("presence_penalty", "min_p", "logit_bias")
    assert sampler_asks(params(prompt_logprobs=1)).logprobs
    assert sampler_asks(params(structured={"regex": "[a-z]+"})).constrained
    assert sampler_asks(params(structured={"choice": ["a", "b"]})).constrained
    # Greedy requests sample alike whatever top_p says (the runner makes them top_k 1).
    assert not job_sampling([params(temperature=0.0, top_p=0.5),
                             params(temperature=0.0)]).mixed
    assert job_sampling([params(temperature=0.7), params(temperature=0.7, top_k=5)]).mixed


def test_each_runtime_says_where_it_samples():
    job = job_sampling([params(structured={"json": {"type": "object"}}), params()])
    assert RUNTIMES[NXDI].sampling is NXDI_SAMPLING
    assert RUNTIMES[VLLM_NEURON].sampling is DEVICE_SAMPLING
    assert NXDI_SAMPLING.host_reasons(job) == ["1 request(s) ask for structured outputs"]
    assert DEVICE_SAMPLING.host_reasons(job) == []      # the Beta/GA plugin's own bitmask
    assert job.counts() == {"constrained_requests": 1, "n_sampled_requests": 0,
                            "logprob_requests": 0}


ONE = st.fixed_dictionaries({}, optional={
    "n": st.integers(1, 4), "logprobs": st.integers(0, 5),
    "temperature": st.sampled_from([0.0, 0.5, 1.0]),
    "presence_penalty": st.sampled_from([0.0, 0.3]),
    "structured": st.sampled_from([{"regex": "[0-9]+"}, {"choice": ["x", "y"]}])})


@given(st.lists(ONE, max_size=12))
def test_the_job_counts_are_the_requests_counts(specs):
    # (vLLM refuses n > 1 when greedy)
    all_params = [params(**{**s, "temperature": 0.5} if s.get("n", 1) > 1 else s)
                  for s in specs]
    job = job_sampling(all_params)
    asks = [sampler_asks(p) for p in all_params]
    assert job.num_requests == len(specs)
    assert job.constrained_requests == sum(a.constrained for a in asks)
    assert job.logprob_requests == sum(a.logprobs for a in asks)
    assert job.n_sampled_requests == sum(a.n > 1 for a in asks)
    # Under NxDI the host samples exactly when some request asks what the device cannot do.
    needs = (any(a.constrained or a.logprobs or a.host_only for a in asks)
             or len({a.device_params for a in asks}) > 1)
    assert bool(NXDI_SAMPLING.host_reasons(job)) == needs
