"""The step records of prefills with prefix caching under nxdi (what a Neuron host's NxDI ran):
vLLM's real scheduler and prefix cache with our NeuronScheduler, the grid where the plugin reads
it (`override_neuron_config["prefix_buckets"]`). The hits are checked against the longest
whole-block prefix an earlier prompt shares, worked out here from the prompts alone; each
prefill's cell against prefix_grid.grid_cell (NxDI's rule) of its new and cached tokens."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from neuron_batch.runtimes.prefix_grid import (  # noqa: E402
    default_prefill_buckets,
    default_prefix_buckets,
    default_tkg_buckets,
    grid_cell,
)
from neuron_batch.runtimes.runtime import NXDI, RUNTIMES  # noqa: E402
from neuron_batch.scheduler import NeuronScheduler  # noqa: E402
from neuron_batch.scheduler.harness import fake_model_output, make_request, make_scheduler  # noqa: E402,E501
from neuron_batch.scheduler.records import DECODE, PREFILL  # noqa: E402

LENGTH, BLOCK, OUTPUT_TOKEN = 2048, 32, 5     # the harness's model writes token 5


def grid_scheduler(max_num_seqs: int, prefix_buckets=None):
    section = {"context_encoding_buckets": default_prefill_buckets(LENGTH),
               "token_generation_buckets": default_tkg_buckets(LENGTH),
               "prefix_buckets": prefix_buckets or default_prefix_buckets(LENGTH)}
    return make_scheduler(NeuronScheduler, runtime=RUNTIMES[NXDI], max_num_seqs=max_num_seqs,
                          max_model_len=LENGTH, block_size=BLOCK, num_blocks=20_000,
                          enable_prefix_caching=True, neuron_config=section), section


def run(scheduler, prompts: list[list[int]], max_tokens: int = 3) -> None:
    requests = {}
    for i, prompt in enumerate(prompts):
        request = make_request(len(prompt), max_tokens, req_id=f"r{i}", prompt_token_ids=prompt,
                               block_size=BLOCK)
        requests[request.request_id] = request
        scheduler.add_request(request)
    for _ in range(10_000):
        if not scheduler.has_requests():
            return
        output = scheduler.schedule()
        scheduler.update_from_output(output, fake_model_output(output, requests, OUTPUT_TOKEN))
    raise AssertionError("the job did not finish")


def expected_hit(prompts: list[list[int]], i: int) -> int:
    """The tokens vLLM's prefix cache serves request i (nothing is evicted from a pool this
    large, and outputs never match a prompt): the longest prefix shared with an earlier prompt,
    in whole blocks, at most the prompt less one token (vLLM computes the last one again)."""
    best = 0
    for earlier in prompts[:i]:
        same = 0
        for a, b in zip(prompts[i], earlier):
            if a != b:
                break
            same += 1
        best = max(best, min(same, len(prompts[i]) - 1) // BLOCK * BLOCK)
    return best


def check(scheduler, section, prompts) -> list:
    steps = [s for s in scheduler.recorder.steps if s.kind == PREFILL]
    assert [s.req_ids for s in steps] == [[f"r{i}"] for i in range(len(prompts))]
    for i, step in enumerate(steps):
        cached = expected_hit(prompts, i)
        assert step.cached_tokens == cached, (i, step.cached_tokens, cached)
        assert step.num_tokens == len(prompts[i]) - cached
        cell = grid_cell(step.num_tokens, cached, section["context_encoding_buckets"],
                         section["prefix_buckets"])
        assert (step.num_tokens_padded, step.prefix_bucket, step.recomputed_tokens) == (
            cell.prefill_bucket, cell.prefix_bucket, cell.recomputed), (i, step)
        assert scheduler.recorder.requests[f"r{i}"].num_cached_tokens == cached
    for step in scheduler.recorder.steps:
        if step.kind == DECODE:
            assert (step.cached_tokens, step.recomputed_tokens, step.prefix_bucket) == (0, 0, None)
    return steps


def test_a_shared_prefix_is_a_hit_and_nxdi_s_cell_is_recorded():
    shared = [7 + i % 900 for i in range(1500)]
    prompts = [shared + [1000 + i] * (40 + 200 * i) for i in range(3)] + [
        [11] * 100 + [12] * 300,            # 257-512 tokens, no hit: (512, 0)
        [11] * 100 + [12] * 300 + [13] * 40]   # a hit NxDI recomputes whole: (512, 0)
    scheduler, section = grid_scheduler(max_num_seqs=2)
    run(scheduler, prompts)
    steps = check(scheduler, section, prompts)
    assert [s.cached_tokens for s in steps] == [0, 1472, 1472, 0, 384]
    # 268 new on 1472 cached: the 512 bucket, 244 cached moved into it, 1228 read -> 2048
    assert (steps[0].num_tokens_padded, steps[0].prefix_bucket) == (2048, 0)
    assert (steps[1].num_tokens_padded, steps[1].prefix_bucket,
            steps[1].recomputed_tokens) == (512, 2048, 244)
    assert (steps[4].num_tokens_padded, steps[4].prefix_bucket,
            steps[4].recomputed_tokens) == (512, 0, 384)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1200), st.integers(1, 600)),
                min_size=1, max_size=6),
       st.sampled_from([None, [0, 1024, 2048], [0, 256, 512, 1024, 1536, 2048]]))
def test_every_prefill_records_vllm_s_hit_and_nxdi_s_cell(spec, prefix_buckets):
    stems = [[20 + (7 * s + i) % 800 for i in range(1200)] for s in range(3)]
    prompts = [stems[stem][:shared] + [900 + (i * 31 + j) % 90 for j in range(own)]
               for i, (stem, shared, own) in enumerate(spec)]
    scheduler, section = grid_scheduler(max_num_seqs=4, prefix_buckets=prefix_buckets)
    run(scheduler, prompts, max_tokens=2)
    check(scheduler, section, prompts)


def test_without_lists_nxdis_default_grid_is_recorded():
    # Prefix caching on and no bucket lists given: NxDI compiles its default grid.
    scheduler = make_scheduler(NeuronScheduler, runtime=RUNTIMES[NXDI], max_num_seqs=2,
                               max_model_len=LENGTH, block_size=BLOCK, num_blocks=20_000,
                               enable_prefix_caching=True)
    prompt = [9 + i % 500 for i in range(700)]
    run(scheduler, [prompt, prompt + [3] * 10])
    second = [s for s in scheduler.recorder.steps if s.kind == PREFILL][1]
    cell = grid_cell(38, 672, default_prefill_buckets(LENGTH), default_prefix_buckets(LENGTH))
    assert (second.cached_tokens, second.recomputed_tokens, second.prefix_bucket) == (
        672, cell.recomputed, cell.prefix_bucket)
    assert second.num_tokens_padded == cell.prefill_bucket
