"""The simulated Neuron device: the whole vLLM engine with NeuronScheduler and
NeuronSimExecutor (no model), timed by the cost model on a virtual clock.

Engines are built sparingly (about a second each, in-process); each test class or fixture runs
one small offline workload and reads the scheduler's records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vllm import LLM, SamplingParams  # noqa: E402

from neuron_batch.device import virtual_clock  # noqa: E402
from neuron_batch.device.architectures import get_architecture  # noqa: E402
from neuron_batch.device.cost_model import (  # noqa: E402
    CapacityError,
    StepCostModel,
    kv_capacity,
    load_profile,
)
from neuron_batch.device.executor import (  # noqa: E402
    NeuronSimExecutor,
    engine_core,
    shutdown_llm,
    sim_executor,
)
from neuron_batch.device.hardware import get_instance  # noqa: E402
from neuron_batch.device.target import (  # noqa: E402
    SimError,
    describe_sim,
    sim_engine_kwargs,
)
from neuron_batch.runtimes.runtime import VLLM_NEURON, get_runtime  # noqa: E402
from neuron_batch.scheduler.records import DECODE, EMPTY, PREFILL, iter_records  # noqa: E402

#: These tests are about the seed design's paged device (the Beta plugin's shapes);
#: tests/device/test_sim_nxdi.py covers NxDI's static one.
PAGED = get_runtime(VLLM_NEURON)
MAX_MODEL_LEN = 4096
MAX_BATCHED = 2048

# (prompt_len, max_tokens): bucket edges, one-token prompts, a segmented prefill (> 2048).
MAIN_WORKLOAD = [
    (1, 5), (31, 12), (32, 1), (33, 20), (127, 3), (128, 17), (129, 9), (300, 40),
    (511, 2), (512, 25), (513, 11), (1000, 7), (1023, 30), (1024, 4), (1025, 16),
    (2047, 6), (2048, 22), (2049, 13), (3000, 8), (4000, 33), (64, 38), (700, 1),
    (1500, 19), (250, 27),
]


@dataclass
class Run:
    device: dict              # Target.resolve's keywords
    max_num_seqs: int
    workload: list
    outputs: list
    recorder: object          # the NeuronScheduler's Recorder (in memory, after shutdown)
    executor: NeuronSimExecutor
    num_gpu_blocks: int
    scheduler_blocks: int
    records_path: Path | None


def prompt_ids(index: int, length: int) -> list[int]:
    return [1000 + (index * 7919 + j) % 20000 for j in range(length)]


def run_workload(tmp: Path, workload, *, device: dict | None = None,
                 max_num_seqs: int = 8, max_model_len: int = MAX_MODEL_LEN,
                 max_num_batched_tokens: int = MAX_BATCHED, records: str | None = None,
                 neuron_config: dict | None = None, kv_reserve: str = "request") -> Run:
    device = device or dict(runtime=PAGED)
    kwargs = sim_engine_kwargs(**device, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=max_num_batched_tokens, workdir=tmp,
                               kv_reserve=kv_reserve)
    records_path = tmp / records if records else None
    if records_path is not None:
        kwargs["additional_config"]["neuron_batch"]["records_path"] = str(records_path)
    if neuron_config is not None:
        kwargs["additional_config"]["neuron_config"] = neuron_config
    llm = LLM(**kwargs)
    try:
        prompts = [{"prompt_token_ids": prompt_ids(i, p)} for i, (p, _) in enumerate(workload)]
        params = [SamplingParams(max_tokens=m, ignore_eos=True, detokenize=False)
                  for _, m in workload]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        core = engine_core(llm)
        executor = sim_executor(llm)
        assert executor is not None
        num_gpu_blocks = core.vllm_config.cache_config.num_gpu_blocks
        scheduler_blocks = core.scheduler.kv_cache_config.num_blocks
        recorder = core.scheduler.recorder
    finally:
        shutdown_llm(llm)
    return Run(device, max_num_seqs, list(workload), outputs, recorder, executor,
               num_gpu_blocks, scheduler_blocks, records_path)


def throughput(run: Run) -> float:
    """Output tokens per simulated second (all requests arrive at 0)."""
    elapsed = max(r.finished for r in run.recorder.requests.values())
    return sum(r.num_output_tokens for r in run.recorder.requests.values()) / elapsed


def step_duration(step) -> float:
    return step.t_end - step.t_start


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sim")


@pytest.fixture(scope="module")
def main_run(workdir) -> Run:
    return run_workload(workdir, MAIN_WORKLOAD, records="main.jsonl")


# -- end to end ----------------------------------------------------------------------------------
def test_every_request_generates_exactly_max_tokens(main_run):
    assert len(main_run.outputs) == len(MAIN_WORKLOAD)
    token = main_run.executor.token_id
    for output, (prompt_len, max_tokens) in zip(main_run.outputs, MAIN_WORKLOAD):
        completion = output.outputs[0]
        assert len(output.prompt_token_ids) == prompt_len
        assert len(completion.token_ids) == max_tokens
        assert set(completion.token_ids) == {token}
        assert completion.finish_reason == "length"
    # the filler token is never one of the model's special tokens (so never EOS)
    assert token not in (1, 2)


def test_step_time_is_the_cost_model_time_of_the_padded_step(main_run):
    cost = StepCostModel(load_profile("inf2.8xlarge"), get_instance("inf2.8xlarge"),
                         get_architecture("llama-3-8b"), 2, runtime=PAGED)
    steps = main_run.recorder.steps
    assert steps and steps[0].t_start == 0.0
    kinds = {s.kind for s in steps}
    assert {PREFILL, DECODE} <= kinds
    for step in steps:
        assert step.t_end is not None
        assert step_duration(step) == pytest.approx(cost.step_time(step), rel=1e-9, abs=1e-12)
        if step.kind == EMPTY:
            assert step_duration(step) == 0.0
    # the clock moves only in steps: each step starts when the previous one ended
    for before, after in zip(steps, steps[1:]):
        assert after.t_start == before.t_end
    # padding is what the step was charged for: a prefill bucket and a decode batch bucket
    prefills = [s for s in steps if s.kind == PREFILL]
    assert any(s.num_tokens_padded > s.num_tokens for s in prefills)
    assert any(s.context_tokens > 0 for s in prefills)       # the segmented 2049+ prompts
    assert main_run.executor.clock.now == steps[-1].t_end


def test_request_times_are_consistent(main_run):
    requests = main_run.recorder.requests
    assert len(requests) == len(MAIN_WORKLOAD)
    by_id = {o.request_id: o for o in main_run.outputs}
    for req_id, record in requests.items():
        assert record.arrival == 0.0
        assert 0.0 <= record.admitted < record.first_token <= record.finished
        assert record.num_output_tokens == len(by_id[req_id].outputs[0].token_ids)
        assert record.finish_reason == "length"
    # a one-token request finishes in the step that produced its first token
    one = [r for r in requests.values() if r.num_output_tokens == 1]
    assert one and all(r.first_token == r.finished for r in one)


def test_request_ids_and_records_are_plain(main_run):
    # LLM's own ids, no random suffix: records are reproducible
    assert sorted(main_run.recorder.requests, key=int) == [str(i) for i in range(24)]


# -- KV-cache handshake ------------------------------------------------------------------------
def test_kv_handshake_answers_the_instance_kv_capacity(main_run):
    expected = kv_capacity(get_instance("inf2.8xlarge"), get_architecture("llama-3-8b"), 2,
                           "bf16", max_model_len=MAX_MODEL_LEN, block_size=32,
                           cap_fraction=0.30)["num_blocks"]
    assert main_run.num_gpu_blocks == expected
    assert main_run.scheduler_blocks == expected
    assert main_run.recorder.config.num_kv_blocks == expected
    assert main_run.recorder.config.block_size == 32
    described = describe_sim(runtime=PAGED, max_model_len=MAX_MODEL_LEN,
                             num_prefill_buckets=5,
                             num_decode_buckets=4)
    assert described["kv_cache"]["num_blocks"] == expected
    assert described["kv_cache"]["scheduler_max_concurrent"] == \
        main_run.recorder.config.max_kv_concurrent


def test_describe_sim_reports_the_device():
    d = describe_sim(instance=get_instance("inf2.48xlarge"), arch="llama-3-8b", runtime=PAGED,
                     max_model_len=8192, num_prefill_buckets=3, num_decode_buckets=2)
    assert d["instance"] == "inf2.48xlarge" and d["tp_degree"] == 24
    assert d["arch"] == "Llama-3-8B" and 7.9e9 < d["params"] < 8.1e9
    assert d["weight_dtype"] == "bf16"
    kv = d["kv_cache"]
    assert kv["tokens"] == kv["num_blocks"] * 32
    assert kv["max_concurrent_at_max_model_len"] == kv["num_blocks"] // 256
    assert d["compile"]["graphs"] == 5 and d["compile"]["estimated_compile_s"] > 0
    assert d["profile"]["source"] == "built-in inf2.48xlarge"


def test_weights_that_do_not_fit_raise_naming_instance_and_tp(workdir):
    with pytest.raises(CapacityError, match=r"TP 2 on inf2\.8xlarge"):
        sim_engine_kwargs(arch="llama-3-70b", runtime=PAGED, max_model_len=4096,
                          max_num_seqs=8,
                          max_num_batched_tokens=2048, workdir=workdir)
    with pytest.raises(CapacityError, match=r"inf2\.8xlarge"):
        describe_sim(arch="llama-3-70b", runtime=PAGED, max_model_len=4096,
                     num_prefill_buckets=1, num_decode_buckets=1)


def test_the_executor_itself_refuses_weights_that_do_not_fit(workdir):
    # Bypass the up-front check: the engine's own start-up must fail the same way.
    kwargs = sim_engine_kwargs(runtime=PAGED, max_model_len=4096, max_num_seqs=8,
                               max_num_batched_tokens=2048, workdir=workdir)
    kwargs["additional_config"]["neuron_batch"]["target"]["arch"] = "Llama-3-70B"
    with pytest.raises(Exception, match=r"TP 2 on inf2\.8xlarge"):
        LLM(**kwargs)


def test_unusable_settings_raise_clear_errors(workdir):
    with pytest.raises(SimError, match="Llama-3.1-8B"):   # Llama-3-8B has 8,192 positions
        sim_engine_kwargs(runtime=PAGED, max_model_len=16384, max_num_seqs=8,
                          max_num_batched_tokens=8192, workdir=workdir)
    with pytest.raises(ValueError, match="TP degree 3"):
        describe_sim(tp=3, runtime=PAGED, max_model_len=4096,
                     num_prefill_buckets=1,
                     num_decode_buckets=1)
    with pytest.raises(CapacityError, match="max_model_len"):
        # KV cache too small for one request of max_model_len (an error under that rule)
        sim_engine_kwargs(arch="llama-2-7b", tp=1, runtime=PAGED,
                          max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=2048,
                          workdir=workdir, kv_reserve="max_model_len")


def test_a_kv_cache_below_one_max_model_len_request_is_a_warning_under_request(workdir,
                                                                              caplog):
    """llama-2-7b on one NeuronCore has room for about 2,600 tokens, less than max_model_len
    4096: under kv_reserve=request this project only warns (the scheduler would run the
    requests that fit, see test_kv_reserve.py), but vLLM 0.32's engine start-up still refuses
    a cache that cannot hold one max_model_len request, with its own message."""
    with caplog.at_level("WARNING"):
        kwargs = sim_engine_kwargs(arch="llama-2-7b", tp=1, runtime=PAGED,
                                   max_model_len=4096, max_num_seqs=8,
                                   max_num_batched_tokens=2048, workdir=workdir)
    assert "less than one request of max_model_len = 4,096 tokens" in caplog.text
    with pytest.raises(ValueError, match="max seq len"):
        LLM(**kwargs)


# -- determinism ---------------------------------------------------------------------------------
def test_two_runs_give_identical_records(main_run, workdir):
    """Record for record (the blocks they are written in end where the wall clock says)."""
    again = run_workload(workdir, MAIN_WORKLOAD, records="again.jsonl")
    first = list(iter_records(main_run.records_path))
    second = list(iter_records(again.records_path))
    kinds = [kind for kind, _ in first]
    assert kinds.count("step") == len(main_run.recorder.steps)
    assert kinds.count("request") == len(MAIN_WORKLOAD)
    assert first == second
    # each engine had its own clock, both started at 0
    assert again.executor.clock is not main_run.executor.clock
    assert again.recorder.steps[0].t_start == 0.0


def test_the_scheduler_reads_the_engines_own_clock(main_run):
    assert main_run.recorder.clock is main_run.executor.clock
    assert main_run.executor.clock_name.startswith(virtual_clock.__name__ + ":engine_")


# -- sanity of the simulated figures -------------------------------------------------------------
SWEEP_WORKLOAD = [(150 + 37 * i % 400, 48) for i in range(36)]


@pytest.fixture(scope="module")
def sweep(workdir) -> dict[int, Run]:
    # max_model_len 8192 on inf2.8xlarge TP2: the KV cache holds 9 requests at that length
    # (the seed design's rule, which this sweep is about).
    return {n: run_workload(workdir, SWEEP_WORKLOAD, max_num_seqs=n, max_model_len=8192,
                            device=dict(arch="llama-3-8b", runtime=PAGED),
                            kv_reserve="max_model_len")
            for n in (1, 2, 4, 8, 16, 32)}


def test_throughput_grows_with_max_num_seqs_until_kv_binds(sweep):
    figures = {n: throughput(run) for n, run in sweep.items()}
    assert figures[1] < figures[2] < figures[4] < figures[8]
    cap = sweep[16].recorder.config.max_kv_concurrent
    assert cap == 9
    for n in (16, 32):
        assert max(s.num_running for s in sweep[n].recorder.steps) == cap
    # past the KV limit more max_num_seqs changes nothing (both pad 9 decodes to 16)
    assert figures[16] == figures[32]
    # and padding 9 decodes to 16 costs: Llama 3 (head_dim 128, bf16 KV) takes the Beta
    # plugin's path that reads a whole max_model_len of KV per padded slot, idle ones too
    assert figures[16] < figures[8]


@pytest.fixture(scope="module")
def chips(workdir) -> dict[str, Run]:
    workload = [(200 + 150 * i, 24 + i) for i in range(10)]
    return {inst: run_workload(workdir, workload, max_num_seqs=4,
                               device=dict(instance=get_instance(inst), arch="llama-3-8b",
                                           runtime=PAGED))
            for inst in ("inf2.8xlarge", "inf2.24xlarge", "inf2.48xlarge")}


def test_more_chips_lower_every_step_time(chips):
    small, medium, large = (chips[i].recorder.steps
                            for i in ("inf2.8xlarge", "inf2.24xlarge", "inf2.48xlarge"))
    assert [c.executor.target.tp for c in chips.values()] == [2, 12, 24]
    shape = [(s.kind, s.num_tokens_padded, s.num_seqs_padded, s.context_tokens) for s in small]
    # the scheduler's decisions do not depend on time: the same steps on all three
    for other in (medium, large):
        assert [(s.kind, s.num_tokens_padded, s.num_seqs_padded, s.context_tokens)
                for s in other] == shape
    for a, b, c in zip(small, medium, large):
        if a.kind != EMPTY:
            assert step_duration(a) > step_duration(b) > step_duration(c)
    assert throughput(chips["inf2.8xlarge"]) < throughput(chips["inf2.24xlarge"]) \
        < throughput(chips["inf2.48xlarge"])


def test_a_longer_prompt_never_prefills_faster(main_run):
    prefill_time: dict[str, float] = {}
    for step in main_run.recorder.steps:
        if step.kind == PREFILL:
            (req_id,) = step.req_ids
            prefill_time[req_id] = prefill_time.get(req_id, 0.0) + step_duration(step)
    by_length = sorted((main_run.recorder.requests[r].num_prompt_tokens, t)
                       for r, t in prefill_time.items())
    assert len(by_length) == len(MAIN_WORKLOAD)
    for (len_a, time_a), (len_b, time_b) in zip(by_length, by_length[1:]):
        # (durations are differences of clock readings: equal up to float rounding)
        assert time_a <= time_b * (1 + 1e-9), (len_a, len_b)
    # and through the executor's arithmetic for every length up to max_model_len
    executor = main_run.executor
    from neuron_batch.runtimes.buckets import bucket_for, default_prefill_buckets
    buckets = default_prefill_buckets(MAX_BATCHED, MAX_MODEL_LEN)
    previous = 0.0
    for length in range(1, MAX_MODEL_LEN + 1, 7):
        total, done = 0.0, 0
        while done < length:
            chunk = min(MAX_BATCHED, length - done)
            total += executor.cost_model.prefill_time(bucket_for(chunk, buckets), done)
            done += chunk
        assert total >= previous
        previous = total


def test_no_padding_waste_when_shapes_are_buckets(workdir):
    # every prompt is a prefill bucket; 16 equal requests decode in full batches of 8
    buckets = [128, 256, 512, 1024, 2048]
    workload = [(buckets[i % len(buckets)], 12) for i in range(16)]
    run = run_workload(workdir, workload, max_num_seqs=8)
    steps = [s for s in run.recorder.steps if s.kind != EMPTY]
    prefills = [s for s in steps if s.kind == PREFILL]
    decodes = [s for s in steps if s.kind == DECODE]
    assert len(prefills) == 16 and decodes
    assert sum(s.num_tokens_padded - s.num_tokens for s in prefills) == 0
    assert all(s.num_seqs == s.num_seqs_padded == 8 for s in decodes)
    # so the simulated time is that of the unpadded work
    cost = run.executor.cost_model
    unpadded = sum(cost.prefill_time(s.num_tokens, s.context_tokens) for s in prefills) + \
        sum(cost.decode_time(s.num_seqs, cost.decode_kv_tokens(s.num_seqs, s.attended_len,
                                                                s.context_tokens))
            for s in decodes)
    assert run.executor.clock.now == pytest.approx(unpadded, rel=1e-12)
    # while lengths off the buckets cost padding
    odd = run_workload(workdir, [(b - 1 if b > 128 else b + 1, m) for b, m in workload],
                       max_num_seqs=8)
    odd_prefills = [s for s in odd.recorder.steps if s.kind == PREFILL]
    assert sum(s.num_tokens_padded - s.num_tokens for s in odd_prefills) > 0


# -- vLLM multiprocessing: the engine core (executor + scheduler) in its own process ------------
MP_SCRIPT = r'''
import json, os, sys
from pathlib import Path
from vllm import LLM, SamplingParams
from neuron_batch.device.cost_model import StepCostModel, load_profile
from neuron_batch.device.executor import shutdown_llm
from neuron_batch.device.target import sim_engine_kwargs
from neuron_batch.device.architectures import get_architecture
from neuron_batch.device.hardware import get_instance
from neuron_batch.runtimes.runtime import get_runtime
from neuron_batch.scheduler.records import read_records

PAGED = get_runtime("vllm-neuron")

if __name__ == "__main__":
    workdir = Path(sys.argv[1])
    kwargs = sim_engine_kwargs(runtime=PAGED, max_model_len=4096, max_num_seqs=4,
                               max_num_batched_tokens=2048, workdir=workdir)
    kwargs["additional_config"]["neuron_batch"]["records_path"] = str(workdir / "mp.jsonl")
    llm = LLM(**kwargs)
    workload = [(100 + 300 * i, 5 + i) for i in range(8)]
    prompts = [{"prompt_token_ids": [1000 + j for j in range(p)]} for p, _ in workload]
    outputs = llm.generate(prompts,
                           [SamplingParams(max_tokens=m, ignore_eos=True, detokenize=False)
                            for _, m in workload], use_tqdm=False)
    shutdown_llm(llm)
    records = read_records(workdir / "mp.jsonl")
    cost = StepCostModel(load_profile("inf2.8xlarge"), get_instance("inf2.8xlarge"),
                         get_architecture("llama-3-8b"), 2, runtime=PAGED)
    print(json.dumps({
        "tokens": [len(o.outputs[0].token_ids) for o in outputs],
        "expected": [m for _, m in workload],
        "steps": len(records.steps),
        "first_t_start": records.steps[0].t_start,
        "max_error": max(abs((s.t_end - s.t_start) - cost.step_time(s)) for s in records.steps),
        "requests": [[r.arrival, r.admitted, r.first_token, r.finished, r.num_output_tokens]
                     for r in records.requests],
    }))
'''


def test_multiprocessing_engine_core_uses_the_virtual_clock(tmp_path):
    """With VLLM_ENABLE_V1_MULTIPROCESSING=1 the executor and the scheduler live in vLLM's
    engine-core process; the scheduler still finds the executor's clock by name."""
    import os
    import subprocess
    import sys

    script = tmp_path / "mp_run.py"
    script.write_text(MP_SCRIPT)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1", VLLM_LOGGING_LEVEL="ERROR")
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=240,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tokens"] == result["expected"]
    assert result["steps"] > 0 and result["first_t_start"] == 0.0
    assert result["max_error"] < 1e-9
    for arrival, admitted, first_token, finished, _num_output in result["requests"]:
        # arrivals are simulated times too (not all 0: vLLM's front end streams requests to
        # the engine-core process while it already runs steps)
        assert 0.0 <= arrival <= admitted < first_token <= finished < 1e4
    assert sorted(r[4] for r in result["requests"]) == sorted(result["expected"])
