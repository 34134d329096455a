#!/usr/bin/env python
"""Speed of the simulated Neuron device, against the bare loop of our own scheduler.

Two measurements, in one process:

1. Overhead ratio. The same offline workload (all requests at time zero) runs
   a) through the whole engine on the simulated device: `LLM.generate(prompt_token_ids)` ->
      engine core -> NeuronScheduler -> NeuronSimExecutor (cost model, virtual clock) ->
      recorder -> vLLM's output processing, and
   b) through the bare scheduler loop: `harness.drive()` with NeuronScheduler (schedule, a
      hand-built model output, update_from_output; no engine, no executor).
   Start-up is excluded: (a) is timed from the generate() call to its return, so it includes
   vLLM's request intake; (b) from drive() (which adds the already built requests) to its end.
   (b) runs twice: with requests from harness.make_request, which always carry a block hasher
   (a sha256 per 32 tokens, generated ones included), and with requests without one, as the
   engine builds them with prefix caching off (the stricter baseline). The ratios a/b, in wall
   and in CPU time, are reported per repeat and as medians (target <= 1.3).

2. The trace. The Azure LLM inference "conv" trace (19,366 requests; prompt_len =
   num_prefill_tokens, max_tokens = num_decode_tokens, synthetic prompt token ids) simulated
   offline at each --max-num-seqs: wall time, simulated elapsed time, throughput.

--profile writes a cProfile breakdown of one engine run (where the time goes).

Examples (the engine core always runs in-process here):
    .venv/bin/python scripts/bench_sim.py --quick
    .venv/bin/python scripts/bench_sim.py --repeats 3 --profile profile.txt --json bench.json
    .venv/bin/python scripts/bench_sim.py --instance inf2.48xlarge --no-trace
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# In-process engine core: the benchmark reads the executor and the scheduler directly.
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TRACE = Path(__file__).resolve().parents[1] / "datasets" / "azure-llm-inference-conv-2023.csv"
#: Synthetic prompt tokens: slices of one shared pool (no per-token int objects per request).
_POOL = [1000 + i % 20000 for i in range(40000)]


def load_trace(path: Path, limit: int | None = None) -> list[tuple[int, int]]:
    """(prompt_len, max_tokens) per request, in trace order."""
    rows = []
    with open(path, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            rows.append((int(row["num_prefill_tokens"]), max(1, int(row["num_decode_tokens"]))))
            if limit is not None and len(rows) >= limit:
                break
    return rows


def prompt_ids(index: int, length: int) -> list[int]:
    start = (index * 7919) % 20000
    return _POOL[start:start + length]


def fit_workload(workload, max_model_len):
    """Drop requests whose prompt + output exceed max_model_len; returns (kept, dropped)."""
    kept = [(p, m) for p, m in workload if p + m <= max_model_len]
    return kept, len(workload) - len(kept)


# -- the two paths -------------------------------------------------------------------------------
def build_llm(settings, args, max_num_seqs, workdir):
    from vllm import LLM

    from neuron_batch.device.target import sim_engine_kwargs

    kwargs = sim_engine_kwargs(**settings, max_model_len=args.max_model_len,
                               max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=args.max_num_batched_tokens,
                               workdir=workdir)
    return LLM(**kwargs)


def run_engine(llm, workload):
    """Seconds of LLM.generate, and the simulated results."""
    from vllm import SamplingParams

    from neuron_batch.device.executor import engine_core

    prompts = [{"prompt_token_ids": prompt_ids(i, p)} for i, (p, _) in enumerate(workload)]
    params = [SamplingParams(max_tokens=m, ignore_eos=True, detokenize=False, temperature=0.0)
              for _, m in workload]
    clock = engine_core(llm).model_executor.clock
    sim_start = clock.now
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    expected = sum(m for _, m in workload)
    if tokens != expected:
        raise RuntimeError(f"engine generated {tokens} tokens, expected {expected}")
    return wall, {"sim_elapsed_s": clock.now - sim_start, "output_tokens": tokens,
                  "steps": engine_core(llm).scheduler.recorder.num_steps, "cpu_s": cpu}


def run_bare(args, max_num_seqs, num_blocks, workload, *, block_hasher=True):
    """Seconds of harness.drive with NeuronScheduler (requests built beforehand).

    block_hasher=True builds the requests with harness.make_request, which always gives them a
    block hasher (a sha256 per full 32-token block, also for every 32 generated tokens);
    False builds them without one, as the engine does with prefix caching off (the simulated
    device's default) -- the stricter baseline."""
    from vllm import SamplingParams
    from vllm.v1.request import Request

    from neuron_batch.runtimes.runtime import get_runtime
    from neuron_batch.scheduler.harness import drive, make_request, make_scheduler
    from neuron_batch.scheduler.neuron import NeuronScheduler

    scheduler = make_scheduler(NeuronScheduler, max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=args.max_num_batched_tokens,
                               max_model_len=args.max_model_len, num_blocks=num_blocks,
                               block_size=32, runtime=get_runtime(args.resolved_runtime))
    if block_hasher:
        requests = [make_request(p, m, req_id=str(i), prompt_token_ids=prompt_ids(i, p))
                    for i, (p, m) in enumerate(workload)]
    else:
        requests = [Request(str(i), list(prompt_ids(i, p)),
                            SamplingParams(max_tokens=m, ignore_eos=True), None)
                    for i, (p, m) in enumerate(workload)]
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    result = drive(scheduler, requests, keep_outputs=False, max_steps=10**9)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if len(result.finished) != len(workload):
        raise RuntimeError("bare loop left requests unfinished")
    return wall, {"steps": scheduler.recorder.num_steps, "cpu_s": cpu}


# -- the measurements ------------------------------------------------------------------------------
def measure_ratio(settings, args, max_num_seqs, workload, workdir):
    from neuron_batch.device.executor import shutdown_llm
    from neuron_batch.device.target import Target

    # the KV pool the engine gets: a static cache's slots (and the null block), or the paged one
    num_blocks = Target.resolve(**settings, max_model_len=args.max_model_len,
                                max_num_seqs=max_num_seqs).pool_blocks
    rows = []
    for repeat in range(args.repeats):
        llm = build_llm(settings, args, max_num_seqs, workdir)
        engine_s, sim = run_engine(llm, workload)
        shutdown_llm(llm)
        del llm
        bare_s, bare = run_bare(args, max_num_seqs, num_blocks, workload)
        strict_s, strict = run_bare(args, max_num_seqs, num_blocks, workload,
                                    block_hasher=False)
        if bare["steps"] != sim["steps"] + 1:   # drive() ends with one empty schedule()
            print(f"  note: engine took {sim['steps']} steps, bare loop {bare['steps']}",
                  file=sys.stderr)
        row = {"engine_s": engine_s, "bare_s": bare_s, "bare_nohash_s": strict_s,
               "ratio": engine_s / bare_s, "ratio_nohash": engine_s / strict_s,
               "engine_cpu_s": sim["cpu_s"], "bare_cpu_s": bare["cpu_s"],
               "bare_nohash_cpu_s": strict["cpu_s"],
               "cpu_ratio": sim["cpu_s"] / bare["cpu_s"],
               "cpu_ratio_nohash": sim["cpu_s"] / strict["cpu_s"],
               "steps": sim["steps"], "sim_elapsed_s": sim["sim_elapsed_s"]}
        rows.append(row)
        print(f"  max_num_seqs={max_num_seqs} repeat {repeat + 1}: engine {engine_s:.2f} s; "
              f"bare loop {bare_s:.2f} s (ratio {row['ratio']:.2f}), without block hasher "
              f"{strict_s:.2f} s (ratio {row['ratio_nohash']:.2f}); CPU-time ratios "
              f"{row['cpu_ratio']:.2f} / {row['cpu_ratio_nohash']:.2f}; {sim['steps']} steps, "
              f"{sim['steps'] / engine_s:,.0f} engine steps/s", flush=True)
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    return {"max_num_seqs": max_num_seqs, "requests": len(workload), "repeats": rows,
            "median_ratio": med("ratio"), "median_ratio_nohash": med("ratio_nohash"),
            "median_cpu_ratio": med("cpu_ratio"),
            "median_cpu_ratio_nohash": med("cpu_ratio_nohash"),
            "median_engine_s": med("engine_s"), "median_bare_s": med("bare_s"),
            "median_bare_nohash_s": med("bare_nohash_s")}


def measure_trace(settings, args, max_num_seqs, workload, workdir):
    from neuron_batch.device.executor import shutdown_llm

    t0 = time.perf_counter()
    llm = build_llm(settings, args, max_num_seqs, workdir)
    startup = time.perf_counter() - t0
    wall, sim = run_engine(llm, workload)
    shutdown_llm(llm)
    elapsed = sim["sim_elapsed_s"]
    row = {"max_num_seqs": max_num_seqs, "requests": len(workload), "startup_s": startup,
           "wall_s": wall, "steps": sim["steps"], "sim_elapsed_s": elapsed,
           "output_tokens": sim["output_tokens"],
           "throughput_tok_s": sim["output_tokens"] / elapsed,
           "requests_per_s": len(workload) / elapsed, "speedup_vs_real_time": elapsed / wall}
    print(f"  trace max_num_seqs={max_num_seqs}: wall {wall:.1f} s (+{startup:.1f} s start-up), "
          f"{sim['steps']:,} steps, simulated {elapsed:,.0f} s = {elapsed / 3600:.2f} h, "
          f"{row['throughput_tok_s']:,.0f} output tok/s, "
          f"simulated {row['speedup_vs_real_time']:,.0f}x faster than real time", flush=True)
    return row


def profile_engine(settings, args, max_num_seqs, workload, workdir, out: Path):
    """cProfile of one engine run, grouped by component."""
    import cProfile
    import pstats

    from neuron_batch.device.executor import shutdown_llm

    llm = build_llm(settings, args, max_num_seqs, workdir)
    profiler = cProfile.Profile()
    profiler.enable()
    run_engine(llm, workload)
    profiler.disable()
    shutdown_llm(llm)
    stats = pstats.Stats(profiler)
    total = max(v[3] for v in stats.stats.values())   # cumulative of the outermost call
    groups = {
        "LLM._add_completion_requests (request intake)": ("offline.py",
                                                          "_add_completion_requests"),
        "Scheduler.schedule (NeuronScheduler + vLLM)": ("neuron.py", "schedule"),
        "Scheduler.update_from_output": ("neuron.py", "update_from_output"),
        "NeuronSimExecutor.execute_model": ("sim.py", "execute_model"),
        "OutputProcessor.process_outputs": ("output_processor.py", "process_outputs"),
        "EngineCore.step (all of the above in it)": ("core.py", "step"),
        "LLMEngine.step": ("llm_engine.py", "step"),
    }
    breakdown = {}
    for label, (file_part, func) in groups.items():
        cum = sum(v[3] for (f, _, name), v in stats.stats.items()
                  if name == func and f.endswith(file_part))
        breakdown[label] = cum
    with open(out, "w", encoding="utf-8") as handle:
        handle.write(f"profile of one engine run, max_num_seqs={max_num_seqs}, "
                     f"{len(workload)} requests; total {total:.2f} s (profiled)\n\n")
        for label, seconds in breakdown.items():
            handle.write(f"{seconds:9.2f} s  {100 * seconds / total:5.1f}%  {label}\n")
        handle.write("\n")
        stats.stream = handle
        stats.sort_stats("tottime").print_stats(35)
    print(f"  profile written to {out}")
    for label, seconds in breakdown.items():
        print(f"    {seconds:8.2f} s {100 * seconds / total:5.1f}%  {label}")
    return {"total_s": total, "breakdown_s": breakdown}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small run: 200-request ratio workload, 2,000-request trace slice")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ratio-requests", type=int, default=1000,
                        help="requests (from the trace's start) in the ratio workload")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--trace-limit", type=int, default=None,
                        help="simulate only the first N trace requests")
    parser.add_argument("--no-trace", action="store_true", help="skip the full-trace runs")
    parser.add_argument("--no-ratio", action="store_true", help="skip the ratio measurement")
    parser.add_argument("--max-num-seqs", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--instance", default="inf2.8xlarge")
    parser.add_argument("--runtime", default=None, choices=("nxdi", "vllm-neuron"),
                        help="default: the instance's (nxdi on inf2/trn1)")
    parser.add_argument("--arch", default="llama-3.1-8b",
                        help="Llama-3.1-8B: Llama-3-8B's shapes with a context of more than "
                             "8,192 tokens, which the trace's longest requests need")
    parser.add_argument("--tp", type=int, default=None)
    parser.add_argument("--weight-dtype", default="bf16")
    parser.add_argument("--max-model-len", type=int, default=16384)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--profile", type=Path, default=None,
                        help="write a cProfile breakdown of one engine run (ratio workload)")
    parser.add_argument("--json", type=Path, default=None, help="write all figures as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.ratio_requests = min(args.ratio_requests, 200)
        args.trace_limit = args.trace_limit or 2000

    from neuron_batch.device.hardware import get_instance
    from neuron_batch.device.target import describe_sim
    from neuron_batch.runtimes.runtime import get_runtime

    # the simulated device, as Target.resolve's keywords (its names looked up here)
    settings = dict(instance=get_instance(args.instance), arch=args.arch, tp=args.tp,
                    weight_dtype=args.weight_dtype,
                    runtime=get_runtime(args.runtime) if args.runtime else None)
    desc = describe_sim(**settings, max_model_len=args.max_model_len, num_prefill_buckets=1,
                        num_decode_buckets=1)
    kv = desc["kv_cache"]
    args.resolved_runtime = desc["runtime"]
    print(f"simulated device: {desc['instance']} TP {desc['tp_degree']}, {desc['arch']} "
          f"{desc['weight_dtype']}, runtime {desc['runtime']}, profile "
          f"{desc['profile']['source']}")
    if kv["layout"] == "static":
        # NxDI's static cache: a max_num_seqs whose slots do not fit cannot load.
        fit = kv["max_concurrent_at_max_model_len"]
        clamped = sorted({min(n, fit) for n in args.max_num_seqs})
        if clamped != sorted(args.max_num_seqs):
            print(f"static KV cache: {fit} slots of {args.max_model_len} fit; max_num_seqs "
                  f"{args.max_num_seqs} -> {clamped}")
        args.max_num_seqs = clamped
    print(f"KV cache: {kv['num_blocks']} blocks x 32 = {kv['tokens']:,} tokens "
          f"({kv['limited_by']}); at max_model_len {args.max_model_len} it holds "
          f"{kv['scheduler_max_concurrent']} requests (NeuronScheduler's admission cap)")
    for n in args.max_num_seqs:
        if n > kv["scheduler_max_concurrent"]:
            print(f"  max_num_seqs={n} exceeds that: at most {kv['scheduler_max_concurrent']} "
                  f"run at once")
    print(f"max_num_batched_tokens {args.max_num_batched_tokens}; requests at time zero; "
          f"vLLM multiprocessing {os.environ.get('VLLM_ENABLE_V1_MULTIPROCESSING')}")

    trace = load_trace(args.trace, args.trace_limit)
    trace, dropped = fit_workload(trace, args.max_model_len)
    if dropped:
        print(f"dropped {dropped} trace requests longer than max_model_len")
    ratio_workload = trace[:args.ratio_requests]
    report = {"device": desc, "args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as tmp:
        workdir = Path(tmp)
        if not args.no_ratio:
            print(f"\nratio: {len(ratio_workload)} requests, {args.repeats} repeats")
            report["ratio"] = [measure_ratio(settings, args, n, ratio_workload, workdir)
                               for n in args.max_num_seqs]
            for row in report["ratio"]:
                print(f"  max_num_seqs={row['max_num_seqs']}: median engine "
                      f"{row['median_engine_s']:.2f} s, bare loop {row['median_bare_s']:.2f} s "
                      f"(without block hasher {row['median_bare_nohash_s']:.2f} s): median "
                      f"ratio {row['median_ratio']:.2f}x ({row['median_ratio_nohash']:.2f}x); "
                      f"CPU time {row['median_cpu_ratio']:.2f}x "
                      f"({row['median_cpu_ratio_nohash']:.2f}x); target <= 1.3x")
        if args.profile is not None:
            print("\nprofile:")
            report["profile"] = profile_engine(settings, args, args.max_num_seqs[0],
                                               ratio_workload, workdir, args.profile)
        if not args.no_trace:
            print(f"\ntrace: {len(trace)} requests, "
                  f"{sum(m for _, m in trace):,} output tokens, all at time zero")
            report["trace"] = [measure_trace(settings, args, n, trace, workdir)
                               for n in args.max_num_seqs]
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
