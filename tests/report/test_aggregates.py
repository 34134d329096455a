"""The running aggregates (scheduler/aggregates.py) against the full pass over every record
(report/metrics.py `summarize`) on the same data: random step streams driven through a
Recorder that keeps nothing in memory, written as compact blocks, read back; records files of
the format before issue 46 read the same way; the recorder's memory set by what is in flight."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.report.metrics import summarize, summarize_run
from neuron_batch.report.run_records import concat, load
from neuron_batch.scheduler.aggregates import Aggregates, ExactSum
from neuron_batch.scheduler.records import (
    Recorder,
    Records,
    RunConfig,
    StepRecord,
    iter_steps,
    read_records,
)

CONFIG = RunConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64, block_size=4,
                   num_kv_blocks=64, max_kv_concurrent=4, prefill_buckets=[4, 8, 16],
                   decode_buckets=[2, 4], scheduler_cls="NeuronScheduler",
                   attention_buckets=[32, 64])
STATES = ("IDLE", "ACTIVE_PREFILL", "ACTIVE_DECODE")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def close(a, b, where="report"):
    """Equal, floats to the last few ulps (the aggregates add the same terms, some in another
    order: the idle time before the first step is known only at the end)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            close(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-12), where
    else:
        assert a == b, where


@st.composite
def streams(draw):
    """A run as the scheduler records it: requests arriving (some while the engine works,
    some after it went idle), steps planned in order (sometimes the next before the last one's
    output is back, as async scheduling does), finished first in first out, requests finishing
    at the end of a step; prefill steps on a grid cell now and then, decode steps with
    attended lengths, missing ends only for steps in flight at shutdown."""
    n_requests = draw(st.integers(1, 8))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.3, 2.5]), min_size=n_requests,
                         max_size=n_requests))
    ops = []
    t = 0.0
    for i, gap in enumerate(gaps):
        t += gap
        ops.append(("arrive", f"r{i}", t, draw(st.integers(1, 40))))
    n_steps = draw(st.integers(0, 25))
    steps = []
    for index in range(n_steps):
        kind = draw(st.sampled_from(("prefill", "decode", "decode", "empty")))
        duration = draw(st.floats(0.0, 1.0))
        gap = draw(st.sampled_from([0.0, 0.0, 0.1, 1.5]))
        overlap = draw(st.booleans())
        seqs = draw(st.integers(1, 4))
        fields = dict(step=index, state=draw(st.sampled_from(STATES)), kind=kind, req_ids=[],
                      num_tokens=0, num_tokens_padded=0, num_seqs=0, num_seqs_padded=0,
                      bucket=None, context_tokens=draw(st.integers(0, 60)),
                      blocked=draw(st.sampled_from([None, None, "at_capacity"])),
                      num_waiting=draw(st.integers(0, 3)), num_running=seqs,
                      kv_usage=draw(st.floats(0.0, 1.0)), t_start=0.0,
                      kv_reserved_blocks=draw(st.integers(0, 50)),
                      num_preempted=draw(st.sampled_from([0, 0, 1])),
                      sampling_s=draw(st.sampled_from([0.0, 0.0, 0.01])))
        if kind == "prefill":
            bucket = draw(st.sampled_from([4, 8, 16, 32]))
            fields.update(num_tokens=draw(st.integers(1, bucket)), num_tokens_padded=bucket,
                          num_seqs=1, num_seqs_padded=1, bucket=bucket,
                          recomputed_tokens=draw(st.integers(0, 3)),
                          prefix_bucket=draw(st.sampled_from([None, None, 0, 8])))
        elif kind == "decode":
            bucket = draw(st.sampled_from([2, 4]))
            fields.update(num_tokens=min(seqs, bucket), num_tokens_padded=min(seqs, bucket),
                          num_seqs=min(seqs, bucket), num_seqs_padded=bucket, bucket=bucket,
                          attended_len=draw(st.sampled_from([None, 32, 64])))
        steps.append((StepRecord(**fields), duration, gap, overlap))
    finishing = draw(st.lists(st.integers(0, max(n_steps - 1, 0)), min_size=n_requests,
                              max_size=n_requests))
    in_flight_at_end = draw(st.booleans())
    return ops, steps, finishing, in_flight_at_end


