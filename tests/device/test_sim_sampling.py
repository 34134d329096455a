"""What the simulated device charges for sampling (device/sampling_cost.py), through vLLM's real
engine and our scheduler: under nxdi a job that needs the host's sampler pays the logits over
the host link and the CPU sampler on every step, and nothing else changes; under the Beta/GA
runtime a constrained token pays the published on-device mask; `n` runs as `n` sequences whose
prompt KV the prefix cache shares. The records and the report say what was charged and what the
requests asked."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402

from neuron_batch.device import sampling_cost  # noqa: E402
from neuron_batch.device.executor import engine_core, shutdown_llm  # noqa: E402
from neuron_batch.device.hardware import get_instance  # noqa: E402
from neuron_batch.device.target import sim_engine_kwargs  # noqa: E402
from neuron_batch.report.sampling import sampling_section  # noqa: E402
from neuron_batch.runtimes.sampling import (  # noqa: E402
    DEVICE_SAMPLING,
    HOST_SAMPLING_KEY,
    sampler_asks,
)
from neuron_batch.scheduler.records import DECODE, PREFILL  # noqa: E402

SCHEMA = StructuredOutputsParams(json={"type": "object"})
PROMPTS = [(300, 12), (900, 20), (64, 30), (1500, 6), (200, 16), (700, 9)]
VOCAB_8B = 128256       # llama-3.1-8b


def run(tmp_path, params, *, host=False, prefix_caching=False, prompts=PROMPTS, **device):
    device = {"instance": get_instance("inf2.8xlarge"), "arch": "llama-3.1-8b", **device}
    kwargs = sim_engine_kwargs(**device, max_model_len=2048, max_num_seqs=4,
                               max_num_batched_tokens=512, workdir=tmp_path,
                               prefix_caching=prefix_caching)
    if host:
        kwargs["additional_config"]["neuron_batch"][HOST_SAMPLING_KEY] = True
    llm = LLM(**kwargs)
    try:
        given = [{"prompt_token_ids": [1000 + (i * 37 + j) % 30000 for j in range(p)]}
                 for i, (p, _) in enumerate(prompts)]
        outputs = llm.generate(given, [sampling_cost.for_simulated(p) for p in params],
                               use_tqdm=False)
        recorder = engine_core(llm).scheduler.recorder
    finally:
        shutdown_llm(llm)
    return outputs, recorder


def plain():
    return [SamplingParams(max_tokens=m, ignore_eos=True, detokenize=False) for _, m in PROMPTS]


def asking():
    """Half the requests ask for a schema or logprobs (what forces the host's sampler)."""
    out = plain()
    for i in (0, 3):
        out[i] = SamplingParams(max_tokens=PROMPTS[i][1], ignore_eos=True, detokenize=False,
                                structured_outputs=SCHEMA)
    out[4] = SamplingParams(max_tokens=PROMPTS[4][1], ignore_eos=True, detokenize=False,
                            logprobs=2)
    return out


def test_the_simulated_device_is_told_not_asked():
    told = sampling_cost.for_simulated(asking()[0])
    assert told.structured_outputs is None and told.logprobs is None
    assert sampler_asks(told).constrained and not sampler_asks(told).logprobs
    assert asking()[0].structured_outputs is SCHEMA          # the request's own, unchanged
    same = plain()[0]
    assert sampling_cost.for_simulated(same) is same


def test_host_sampling_under_nxdi_charges_the_logits_and_the_cpu_sampler(tmp_path):
    base_out, base = run(tmp_path / "a", plain())
    out, host = run(tmp_path / "b", asking(), host=True)
    assert [len(o.outputs[0].token_ids) for o in out] == [m for _, m in PROMPTS]
    assert all(s.sampling_s == 0.0 for s in base.steps)
    assert sampling_section(base.steps, list(base.requests.values())) is None
    # The same steps, in the same shapes; each one longer by exactly what it was charged.
    steps = [s for s in host.steps if s.kind != "empty"]
    plain_steps = [s for s in base.steps if s.kind != "empty"]
    assert [(s.kind, s.num_tokens_padded, s.num_seqs_padded) for s in steps] == \
        [(s.kind, s.num_tokens_padded, s.num_seqs_padded) for s in plain_steps]
    charge = sampling_cost.SamplingCharge(DEVICE_SAMPLING, VOCAB_8B, host=True)
    asks = {r: host.requests[r] for r in host.requests}
    for step, was in zip(steps, plain_steps):
        rows = step.req_ids
        constrained = sum(asks[r].constrained for r in rows)
        logprobs = sum(asks[r].logprobs for r in rows)
        padded = step.num_seqs_padded if step.kind == DECODE else 1
        assert step.sampling_s == pytest.approx(charge.step_s(padded, len(rows), constrained,
                                                              logprobs))
        assert step.sampling_s > 0
        assert (step.t_end - step.t_start) == pytest.approx(
            (was.t_end - was.t_start) + step.sampling_s)
    # Decode: 4 padded rows x 128,256 fp32 logits over the host link, and more.
    decode = next(s for s in steps if s.kind == DECODE)
    assert decode.sampling_s > 4 * VOCAB_8B * 4 / sampling_cost.HOST_LINK_BYTES_S
    section = sampling_section(host.steps, list(host.requests.values()))
    assert section["constrained_requests"] == 2 and section["logprob_requests"] == 1
    assert section["n_sampled_requests"] == 0
    assert section["sampling_s"] == pytest.approx(sum(s.sampling_s for s in steps))
    assert 0 < section["share_of_step_time"] < 1


def test_the_beta_runtime_charges_the_published_mask_per_constrained_token(tmp_path):
    device = {"instance": get_instance("trn2.3xlarge"), "arch": "llama-3.1-8b"}
    _, records = run(tmp_path, asking(), **device)
    constrained = {r for r, rec in records.requests.items() if rec.constrained}
    assert len(constrained) == 2
    for step in records.steps:
        if step.kind == DECODE:     # every running request samples a token
            rows = [r for r in step.req_ids if r in constrained]
            assert step.sampling_s == pytest.approx(len(rows) * 0.4e-3)
    # (a prefill samples only when its prompt is done: its last chunk)
    section = sampling_section(records.steps, list(records.requests.values()),
                               DEVICE_SAMPLING)
    assert section["extra_graphs"] == 1 and section["extra_compile_s"] == pytest.approx(8.4)
    assert sum(s.sampling_s for s in records.steps) == pytest.approx(
        0.4e-3 * sum(m for i, (_, m) in enumerate(PROMPTS) if i in (0, 3)))


def test_n_runs_as_n_sequences_sharing_the_prompt_through_the_prefix_cache(tmp_path):
    params = [SamplingParams(max_tokens=m, ignore_eos=True, detokenize=False, n=2,
                             temperature=0.8, seed=1) for _, m in PROMPTS[:2]]
    out, records = run(tmp_path, params, prefix_caching=True, prompts=PROMPTS[:2])
    assert [len(o.outputs) for o in out] == [2, 2]
    prefills = [s for s in records.steps if s.kind == PREFILL]
    assert len(prefills) == 4                       # two sequences a request
    # The second sequence of a prompt finds its full blocks in the prefix cache.
    assert sum(s.cached_tokens for s in prefills) >= (300 // 32 + 900 // 32) * 32 - 64
    section = sampling_section(records.steps, list(records.requests.values()))
    assert section["n_sampled_requests"] == 2 and section["n_sampled_sequences"] == 4
    assert section["sampling_s"] == 0.0
