"""Benchmark: a text job's tokens, through the tokenizer's own call against straight from Rust
(inputs/text_tokens.py; issue 48: a text job's check is its tokenizer's work).

Two measurements, each the direct path against the call in the same run, medians of
--repeats, one tokenizer thread (TOKENIZERS_PARALLELISM=false, as the check's processes run):

- `tokens`: the built-in model's tokenizer on --texts text prompts (scripts/bench_scale.py's
  text job: up to 64 words) and as many one-turn chats of the same text (rendered by the chat
  template first), microseconds a prompt;
- `check`: the whole check before a run (`load_workload`, one process, the simulated device) of
  a text job of --lines lines, seconds.

    .venv/bin/python scripts/bench_text_tokens.py
    .venv/bin/python scripts/bench_text_tokens.py --lines 200000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["NEURON_BATCH_CHECK_PROCESSES"] = "1"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_scale  # noqa: E402  (its text job)

from neuron_batch.inputs import text_tokens  # noqa: E402


class _Switch:
    """The direct path off: every TextTokens made goes through the tokenizer's call."""

    off = False


_real_init = text_tokens.TextTokens.__init__


def _init(self, tokenizer):
    _real_init(self, tokenizer)
    if _Switch.off:
        self._fast = None


text_tokens.TextTokens.__init__ = _init     # type: ignore[method-assign]


def per_prompt(tokenizer, texts: list[str], chats: bool, direct: bool) -> float:
    tokens = text_tokens.TextTokens(tokenizer)
    if not direct:
        tokens._fast = None
    begun = time.perf_counter()
    for k in range(0, len(texts), 512):
        batch = texts[k:k + 512]
        if chats:
            batch = tokenizer.apply_chat_template([[{"role": "user", "content": t}]
                                                   for t in batch],
                                                  add_generation_prompt=True, tokenize=False)
        tokens.ids(batch, special=not chats)
    return (time.perf_counter() - begun) / len(texts) * 1e6


def check_seconds(path: Path, direct: bool) -> float:
    from neuron_batch.job.workload import load_workload
    from neuron_batch.settings import RunSettings

    _Switch.off = not direct
    settings = RunSettings.of((str(path),), device="sim", instance="inf2.8xlarge",
                              architecture="llama-3.1-8b", max_model_len=8192, quiet=True)
    begun = time.perf_counter()
    load_workload(settings, lambda _: None)
    took = time.perf_counter() - begun
    _Switch.off = False
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=10_000)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from neuron_batch.engine.models import load_tokenizer, resolve_model

    tokenizer = load_tokenizer(resolve_model(None))
    workdir = Path(tempfile.mkdtemp(prefix="neuron-batch-tokens-bench-"))
    try:
        path = bench_scale.write_job("text", max(args.texts, args.lines), workdir, 64)
        texts = [json.loads(line)["prompt"] for line in path.open()][:args.texts]
        print(f"{'what':<26}{'call':>10}{'direct':>10}{'call/direct':>13}", flush=True)
        for chats in (False, True):
            times = {way: [per_prompt(tokenizer, texts, chats, way == "direct")
                           for _ in range(args.repeats)] for way in ("call", "direct")}
            call, direct = (statistics.median(times[w]) for w in ("call", "direct"))
            what = f"{len(texts):,} {'chats' if chats else 'texts'} (us each)"
            print(f"{what:<26}{call:>10.1f}{direct:>10.1f}{call / direct:>13.2f}", flush=True)
        lines = workdir / "lines.jsonl"
        with path.open() as source, lines.open("w") as out:
            for _, line in zip(range(args.lines), source):
                out.write(line)
        check_seconds(lines, True)          # (imports, the model's files)
        seconds: dict[str, list[float]] = {"call": [], "direct": []}
        for _ in range(args.repeats):       # (turn about)
            seconds["call"].append(check_seconds(lines, False))
            seconds["direct"].append(check_seconds(lines, True))
        call, direct = (statistics.median(seconds[w]) for w in ("call", "direct"))
        what = f"check, {args.lines:,} lines (s)"
        print(f"{what:<26}{call:>10.1f}{direct:>10.1f}{call / direct:>13.2f}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
