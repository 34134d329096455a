#!/usr/bin/env python3
"""Speed of `--order prefix` (inputs/shared_prefix.py) on a real trace, against `--order length`.

Reads a Mooncake trace (default: the whole one in ../shared/datasets, else the slice in
datasets/), makes every prompt's token ids as a run does (inputs/prepare.py), then times
`in_order(..., "prefix")` (input-order branches, and longest-first as under NxDI),
`in_order(..., "length")` and the report's `shared_prefix_tokens` bound, each `--repeats`
times, and prints the median seconds (wall and CPU), each one's CPU time as a multiple of the
length sort's, and the bound as a share of the prompt tokens. The test suite checks what the
order is; its speed lives here because the machine's speed is not a property of the code.

    .venv/bin/python scripts/bench_order.py [--trace PATH] [--block 32] [--repeats 3] \
        [--max-len 16384]

A benchmark, not a test: it always exits with status 0.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from neuron_batch.inputs.load import load_prompts
from neuron_batch.inputs.prepare import in_order, prepare_requests
from neuron_batch.inputs.shared_prefix import shared_prefix_tokens

ROOT = Path(__file__).resolve().parents[1]
TRACES = (ROOT.parent / "shared" / "datasets" / "mooncake-conversation-trace.jsonl",
          ROOT / "datasets" / "mooncake-conversation-trace-300.jsonl")


def median_s(work, repeats: int) -> tuple[float, float]:
    """Median (wall, CPU) seconds of `work`: on a shared machine the CPU time is the one that
    says what the code costs."""
    wall, cpu = [], []
    for _ in range(repeats):
        started, started_cpu = time.perf_counter(), time.process_time()
        work()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=next((t for t in TRACES if t.exists()),
                                                           TRACES[-1]))
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=None,
                        help="keep only requests of input + output <= this (a layout's limit)")
    args = parser.parse_args()
    started = time.perf_counter()
    loaded = load_prompts([args.trace])
    requests = prepare_requests(loaded.records, tokenizer=None, tokenizer_name=None,
                                vocab_size=128_256, max_model_len=1 << 30,
                                default_max_tokens=1).requests
    if args.max_len is not None:
        requests = [r for r in requests if r.length <= args.max_len]
    tokens = sum(len(r.prompt_token_ids) for r in requests)
    print(f"{args.trace.name}: {len(requests):,} requests, {tokens / 1e6:.1f} M prompt tokens "
          f"(read and made in {time.perf_counter() - started:.1f} s); block {args.block}")
    prompts = [r.prompt_token_ids for r in requests]
    cases = {
        "prefix": lambda: in_order(requests, "prefix", block_size=args.block),
        "prefix, longest first": lambda: in_order(requests, "prefix", block_size=args.block,
                                                  by_length=True),
        "length": lambda: in_order(requests, "length"),
        "bound": lambda: shared_prefix_tokens(prompts, args.block),
    }
    medians = {name: median_s(work, args.repeats) for name, work in cases.items()}
    for name, (wall, cpu) in medians.items():
        print(f"  {name:<22} {wall:7.3f} s wall {cpu:7.3f} s CPU  "
              f"({cpu / medians['length'][1]:.0f}x length)")
    bound = shared_prefix_tokens(prompts, args.block)
    print(f"  bound: {bound:,} tokens, {bound / tokens:.1%} of the prompt tokens")


if __name__ == "__main__":
    main()
