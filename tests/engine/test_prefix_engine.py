"""vLLM's prefix cache with the Neuron scheduler in the real engine on the CPU: a job whose
prompts share a long system prompt computes only each prompt's own tokens after the first (the
seed design's rule: a prefill schedules its prompt less the cached tokens, padded to a token
bucket), and its records and report say so; `--no-prefix-caching` computes every token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")

from neuron_batch.cli import main  # noqa: E402
from neuron_batch.scheduler.records import read_records  # noqa: E402

SHARED = 256                                    # the system prompt: two of vLLM's CPU blocks
OWN = [16, 20, 24, 28, 32, 17, 23, 31]          # each request's own tokens after it


def our_id(req_id: str) -> str:
    """The job's id of a request id in the records (newer vLLM adds "-<random>" to it)."""
    return req_id.split("-")[0]


def run_job(tiny_model: str, tmp_path: Path, *flags: str) -> tuple[dict, Path]:
    path = tmp_path / "shared.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt_len": SHARED + own,
                                        "prefix_id": "system", "prefix_len": SHARED,
                                        "max_tokens": 4}) + "\n"
                            for i, own in enumerate(OWN)))
    out = tmp_path / "run"
    result = CliRunner().invoke(main, [
        "run", str(path), "--model", tiny_model, "--device", "cpu", "--max-num-seqs", "4",
        "--max-num-batched-tokens", "512", "--max-model-len", "1024", "-q", "-o", str(out),
        *flags], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads((out / "report.json").read_text()), out


def test_a_shared_system_prompt_is_computed_once(tiny_model, tmp_path):
    report, out = run_job(tiny_model, tmp_path)
    records = read_records(next(out.glob("records*.jsonl")))
    assert records.config.enable_prefix_caching is True       # vLLM's default, kept
    block = records.config.block_size
    assert SHARED % block == 0 and all(own > 0 for own in OWN)
    by_id = {our_id(r.req_id): r for r in records.requests}
    # one prefill at a time, first come first served: r0 computes the system prompt, every
    # later request is served it from the cache
    assert [by_id[f"r{i}"].num_cached_tokens for i in range(len(OWN))] == \
        [0] + [SHARED] * (len(OWN) - 1)
    prefills = {our_id(s.req_ids[0]): s for s in records.steps if s.kind == "prefill"}
    assert len(prefills) == len(OWN)                          # one step each (no chunking)
    for i, own in enumerate(OWN):
        step = prefills[f"r{i}"]
        cached = 0 if i == 0 else SHARED
        assert (step.cached_tokens, step.num_tokens) == (cached, SHARED + own - cached)
        assert step.num_tokens_padded >= step.num_tokens      # only the new tokens padded
        assert (step.recomputed_tokens, step.prefix_bucket) == (0, None)
    prompt = sum(SHARED + own for own in OWN)
    hits = SHARED * (len(OWN) - 1)
    assert report["prefix_cache"] == {
        "enabled": True, "prompt_tokens": prompt, "hit_tokens": hits,
        "hit_fraction": hits / prompt, "recomputed_tokens": 0, "computed_tokens": prompt - hits,
        # every shared whole block computed once: what this run reached
        "bound_tokens": hits, "bound_fraction": hits / prompt}


def test_without_prefix_caching_every_prompt_token_is_computed(tiny_model, tmp_path):
    report, out = run_job(tiny_model, tmp_path, "--no-prefix-caching")
    records = read_records(next(out.glob("records*.jsonl")))
    assert records.config.enable_prefix_caching is False
    assert all(r.num_cached_tokens == 0 for r in records.requests)
    assert all(s.cached_tokens == 0 for s in records.steps)
    prompt = sum(SHARED + own for own in OWN)
    section = report["prefix_cache"]
    assert (section["enabled"], section["hit_tokens"], section["computed_tokens"]) == (
        False, 0, prompt)
    assert section["bound_tokens"] == SHARED * (len(OWN) - 1)  # what caching would have saved
