#!/usr/bin/env python
"""What prefix caching and prefix order are worth on the simulated device (issue 30):
Llama-3.1-8B bf16, each job run three ways -- caching off, on in input order, on in prefix
order (`--order prefix`) -- with output tokens per simulated second, the prompt tokens vLLM's
prefix cache served (hit fraction) against what an unbounded cache could serve (the bound:
every shared block computed once), $ per million output tokens, and where the time went.

Jobs and layouts:
- the Mooncake conversation trace (../shared/datasets, else the slice in datasets/): the
  requests that fit in 16,384 tokens on inf2.48xlarge (nxdi, TP 24, max_num_seqs 16) and
  trn2.48xlarge (vllm-neuron, TP 64, max_num_seqs 16; no built-in price), and those that fit
  in 8,192 on inf2.8xlarge (nxdi, TP 2, max_num_seqs 8);
- on inf2.48xlarge, a shared-instruction job (1,024 shared tokens, 256 own, 64 out) and a job
  that shares nothing (1,280 own tokens, 64 out).

Targets (issue 30): on the Mooncake slice on inf2.48xlarge, prefix order serves >= 90% of the
bound and >= 1.15x the output tok/s of caching off; the shared-instruction job >= 2x; on the
job that shares nothing, caching should be left off. Each row's time is split into prefill,
decode and (nxdi on inf2/trn1) the decode-time block-KV gather, which says which term of the
step model holds a missed target back.

    .venv/bin/python scripts/bench_prefix.py --limit 200          # small, a few minutes
    .venv/bin/python scripts/bench_prefix.py --limit 0 --json prefix.json   # all (long)

A benchmark, not a test: it exits 0 whatever the figures.
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
TRACES = (ROOT.parent / "shared" / "datasets" / "mooncake-conversation-trace.jsonl",
          ROOT / "datasets" / "mooncake-conversation-trace-300.jsonl")
ARCH = "llama-3.1-8b"
#: (name, instance, runtime, tensor parallel, max_model_len, max_num_seqs)
LAYOUTS = (("inf2.48xlarge", "inf2.48xlarge", "nxdi", 24, 16384, 16),
           ("trn2.48xlarge", "trn2.48xlarge", "vllm-neuron", 64, 16384, 16),
           ("inf2.8xlarge", "inf2.8xlarge", "nxdi", 2, 8192, 8))
MODES = (("off", ["--no-prefix-caching"]), ("on, input order", ["--prefix-caching"]),
         ("on, prefix order", ["--prefix-caching", "--order", "prefix"]))
#: A price for trn2.48xlarge's $/M column (none is built in): pass --trn2-price.
BLOCK = 32


def mooncake_slice(trace: Path, max_len: int, limit: int, out: Path) -> Path:
    """The trace's lines whose input + output fit in `max_len` (the first `limit`; 0: all)."""
    kept = []
    with trace.open(encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            if row["input_length"] + max(row["output_length"], 1) <= max_len:
                kept.append(line if line.endswith("\n") else line + "\n")
                if limit and len(kept) >= limit:
                    break
    out.write_text("".join(kept), encoding="utf-8")
    return out


def synthetic_job(out: Path, count: int, shared: bool) -> Path:
    """`count` requests of 1,280 prompt tokens and 64 out: the first 1,024 one instruction
    (`shared`) or each request's own."""
    rows = [{"prompt_len": 1280, "max_tokens": 64,
             **({"prefix_id": "instruction", "prefix_len": 1024} if shared else {})}
            for _ in range(count)]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return out


def bound_fraction(path: Path) -> tuple[int, int]:
    """(prompt tokens, the most an unbounded cache of 32-token blocks serves) of a job."""
    from neuron_batch.inputs.load import load_prompts
    from neuron_batch.inputs.prepare import prepare_requests
    from neuron_batch.inputs.shared_prefix import shared_prefix_tokens

    records = load_prompts([path]).records
    prompts = [r.prompt_token_ids for r in prepare_requests(
        records, tokenizer=None, tokenizer_name=None, vocab_size=128_256,
        max_model_len=1 << 30, default_max_tokens=64).requests]
    return sum(len(p) for p in prompts), shared_prefix_tokens(prompts, BLOCK)


def run_one(job: Path, layout: tuple, mode: list[str], out: Path, price: float | None
            ) -> dict:
    """One `neuron-batch run` on the simulated device; its figures and its time by term."""
    from click.testing import CliRunner

    from neuron_batch.cli import main
    from neuron_batch.device.hardware import get_instance
    from neuron_batch.device.target import Target
    from neuron_batch.runtimes.runtime import get_runtime
    from neuron_batch.scheduler.records import DECODE, PREFILL, read_records

    _, instance, runtime, tp, max_len, seqs = layout
    args = ["run", str(job), "--device", "sim", "--instance", instance, "--runtime", runtime,
            "--architecture", ARCH, "--tensor-parallel-size", str(tp), "--max-model-len",
            str(max_len), "--max-num-seqs", str(seqs), "--max-num-batched-tokens", "2048",
            "-q", "-o", str(out), *mode]
    if price is not None:
        args += ["--price-per-hour", str(price)]
    started = time.perf_counter()
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    if result.exit_code != 0:
        return {"error": result.output.strip()[-400:]}
    report = json.loads((out / "report.json").read_text())
    caching = "--no-prefix-caching" not in mode
    model = Target.resolve(instance=get_instance(instance), arch=ARCH, tp=tp,
                           runtime=get_runtime(runtime),
                           max_model_len=max_len, max_num_seqs=seqs,
                           prefix_caching=caching).cost_model
    prompt = hits = 0
    seconds = {"prefill": 0.0, "decode": 0.0, "gather": 0.0}
    for path in sorted(out.glob("records-*.jsonl")):
        records = read_records(path)
        prompt += sum(r.num_prompt_tokens for r in records.requests)
        for step in records.steps:
            took = step.t_end - step.t_start
            if step.kind == PREFILL:
                hits += step.cached_tokens
                seconds["prefill"] += took
            elif step.kind == DECODE:
                gathered = model.gathered_tokens(step.num_seqs_padded, step.attended_len)
                if gathered:
                    kv = model.decode_kv_tokens(step.num_seqs_padded, step.attended_len,
                                                step.context_tokens)
                    seconds["gather"] += (model.decode_time(step.num_seqs_padded, kv, gathered)
                                          - model.decode_time(step.num_seqs_padded, kv))
                seconds["decode"] += took
    cost = report.get("cost") or {}
    return {"output_tok_s": report["throughput"]["output_tokens_per_s"],
            "elapsed_s": report["throughput"]["elapsed_s"], "prompt_tokens": prompt,
            "hit_tokens": hits, "hit_fraction": hits / prompt if prompt else 0.0,
            "usd_per_m_output": cost.get("usd_per_million_output_tokens"),
            "graphs": report["config"].get("compiled_graphs"),
            "order": report["config"].get("order", "input"),
            "seconds": {k: round(v, 1) for k, v in seconds.items()},
            "wall_s": round(time.perf_counter() - started, 1)}


def verdict(rows: dict[str, dict], bound: int) -> str:
    """Whether to enable prefix caching on this job and layout, and why, in one sentence."""
    off, best = rows.get("off"), max((r for k, r in rows.items() if k != "off"
                                      and "error" not in r),
                                     key=lambda r: r["output_tok_s"], default=None)
    if not off or "error" in off or best is None:
        return "no verdict (a run failed)"
    gain = best["output_tok_s"] / off["output_tok_s"]
    prefill_saved = off["seconds"]["prefill"] - best["seconds"]["prefill"]
    words = (f"{gain:.2f}x output tok/s with caching ({best['order']} order); hits "
             f"{best['hit_fraction']:.0%} of prompt tokens ({best['hit_tokens'] / bound:.0%} of "
             f"the bound); {prefill_saved:.0f} s of prefill saved, decode gather "
             f"{best['seconds']['gather']:.0f} s paid, graphs {off['graphs']} -> "
             f"{best['graphs']}" if bound else
             f"{gain:.2f}x output tok/s with caching; nothing to share; decode gather "
             f"{best['seconds']['gather']:.0f} s paid, graphs {off['graphs']} -> "
             f"{best['graphs']}")
    return ("enable prefix caching: " if gain > 1.0 else "leave prefix caching off: ") + words


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=next((t for t in TRACES if t.exists()),
                                                           TRACES[-1]))
    parser.add_argument("--limit", type=int, default=200,
                        help="requests per job (0: every Mooncake request that fits)")
    parser.add_argument("--layouts", default=",".join(name for name, *_ in LAYOUTS))
    parser.add_argument("--trn2-price", type=float, default=None,
                        help="USD per hour of trn2.48xlarge (none is built in)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    chosen = [layout for layout in LAYOUTS if layout[0] in args.layouts.split(",")]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-prefix-") as tmp:
        tmp = Path(tmp)
        jobs = []
        for layout in chosen:
            jobs.append((f"mooncake <= {layout[4]} on {layout[0]}", layout, mooncake_slice(
                args.trace, layout[4], args.limit, tmp / f"mooncake-{layout[0]}.jsonl")))
        first = LAYOUTS[0]
        count = args.limit or 1000
        jobs.append(("shared instruction on inf2.48xlarge", first,
                     synthetic_job(tmp / "shared.jsonl", count, True)))
        jobs.append(("shares nothing on inf2.48xlarge", first,
                     synthetic_job(tmp / "nothing.jsonl", count, False)))
        for name, layout, path in jobs:
            prompt, bound = bound_fraction(path)
            rows = {}
            price = args.trn2_price if layout[1].startswith("trn2") else None
            for mode, flags in MODES:
                out = tmp / f"{len(results)}-{mode.replace(' ', '').replace(',', '-')}"
                rows[mode] = run_one(path, layout, flags, out, price)
                print(f"  {name} / {mode}: {rows[mode]}", file=sys.stderr, flush=True)
            results[name] = {"prompt_tokens": prompt, "bound_tokens": bound,
                             "bound_fraction": bound / prompt if prompt else 0.0,
                             "rows": rows, "verdict": verdict(rows, bound)}
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


