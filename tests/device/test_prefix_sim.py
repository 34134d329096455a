"""Prefix caching on the simulated device, per runtime, through vLLM's real engine and KV
manager: hits come from vLLM's prefix cache over the pool the runtime has (nxdi: the block
layout, as many blocks as the static slots; vllm-neuron: the paged cache); the scheduler
records the shape each prefill runs on (nxdi: the (prefill, prefix) grid cell of
runtimes/prefix_grid.py; vllm-neuron: the new tokens padded to a token bucket) and the executor
charges exactly that shape, with NxDI's block-KV gather on NeuronCore-v2 decodes."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402

from neuron_batch.device.executor import engine_core, shutdown_llm, sim_executor  # noqa: E402
from neuron_batch.device.hardware import get_instance  # noqa: E402
from neuron_batch.device.target import Target, sim_engine_kwargs  # noqa: E402
from neuron_batch.runtimes.buckets import bucket_for  # noqa: E402
from neuron_batch.runtimes.prefix_grid import (  # noqa: E402
    default_prefill_buckets,
    default_prefix_buckets,
    default_tkg_buckets,
    grid_cell,
)
from neuron_batch.runtimes.runtime import KV_SEGMENT_SIZE, NXDI, VLLM_NEURON, get_runtime  # noqa: E402
from neuron_batch.scheduler.harness import drive, make_request, make_scheduler  # noqa: E402
from neuron_batch.scheduler.neuron import NeuronScheduler  # noqa: E402
from neuron_batch.scheduler.records import DECODE, PREFILL  # noqa: E402

INF2_8X = get_instance("inf2.8xlarge")
MAX_MODEL_LEN = 4096
SEQS = 4
SHARED = [7 + (i * 13) % 5000 for i in range(1024)]     # a 1,024-token instruction
OWN = [300, 900, 40, 1500, 700, 260]                     # each request's own tokens
MAX_TOKENS = 6


def _prompts():
    return [{"prompt_token_ids": SHARED + [6000 + (n * 31 + j) % 9000 for j in range(own)]}
            for n, own in enumerate(OWN)]


def _run(tmp_path, prefix_caching: bool, **device):
    kwargs = sim_engine_kwargs(**device, max_model_len=MAX_MODEL_LEN, max_num_seqs=SEQS,
                               max_num_batched_tokens=2048, workdir=tmp_path,
                               prefix_caching=prefix_caching)
    llm = LLM(**kwargs)
    try:
        outputs = llm.generate(_prompts(), SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True,
                                                           detokenize=False), use_tqdm=False)
        core = engine_core(llm)
        scheduler, executor = core.scheduler, sim_executor(llm)
        blocks = core.vllm_config.cache_config.num_gpu_blocks
    finally:
        shutdown_llm(llm)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [MAX_TOKENS] * len(OWN)
    return scheduler, executor, blocks


@pytest.fixture(scope="module")
def nxdi_on(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("on"), True, instance=INF2_8X, arch="llama-3-8b")


def test_nxdi_later_prefills_hit_the_shared_prefix_and_run_on_its_grid_cell(nxdi_on):
    scheduler, executor, blocks = nxdi_on
    # The block layout holds as many blocks as the static slots (+ vLLM's null block).
    assert blocks == SEQS * (MAX_MODEL_LEN // 32) + 1
    assert scheduler.recorder.config.enable_prefix_caching
    prefills = [s for s in scheduler.recorder.steps if s.kind == PREFILL]
    assert len(prefills) == len(OWN)
    first, later = prefills[0], prefills[1:]
    assert first.cached_tokens == 0 and first.prefix_bucket == 0
    prefill_b = default_prefill_buckets(MAX_MODEL_LEN)
    prefix_b = default_prefix_buckets(MAX_MODEL_LEN)
    for step, own in zip(later, OWN[1:]):
        # vLLM's hits: the whole 32-token blocks of the shared instruction.
        assert step.cached_tokens == 1024
        assert step.num_tokens == own                       # only the new tokens
        cell = grid_cell(own, 1024, prefill_b, prefix_b)
        assert (step.num_tokens_padded, step.prefix_bucket, step.recomputed_tokens) == (
            cell.prefill_bucket, cell.prefix_bucket, cell.recomputed)
        assert step.context_tokens == 1024
    # 40 own tokens: 472 of the prefix move into the 512 bucket's spare room; 552 stay.
    small = later[1]
    assert (small.num_tokens_padded, small.prefix_bucket, small.recomputed_tokens) == (
        512, 1024, 472)
    # 1,500 own tokens: (2048, 512) with 548 of the prefix moved into the bucket's room.
    big = later[2]
    assert (big.num_tokens_padded, big.prefix_bucket, big.recomputed_tokens) == (2048, 512, 548)


def test_nxdi_steps_are_charged_the_grid_cell_and_the_block_gather(nxdi_on):
    scheduler, executor, _ = nxdi_on
    model = executor.cost_model
    assert model.gathers_block_kv              # inf2 is NeuronCore-v2
    tkg = default_tkg_buckets(MAX_MODEL_LEN)
    for step in scheduler.recorder.steps:
        if step.kind == PREFILL:
            assert step.t_end - step.t_start == pytest.approx(
                model.prefill_time(step.num_tokens_padded, step.prefix_bucket))
        elif step.kind == DECODE:
            assert step.attended_len in tkg and step.attended_len >= 256
            gathered = step.num_seqs_padded * step.attended_len
            expected = model.decode_time(step.num_seqs_padded, step.num_seqs_padded
                                         * step.attended_len, gathered)
            assert step.t_end - step.t_start == pytest.approx(expected)
            assert expected > model.decode_time(step.num_seqs_padded, gathered)
    # Graphs: the 4 x 5 grid plus 5 token-generation buckets from 256.
    assert scheduler.shapes.num_graphs == 4 * 5 + 5


def test_nxdi_without_prefix_caching_computes_every_prompt_whole(tmp_path, nxdi_on):
    scheduler, executor, _ = _run(tmp_path, False, instance=INF2_8X, arch="llama-3-8b")
    prefills = [s for s in scheduler.recorder.steps if s.kind == PREFILL]
    assert all(s.cached_tokens == 0 and s.prefix_bucket is None for s in prefills)
    assert sorted(s.num_tokens for s in prefills) == sorted(1024 + own for own in OWN)
    assert not executor.cost_model.gathers_block_kv
    on = nxdi_on[0].recorder.steps
    prefill_s = {True: sum(s.t_end - s.t_start for s in on if s.kind == PREFILL),
                 False: sum(s.t_end - s.t_start for s in scheduler.recorder.steps
                            if s.kind == PREFILL)}
    assert prefill_s[True] < prefill_s[False]       # the hits saved prefill time


def test_vllm_neuron_pads_only_the_new_tokens_and_reads_the_prefix_in_segments(tmp_path):
    scheduler, executor, _ = _run(tmp_path, True, instance=get_instance("trn2.3xlarge"),
                                  arch="llama-3-8b")
    model = executor.cost_model
    assert not model.gathers_block_kv
    buckets = scheduler.shapes.prefill_buckets
    prefills = [s for s in scheduler.recorder.steps if s.kind == PREFILL]
    hits = [s for s in prefills if s.cached_tokens]
    assert len(hits) >= len(OWN) - 1
    for step in prefills:
        assert step.prefix_bucket is None and step.recomputed_tokens == 0
        assert step.num_tokens_padded == bucket_for(step.num_tokens, buckets)
        read = -(-step.context_tokens // KV_SEGMENT_SIZE) * KV_SEGMENT_SIZE
        assert step.t_end - step.t_start == pytest.approx(
            model.prefill_time(step.num_tokens_padded, read))


def test_the_engine_and_the_target_must_agree_on_prefix_caching(tmp_path):
    kwargs = sim_engine_kwargs(instance=INF2_8X, arch="llama-3-8b",
                               max_model_len=MAX_MODEL_LEN, max_num_seqs=SEQS,
                               max_num_batched_tokens=2048, workdir=tmp_path,
                               prefix_caching=False)
    kwargs["enable_prefix_caching"] = True
    with pytest.raises(Exception, match="prefix_caching"):
        LLM(**kwargs)


def test_the_target_describes_the_block_layout():
    target = Target.resolve(instance=INF2_8X, arch="llama-3-8b",
                            max_model_len=MAX_MODEL_LEN, max_num_seqs=SEQS, prefix_caching=True)
    kv = target.describe(num_prefill_buckets=20, num_decode_buckets=5)["kv_cache"]
    assert kv["layout"] == "block"
    assert kv["pa_num_blocks"] == SEQS * MAX_MODEL_LEN // 32 + 1
    assert Target.from_dict(target.to_dict()).prefix_caching
    off = Target.resolve(instance=INF2_8X, arch="llama-3-8b",
                         max_model_len=MAX_MODEL_LEN, max_num_seqs=SEQS)
    assert off.describe(num_prefill_buckets=7, num_decode_buckets=7)["kv_cache"]["layout"] \
        == "static"


# -- invariants over random workloads with shared prefixes (vLLM's real scheduler) -----------
_workloads = st.lists(st.tuples(st.integers(0, 3),            # which shared prefix
                                st.sampled_from([0, 64, 512, 1000, 1536]),  # its length
                                st.integers(1, 1200),          # own tokens
                                st.integers(1, 12)),           # max_tokens
                      min_size=1, max_size=12)


@pytest.mark.parametrize("runtime", [NXDI, VLLM_NEURON])
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(workload=_workloads)
def test_prefix_caching_keeps_the_scheduler_s_invariants(runtime, workload):
    sched = make_scheduler(NeuronScheduler, max_num_seqs=4, max_num_batched_tokens=1024,
                           max_model_len=4096, num_blocks=4 * 4096 // 32 + 1,
                           enable_prefix_caching=True, runtime=get_runtime(runtime))
    requests = []
    for n, (group, shared, own, max_tokens) in enumerate(workload):
        prefix = [11 + (group * 977 + j) % 900 for j in range(shared)]
        ids = prefix + [1 + (n * 7919 + j) % 1000 for j in range(own)]
        requests.append(make_request(len(ids), max_tokens, prompt_token_ids=ids,
                                     req_id=f"r{n}"))
    result = drive(sched, requests)
    # No request lost: each finished with exactly its tokens.
    assert result.finished == {f"r{n}": w[3] for n, w in enumerate(workload)}
    steps = sched.recorder.steps
    shapes = sched.shapes
    for step in steps:
        if step.kind == PREFILL:
            assert step.num_seqs == 1                     # no mixed batch, one prefill
            assert step.num_tokens_padded >= step.num_tokens + step.recomputed_tokens
            assert step.num_tokens_padded in shapes.prefill_buckets
            if runtime == NXDI:
                assert step.prefix_bucket in shapes.prefix_buckets
                assert step.prefix_bucket >= step.cached_tokens - step.recomputed_tokens
            else:
                assert step.prefix_bucket is None and step.recomputed_tokens == 0
        elif step.kind == DECODE:
            assert step.num_seqs_padded >= step.num_seqs
    # FIFO admission: requests start in the order they arrived.
    admitted = [sched.recorder.requests[f"r{n}"].admitted for n in range(len(workload))]
    assert admitted == sorted(admitted)
    hits = sum(s.cached_tokens for s in steps)
    assert hits == sum(r.num_cached_tokens for r in sched.recorder.requests.values())
