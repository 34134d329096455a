"""How long `neuron-batch --help` and `neuron-batch run --help` take here against another checkout
of the package, measured in the same run: alternating fresh interpreters, medians and their
ratio (this machine is shared and noisy: only the ratio means much).

    python scripts/bench_help.py --base ../other-checkout [--repeats 15]

`--base` is a folder holding another `neuron_batch/` (a `git worktree add ../base <rev>`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = (["--help"], ["run", "--help"])


def once(checkout: Path, args: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "neuron_batch.cli", *args], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    for command in COMMANDS:
        times: dict[str, list[float]] = {"this": [], "base": []}
        once(ROOT, command), once(args.base, command)          # (warm the file cache)
        for _ in range(args.repeats):
            times["this"].append(once(ROOT, command))
            times["base"].append(once(args.base, command))
        this, base = (statistics.median(times[k]) for k in ("this", "base"))
        print(f"neuron-batch {' '.join(command):<12} this {this * 1000:6.0f} ms   "
              f"base {base * 1000:6.0f} ms   ratio {this / base:.3f} "
              f"(medians of {args.repeats})")


if __name__ == "__main__":
    main()
