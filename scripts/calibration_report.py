#!/usr/bin/env python3
"""Calibration report for the simulated Neuron device's cost model.

Prints, for AWS's published inf2.48xlarge rows: published vs modelled TTFT, median TPOT and
output throughput with relative errors, for the fit to all rows and for held-out rows; then
the cost of one step-time call. `--write` regenerates the built-in profile JSON files.

    .venv/bin/python scripts/calibration_report.py [--csv PATH] [--write]
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from neuron_batch.device.calibrate import (  # noqa: E402
    FIT_PARAMS,
    builtin_profiles,
    evaluate_published,
    fit_published,
    holdout,
    leave_one_out,
    median_abs_errors,
)
from neuron_batch.device.cost_model import PROFILES_DIR, StepCostModel, save_profile  # noqa: E402


def print_table(title: str, table: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'row':44s} {'TTFT ms pub/model':>19s} {'err':>6s}  {'TPOT ms pub/model':>17s} "
          f"{'err':>6s}  {'tok/s pub/model':>17s} {'err':>6s}")
    for e in table:
        r, err = e["row"], e["error"]
        print(f"{r.label:44s} {r.ttft_s * 1e3:8.1f} /{e['ttft_s'] * 1e3:8.1f} {err['ttft']:+6.1%}  "
              f"{r.tpot_s * 1e3:7.2f} /{e['tpot_s'] * 1e3:7.2f} {err['tpot']:+6.1%}  "
              f"{r.throughput:7.1f} /{e['throughput']:7.1f} {err['throughput']:+6.1%}")
    med = median_abs_errors(table)
    print(f"{'median |error|':44s} {'':17s} {med['ttft']:6.1%}  {'':17s} {med['tpot']:6.1%}  "
          f"{'':15s} {med['throughput']:6.1%}")


def per_call_cost(profile) -> dict[str, float]:
    model = StepCostModel(profile, "inf2.48xlarge", "Llama-3-8B", 24, "int8")
    record = SimpleNamespace(kind="decode", num_seqs=30, num_seqs_padded=32, num_tokens=30,
                             num_tokens_padded=30, context_tokens=40_000)
    calls = {"decode_time(32, 40000)": lambda: model.decode_time(32, 40_000),
             "prefill_time(1024, 512)": lambda: model.prefill_time(1024, 512),
             "step_time(record)": lambda: model.step_time(record)}
    n = 200_000
    return {name: min(timeit.repeat(fn, number=n, repeat=3)) / n for name, fn in calls.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", help="published figures (default: the copy in calibrate.py)")
    parser.add_argument("--write", action="store_true",
                        help=f"regenerate the built-in profiles in {PROFILES_DIR}")
    args = parser.parse_args()

    profile = fit_published(args.csv)
    print("Fitted inf2.48xlarge profile (all published rows):")
    for name in FIT_PARAMS + ("collective_latency_s", "compile_s_per_graph_per_gb"):
        print(f"  {name:28s} {getattr(profile, name):.6g}"
              + ("   (held, not fitted)" if name not in FIT_PARAMS else ""))
    print_table("Fit to all 8 rows (in-sample)", evaluate_published(profile, args.csv))

    print_table("Held out, leave-one-out: each row predicted by a fit to the other 7",
                leave_one_out(args.csv))
    _, held = holdout(lambda r: r.batch == 1 and r.model == "Llama-3-8B", args.csv)
    print_table("Held out: fit on the 4 batch-1 Llama-3-8B rows, predict the other 4", held)
    _, held = holdout(lambda r: r.batch == 1, args.csv)
    print_table("Held out: fit on the 6 batch-1 rows, predict the 2 batch-8 rows", held)

    print("\nCost of one call (best of 3 x 200,000):")
    for name, seconds in per_call_cost(profile).items():
        print(f"  {name:26s} {seconds * 1e6:.2f} us")

    if args.write:
        for name, derived in builtin_profiles(profile).items():
            print(f"wrote {save_profile(derived, PROFILES_DIR / f'{name}.json')}")


if __name__ == "__main__":
    main()
