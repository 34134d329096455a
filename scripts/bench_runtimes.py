#!/usr/bin/env python
"""What bucket tuning is worth under each Neuron runtime: the conversation trace on a simulated
inf2.8xlarge and inf2.48xlarge (nxdi, what inf2 hosts run) and trn2.48xlarge (vllm-neuron, AWS's
Beta plugin), each a `neuron-batch bench --sweep-buckets` (the library's run_sweep, in fresh
engines): the default buckets against the sweep's best, output tokens per simulated second and
USD per million output tokens.

Layouts (Llama-3.1-8B bf16; max_model_len 16384 holds every request of the trace):
- inf2.8xlarge, TP 2, nxdi: the static KV cache holds 6 slots of 16384 beside the weights, so
  max_num_seqs 6 (a larger one cannot load: the sweep would refuse it);
- inf2.48xlarge, TP 24, nxdi: max_num_seqs 32 (static KV fits);
- trn2.48xlarge, TP 64 (logical cores at LNC 2), vllm-neuron: max_num_seqs 32, paged KV.
  trn2 has no built-in price and no published figures (its profile is uncalibrated): its $/M
  column needs --trn2-price USD.

The sweep's grid is the runtime's own: context-encoding x token-generation buckets under nxdi,
prefill x decode batch buckets plus decode context-length buckets under vllm-neuron.

Examples:
    .venv/bin/python scripts/bench_runtimes.py                    # first 2,000 requests
    .venv/bin/python scripts/bench_runtimes.py --limit 0 --jobs 2 # the whole trace (long)
    .venv/bin/python scripts/bench_runtimes.py --instances inf2.8xlarge --json runtimes.json
"""

from __future__ import annotations

import argparse
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

#: instance -> (TP, max_num_seqs)
LAYOUTS = {"inf2.8xlarge": (2, 6), "inf2.48xlarge": (24, 32), "trn2.48xlarge": (64, 32)}


def bench_one(instance: str, args, out: Path) -> dict:
    from neuron_batch.bench.ranking import rank
    from neuron_batch.bench.sweep import SWEEP_JSON, run_sweep
    from neuron_batch.bench.sweep_spec import SweepSpec
    from neuron_batch.settings import RunSettings

    tp, seqs = LAYOUTS[instance]
    price = args.trn2_price if instance.startswith("trn2") else None
    base = RunSettings.of(
        inputs=(str(TRACE),), device="sim", max_num_seqs=seqs, max_model_len=16384,
        max_num_batched_tokens=8192, limit=args.limit or None, quiet=True,
        instance=instance, architecture="llama-3.1-8b", tensor_parallel_size=tp,
        price_per_hour=price).validate()
    sweep_dir = out / instance
    started = time.monotonic()
    spec = SweepSpec(base, seqs_values=(seqs,), sweep_buckets=True,
                     max_prefill_buckets=args.max_buckets, max_decode_buckets=args.max_buckets,
                     jobs=args.jobs, resume=True)
    run_sweep(spec, sweep_dir, log=lambda m: print(f"  {instance}: {m}", file=sys.stderr,
                                                   flush=True))
    data = json.loads((sweep_dir / SWEEP_JSON).read_text(encoding="utf-8"))
    rows = rank(data["configurations"])
    default = next(r for r in rows if r["name"] == "default")
    best = rows[0]
    return {"instance": instance, "runtime": base.resolve_runtime().name, "tp": tp,
            "max_num_seqs": seqs, "configurations": len(rows),
            "default_tok_s": default["output_tokens_per_s"],
            "best": best["name"], "best_tok_s": best["output_tokens_per_s"],
            "gain": best["output_tokens_per_s"] / default["output_tokens_per_s"],
            "default_usd_per_m": default.get("usd_per_million_output_tokens"),
            "best_usd_per_m": best.get("usd_per_million_output_tokens"),
            "best_graphs": best["compiled_graphs"], "default_graphs": default["compiled_graphs"],
            "wall_s": round(time.monotonic() - started)}


def usd(value) -> str:
    return "n/a (no price)" if value is None else f"${value:,.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", default=",".join(LAYOUTS))
    parser.add_argument("--limit", type=int, default=2000,
                        help="first N requests of the trace (0: all 19,366)")
    parser.add_argument("--max-buckets", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--trn2-price", type=float, default=None, metavar="USD",
                        help="trn2.48xlarge USD per hour (no built-in price)")
    parser.add_argument("--out", default=None, help="keep the sweeps here (default: a temp dir)")
    parser.add_argument("--json", default=None, help="write the table as JSON here")
    args = parser.parse_args()

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-runtimes-"))
    results = [bench_one(name.strip(), args, out) for name in args.instances.split(",")]
    print(f"\nconversation trace, {'all' if not args.limit else f'first {args.limit:,}'} "
          f"requests, Llama-3.1-8B, max_model_len 16384 (sweeps in {out})")
    print(f"{'instance':14} {'runtime':12} {'S':>3} {'default tok/s':>13} {'best tok/s':>11} "
          f"{'gain':>6} {'$/M default':>15} {'$/M best':>15}  best")
    for r in results:
        print(f"{r['instance']:14} {r['runtime']:12} {r['max_num_seqs']:>3} "
              f"{r['default_tok_s']:>13,.1f} {r['best_tok_s']:>11,.1f} {r['gain']:>5.2f}x "
              f"{usd(r['default_usd_per_m']):>15} {usd(r['best_usd_per_m']):>15}  "
              f"{r['best']} ({r['best_graphs']} graphs vs {r['default_graphs']})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
