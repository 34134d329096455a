"""Benchmark: what a JSON schema costs a request, on this machine's CPU (vLLM's own engine, the
Neuron scheduler, the built-in model).

One engine runs the built-in prompts in rounds that alternate: every prompt unconstrained, then
every prompt under one JSON schema (`response_format` json_schema, as a batch file asks it),
then unconstrained again, and so on. Each round's rate is its output tokens over its wall time
(grammar compilation included: a batch pays it too); the script prints each pair's ratio and
the median (constrained / unconstrained output tokens per second).

    .venv/bin/python scripts/bench_structured.py                 # 5 pairs, 32 tokens
    .venv/bin/python scripts/bench_structured.py --pairs 9 --max-tokens 64 --json
    .venv/bin/python scripts/bench_structured.py --pairs 3 --prompts 8 --max-tokens 16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neuron_batch.engine.engine import Engine, engine_kwargs  # noqa: E402
from neuron_batch.engine.models import load_tokenizer, resolve_model  # noqa: E402
from neuron_batch.inputs.load import load_prompts  # noqa: E402
from neuron_batch.inputs.prepare import prepare_requests  # noqa: E402
from neuron_batch.inputs.request_fields import sampling_spec  # noqa: E402
from neuron_batch.settings import RunSettings  # noqa: E402

BUILTIN_PROMPTS = ROOT / "neuron_batch" / "data" / "example_prompts.jsonl"
#: A small extraction schema, the kind a nightly batch job asks for.
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"},
                                           "confidence": {"type": "number"}},
          "required": ["answer", "confidence"], "additionalProperties": False}


def run_round(engine: Engine, requests, max_tokens: int, tag: str,
              constrained: bool) -> tuple[float, int]:
    """(seconds, output tokens) of every request through the engine once."""
    started = time.perf_counter()
    for request in requests:
        record = request.record
        if constrained:
            record = replace(record, sampling={"structured": {"json": SCHEMA}})
        spec = sampling_spec(record, max_tokens=max_tokens, temperature=0.0, seed=0,
                             ignore_eos=False)
        engine.add(f"{record.id}-{tag}", request.prompt_token_ids, spec)
    tokens = 0
    while engine.has_unfinished():
        for done in engine.step():
            tokens += len(done.token_ids)
    return time.perf_counter() - started, tokens


def cpu_pairs(pairs: int, max_tokens: int, max_num_seqs: int, prompts: int | None = None,
              show=None) -> list[dict]:
    model = resolve_model(None)
    tokenizer = load_tokenizer(model)
    loaded = load_prompts([BUILTIN_PROMPTS], default_max_tokens=max_tokens, limit=prompts)
    prepared = prepare_requests(loaded.records, tokenizer=tokenizer, tokenizer_name=model.name,
                                vocab_size=len(tokenizer), max_model_len=2048,
                                default_max_tokens=max_tokens)
    settings = RunSettings.of(inputs=(str(BUILTIN_PROMPTS),), device="cpu", max_model_len=2048,
                           max_num_seqs=max_num_seqs, max_tokens=max_tokens).validate()
    with tempfile.TemporaryDirectory() as tmp:
        kwargs = engine_kwargs(settings, "cpu", model.path, Path(tmp) / "records.jsonl",
                               Path(tmp), has_tokenizer=True)
        engine = Engine(kwargs, quiet=True)
        try:
            run_round(engine, prepared.requests, max_tokens, "warm", False)   # (compile, cache)
            rows = []
            for pair in range(pairs):
                plain_s, plain_tokens = run_round(engine, prepared.requests, max_tokens,
                                                  f"p{pair}", False)
                json_s, json_tokens = run_round(engine, prepared.requests, max_tokens,
                                                f"j{pair}", True)
                rows.append({"pair": pair, "plain_s": plain_s, "plain_tokens": plain_tokens,
                             "json_s": json_s, "json_tokens": json_tokens,
                             "ratio": (json_tokens / json_s) / (plain_tokens / plain_s)})
                if show is not None:
                    show(rows[-1])
        finally:
            engine.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=None,
                        help="the first N built-in prompts (default all 24)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    def show(row):
        print(f"{row['pair']:>4} {row['plain_tokens'] / row['plain_s']:>12.1f} "
              f"{row['json_tokens'] / row['json_s']:>11.1f} {row['ratio']:>6.3f}", flush=True)

    if not args.json:
        print(f"{'pair':>4} {'plain tok/s':>12} {'json tok/s':>11} {'ratio':>6}", flush=True)
    rows = cpu_pairs(args.pairs, args.max_tokens, args.max_num_seqs, args.prompts,
                     None if args.json else show)
    median = statistics.median(row["ratio"] for row in rows)
    if args.json:
        print(json.dumps({"cpu": rows, "cpu_median_ratio": median}, indent=2))
        return
    print(f"CPU, built-in model: JSON schema / unconstrained output tokens per second, median "
          f"of {len(rows)} pairs: {median:.3f}")


if __name__ == "__main__":
    main()
