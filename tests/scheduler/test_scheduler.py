"""The design document's examples, run on vLLM's real scheduler (no model, hand-built outputs)."""

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402

from neuron_batch.runtimes.buckets import BucketError  # noqa: E402
from neuron_batch.scheduler import NeuronAsyncScheduler, NeuronScheduler  # noqa: E402
from neuron_batch.scheduler.harness import (  # noqa: E402
    drive,
    fake_model_output,
    make_request,
    make_scheduler,
)
from neuron_batch.scheduler.records import SchedulerState, iter_records, read_records  # noqa: E402

BOTH = [NeuronScheduler, NeuronAsyncScheduler]


def prefill_chunks(result, req_id):
    """(actual, padded, computed_before) of every prefill chunk of a request."""
    chunks = []
    for out in result.outputs:
        before = {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs}
        before.update(zip(out.scheduled_cached_reqs.req_ids,
                          out.scheduled_cached_reqs.num_computed_tokens))
        if req_id in out.num_scheduled_tokens and out.num_scheduled_tokens[req_id] > 1:
            chunks.append((out.num_scheduled_tokens[req_id],
                           out.num_scheduled_tokens_padded[req_id], before[req_id]))
    return chunks


@pytest.mark.parametrize("cls", BOTH)
def test_32000_token_prompt_runs_in_four_8192_token_chunks(cls):
    sched = make_scheduler(cls, max_num_batched_tokens=8192, max_model_len=32768)
    request = make_request(32_000, 3, req_id="long")
    result = drive(sched, [request])
    assert prefill_chunks(result, "long") == [
        (8192, 8192, 0), (8192, 8192, 8192), (8192, 8192, 16384), (7424, 8192, 24576)]
    states = [step.state for step in sched.recorder.steps[:4]]
    assert states == ["ACTIVE_PREFILL"] * 4          # stays in prefill across all chunks
    assert sched.recorder.steps[4].state == "ACTIVE_DECODE"
    assert result.finished == {"long": 3}


@pytest.mark.parametrize("cls", BOTH)
def test_5000_token_prompt_padded_to_8192_advances_by_5000(cls):
    sched = make_scheduler(cls, max_num_batched_tokens=8192, max_model_len=8192,
                           neuron_config={"num_batched_tokens_buckets": [8192]})
    request = make_request(5000, 2, req_id="r")
    sched.add_request(request)
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"r": 5000}
    assert out.num_scheduled_tokens_padded == {"r": 8192}
    assert request.num_computed_tokens == 5000          # not 8192: no accounting bug
    sched.update_from_output(out, fake_model_output(out, {"r": request}))
    out = sched.schedule()                              # next step is a decode of 1 token
    assert out.num_scheduled_tokens == {"r": 1}
    assert out.num_scheduled_tokens_padded == {"r": 1}
    assert out.num_seqs_padded == 1
    assert sched.state is SchedulerState.ACTIVE_DECODE


@pytest.mark.parametrize("cls", BOTH)
def test_prefix_cache_hit_pads_only_the_new_tokens(cls):
    # 1,000 of the second request's 5,000 tokens are cached (block size 8 keeps 1,000 aligned).
    sched = make_scheduler(cls, block_size=8, enable_prefix_caching=True,
                           max_num_batched_tokens=8192, max_model_len=8192)
    shared = [7 + i % 900 for i in range(1000)]
    first = make_request(1000, 1, req_id="first", prompt_token_ids=shared, block_size=8)
    drive(sched, [first])
    second_ids = shared + [11 + i % 700 for i in range(4000)]
    second = make_request(5000, 1, req_id="second", prompt_token_ids=second_ids, block_size=8)
    result = drive(sched, [second])
    assert prefill_chunks(result, "second") == [(4000, 4096, 1000)]
    assert sched.recorder.requests["second"].num_cached_tokens == 1000
    assert result.finished == {"second": 1}


@pytest.mark.parametrize("cls", BOTH)
def test_decode_batch_gets_its_batch_bucket(cls):
    sched = make_scheduler(cls, max_num_seqs=8,
                           neuron_config={"num_seqs_buckets": [1, 2, 4, 8]})
    drive(sched, [make_request(40, 4) for _ in range(3)])
    decode_steps = [s for s in sched.recorder.steps if s.kind == "decode"]
    assert decode_steps and all(s.num_seqs == 3 and s.num_seqs_padded == 4 and s.bucket == 4
                                for s in decode_steps)


@pytest.mark.parametrize("cls", BOTH)
def test_new_prefill_hides_running_decodes_and_restores_them(cls):
    sched = make_scheduler(cls, max_num_seqs=4)
    a, b = make_request(100, 50, req_id="a"), make_request(100, 50, req_id="b")
    sched.add_request(a)
    out = sched.schedule()
    sched.update_from_output(out, fake_model_output(out, {"a": a}))
    sched.add_request(b)
    out = sched.schedule()                        # b prefills; a's decode waits
    assert list(out.num_scheduled_tokens) == ["b"]
    assert [r.request_id for r in sched.running] == ["b", "a"]
    assert sched.max_num_running_reqs == 4        # the lowered cap is restored
    sched.update_from_output(out, fake_model_output(out, {"a": a, "b": b}))
    out = sched.schedule()                        # both decode together
    assert sorted(out.num_scheduled_tokens) == ["a", "b"]


