"""Benchmark: `neuron-batch run` against a plain `LLM.generate` script on the same model,
prompts, engine settings and scheduler, in the same process, alternating, and print the ratio
of output tokens per second (target: at least 0.95).

Both sides get identical token ids (prepared once, chat templates applied) and greedy
sampling, so they generate the same tokens. Each side's rate is output tokens over the
generation time, model loading excluded: for `run`, the span its scheduler records cover (first
arrival to last step); for the plain script, the wall time of `llm.generate(...)`.

    .venv/bin/python scripts/bench_run.py                 # built-in prompts x2, 32 tokens each
    .venv/bin/python scripts/bench_run.py --repeats 5 --max-tokens 64 --json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from neuron_batch.engine.engine import engine_kwargs  # noqa: E402
from neuron_batch.engine.models import load_tokenizer, resolve_model  # noqa: E402
from neuron_batch.inputs.load import load_prompts  # noqa: E402
from neuron_batch.inputs.prepare import prepare_requests  # noqa: E402
from neuron_batch.run.runner import run  # noqa: E402
from neuron_batch.settings import RunSettings  # noqa: E402

BUILTIN_PROMPTS = ROOT / "neuron_batch" / "data" / "example_prompts.jsonl"


def make_input(copies: int, workdir: Path) -> str:
    """The built-in prompts, `copies` times with distinct ids (and distinct texts, so the
    prefix cache does not serve the copies)."""
    rows = [json.loads(line) for line in BUILTIN_PROMPTS.read_text().splitlines()]
    path = workdir / "prompts.jsonl"
    with open(path, "w") as handle:
        for copy in range(copies):
            for row in rows:
                row = dict(row, id=f"{row['id']}-{copy}")
                if "prompt" in row:
                    row["prompt"] = f"({copy}) {row['prompt']}"
                else:
                    row["messages"] = [dict(m, content=f"({copy}) {m['content']}")
                                       for m in row["messages"]]
                handle.write(json.dumps(row) + "\n")
    return str(path)


def time_neuron_batch(settings: RunSettings) -> tuple[float, int]:
    result = run(settings, log=lambda message: None)
    report = result.report
    return report.throughput.elapsed_s, report.tokens.output


def time_plain_generate(settings: RunSettings, workdir: Path) -> tuple[float, int]:
    from vllm import LLM, SamplingParams

    model = resolve_model(settings.model)
    loaded = load_prompts(settings.inputs, default_max_tokens=settings.max_tokens)
    prepared = prepare_requests(loaded.records, tokenizer=load_tokenizer(model),
                                tokenizer_name=model.name, vocab_size=10**9,
                                max_model_len=settings.max_model_len,
                                default_max_tokens=settings.max_tokens)
    kwargs = engine_kwargs(settings, "cpu", model.path, workdir / "plain-records.jsonl", workdir,
                           has_tokenizer=True)
    llm = LLM(**kwargs)
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in prepared.requests]
    params = [SamplingParams(max_tokens=r.max_tokens, temperature=0.0) for r in prepared.requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--copies", type=int, default=2, help="copies of the 24 built-in prompts")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        prompts = make_input(args.copies, workdir)
        for repeat in range(args.repeats):
            settings = RunSettings.of(inputs=(prompts,), device="cpu", max_tokens=args.max_tokens,
                                   max_num_seqs=args.max_num_seqs,
                                   output=str(workdir / f"run-{repeat}"), quiet=True)
            plain_s, plain_tokens = time_plain_generate(settings, workdir)
            ours_s, ours_tokens = time_neuron_batch(settings)
            rows.append({"plain_tok_s": plain_tokens / plain_s, "run_tok_s": ours_tokens / ours_s,
                         "plain_tokens": plain_tokens, "run_tokens": ours_tokens})
            print(f"repeat {repeat + 1}: plain {rows[-1]['plain_tok_s']:.1f} tok/s "
                  f"({plain_tokens} tokens in {plain_s:.1f} s), neuron-batch run "
                  f"{rows[-1]['run_tok_s']:.1f} tok/s ({ours_tokens} tokens in {ours_s:.1f} s)",
                  file=sys.stderr)
    plain = statistics.median(r["plain_tok_s"] for r in rows)
    ours = statistics.median(r["run_tok_s"] for r in rows)
    ratios = [r["run_tok_s"] / r["plain_tok_s"] for r in rows]
    summary = {"plain_median_tok_s": plain, "run_median_tok_s": ours,
               "ratio_of_medians": ours / plain, "ratios": ratios, "target": 0.95,
               "met": ours / plain >= 0.95, "repeats": rows}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"output tokens/s, median of {args.repeats}: plain LLM.generate {plain:.1f}, "
              f"neuron-batch run {ours:.1f}; ratio {ours / plain:.3f} "
              f"(per repeat: {', '.join(f'{r:.3f}' for r in ratios)}); target >= 0.95: "
              f"{'met' if ours / plain >= 0.95 else 'NOT met'}")


if __name__ == "__main__":
    main()