def drive(stream, path):
    """Feed a stream to a Recorder that keeps nothing (and to one that keeps everything, the
    reference); (the bounded recorder, the records in memory)."""
    ops, steps, finishing, in_flight_at_end = stream
    clock = Clock()
    bounded = Recorder(clock=clock, path=path, keep=False, flush_every=3)
    kept = Recorder(clock=clock, keep=True)
    for recorder in (bounded, kept):
        recorder.start(CONFIG)
    arrivals = list(ops)
    # every request arrives before the first step (a step needs one) and the rest as the clock
    # passes its arrival time
    t = arrivals[0][2]

    def arrive_until(now):
        while arrivals and arrivals[0][2] <= now:
            _, req_id, at, prompt = arrivals.pop(0)
            clock.now = at
            for recorder in (bounded, kept):
                recorder.request_arrived(req_id, prompt)
        clock.now = now

    arrive_until(t)
    unfinished = {f"r{i}": s for i, s in enumerate(finishing)}
    pending = []        # (step index, end time) planned, output not back

    def finish_one():
        index, end = pending.pop(0)
        arrive_until(max(end, clock.now))
        for recorder in (bounded, kept):
            recorder.finish_oldest_step(t_end=end)
        for req_id, at in sorted(unfinished.items()):
            if at <= index and req_id in kept.requests and kept.requests[req_id].arrival <= end:
                for recorder in (bounded, kept):
                    record = recorder.requests[req_id]
                    record.admitted = record.arrival
                    record.first_token = end
                    recorder.request_finished(req_id, 1 + at % 3, "length", end)
                del unfinished[req_id]

    for n, (record, duration, gap, overlap) in enumerate(steps):
        last = n == len(steps) - 1
        t = max(t + gap, clock.now)
        arrive_until(t)
        for recorder in (bounded, kept):
            recorder.add_step(replace(record, t_start=t))
            if record.blocked:
                recorder.blocked_counts[record.blocked] += 1
        end = t + duration
        pending.append((record.step, end))
        if last and in_flight_at_end:
            break
        if not overlap or len(pending) > 1:
            finish_one()
        t = end if not overlap else t + duration / 2
    while pending and not in_flight_at_end:
        finish_one()
    for recorder in (bounded, kept):
        recorder.close()
    return bounded, Records.from_recorder(kept)


def completed(records):
    """The reference's records as the report counts them: requests that finished (a file
    cut short holds no others)."""
    return Records(records.config, records.steps,
                   [r for r in records.requests if r.finished is not None],
                   records.blocked_counts)


@settings(max_examples=150, deadline=None)
@given(streams())
def test_aggregates_equal_the_full_pass(tmp_path_factory, stream):
    path = tmp_path_factory.mktemp("agg") / "records-1.jsonl"
    bounded, reference = drive(stream, path)
    # (a request still in flight at the end stays in the system: the full pass over every
    # request the recorder saw counts it so too)
    expected = summarize(reference)
    run = load(path)
    run.requests = run.requests.completed()
    close(summarize_run(run), expected)
    # a single engine's report reads no ids (RequestColumns.with_ids): the same figures
    bare = load(path, ids=False)
    bare.requests = bare.requests.completed()
    assert bare.requests.req_id == [] and len(bare.requests) == len(run.requests)
    close(summarize_run(bare), expected)
    # and added up block by block as the file is read (report/request_figures.py): the same
    streamed = load(path, ids=False, streamed=True)
    assert not len(streamed.requests)
    close(summarize_run(streamed), expected)
    # the steps read back from their blocks are the recorded ones (less their request ids)
    steps = [asdict(s) for s in iter_steps(path)]
    assert steps == [{**asdict(s), "req_ids": []} for s in reference.steps]
    # and nothing per step, nor per request but those still in flight, stayed in the bounded
    # recorder
    assert not bounded.steps
    assert set(bounded.requests) == {r.req_id for r in reference.requests if r.finished is None}
    assert bounded.aggregates.num_steps == len(reference.steps)


def write_old_format(path, records: Records):
    """A records file as neuron-batch wrote them before issue 46: a JSON line per record."""
    lines = [json.dumps({"type": "config", **asdict(records.config)})]
    lines += [json.dumps({"type": "step", **asdict(s)}) for s in records.steps]
    lines += [json.dumps({"type": "request", **asdict(r)}) for r in records.requests]
    lines.append(json.dumps({"type": "summary", "admission_blocked": records.blocked_counts,
                             "num_steps": len(records.steps)}))
    path.write_text("\n".join(lines) + "\n")


@settings(max_examples=60, deadline=None)
@given(streams())
def test_old_records_files_give_the_same_report(tmp_path_factory, stream):
    folder = tmp_path_factory.mktemp("old")
    _, reference = drive(stream, folder / "new.jsonl")
    write_old_format(folder / "old.jsonl", reference)
    run = load(folder / "old.jsonl")
    run.requests = run.requests.completed()
    expected = summarize(completed(read_records(folder / "old.jsonl")))
    close(summarize_run(run), expected)
    close(summarize_run(load(folder / "old.jsonl", ids=False, streamed=True)), expected)


