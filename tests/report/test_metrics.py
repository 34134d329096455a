"""metrics.summarize(): hand-computed scenarios, invariants over random runs, file round trip."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.report.metrics import percentile, summarize
from neuron_batch.scheduler.records import (
    BLOCK_REASONS,
    Recorder,
    Records,
    RequestRecord,
    RunConfig,
    StepRecord,
    read_records,
)

CONFIG = RunConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64, block_size=4,
                   num_kv_blocks=64, max_kv_concurrent=4, prefill_buckets=[4, 8, 16],
                   decode_buckets=[2, 4], scheduler_cls="NeuronScheduler")


def step(index, state, kind, req_ids, t_start, t_end, *, tokens=0, padded=0, seqs=0,
         seqs_padded=0, bucket=None, blocked=None):
    """A step record with only the fields the metrics read spelled out."""
    return StepRecord(step=index, state=state, kind=kind, req_ids=list(req_ids), num_tokens=tokens,
                      num_tokens_padded=padded, num_seqs=seqs, num_seqs_padded=seqs_padded,
                      bucket=bucket, context_tokens=0, blocked=blocked, num_waiting=0,
                      num_running=len(req_ids), kv_usage=0.0, t_start=t_start, t_end=t_end)


def prefill(index, req_id, t_start, t_end, tokens, bucket):
    return step(index, "ACTIVE_PREFILL", "prefill", [req_id], t_start, t_end, tokens=tokens,
                padded=bucket, seqs=1, seqs_padded=1, bucket=bucket)


def decode(index, req_ids, t_start, t_end, bucket):
    n = len(req_ids)
    return step(index, "ACTIVE_DECODE", "decode", req_ids, t_start, t_end, tokens=n, padded=n,
                seqs=n, seqs_padded=bucket, bucket=bucket)


def two_request_run() -> Records:
    """A (10-token prompt, 3 outputs) and B (5-token prompt, 5 outputs), both arriving at 0.

    0.5-0.6 empty step; A prefills in chunks 8 (bucket 8) and 2 (bucket 4), B in one chunk of
    5 (bucket 8); then decodes [A,B], [A,B], [B], [B] in batch bucket 2. Step 6 ends at 5.0
    and step 7 starts at 5.2 with B still running: that gap is decode time, not idle.
    """
    steps = [
        step(0, "IDLE", "empty", [], 0.5, 0.6),
        prefill(1, "A", 1.0, 2.0, tokens=8, bucket=8),
        prefill(2, "A", 2.0, 2.5, tokens=2, bucket=4),
        prefill(3, "B", 2.5, 3.5, tokens=5, bucket=8),
        decode(4, ["A", "B"], 3.5, 4.0, bucket=2),
        decode(5, ["A", "B"], 4.0, 4.5, bucket=2),
        decode(6, ["B"], 4.5, 5.0, bucket=2),
        decode(7, ["B"], 5.2, 5.5, bucket=2),
    ]
    requests = [
        RequestRecord("A", 10, arrival=0.0, admitted=1.0, first_token=2.5, finished=4.5,
                      num_output_tokens=3, finish_reason="length"),
        RequestRecord("B", 5, arrival=0.0, admitted=2.5, first_token=3.5, finished=5.5,
                      num_output_tokens=5, finish_reason="stop"),
    ]
    blocked = {"at_capacity": 0, "prefill_in_running": 2, "prefill_batch_full": 0,
               "kv_saturated": 1}
    return Records(CONFIG, steps, requests, blocked)


def approx_tree(value):
    """pytest.approx applied to every float in a nested dict (approx does not nest dicts)."""
    if isinstance(value, dict):
        return {key: approx_tree(item) for key, item in value.items()}
    if isinstance(value, float):
        return pytest.approx(value, abs=1e-12)
    return value


def test_two_request_run_every_key():
    report = summarize(two_request_run(), extra_config={"model": "tiny", "device": "inf2"})
    elapsed = 5.5  # earliest arrival 0.0 to the last step end / finish 5.5
    expected = {
        "elapsed_time": elapsed,
        "num_requests": 2,
        "total_num_tokens": 23,
        "requests_per_second": 2 / elapsed,
        "tokens_per_second": 23 / elapsed,
        "config": {**asdict(CONFIG), "model": "tiny", "device": "inf2", "compiled_graphs": 5},
        "requests": {"total": 2, "completed": 2, "failed": 0, "skipped": 0},
        "throughput": {"elapsed_s": elapsed, "requests_per_s": 2 / elapsed,
                       "input_tokens_per_s": 15 / elapsed, "output_tokens_per_s": 8 / elapsed,
                       "total_tokens_per_s": 23 / elapsed},
        "tokens": {"input": 15, "output": 8, "total": 23},
        "padding": {
            "prefill": {"actual_tokens": 15, "padded_tokens": 20, "waste_fraction": 0.25,
                        "by_bucket": {
                            "4": {"chunks": 1, "actual_tokens": 2, "padded_tokens": 4},
                            "8": {"chunks": 2, "actual_tokens": 13, "padded_tokens": 16},
                            "16": {"chunks": 0, "actual_tokens": 0, "padded_tokens": 0}}},
            "decode": {"actual_seqs": 6, "padded_seqs": 8, "waste_fraction": 0.25,
                       "by_bucket": {
                           "2": {"steps": 4, "actual_seqs": 6, "padded_seqs": 8},
                           "4": {"steps": 0, "actual_seqs": 0, "padded_seqs": 0}}},
        },
        # IDLE: 0-0.5 before the first step + the empty step's span 0.5-1.0.
        # PREFILL: 1.0-3.5. DECODE: 3.5-5.5 (5.0-5.2 is B waiting on the host: decode time).
        "states": {"IDLE": {"steps": 1, "seconds": 1.0},
                   "ACTIVE_PREFILL": {"steps": 3, "seconds": 2.5},
                   "ACTIVE_DECODE": {"steps": 4, "seconds": 2.0}},
        "admission_blocked": {"at_capacity": 0, "prefill_in_running": 2,
                              "prefill_batch_full": 0, "kv_saturated": 1},
        "latency": {
            # TTFT 2.5 and 3.5; E2E 4.5 and 5.5; TPOT (4.5-2.5)/2 = 1.0 and (5.5-3.5)/4 = 0.5.
            "ttft_s": {"mean": 3.0, "p50": 3.0, "p90": 3.4, "p99": 3.49},
            "tpot_s": {"mean": 0.75, "p50": 0.75, "p90": 0.95, "p99": 0.995},
            "e2e_s": {"mean": 5.0, "p50": 5.0, "p90": 5.4, "p99": 5.49},
        },
        "steps": {"total": 8, "prefill": 3, "decode": 4, "empty": 1},
        "preemptions": 0,
        "kv": {"num_blocks": 64, "peak_reserved_blocks": 0, "peak_used_blocks": 0,
               "mean_used_fraction": 0.0},
        # caching off: every prompt token computed; the bound needs the prompts' token ids
        "prefix_cache": {"enabled": False, "prompt_tokens": 15, "hit_tokens": 0,
                         "hit_fraction": 0.0, "recomputed_tokens": 0, "computed_tokens": 15,
                         "bound_tokens": None, "bound_fraction": None},
    }
    assert report == approx_tree(expected)
    assert list(report["padding"]["prefill"]["by_bucket"]) == ["4", "8", "16"]  # by size
    assert list(report["admission_blocked"]) == list(BLOCK_REASONS)
    assert json.loads(json.dumps(report)) == report  # JSON-ready as is


def test_given_elapsed_extends_last_span_and_idle_after_all_finished():
    report = summarize(two_request_run(), elapsed_s=6.0)
    # The last step spans 5.2-6.0; after its end at 5.5 nothing is in the system: idle.
    assert report["states"]["IDLE"]["seconds"] == pytest.approx(1.5)
    assert report["states"]["ACTIVE_DECODE"]["seconds"] == pytest.approx(2.0)
    assert report["states"]["ACTIVE_PREFILL"]["seconds"] == pytest.approx(2.5)
    assert report["elapsed_time"] == report["throughput"]["elapsed_s"] == 6.0
    assert report["throughput"]["output_tokens_per_s"] == pytest.approx(8 / 6.0)


def test_given_start_before_arrivals_counts_as_idle():
    report = summarize(two_request_run(), start=-1.0)
    assert report["throughput"]["elapsed_s"] == pytest.approx(6.5)
    assert report["states"]["IDLE"]["seconds"] == pytest.approx(2.0)


def test_negative_elapsed_is_refused():
    with pytest.raises(ValueError):
        summarize(two_request_run(), elapsed_s=-1.0)


def test_gap_with_no_request_in_system_is_idle():
    # X: 0-1, then nothing until Y arrives at 3 and runs 3-4.
    steps = [prefill(0, "X", 0.0, 1.0, tokens=3, bucket=4),
             prefill(1, "Y", 3.0, 4.0, tokens=4, bucket=4)]
    requests = [RequestRecord("X", 3, 0.0, 0.0, 1.0, 1.0, num_output_tokens=1),
                RequestRecord("Y", 4, 3.0, 3.0, 4.0, 4.0, num_output_tokens=1)]
    report = summarize(Records(CONFIG, steps, requests, {}))
    assert report["states"]["IDLE"] == {"steps": 0, "seconds": 2.0}
    assert report["states"]["ACTIVE_PREFILL"] == {"steps": 2, "seconds": 2.0}
    # One output token each: TTFT and E2E exist, TPOT has nothing to describe.
    assert report["latency"]["tpot_s"] == {"mean": None, "p50": None, "p90": None, "p99": None}
    assert report["latency"]["e2e_s"]["mean"] == pytest.approx(1.0)
    assert report["admission_blocked"] == dict.fromkeys(BLOCK_REASONS, 0)


def test_steps_without_end_use_next_start_or_their_own_start():
    steps = [prefill(0, "X", 0.0, None, tokens=3, bucket=4),   # ran until step 1 began
             decode(1, ["X"], 1.0, 2.0, bucket=2),
             decode(2, ["X"], 2.0, None, bucket=2)]             # never came back
    requests = [RequestRecord("X", 3, 0.0)]                   # never finished
    report = summarize(Records(CONFIG, steps, requests, {}))
    assert report["throughput"]["elapsed_s"] == pytest.approx(2.0)  # to the last t_start
    assert report["states"]["ACTIVE_PREFILL"]["seconds"] == pytest.approx(1.0)
    assert report["states"]["ACTIVE_DECODE"]["seconds"] == pytest.approx(1.0)
    # With a longer wall time the unfinished request keeps the engine busy, not idle.
    longer = summarize(Records(CONFIG, steps, requests, {}), elapsed_s=5.0)
    assert longer["states"]["ACTIVE_DECODE"]["seconds"] == pytest.approx(4.0)
    assert longer["states"]["IDLE"]["seconds"] == 0.0
    assert longer["requests"]["completed"] == 0
    assert longer["tokens"] == {"input": 0, "output": 0, "total": 0}


def test_caller_counts_override_defaults():
    report = summarize(two_request_run(), total=5, failed=1, skipped=2)
    assert report["requests"] == {"total": 5, "completed": 2, "failed": 1, "skipped": 2}
    assert report["num_requests"] == 2  # vLLM's field counts what was measured


def test_empty_records():
    report = summarize(Records(None, [], [], {}))
    assert report["elapsed_time"] == 0.0
    assert report["requests_per_second"] == report["tokens_per_second"] == 0.0
    assert report["config"] == {"compiled_graphs": 0}
    assert report["padding"]["prefill"] == {"actual_tokens": 0, "padded_tokens": 0,
                                            "waste_fraction": 0.0, "by_bucket": {}}
    assert report["states"]["IDLE"] == {"steps": 0, "seconds": 0.0}
    assert report["latency"]["ttft_s"]["p99"] is None
    assert report["steps"] == {"total": 0, "prefill": 0, "decode": 0, "empty": 0}
    # Wall time with no steps at all is idle time.
    assert summarize(Records(None, [], [], {}), elapsed_s=3.0)["states"]["IDLE"]["seconds"] == 3.0


def test_unconfigured_buckets_are_listed_in_size_order():
    steps = [prefill(0, "X", 0.0, 1.0, tokens=20, bucket=32),
             step(1, "ACTIVE_PREFILL", "prefill", ["X"], 1.0, 2.0, tokens=1, padded=2,
                  seqs=1, seqs_padded=1, bucket=None)]  # no bucket: filed under its padded size
    report = summarize(Records(CONFIG, steps, [], {}))
    by_bucket = report["padding"]["prefill"]["by_bucket"]
    assert list(by_bucket) == ["2", "4", "8", "16", "32"]
    assert by_bucket["32"] == {"chunks": 1, "actual_tokens": 20, "padded_tokens": 32}
    assert by_bucket["2"] == {"chunks": 1, "actual_tokens": 1, "padded_tokens": 2}


def test_unknown_block_reason_is_kept_after_known_ones():
    records = two_request_run()
    records.blocked_counts = {"kv_saturated": 3, "new_reason": 1}
    blocked = summarize(records)["admission_blocked"]
    assert list(blocked) == [*BLOCK_REASONS, "new_reason"]
    assert blocked["kv_saturated"] == 3 and blocked["at_capacity"] == 0


def test_percentile_is_linear_interpolation_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0]
    # numpy.percentile(values, [0, 50, 90, 99, 100]) -> 1.0, 2.5, 3.7, 3.97, 4.0
    for fraction, expected in [(0.0, 1.0), (0.5, 2.5), (0.9, 3.7), (0.99, 3.97), (1.0, 4.0)]:
        assert percentile(values, fraction) == pytest.approx(expected)
    assert percentile([7.0], 0.99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 0.5)


# -- invariants over random runs ---------------------------------------------------------------

STATES = ("IDLE", "ACTIVE_PREFILL", "ACTIVE_DECODE")


@st.composite
def random_runs(draw):
    """Steps with random gaps, overlaps (async), missing ends and occasional clock steps back."""
    steps, t = [], draw(st.floats(0, 5))
    for index in range(draw(st.integers(0, 30))):
        t += draw(st.one_of(st.floats(0, 2), st.floats(-0.5, 0)))
        duration = draw(st.one_of(st.none(), st.floats(0, 3)))
        t_end = None if duration is None else t + duration
        state = draw(st.sampled_from(STATES))
        kind = draw(st.sampled_from(("prefill", "decode", "empty")))
        if kind == "prefill":
            bucket = draw(st.sampled_from(CONFIG.prefill_buckets + [32]))
            steps.append(step(index, state, kind, ["r"], t, t_end, seqs=1, seqs_padded=1,
                              tokens=draw(st.integers(1, bucket)), padded=bucket, bucket=bucket))
        elif kind == "decode":
            bucket = draw(st.sampled_from(CONFIG.decode_buckets))
            seqs = draw(st.integers(1, bucket))
            steps.append(step(index, state, kind, ["r"] * seqs, t, t_end, tokens=seqs,
                              padded=seqs, seqs=seqs, seqs_padded=bucket, bucket=bucket))
        else:
            steps.append(step(index, state, kind, [], t, t_end))
    requests = []
    for index in range(draw(st.integers(0, 6))):
        arrival = draw(st.floats(0, 30))
        finished = draw(st.one_of(st.none(), st.floats(0, 10).map(lambda d, a=arrival: a + d)))
        first = None if finished is None else arrival + (finished - arrival) / 2
        requests.append(RequestRecord(f"q{index}", draw(st.integers(1, 50)), arrival, None,
                                      first, finished, draw(st.integers(0, 20))))
    elapsed = draw(st.one_of(st.none(), st.floats(0, 60)))
    start = draw(st.one_of(st.none(), st.floats(-5, 10)))
    return Records(CONFIG, steps, requests, {}), elapsed, start


@settings(max_examples=100, deadline=None)
@given(random_runs())
def test_invariants(run):
    records, elapsed_s, start = run
    report = summarize(records, elapsed_s=elapsed_s, start=start)
    elapsed = report["throughput"]["elapsed_s"]
    assert elapsed >= 0
    states = report["states"]
    assert set(STATES) <= set(states)
    assert all(figures["seconds"] >= 0 for figures in states.values())
    assert math.fsum(f["seconds"] for f in states.values()) == pytest.approx(elapsed, abs=1e-9)
    assert sum(f["steps"] for f in states.values()) == len(records.steps)

    for phase, count, actual, padded in (("prefill", "chunks", "actual_tokens", "padded_tokens"),
                                         ("decode", "steps", "actual_seqs", "padded_seqs")):
        figures = report["padding"][phase]
        assert figures[padded] >= figures[actual] >= 0
        assert 0.0 <= figures["waste_fraction"] < 1.0
        rows = figures["by_bucket"].values()
        assert sum(r[actual] for r in rows) == figures[actual]
        assert sum(r[padded] for r in rows) == figures[padded]
        assert sum(r[count] for r in rows) == report["steps"][phase]
        assert [int(b) for b in figures["by_bucket"]] == sorted(int(b) for b in
                                                                 figures["by_bucket"])
    counts = report["steps"]
    assert counts["prefill"] + counts["decode"] + counts["empty"] == counts["total"]
    for figures in report["latency"].values():
        if figures["mean"] is not None:
            assert figures["p50"] <= figures["p90"] <= figures["p99"]


# -- records file round trip -------------------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_file_round_trip_gives_the_live_summary(tmp_path):
    clock = FakeClock()
    recorder = Recorder(clock=clock, path=tmp_path / "run" / "records.jsonl", flush_every=2)
    recorder.start(CONFIG)
    recorder.request_arrived("A", 6)
    clock.now = 0.25
    recorder.request_arrived("B", 3)

    def plan(record, at):
        clock.now = at
        record.t_start = at
        recorder.add_step(record)

    def finish(at):
        clock.now = at
        return recorder.finish_oldest_step()

    plan(prefill(0, "A", 0, None, tokens=6, bucket=8), at=0.5)
    recorder.requests["A"].admitted = 0.5
    blocked = step(1, "ACTIVE_PREFILL", "prefill", ["B"], 0, None, tokens=3, padded=4, seqs=1,
                   seqs_padded=1, bucket=4, blocked="prefill_in_running")
    plan(blocked, at=0.75)  # async: planned before step 0's output is back
    recorder.blocked_counts["prefill_in_running"] += 1
    recorder.requests["A"].first_token = finish(at=1.0).t_end
    recorder.requests["B"].admitted = 0.75
    recorder.requests["B"].first_token = finish(at=1.5).t_end
    plan(decode(2, ["A", "B"], 0, None, bucket=2), at=1.5)
    finish(at=2.0)
    recorder.request_finished("A", 2, "length", now=2.0)
    plan(decode(3, ["B"], 0, None, bucket=2), at=2.125)
    finish(at=2.5)
    recorder.request_finished("B", 3, "stop", now=2.5)
    plan(step(4, "IDLE", "empty", [], 0, None), at=3.0)  # still in flight at shutdown
    recorder.close()

    live = summarize(Records.from_recorder(recorder), extra_config={"model": "tiny"})
    from_file = summarize(read_records(tmp_path / "run" / "records.jsonl"),
                          extra_config={"model": "tiny"})
    assert from_file == live
    assert live["steps"] == {"total": 5, "prefill": 2, "decode": 2, "empty": 1}
    assert live["admission_blocked"]["prefill_in_running"] == 1
    assert live["throughput"]["elapsed_s"] == 3.0  # 0.0 to the unfinished step's t_start
    assert sum(f["seconds"] for f in live["states"].values()) == pytest.approx(3.0)


# -- speed -------------------------------------------------------------------------------------

def test_large_run_is_summarized_quickly():
    steps, t = [], 0.0
    for index in range(50_000):
        if index % 10 == 0:
            steps.append(prefill(index, "r", t, t + 0.01, tokens=100, bucket=16))
        else:
            steps.append(decode(index, ["a", "b", "c"], t, t + 0.01, bucket=4))
        t += 0.011
    requests = [RequestRecord(f"r{i}", 100, 0.0, 0.1, 0.2, (i + 1) * t / 5_000, 50)
                for i in range(5_000)]
    records = Records(CONFIG, steps, requests, {})
    report = summarize(records)
    assert report["steps"]["total"] == 50_000