@pytest.mark.parametrize("cls", BOTH)
def test_admission_refusals_are_counted_by_reason(cls):
    sched = make_scheduler(cls, max_num_seqs=2, max_num_batched_tokens=256, max_model_len=1024)
    drive(sched, [make_request(600, 3) for _ in range(4)])
    blocked = sched.recorder.blocked_counts
    assert blocked["prefill_batch_full"] > 0        # 4 waiting, one admitted a step
    assert blocked["prefill_in_running"] > 0        # 600 tokens take 3 chunks of 256
    assert blocked["at_capacity"] > 0               # 2 running at max_num_seqs=2
    assert blocked["kv_saturated"] == 0


# -- the deadlock of the design's last section ---------------------------------------------

RULES = ["request", "max_model_len"]


def deadlock_setup(cls, kv_reserve=None):
    # max_num_seqs = 64, but the KV cache holds 2 requests at max_model_len (32 blocks each).
    return make_scheduler(cls, max_num_seqs=64, max_num_batched_tokens=1024, max_model_len=1024,
                          num_blocks=70, block_size=32, kv_reserve=kv_reserve)


@pytest.mark.parametrize("kv_reserve", RULES)
@pytest.mark.parametrize("cls", BOTH)
def test_no_deadlock_when_max_num_seqs_exceeds_kv_capacity(cls, kv_reserve):
    # 600 + 300 tokens reach 29 blocks of 32: two fit in 69 under either rule.
    sched = deadlock_setup(cls, kv_reserve)
    assert sched._max_kv_concurrent == 2
    requests = [make_request(600, 300) for _ in range(10)]
    result = drive(sched, requests, max_steps=20_000)
    assert len(result.finished) == 10 and set(result.finished.values()) == {300}
    assert sched.recorder.blocked_counts["kv_saturated"] > 0
    assert max(s.num_running for s in sched.recorder.steps) <= 2


def test_without_the_kv_check_the_same_workload_gets_stuck():
    """The guard above is what makes it pass: switched off (as the AWS code does when its
    estimate is 0), the same workload livelocks behind a prefill that can never get blocks."""
    sched = deadlock_setup(NeuronScheduler, "max_model_len")
    sched._max_kv_concurrent = sched.max_num_seqs
    with pytest.raises(RuntimeError, match="no completion"):
        drive(sched, [make_request(600, 300) for _ in range(10)], max_steps=3_000,
              keep_outputs=False)


def test_kv_cache_smaller_than_one_request_is_refused_with_numbers():
    with pytest.raises(ValueError, match=r"holds 19 blocks x 32 tokens = 608 tokens.*"
                                         r"max_model_len = 1,024.*at most 608"):
        make_scheduler(NeuronScheduler, max_model_len=1024, max_num_batched_tokens=1024,
                       num_blocks=20, block_size=32, kv_reserve="max_model_len")


def test_mixed_batch_raises(monkeypatch):
    """If the base scheduler ever returned prefill and decode together, the step fails loudly."""
    sched = make_scheduler(NeuronScheduler, max_num_seqs=4)
    a = make_request(100, 50, req_id="a")
    drive_one = sched.schedule()  # nothing yet: empty step
    sched.update_from_output(drive_one, fake_model_output(drive_one, {}))
    sched.add_request(a)
    out = sched.schedule()
    sched.update_from_output(out, fake_model_output(out, {"a": a}))
    sched.add_request(make_request(100, 5, req_id="b"))
    # Sabotage the separation: let the base see decodes and the new prefill together.
    monkeypatch.setattr(sched, "admission_refusal", lambda *a, **k: None)
    monkeypatch.setattr(NeuronScheduler, "_lower_running_caps", lambda self, n: None)
    original = Scheduler.schedule

    def unhidden(self, *args, **kwargs):
        self.running = self.running + [r for r in sched.requests.values()
                                       if r not in self.running and r.request_id == "a"]
        return original(self, *args, **kwargs)
    monkeypatch.setattr(NeuronScheduler, "_call_base_schedule", unhidden)
    with pytest.raises(RuntimeError, match=r"Mixed prefill \(1\) and decode \(1\)"):
        sched.schedule()


def test_invalid_neuron_config_buckets_fail_at_start_up():
    with pytest.raises(BucketError, match=r"must equal min\(max_num_batched_tokens, "
                                          r"max_model_len\) = 2048"):
        make_scheduler(NeuronScheduler, max_num_batched_tokens=2048, max_model_len=4096,
                       neuron_config={"num_batched_tokens_buckets": [512, 1024]})


def test_state_machine_walks_idle_prefill_decode_idle():
    sched = make_scheduler(NeuronScheduler)
    assert sched.state is SchedulerState.IDLE
    drive(sched, [make_request(50, 3)])
    states = [s.state for s in sched.recorder.steps]
    assert states[0] == "ACTIVE_PREFILL"
    assert "ACTIVE_DECODE" in states
    assert sched.state is SchedulerState.IDLE


