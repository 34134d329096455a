#!/usr/bin/env python
"""A batch job split by length (`run --split-at N`) against the best single layout, on the
simulated device under nxdi (what inf2 hosts run), measured in the same run
(`bench --split-at`, neuron_batch/bench/split_compare.py).

The Azure conversation trace (datasets/), Llama-3.1-8B bf16, all requests at time zero. On
each instance:
- single layouts: max_model_len the tightest that holds every request (its longest prompt +
  max_tokens, rounded up to 128), every static slot that fits beside the weights there;
  (a) NxDI's default buckets in input order, what a user gets by default; (b) buckets fitted
  to the workload and longest-first order (`--order length`), the best single layout we know;
- splits, fitted buckets and longest-first order (what `run --split-at N --order length`
  does): for each cut, the requests that fit in N first with every slot that fits at N, then
  the rest in the single layout. Cuts: by default the candidate cut points (where the short
  layout's slot count changes) nearest the 82nd, 86th, 90th and 99th percentile of the lengths.
Output tokens per simulated second of run time (each layout's estimated compile time is shown
apart; a split compiles twice) and USD per million output tokens at the on-demand price.
Target (issue 23): the best split >= 1.5x the best single layout on inf2.8xlarge. Exit status
1 if missed.

Examples:
    .venv/bin/python scripts/bench_length_split.py                       # the whole trace
    .venv/bin/python scripts/bench_length_split.py --limit 3000 --instances inf2.8xlarge
    .venv/bin/python scripts/bench_length_split.py --cuts 2176,4224 --json split.json
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRACE = ROOT / "datasets" / "azure-llm-inference-conv-2023.csv"
ARCH = "llama-3.1-8b"
#: instance -> TP degree (a replica of TP 2 on inf2.8xlarge; every core on inf2.48xlarge)
LAYOUTS = {"inf2.8xlarge": 2, "inf2.48xlarge": 24}
QUANTILES = (0.82, 0.86, 0.90, 0.99)
TARGET = 1.5
STEP = 128


def trace_lengths(limit: int | None) -> tuple[list[int], list[int]]:
    with open(TRACE, newline="", encoding="utf-8") as handle:
        rows = [(int(r["num_prefill_tokens"]), max(1, int(r["num_decode_tokens"])))
                for r in csv.DictReader(handle)]
    rows = rows[:limit] if limit else rows
    return [p for p, _ in rows], [p + o for p, o in rows]


def slots_at(instance: str, tp: int):
    from neuron_batch.device.architectures import resolve_architecture
    from neuron_batch.device.hardware import get_instance
    from neuron_batch.device.static_kv import static_slots
    from neuron_batch.layout.split import MAX_SHORT_SLOTS

    arch, inst = resolve_architecture(ARCH), get_instance(instance)
    return lambda n: min(static_slots(inst, arch, tp, "bf16", n), MAX_SHORT_SLOTS)


def default_cuts(lengths: list[int], instance: str, tp: int, longest: int) -> list[int]:
    from neuron_batch.layout.split import cut_candidates

    candidates = [cut for cut, _ in cut_candidates(lengths, slots_at(instance, tp), longest,
                                                   STEP)]
    ordered = sorted(lengths)
    share = [bisect.bisect_right(ordered, cut) / len(ordered) for cut in candidates]
    return sorted({min(candidates, key=lambda c, q=q: abs(share[candidates.index(c)] - q))
                   for q in QUANTILES})


def compare_on(instance: str, tp: int, cuts: list[int], limit: int | None, prompt_lens,
               lengths, out: Path, jobs: int) -> dict:
    from neuron_batch.bench.split_compare import (
        compare,
        comparison_candidates,
        figures,
        format_comparison,
        run_candidates,
    )
    from neuron_batch.settings import RunSettings

    longest = -(-max(lengths) // STEP) * STEP
    base = RunSettings.of(
        inputs=(str(TRACE),), device="sim", max_num_seqs=slots_at(instance, tp)(longest),
        max_model_len=longest, limit=limit, quiet=True, order="length",
        instance=instance, architecture=ARCH, tensor_parallel_size=tp)
    candidates = comparison_candidates(base, out, cuts, prompt_lens, lengths)
    as_default = replace(candidates[0], name="single default",
                         params={**candidates[0].params, "order": "input"},
                         settings=candidates[0].settings.replace(order="input",
                                          output=str(out / "configs" / "single-default")))
    candidates = [as_default, *candidates[1:]]   # (fitted + longest first is the better one)
    outcomes = run_candidates(candidates, jobs=jobs, log=lambda m: print(m, flush=True))
    rows = [figures(c.name, c.params, outcomes[c.name]["report"]) for c in candidates]
    verdict = compare(rows)
    print(f"\n{instance} TP {tp}, {len(lengths):,} requests\n"
          + format_comparison(rows, verdict), flush=True)
    return {"instance": instance, "tp": tp, "cuts": cuts, "configurations": rows, **verdict}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", default=",".join(LAYOUTS))
    parser.add_argument("--limit", type=int, default=0, help="first N requests (0: all)")
    parser.add_argument("--cuts", default=None, help="comma-separated cuts (default: the "
                        "candidate cut points nearest the 82/86/90/99th percentile lengths)")
    parser.add_argument("--jobs", type=int, default=2, help="simulations at once")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    limit = args.limit or None
    prompt_lens, lengths = trace_lengths(limit)
    longest = -(-max(lengths) // STEP) * STEP
    results, failed = [], False
    with tempfile.TemporaryDirectory(prefix="bench-split-") as tmp:
        for instance in args.instances.split(","):
            tp = LAYOUTS[instance]
            cuts = (sorted({int(c) for c in args.cuts.split(",")}) if args.cuts
                    else default_cuts(lengths, instance, tp, longest))
            print(f"{instance} TP {tp}: {len(lengths):,} requests, single layout max_model_len "
                  f"{longest:,}; cuts {cuts}", flush=True)
            result = compare_on(instance, tp, cuts, limit, prompt_lens, lengths,
                                Path(tmp) / instance, args.jobs)
            results.append(result)
            if instance == "inf2.8xlarge" and (result["ratio"] or 0) < TARGET:
                failed = True
    for r in results:
        print(f"{r['instance']}: best split {r['best_split']} = {r['ratio']:.2f}x the best "
              f"single layout ({r['best_single']})")
    print(f"target: best split >= {TARGET}x the best single layout on inf2.8xlarge: "
          f"{'missed' if failed else 'met'}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