def test_a_file_cut_short_is_summarised_from_its_steps(tmp_path):
    """An attempt killed before it closed its file has no summary line: its blocks are read."""
    stream = ([("arrive", "r0", 0.0, 5), ("arrive", "r1", 0.0, 7)],
              [(StepRecord(i, "ACTIVE_DECODE", "decode", [], 2, 2, 2, 2, 2, 10, None, 0, 2,
                           0.5, 0.0), 1.0, 0.0, False) for i in range(10)],
              [3, 9], False)
    path = tmp_path / "records-1.jsonl"
    _, reference = drive(stream, path)
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1])["type"] == "summary"
    path.write_text("\n".join(lines[:-1]) + "\n")
    run = load(path)
    run.requests = run.requests.completed()
    close(summarize_run(run), summarize(completed(reference)))
    close(summarize_run(load(path, streamed=True)), summarize(completed(reference)))


def test_a_killed_engine_file_is_summarised_from_its_last_checkpoint(tmp_path, monkeypatch):
    """A single engine's recorder writes a checkpoint after each block: a run killed -9 leaves
    a file whose last checkpoint holds every step in it, so its report reads no step again
    (the full pass held them all: ~0.4 GiB a 50k-request attempt) and says what the full pass
    over the same file says."""
    stream = ([("arrive", "r0", 0.0, 5), ("arrive", "r1", 0.5, 7), ("arrive", "r2", 6.0, 3)],
              [(StepRecord(i, "ACTIVE_DECODE", "decode", [], 2, 2, 2, 2, 2, 10, None, i % 2, 2,
                           0.5, 0.0), 0.7, 0.4 * (i % 3), i % 4 == 1) for i in range(12)],
              [3, 7, 11], False)
    path = tmp_path / "records-1.jsonl"
    drive(stream, path)
    lines = path.read_text().splitlines()
    kinds = [json.loads(line)["type"] for line in lines]
    last = len(kinds) - 1 - kinds[::-1].index("checkpoint")
    assert "steps" in kinds[:last] and kinds[-1] == "summary"
    killed = lines[:last + 1]
    (tmp_path / "full-pass.jsonl").write_text(
        "\n".join(line for line in killed if '"checkpoint"' not in line) + "\n")
    expected = summarize_run(load(tmp_path / "full-pass.jsonl", streamed=True))
    path.write_text("\n".join(killed) + "\n")
    monkeypatch.setattr("neuron_batch.report.run_records._rebuild", None)   # (not called)
    close(summarize_run(load(path, streamed=True)), expected)


def test_a_steps_line_torn_before_its_count_reads_as_cut_short(tmp_path):
    """A killed process may leave its last line a block of steps cut before the block's count:
    the file reads up to its last whole line (this once raised AttributeError)."""
    stream = ([("arrive", "r0", 0.0, 5), ("arrive", "r1", 0.0, 7)],
              [(StepRecord(i, "ACTIVE_DECODE", "decode", [], 2, 2, 2, 2, 2, 10, None, 0, 2,
                           0.5, 0.0), 1.0, 0.0, False) for i in range(10)],
              [3, 9], False)
    path = tmp_path / "records-1.jsonl"
    _, reference = drive(stream, path)
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1])["type"] == "summary"
    path.write_text("\n".join(lines[:-1]) + '\n{"type":"steps","n')
    run = load(path)
    run.requests = run.requests.completed()
    close(summarize_run(run), summarize(completed(reference)))


def test_attempts_add_up(tmp_path):
    """A resumed run's attempts: steps, padding and time per state add up, the elapsed time is
    theirs end to end."""
    stream = ([("arrive", "r0", 0.0, 5)],
              [(StepRecord(i, "ACTIVE_DECODE", "decode", [], 1, 1, 1, 2, 2, 10, None, 0, 1,
                           0.5, 0.0), 1.0, 0.0, False) for i in range(4)], [3], False)
    drive(stream, tmp_path / "records-1.jsonl")
    drive(stream, tmp_path / "records-2.jsonl")
    one = load(tmp_path / "records-1.jsonl")
    both = concat([load(tmp_path / "records-1.jsonl"), load(tmp_path / "records-2.jsonl")])
    report, single = summarize_run(both), summarize_run(one)
    assert report["steps"]["total"] == 2 * single["steps"]["total"] == 8
    assert report["throughput"]["elapsed_s"] == 2 * single["throughput"]["elapsed_s"]
    assert math.fsum(s["seconds"] for s in report["states"].values()) == pytest.approx(8.0)
    assert report["requests"]["completed"] == 2


@given(st.lists(st.floats(-1e9, 1e9), max_size=40))
def test_exact_sum_is_fsum(values):
    total = ExactSum()
    for value in values:
        total.add(value)
    assert total.value() == math.fsum(values)
    again = ExactSum(list(total.partials))
    assert again.value() == math.fsum(values)


