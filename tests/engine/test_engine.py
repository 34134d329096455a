"""The Neuron scheduler inside vLLM's real engine (LLM -> engine core -> scheduler -> CPU model
runner), with a tiny randomly initialised llama model made from a local config.json, under
kv_reserve=request (the default rule)."""


import pytest

pytest.importorskip("vllm")

from neuron_batch.scheduler.records import read_records  # noqa: E402

PROMPT_LENS = [10, 300, 50, 700, 129, 128]
MAX_TOKENS = 6




def run_engine(model_dir, records_path, scheduler_cls, **extra):
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
              dtype="float32", max_model_len=1024, max_num_seqs=4, max_num_batched_tokens=256,
              seed=0, scheduler_cls=scheduler_cls, kv_cache_memory_bytes=256 << 20,
              additional_config={"neuron_config": {"num_batched_tokens_buckets": [128, 256],
                                                   "num_seqs_buckets": [1, 2, 4]},
                                 "neuron_batch": {"records_path": str(records_path),
                                                  "kv_reserve": "request"}},
              **extra)
    try:
        prompts = [{"prompt_token_ids": [3 + (i * 31 + j) % 500 for j in range(n)]}
                   for i, n in enumerate(PROMPT_LENS)]
        outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True),
                               use_tqdm=False)
    finally:
        llm.llm_engine.engine_core.shutdown()
    return outputs


def check_records(records):
    assert records.config.prefill_buckets == [128, 256]
    assert records.config.decode_buckets == [1, 2, 4]
    prefill = [s for s in records.steps if s.kind == "prefill"]
    decode = [s for s in records.steps if s.kind == "decode"]
    # prompts chunked at 256 tokens: 10, 256+44, 50, 256+256+188, 129, 128
    assert sorted(s.num_tokens for s in prefill) == sorted(
        [10, 256, 44, 50, 256, 256, 188, 129, 128])
    for step in prefill:
        assert step.num_seqs == 1 and step.num_tokens_padded in (128, 256)
        assert step.num_tokens_padded >= step.num_tokens
    for step in decode:
        assert step.num_seqs_padded in (1, 2, 4) and step.num_seqs_padded >= step.num_seqs
        assert step.state == "ACTIVE_DECODE"
    assert sum(s.num_seqs for s in decode) == len(PROMPT_LENS) * (MAX_TOKENS - 1)
    assert len(records.requests) == len(PROMPT_LENS)
    for request in records.requests:
        assert request.num_output_tokens == MAX_TOKENS
        assert request.arrival <= request.admitted <= request.first_token <= request.finished
    assert max(s.num_running for s in records.steps) <= 4
    # admission by each request's own need: nothing preempted, every block held was reserved
    assert records.config.kv_reserve == "request"
    assert sum(s.num_preempted for s in records.steps) == 0
    usable = records.config.num_kv_blocks - 1
    for step in records.steps:
        assert round(step.kv_usage * usable) <= step.kv_reserved_blocks <= usable
    assert max(s.kv_reserved_blocks for s in records.steps) > 0


def test_engine_runs_with_neuron_scheduler(tiny_model, tmp_path):
    outputs = run_engine(tiny_model, tmp_path / "records.jsonl",
                         "neuron_batch.scheduler.NeuronScheduler")
    assert [len(o.outputs[0].token_ids) for o in outputs] == [MAX_TOKENS] * len(PROMPT_LENS)
    check_records(read_records(tmp_path / "records.jsonl"))


def test_engine_runs_with_neuron_async_scheduler(tiny_model, tmp_path):
    outputs = run_engine(tiny_model, tmp_path / "records.jsonl",
                         "neuron_batch.scheduler.NeuronAsyncScheduler", async_scheduling=True)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [MAX_TOKENS] * len(PROMPT_LENS)
    records = read_records(tmp_path / "records.jsonl")
    assert records.config.scheduler_cls.endswith("NeuronAsyncScheduler")
    check_records(records)
