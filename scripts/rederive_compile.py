#!/usr/bin/env python
"""Every measured figure that weighed compile time, again with the compile-time model of
issue 29 (neuron_batch/device/compile_time.py), from the stored results: the run figures
(hours, tok/s, $ of the run) do not depend on compile, so only the start-up and the "with
compile" columns are recomputed, each layout from its graph counts. Prints old against new.

- the split tables (results/examples/length-split-conv-trace/bench_length_split.json);
- the nxdi sweep's "cheapest with compile" (results/examples/sweep-nxdi-inf2.8xlarge/sweep.csv);
- `--split-at auto`'s choice on the whole trace and the side-by-side placement on its first
  3,000 requests: the step-time estimate again (layout/split.py choose_cut, placement.choose),
  a few seconds to a minute, nothing simulated.

(The plan example, results/examples/plan-conv-trace, is made under this start-up itself since
2026-12-02: nothing of it to re-derive.)

    PYTHONPATH=. .venv/bin/python scripts/rederive_compile.py [--skip-estimates]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neuron_batch.device.architectures import get_architecture  # noqa: E402
from neuron_batch.device.compile_time import compile_footprint  # noqa: E402
from neuron_batch.device.hardware import get_instance  # noqa: E402
from neuron_batch.report.cost import price_for  # noqa: E402
from neuron_batch.runtimes.buckets import nxdi_default_buckets  # noqa: E402
from neuron_batch.runtimes.runtime import get_runtime  # noqa: E402

EXAMPLES = ROOT / "results" / "examples"
TRACE = ROOT / "datasets" / "azure-llm-inference-conv-2023.csv"
ARCH = "llama-3.1-8b"
LLAMA = get_architecture(ARCH)
NXDI = get_runtime("nxdi")


def startup_s(instance: str, tp: int, prefill: int, decode: int, compiled: bool = False):
    return compile_footprint(prefill, decode, LLAMA, "bf16", tp, instance=get_instance(instance),
                             runtime=NXDI, compiled=compiled)["estimated_compile_s"]


def layout_graphs(part: dict | None, max_model_len: int) -> tuple[int, int]:
    """(context-encoding, token-generation) graphs of a stored layout; NxDI's default count
    (fitted lists keep it) when the lists were not stored."""
    if part:
        buckets = part["buckets"]
        return (len(buckets["context_encoding_buckets"]),
                len(buckets["token_generation_buckets"]))
    count = len(nxdi_default_buckets(max_model_len))
    return count, count


def split_tables() -> None:
    data = json.loads((EXAMPLES / "length-split-conv-trace" / "bench_length_split.json")
                      .read_text())
    for block in data:
        instance, tp = block["instance"], block["tp"]
        price = price_for(instance, "on-demand", None).per_hour_usd
        print(f"\n{instance} TP {tp}: compile h old -> new, $/M with compile old -> new "
              f"(fresh; loaded only)")
        for row in block["configurations"]:
            layouts = row["parts"] or [None]
            new = sum(startup_s(instance, tp, *layout_graphs(p, p["max_model_len"] if p else
                                                                row["max_model_len"]))
                      for p in layouts)
            loaded = sum(startup_s(instance, tp, *layout_graphs(p, p["max_model_len"] if p
                                                                else row["max_model_len"]),
                                   compiled=True) for p in layouts)
            output_m = row["output_tokens_per_s"] * row["elapsed_s"] / 1e6
            run = row["usd_per_million_output_tokens"]
            fresh_m = run + new / 3600 * price / output_m
            loaded_m = run + loaded / 3600 * price / output_m
            print(f"  {row['name']:<14} {row['estimated_compile_s'] / 3600:5.2f} -> "
                  f"{new / 3600:4.2f} h   ${row['usd_per_million_with_compile']:.2f} -> "
                  f"${fresh_m:.2f}; ${loaded_m:.2f}   (run ${run:.2f}, "
                  f"{row['elapsed_s'] / 3600:.2f} h)")


def sweep() -> None:
    path = EXAMPLES / "sweep-nxdi-inf2.8xlarge" / "sweep.csv"
    rows = list(csv.DictReader(path.open()))
    price = price_for("inf2.8xlarge", "on-demand", None).per_hour_usd
    print("\nsweep-nxdi-inf2.8xlarge: graphs, est. compile old -> new, USD run + compile "
          "old -> new")
    table = []
    for row in rows:
        graphs = int(row["compiled_graphs"])
        prefill = len(row["prefill_buckets"].split(","))
        new = startup_s("inf2.8xlarge", 2, prefill, graphs - prefill)
        usd = float(row["usd"])
        table.append((row["name"], graphs, float(row["estimated_compile_s"]), new, usd,
                      float(row["usd_with_compile"]), usd + new / 3600 * price,
                      float(row["output_tokens_per_s"])))
    for name, graphs, old, new, usd, old_c, new_c, tps in sorted(table, key=lambda r: -r[7]):
        print(f"  {name:<12} {graphs:>2} graphs  {old / 60:5.0f} -> {new / 60:4.1f} min   "
              f"${old_c:.2f} -> ${new_c:.2f}   (run ${usd:.2f}, {tps:.0f} tok/s)")
    print(f"  cheapest with compile: old {min(table, key=lambda r: r[5])[0]}, "
          f"new {min(table, key=lambda r: r[6])[0]}; by the run alone "
          f"{min(table, key=lambda r: r[4])[0]}")


def estimates() -> None:
    """choose_cut on the whole trace, and the side-by-side placement on 3,000 requests."""
    from neuron_batch.inputs.prepare import in_order
    from neuron_batch.job.job import resolve_target
    from neuron_batch.layout.split import choose_cut, plan_parts
    from neuron_batch.run.runner import split_inputs
    from neuron_batch.settings import RunSettings

    sys.path.insert(0, str(ROOT / "scripts"))
    from split_what_if import load

    base = RunSettings.of(("rederive",), device="sim", max_model_len=14208, max_num_seqs=7,
                       order="length", instance="inf2.8xlarge",
                                                      tensor_parallel_size=2,
                                                      architecture=ARCH).validate()
    slots, estimate = split_inputs(resolve_target(base, None), None)
    requests = in_order(load(TRACE, None), "length")
    print("\n--split-at auto on the whole trace (inf2.8xlarge TP 2, 7 slots of 14,208):")
    print("  " + choose_cut(base, requests, slots, estimate)[1])
    for compiled in (False, True):
        print(f"  every layout {'compiled before' if compiled else 'compiled fresh'}: "
              + choose_cut(base, requests, slots, estimate.assuming(compiled))[1])
    side = base.replace(split_at=2176, replicas=2, split_placement="auto",
                        num_instances=2).validate()
    first = in_order(load(TRACE, 3000), "length")
    slots, estimate = split_inputs(resolve_target(side, None), None)
    for compiled in (None, False, True):
        chosen = plan_parts(side, first, slots, estimate if compiled is None
                            else estimate.assuming(compiled))[1]
        label = {None: "as they stand", False: "compiled fresh", True: "compiled before"}
        print(f"  split at 2,176 on 2 x inf2.8xlarge, first 3,000, layouts "
              f"{label[compiled]}: {chosen.mode}"
              f" (K {chosen.short_replicas}), estimated {chosen.estimated_s / 3600:.2f} h "
              f"(start-up wall {chosen.compile_s / 3600:.2f} h) against "
              f"{chosen.in_turn_s / 3600:.2f} h in turn")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-estimates", action="store_true",
                        help="only the stored tables (no step-time estimate of the trace)")
    args = parser.parse_args()
    split_tables()
    sweep()
    if not args.skip_estimates:
        estimates()


if __name__ == "__main__":
    main()