def print_table(results: dict[str, dict]) -> None:
    print("| job | mode | output tok/s | x off | hits (of prompt) | of bound | $/M out | "
          "prefill s | decode s | of it gather s | graphs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, job in results.items():
        off = job["rows"].get("off", {}).get("output_tok_s")
        for mode, row in job["rows"].items():
            if "error" in row:
                print(f"| {name} | {mode} | failed: {row['error'][:80]} |")
                continue
            usd = row["usd_per_m_output"]
            of_bound = (f"{row['hit_tokens'] / job['bound_tokens']:.0%}"
                        if job["bound_tokens"] else "-")
            print(f"| {name} | {mode} | {row['output_tok_s']:.1f} | "
                  f"{row['output_tok_s'] / off:.2f} | {row['hit_fraction']:.1%} | {of_bound} | "
                  f"{'-' if usd is None else f'{usd:.2f}'} | {row['seconds']['prefill']} | "
                  f"{row['seconds']['decode']} | {row['seconds']['gather']} | "
                  f"{row['graphs']} |")
    print()
    for name, job in results.items():
        print(f"- {name} (bound {job['bound_fraction']:.1%} of {job['prompt_tokens']:,} "
              f"prompt tokens): {job['verdict']}")


if __name__ == "__main__":
    main()
