#!/usr/bin/env python3
"""Bucket optimiser speed: divide and conquer against the plain DP on the same histograms.

For histograms of N distinct prefill sizes (default 500, 1,000 and 2,000; counts 1-50, sizes in
1..8192) it times `plans_for_each_k(..., K=8)` with `method="dc"` and `method="plain"`, each
`--repeats` times interleaved, checks that both give the same plans, and prints the median
seconds of each and their ratio (the speed-up of D&C). The test suite checks the plans; their
speed lives here, as a ratio measured in one run, because the machine's speed is not a property
of the code.

    .venv/bin/python scripts/bench_optimiser.py [--sizes 500,1000,2000] [--repeats 3]

A benchmark, not a test: it always exits with status 0.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from neuron_batch.layout.optimiser import plans_for_each_k


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="500,1000,2000")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'sizes':>6}  {'dc median s':>12}  {'plain median s':>15}  {'plain / dc':>10}")
    for num_sizes in (int(s) for s in args.sizes.split(",")):
        rng = random.Random(num_sizes)
        counts = {s: rng.randint(1, 50) for s in rng.sample(range(1, 8193), num_sizes)}
        times: dict[str, list[float]] = {"dc": [], "plain": []}
        plans = {}
        for _ in range(args.repeats):
            for method in ("dc", "plain"):
                started = time.perf_counter()
                plans[method] = plans_for_each_k(counts, 8, 8192, method=method)
                times[method].append(time.perf_counter() - started)
        assert [p.buckets for p in plans["dc"]] == [p.buckets for p in plans["plain"]]
        dc, plain = statistics.median(times["dc"]), statistics.median(times["plain"])
        print(f"{num_sizes:>6}  {dc:>12.3f}  {plain:>15.3f}  {plain / dc:>9.1f}x")


if __name__ == "__main__":
    main()