def test_aggregates_round_trip_through_their_summary_line():
    agg = Aggregates()
    agg.count(StepRecord(0, "ACTIVE_PREFILL", "prefill", [], 5, 8, 1, 1, 8, 0, None, 0, 1,
                         0.25, 0.0, 1.0, prefix_bucket=16, recomputed_tokens=2))
    agg.count(StepRecord(1, "ACTIVE_DECODE", "decode", [], 1, 1, 1, 2, 2, 5, None, 0, 1,
                         0.5, 1.0, 1.5, attended_len=64))
    again = Aggregates.from_dict(json.loads(json.dumps(agg.to_dict())))
    assert again.to_dict() == agg.to_dict()
    assert again.kv_mean() == agg.kv_mean() == (0.25 * 1.0 + 0.5 * 0.5) / 1.5


def test_memory_is_set_by_the_work_in_flight(tmp_path):
    """10,000 requests through a Recorder that keeps nothing: at any time it holds the requests
    and steps in flight and one block's worth waiting to be written."""
    clock = Clock()
    recorder = Recorder(clock=clock, path=tmp_path / "records-1.jsonl", keep=False)
    recorder.start(CONFIG)
    most = 0
    for i in range(10_000):
        clock.now = float(i)
        recorder.request_arrived(f"r{i}", 10)
        recorder.add_step(StepRecord(i, "ACTIVE_DECODE", "decode", [f"r{i}"], 1, 1, 1, 2, 2,
                                     10, None, 0, 1, 0.5, clock.now))
        # (back to back half the time: a step with no idle tail still folds the events)
        recorder.finish_oldest_step(t_end=clock.now + (1.0 if i % 2 else 0.5))
        recorder.request_finished(f"r{i}", 3, "length", clock.now + 0.5)
        in_system = recorder._in_system
        most = max(most, len(recorder.requests) + len(recorder._unfinished_steps)
                   + len(recorder._steps_out) + len(recorder._requests_out)
                   + len(in_system.arrivals) + len(in_system.finishes))
    recorder.close()
    assert most <= recorder.flush_every + 6
    assert not recorder.steps
    run = load(tmp_path / "records-1.jsonl")
    assert summarize_run(run)["requests"]["completed"] == 10_000
    assert run.aggregates.num_steps == 10_000


def test_a_replicas_records_end_with_a_checkpoint_that_stands_for_the_summary(tmp_path,
                                                                              monkeypatch):
    """A replica's actor flushes the recorder before it ships the file's lines, and the summary
    written at shutdown never reaches the driver: the last checkpoint says what it would."""
    stream = ([("arrive", "r0", 0.0, 5), ("arrive", "r1", 0.5, 7), ("arrive", "r2", 6.0, 3)],
              [(StepRecord(i, "ACTIVE_DECODE", "decode", [], 2, 2, 2, 2, 2, 10, None, i % 2, 2,
                           0.5, 0.0), 0.7, 0.4 * (i % 3), i % 4 == 1) for i in range(12)],
              [3, 7, 11], False)
    path = tmp_path / "records-1-r0.jsonl"
    flushes = []
    original = Recorder.request_finished

    def finished_then_flushed(self, *args, **kwargs):     # as the actor does after a batch
        original(self, *args, **kwargs)
        if self.path is not None:
            self.flush()
            flushes.append(path.read_text())

    monkeypatch.setattr(Recorder, "request_finished", finished_then_flushed)
    drive(stream, path)
    shipped = flushes[-1]
    assert json.loads(shipped.splitlines()[-1])["type"] == "checkpoint"
    whole = load(path)
    path.write_text(shipped)
    monkeypatch.setattr("neuron_batch.report.run_records._rebuild", None)   # (not called)
    from_checkpoint = load(path)
    close(summarize_run(from_checkpoint), summarize_run(whole))


def test_a_folder_resumed_across_the_format_change_reports_both_attempts(tmp_path):
    """Attempt 1 written before issue 46 (a JSON line per record), attempt 2 after: the
    report adds them up as it adds up two attempts of one format."""
    stream = ([("arrive", "r0", 0.0, 5), ("arrive", "r1", 0.0, 9)],
              [(StepRecord(i, "ACTIVE_DECODE", "decode", [], 2, 2, 2, 2, 2, 10, None, 0, 2,
                           0.5, 0.0), 1.0, 0.0, False) for i in range(6)], [2, 5], False)
    _, reference = drive(stream, tmp_path / "records-2.jsonl")
    write_old_format(tmp_path / "records-1.jsonl", reference)
    old, new = load(tmp_path / "records-1.jsonl"), load(tmp_path / "records-2.jsonl")
    close(summarize_run(old), summarize_run(new))
    both = summarize_run(concat([old, new]))
    assert both["steps"]["total"] == 12
    assert both["requests"]["completed"] == 4
    assert both["throughput"]["elapsed_s"] == pytest.approx(12.0)