def test_records_stream_to_jsonl_and_read_back(tmp_path):
    path = tmp_path / "records.jsonl"
    sched = make_scheduler(NeuronScheduler, max_num_seqs=2,
                           neuron_batch_config={"records_path": str(path)})
    drive(sched, [make_request(300, 4) for _ in range(3)])
    sched.shutdown()
    records = read_records(path)
    assert records.config.max_num_seqs == 2 and records.config.decode_buckets == [1, 2]
    assert len(records.steps) == len(sched.recorder.steps)
    assert [s.kind for s in records.steps] == [s.kind for s in sched.recorder.steps]
    assert all(s.t_end is not None and s.t_end >= s.t_start for s in records.steps)
    assert sorted(r.num_output_tokens for r in records.requests) == [4, 4, 4]
    assert records.blocked_counts == sched.recorder.blocked_counts
    for request in records.requests:
        assert request.arrival <= request.admitted <= request.first_token <= request.finished


def test_records_reach_the_file_when_flushed_after_the_update(tmp_path):
    """A replica's actor flushes the scheduler's records (same thread) before it reads a
    finished request's record from the file (replicas/actor.py): the update that finished a
    request has buffered its record, and the flush writes it out."""
    path = tmp_path / "records.jsonl"
    sched = make_scheduler(NeuronScheduler, max_num_seqs=2,
                           neuron_batch_config={"records_path": str(path)})
    sched.recorder.flush_seconds = float("inf")   # no timed flush: only the caller's
    update = sched.update_from_output
    on_disk_before, on_disk_after = [], []

    def update_and_look(output, model_output):
        outputs = update(output, model_output)
        finished = [out.request_id for client in outputs.values()
                    for out in client.outputs if out.finish_reason is not None]
        before = on_disk()
        sched.recorder.flush()
        after = on_disk()
        on_disk_before.extend(req_id in before for req_id in finished)
        on_disk_after.extend(req_id in after for req_id in finished)
        return outputs

    def on_disk() -> set[str]:
        return {r.req_id for kind, r in iter_records(path) if kind == "request"}

    sched.update_from_output = update_and_look
    drive(sched, [make_request(300, 4) for _ in range(3)] + [make_request(40, 9)])
    assert len(on_disk_after) == 4
    assert all(on_disk_after) and not any(on_disk_before)


def test_injected_clock_times_the_records():
    ticks = iter(range(1_000_000))
    sched = make_scheduler(NeuronScheduler,
                           neuron_batch_config={"clock": "time:perf_counter"})
    assert sched.recorder.clock.__name__ == "perf_counter"
    sched.recorder.clock = lambda: float(next(ticks))
    drive(sched, [make_request(50, 2)])
    times = [(s.t_start, s.t_end) for s in sched.recorder.steps]
    assert times == sorted(times) and all(isinstance(t, float) for pair in times for t in pair)


def test_step_record_is_built_in_its_field_order():
    from dataclasses import fields

    from neuron_batch.scheduler.neuron import STEP_FIELDS_FILLED
    from neuron_batch.scheduler.records import StepRecord

    names = tuple(f.name for f in fields(StepRecord))
    assert names[:len(STEP_FIELDS_FILLED)] == STEP_FIELDS_FILLED


@pytest.mark.parametrize("cls", BOTH)
def test_decode_only_steps_skip_classifying_and_agree_with_it(cls, monkeypatch):
    """schedule() tells _pad_and_record when only running decodes went into the base; the
    per-request classification it then skips finds exactly that: no prefill, every one a decode."""
    from neuron_batch.scheduler.prefills import split_prefills

    sched = make_scheduler(cls, max_num_seqs=4, max_num_batched_tokens=1024,
                           max_model_len=1024)
    original = cls._pad_and_record
    fast: list[bool] = []

    def checked(self, output, t_start, blocked, num_waiting, only_decodes=False):
        fast.append(only_decodes)
        if only_decodes:
            cached = output.scheduled_cached_reqs
            assert split_prefills(output, self.requests) == (
                {}, 0, len(cached.req_ids), sum(cached.num_computed_tokens))
        return original(self, output, t_start, blocked, num_waiting, only_decodes)
    monkeypatch.setattr(cls, "_pad_and_record", checked)
    arrivals = {5: [make_request(300, 4)], 9: [make_request(40, 30) for _ in range(3)]}
    result = drive(sched, [make_request(700, 20), make_request(50, 6)], arrivals=arrivals,
                   overlap=cls is NeuronAsyncScheduler)
    assert len(result.finished) == 6
    assert fast.count(True) > 10 and fast.count(False) > 5
    steps = sched.recorder.steps
    assert len(steps) == len(fast)
    assert {s.kind for s, f in zip(steps, fast) if f} <= {"decode", "empty"}
    assert {s.kind for s, f in zip(steps, fast) if not f} == {"prefill"}
