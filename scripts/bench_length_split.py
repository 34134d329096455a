#!/usr/bin/env python
"""A batch job split by length (`run --split-at N`) against the best single layout, on the
simulated device under nxdi (what inf2 hosts run), measured in the same run.

The Azure conversation trace (datasets/), Llama-3.1-8B bf16, all requests at time zero:
- single layout: max_model_len the tightest that holds every request (its longest prompt +
  max_tokens, rounded up to 128), with every static slot that fits beside the weights there;
- split: for each cut N (by default the trace's 90th, 95th and 99th percentile lengths and
  4224, rounded up to 128), the requests that fit in N run first with every slot that fits at
  N, the rest in the single layout. The best cut is reported.
Output tokens per simulated second (run time only; the table also gives each layout's
estimated compile time, which a split pays twice) and USD per million output tokens at the
on-demand price. Target (issue 23): the best split >= 1.5x the best single layout on
inf2.8xlarge. Exit status 1 if missed.

Examples:
    .venv/bin/python scripts/bench_length_split.py                       # the whole trace
    .venv/bin/python scripts/bench_length_split.py --limit 2000 --instances inf2.8xlarge
    .venv/bin/python scripts/bench_length_split.py --cuts 4224 --json split.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRACE = ROOT / "datasets" / "azure-llm-inference-conv-2023.csv"
ARCH = "llama-3.1-8b"
#: instance -> TP degree (a replica of TP 2 on inf2.8xlarge; every core on inf2.48xlarge)
LAYOUTS = {"inf2.8xlarge": 2, "inf2.48xlarge": 24}
TARGET = 1.5
STEP = 128


def lengths(limit: int | None) -> list[int]:
    with open(TRACE, newline="", encoding="utf-8") as handle:
        rows = [int(r["num_prefill_tokens"]) + max(1, int(r["num_decode_tokens"]))
                for r in csv.DictReader(handle)]
    return rows[:limit] if limit else rows


def round_up(value: int) -> int:
    return -(-value // STEP) * STEP


def slots(instance: str, tp: int, max_model_len: int) -> int:
    from neuron_batch.device.architectures import resolve_architecture
    from neuron_batch.device.static_kv import static_slots

    return static_slots(instance, resolve_architecture(ARCH), tp, "bf16", max_model_len)


def run_one(instance: str, tp: int, max_model_len: int, seqs: int, split_at: int | None,
            limit: int | None, out: Path) -> dict:
    from neuron_batch.config import RunSettings, SimOptions
    from neuron_batch.run.runner import run

    settings = RunSettings(
        inputs=(str(TRACE),), device="sim", max_num_seqs=seqs, max_model_len=max_model_len,
        max_num_batched_tokens=8192, limit=limit, quiet=True, split_at=split_at,
        output=str(out), sim=SimOptions(instance=instance, architecture=ARCH,
                                        tensor_parallel_size=tp))
    started = time.monotonic()
    report = run(settings).report
    split = report.get("split") or {}
    compile_s = split.get("estimated_compile_s") or \
        report["config"]["sim"]["compile"]["estimated_compile_s"]
    return {"instance": instance, "max_model_len": max_model_len, "max_num_seqs": seqs,
            "split_at": split_at,
            "parts": [{k: p[k] for k in ("part", "max_model_len", "max_num_seqs", "requests",
                                         "output_tokens_per_s")} for p in split.get("parts", [])],
            "output_tokens_per_s": report["throughput"]["output_tokens_per_s"],
            "usd_per_million_output_tokens": report["cost"]["usd_per_million_output_tokens"],
            "estimated_compile_s": compile_s, "wall_s": round(time.monotonic() - started)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", default=",".join(LAYOUTS))
    parser.add_argument("--limit", type=int, default=0, help="first N requests (0: all)")
    parser.add_argument("--cuts", default=None, help="comma-separated cuts (default: p90, p95, "
                        "p99 of the lengths and 4224)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    limit = args.limit or None
    sizes = sorted(lengths(limit))
    longest = round_up(sizes[-1])
    if args.cuts:
        cuts = sorted({int(c) for c in args.cuts.split(",")})
    else:
        cuts = sorted({round_up(sizes[int(q * (len(sizes) - 1))]) for q in (0.90, 0.95, 0.99)}
                      | {4224})
    cuts = [c for c in cuts if c < longest]
    print(f"{len(sizes):,} requests; longest {sizes[-1]:,} tokens -> single layout "
          f"max_model_len {longest:,}; cuts {cuts}", flush=True)
    results, failed = [], False
    with tempfile.TemporaryDirectory(prefix="bench-split-") as tmp:
        for instance in args.instances.split(","):
            tp = LAYOUTS[instance]
            fit = slots(instance, tp, longest)
            single = run_one(instance, tp, longest, fit, None, limit, Path(tmp) / f"{instance}-1")
            print(f"{instance} TP {tp}: single layout, {fit} slots of {longest:,}: "
                  f"{single['output_tokens_per_s']:,.1f} out tok/s ({single['wall_s']} s)",
                  flush=True)
            splits = []
            for cut in cuts:
                result = run_one(instance, tp, longest, fit, cut, limit,
                                 Path(tmp) / f"{instance}-split-{cut}")
                parts = ", ".join(f"{p['part']} {p['requests']:,} req x {p['max_num_seqs']} "
                                  f"slots of {p['max_model_len']:,}" for p in result["parts"])
                print(f"  split at {cut:,}: {result['output_tokens_per_s']:,.1f} out tok/s "
                      f"({result['output_tokens_per_s'] / single['output_tokens_per_s']:.2f}x; "
                      f"{parts}; {result['wall_s']} s)", flush=True)
                splits.append(result)
            best = max(splits, key=lambda r: r["output_tokens_per_s"])
            ratio = best["output_tokens_per_s"] / single["output_tokens_per_s"]
            results.append({"instance": instance, "single": single, "best_split": best,
                            "ratio": ratio, "splits": splits})
            if instance == "inf2.8xlarge" and ratio < TARGET:
                failed = True
    print("\ninstance        single tok/s  $/M single  best split  tok/s   ratio  $/M split  "
          "compile single / split")
    for r in results:
        s, b = r["single"], r["best_split"]
        print(f"{r['instance']:15} {s['output_tokens_per_s']:>12,.1f} "
              f"{s['usd_per_million_output_tokens']:>11.2f}  at {b['split_at']:>6,} "
              f"{b['output_tokens_per_s']:>8,.1f} {r['ratio']:>6.2f}x "
              f"{b['usd_per_million_output_tokens']:>10.2f}  "
              f"{s['estimated_compile_s'] / 60:,.0f} / {b['estimated_compile_s'] / 60:,.0f} min")
    print(f"target: best split >= {TARGET}x the single layout on inf2.8xlarge: "
          f"{'missed' if failed else 'met'}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
