#!/usr/bin/env python
"""The records of a run and the report built from them, at two job sizes (issue 46): bytes of
records per request, the report's build time per request, and the recorder's cost per step,
each against the records as they were written before (one JSON line per step and request,
the report a full pass over every step), measured in the same run.

The records are simulated: a FIFO engine of --max-num-seqs slots (one prefill a step, then
decode steps over every running request) on a virtual clock with step times like the
simulated inf2.8xlarge's, prompts of 100-2,000 tokens and outputs of --min-out to --max-out
tokens. The new records go through the Recorder as the scheduler feeds it (blocks, running
aggregates, a summary line); the old ones are the same records written as the old format
wrote them. The report is `report/run_records.load` + `metrics.summarize_run` (new) and
`read_records` + `metrics.summarize` (old).

Printed per size: steps per request, bytes per request (new, old, ratio), report build
seconds (new, old), and the ratios that say whether the cost of a report is set by the
job's size: new build time per request at the large size / at the small size (1.0: linear in
requests; what remains linear is reading the requests' columns: exact latency percentiles),
and the same for steps. Medians of --repeats.

Examples:
    .venv/bin/python scripts/bench_records.py                      # 10k and 100k requests
    .venv/bin/python scripts/bench_records.py --sizes 1000 10000 --repeats 3
    .venv/bin/python scripts/bench_records.py --max-num-seqs 12 --min-out 200 --max-out 600
    .venv/bin/python scripts/bench_records.py --replicas --sizes 10000 200000 --min-out 1 \
        --max-out 4                      # a --replicas run's report
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from neuron_batch.report.metrics import summarize, summarize_run  # noqa: E402
from neuron_batch.report.run_records import load  # noqa: E402
from neuron_batch.scheduler.records import (  # noqa: E402
    Recorder,
    RunConfig,
    StepRecord,
    read_records,
)

PREFILL_BUCKETS = [128, 256, 512, 1024, 2048]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def simulate(n: int, slots: int, min_out: int, max_out: int, path: Path, seed: int = 1,
             prefix: str = "request"):
    """Drive a Recorder (keeping nothing) through a FIFO run of n requests; (steps, wall
    seconds the recorder took, the records kept for the old format)."""
    rng = random.Random(seed)
    decode_buckets = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, slots} & set(range(1, slots + 1)))
    config = RunConfig(slots, 2048, 8192, 32, 4000, slots, PREFILL_BUCKETS, decode_buckets,
                       "NeuronScheduler")
    clock = Clock()
    recorder = Recorder(clock=clock, path=path, keep=False)
    old_lines = [json.dumps({"type": "config", **asdict(config)})]
    recorder.start(config)
    spent = 0.0
    waiting = []
    for i in range(n):
        waiting.append((f"{prefix}-{i:07d}", rng.randint(100, 2000), rng.randint(min_out, max_out)))
        began = time.perf_counter()
        recorder.request_arrived(waiting[-1][0], waiting[-1][1])
        spent += time.perf_counter() - began
    waiting.reverse()
    running: dict[str, list[int]] = {}       # id -> [context, left]
    steps = 0

    def record_step(kind, ids, tokens, padded, seqs, seqs_padded, bucket, context, seconds):
        nonlocal steps, spent
        record = StepRecord(steps, "ACTIVE_DECODE" if kind == "decode" else "ACTIVE_PREFILL",
                            kind, ids, tokens, padded, seqs, seqs_padded, bucket, context,
                            "at_capacity" if waiting and len(running) >= slots else None,
                            len(waiting), len(running), len(running) / slots, clock.now,
                            kv_reserved_blocks=len(running) * 4)
        began = time.perf_counter()
        recorder.add_step(record)
        clock.now += seconds
        recorder.finish_oldest_step()
        spent += time.perf_counter() - began
        old_lines.append(json.dumps({"type": "step", **asdict(record)}))
        steps += 1

    while waiting or running:
        if waiting and len(running) < slots:
            req_id, prompt, out = waiting.pop()
            bucket = next(b for b in PREFILL_BUCKETS if b >= prompt)
            recorder.requests[req_id].admitted = clock.now
            record_step("prefill", [req_id], prompt, bucket, 1, 1, bucket, 0,
                        0.004 + bucket * 2.1e-5 * (1 + rng.random() * 0.01))
            recorder.requests[req_id].first_token = clock.now
            running[req_id] = [prompt + 1, out - 1]
        else:
            ids = list(running)
            bucket = next(b for b in decode_buckets if b >= len(ids))
            context = sum(running[r][0] for r in ids)
            record_step("decode", ids, len(ids), len(ids), len(ids), bucket, bucket, context,
                        0.021 + context * 1.3e-8 * (1 + rng.random() * 0.01))
        for req_id in [r for r, (_, left) in running.items() if left <= 0]:
            began = time.perf_counter()
            record = recorder.requests[req_id]
            recorder.request_finished(req_id, 0, "length", clock.now)
            spent += time.perf_counter() - began
            old_lines.append(json.dumps({"type": "request", **asdict(record),
                                         "num_output_tokens": record.num_output_tokens}))
            del running[req_id]
        for state in running.values():
            state[0] += 1
            state[1] -= 1
    began = time.perf_counter()
    recorder.close()
    spent += time.perf_counter() - began
    old_lines.append(json.dumps({"type": "summary",
                                 "admission_blocked": dict(recorder.blocked_counts),
                                 "num_steps": steps}))
    old_path = path.with_name("old-" + path.name)
    old_path.write_text("\n".join(old_lines) + "\n")
    return steps, spent, old_path


def build_new(path: Path) -> float:
    began = time.perf_counter()
    run = load(path)
    run.requests = run.requests.completed()
    summarize_run(run)
    return time.perf_counter() - began


def build_old(path: Path) -> float:
    began = time.perf_counter()
    records = read_records(path)
    records.requests = [r for r in records.requests if r.finish_reason not in ("abort", "error")]
    summarize(records)
    return time.perf_counter() - began


def replicas_report(args) -> int:
    """The report of two replicas' records (each --sizes requests, ids of their own, every
    one done), built as a run folder builds it: its peak traced memory and seconds a
    request, the large size against the small (1.0: the report's memory is a request's
    worth at both sizes; what does not grow with the job, the imports, is left out)."""
    import tracemalloc

    from neuron_batch.job.folder import RunFolder
    from neuron_batch.report.replicas import summarize_replicas

    try:
        from neuron_batch.report.replicas import DoneIds
    except ImportError:     # (a tree before DoneIds, on PYTHONPATH: the set its report took)
        DoneIds = set

    rows = {}
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            ids = []
            for replica in (0, 1):
                path = Path(tmp) / f"records-1-r{replica}.jsonl"
                simulate(n, args.max_num_seqs, args.min_out, args.max_out, path,
                         seed=replica, prefix=f"r{replica}")
                path.with_name("old-" + path.name).unlink()
                ids += [f"r{replica}-{i:07d}" for i in range(n)]
            layout = RunFolder(Path(tmp)).records_layout()
            tracemalloc.start()
            began = time.perf_counter()
            done = DoneIds(iter(ids))
            del ids
            report = summarize_replicas(layout, attempts=[{"attempt": 1}], done_ids=done,
                                        simulated=True, extra_config={}, total=2 * n,
                                        skipped=0)
            seconds = time.perf_counter() - began
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert report["requests"]["completed"] == 2 * n, report["requests"]
            rows[n] = (peak, seconds)
            print(f"{2 * n:>10,} requests on 2 replicas: report peak {peak / 2**20:7.1f} MiB "
                  f"({peak / (2 * n):6.1f} B/request), {seconds:6.2f} s "
                  f"({seconds / (2 * n) * 1e6:5.1f} us/request)", flush=True)
    (small_peak, small_s), (large_peak, large_s) = (rows[n] for n in args.sizes)
    scale = args.sizes[1] / args.sizes[0]
    print(f"{args.sizes[1]:,} / {args.sizes[0]:,}: peak memory {large_peak / small_peak:.2f}x "
          f"for {scale:.0f}x the requests; time a request {large_s / small_s / scale:.2f}x")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=[10_000, 100_000])
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--min-out", type=int, default=20)
    parser.add_argument("--max-out", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-old", action="store_true",
                        help="do not build the old report (slow at large sizes)")
    parser.add_argument("--replicas", action="store_true",
                        help="only a --replicas run's report (report/replicas.py): two "
                        "replicas' records of each size, the report's peak traced memory and "
                        "time a request, the large size against the small")
    args = parser.parse_args()
    if args.replicas:
        return replicas_report(args)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            path = Path(tmp) / f"records-{n}.jsonl"
            steps, spent, old_path = simulate(n, args.max_num_seqs, args.min_out, args.max_out,
                                              path)
            new_bytes, old_bytes = path.stat().st_size, old_path.stat().st_size
            new_s = statistics.median(build_new(path) for _ in range(args.repeats))
            old_s = (None if args.skip_old else
                     statistics.median(build_old(old_path) for _ in range(args.repeats)))
            rows[n] = {"steps": steps, "new_bytes": new_bytes, "old_bytes": old_bytes,
                       "new_s": new_s, "old_s": old_s, "recorder_us_per_step":
                       spent / steps * 1e6}
            print(f"{n:>9,} requests  {steps / n:5.1f} steps/request  records "
                  f"{new_bytes / n:7.1f} B/request (old {old_bytes / n:8.1f}, "
                  f"{old_bytes / new_bytes:5.1f}x smaller)  report {new_s:6.3f} s"
                  + (f" (old {old_s:6.3f} s, {old_s / new_s:5.1f}x faster)" if old_s else "")
                  + f"  recorder {spent / steps * 1e6:5.1f} us/step")
    small, large = (rows[n] for n in args.sizes)
    step_ratio = (large["new_s"] / large["steps"]) / (small["new_s"] / small["steps"])
    scale = args.sizes[1] / args.sizes[0]
    print(f"report build time per request, {args.sizes[1]:,} / {args.sizes[0]:,}: "
          f"{large['new_s'] / small['new_s'] / scale:.2f} (new)"
          + (f", {large['old_s'] / small['old_s'] / scale:.2f} (old)" if large["old_s"] else "")
          + f"; per step: {step_ratio:.2f}")
    per_request = [rows[n]["new_bytes"] / n for n in args.sizes]
    print(f"records bytes per request, {args.sizes[1]:,} / {args.sizes[0]:,}: "
          f"{per_request[1] / per_request[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
