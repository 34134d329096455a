"""Benchmark: data-parallel replicas on the simulated device, through `neuron-batch run`.

The whole conversation trace (datasets/azure-llm-inference-conv-2023.csv, 19,366 requests),
Llama-3.1-8B, --max-model-len 16384, each layout a fresh `neuron-batch run` (its own process, a
local Ray instance where it runs replicas):

- one inf2.48xlarge as 1 x TP24 (one engine, the plain path), 6 x TP4 and 12 x TP2 replicas;
- inf2.8xlarge: one instance (TP2, the plain path), the same through Ray (`--ray local
  --replicas 1`), and two instances (`--num-instances 2 --replicas 2`).

Prints, per layout, simulated output and total tokens/s (tokens over the longest replica's
simulated time), the lowest replica busy fraction and the wall time of the command, then the two
targets: two inf2.8xlarge give at least 1.9x the tokens/s of one; one replica through Ray takes at
most 1.3x the wall time of the plain path.

    .venv/bin/python scripts/bench_replicas.py                  # everything (about 11 min here)
    .venv/bin/python scripts/bench_replicas.py --limit 2000 --only 8xl
    .venv/bin/python scripts/bench_replicas.py --json > bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "datasets" / "azure-llm-inference-conv-2023.csv"

#: (name, group, instance, tensor parallel size, replicas, instances, through Ray)
LAYOUTS = [
    ("inf2.8xlarge x1 (plain)", "8xl", "inf2.8xlarge", 2, 1, 1, False),
    ("inf2.8xlarge x1 (Ray, 1 replica)", "8xl", "inf2.8xlarge", 2, 1, 1, True),
    ("inf2.8xlarge x2 (Ray, 2 replicas)", "8xl", "inf2.8xlarge", 2, 2, 2, True),
    ("inf2.48xlarge 1 x TP24", "48xl", "inf2.48xlarge", 24, 1, 1, False),
    ("inf2.48xlarge 6 x TP4", "48xl", "inf2.48xlarge", 4, 6, 1, True),
    ("inf2.48xlarge 12 x TP2", "48xl", "inf2.48xlarge", 2, 12, 1, True),
]


def run_layout(layout, args, workdir: Path) -> dict:
    name, _, instance, tp, replicas, instances, through_ray = layout
    out = workdir / name.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "")
    command = [sys.executable, "-m", "neuron_batch.cli", "run", str(args.trace),
               "--device", "sim", "--instance", instance, "--architecture", "llama-3.1-8b",
               "--tensor-parallel-size", str(tp), "--max-model-len", "16384",
               "--max-num-batched-tokens", str(args.max_num_batched_tokens),
               "--max-num-seqs", str(args.max_num_seqs), "-q", "-o", str(out)]
    if args.limit:
        command += ["--limit", str(args.limit)]
    if through_ray:
        command += ["--replicas", str(replicas), "--num-instances", str(instances),
                    "--ray", "local"]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stdout[-3000:]}"
                         f"{done.stderr[-3000:]}")
    report = json.loads((out / "report.json").read_text())
    throughput = report["throughput"]
    replicas_rows = report.get("replicas") or []
    return {"layout": name, "instance": instance, "tp": tp, "replicas": replicas,
            "instances": instances, "ray": through_ray,
            "requests": report["requests"]["completed"],
            "sim_elapsed_s": throughput["elapsed_s"],
            "sim_output_tokens_per_s": throughput["output_tokens_per_s"],
            "sim_total_tokens_per_s": throughput["total_tokens_per_s"],
            "min_busy_fraction": min((r["busy_fraction"] for r in replicas_rows), default=None),
            "replica_requests": [r["requests"] for r in replicas_rows],
            "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--limit", type=int, default=None, help="first N requests only")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--only", choices=["48xl", "8xl"], default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as tmp:
        os.environ.setdefault("RAY_TMPDIR", tmp)
        for layout in LAYOUTS:
            if args.only and layout[1] != args.only:
                continue
            row = run_layout(layout, args, Path(tmp))
            rows.append(row)
            busy = row["min_busy_fraction"]
            print(f"{row['layout']:<36} {row['sim_output_tokens_per_s']:>9,.1f} out tok/s "
                  f"{row['sim_total_tokens_per_s']:>10,.1f} total tok/s (simulated, "
                  f"{row['sim_elapsed_s']:,.0f} s)  wall {row['wall_s']:,.0f} s"
                  + (f"  min busy {busy:.3f}" if busy is not None else ""),
                  file=sys.stderr, flush=True)
    by_name = {row["layout"]: row for row in rows}
    summary: dict = {"rows": rows, "limit": args.limit, "max_num_seqs": args.max_num_seqs}
    one, two = (by_name.get("inf2.8xlarge x1 (plain)"),
                by_name.get("inf2.8xlarge x2 (Ray, 2 replicas)"))
    ray_one = by_name.get("inf2.8xlarge x1 (Ray, 1 replica)")
    if one and two:
        ratio = two["sim_output_tokens_per_s"] / one["sim_output_tokens_per_s"]
        summary["two_instances_vs_one"] = {"ratio": ratio, "target": 1.9, "met": ratio >= 1.9}
    if one and ray_one:
        ratio = ray_one["wall_s"] / one["wall_s"]
        summary["ray_overhead_one_replica"] = {"ratio": ratio, "target": 1.3, "met": ratio <= 1.3}
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    for key, label, direction in (("two_instances_vs_one", "two inf2.8xlarge vs one, simulated "
                                   "tokens/s", ">="),
                                  ("ray_overhead_one_replica", "one replica through Ray vs the "
                                   "plain path, wall time", "<=")):
        if key in summary:
            item = summary[key]
            print(f"{label}: {item['ratio']:.3f} (target {direction} {item['target']}: "
                  f"{'met' if item['met'] else 'NOT met'})")


if __name__ == "__main__":
    main()
