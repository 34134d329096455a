"""`plan` weighs prefix caching: each option with it off and, where the prompts share KV blocks,
on in prefix order; real engine runs on the simulated device (in process)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.plan.prefix_options import shareable_tokens


@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=12), min_size=1, max_size=8),
       st.integers(1, 4))
def test_shareable_tokens_are_the_leading_blocks_another_prompt_starts_with(prompts, block):
    out = shareable_tokens(prompts, block)
    for i, ids in enumerate(prompts):
        whole = len(ids) // block
        best = 0
        for j, other in enumerate(prompts):
            if j != i:
                k = 0
                while k < whole and other[:(k + 1) * block] == ids[:(k + 1) * block]:
                    k += 1
                best = max(best, k)
        assert out[i] == min(best * block, len(ids) - 1)


vllm = pytest.importorskip("vllm")

from neuron_batch.bench.deadline import Deadline  # noqa: E402
from neuron_batch.plan.candidates import PlanSpec  # noqa: E402
from neuron_batch.plan.planner import PlanJob, plan_base, run_plan  # noqa: E402
from neuron_batch.settings import RunSettings  # noqa: E402

SPEC = PlanSpec(architecture="llama-3.1-8b", instances=("inf2.8xlarge",), max_num_instances=1,
                seqs_values=(4,), max_prefill_buckets=1, compiled=True, max_model_len=2048,
                max_num_batched_tokens=2048, splits=False)


def write_job(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def plan(out: Path, job: Path, *, prune: bool) -> dict:
    settings = RunSettings.of(inputs=(str(job),), device="sim", max_model_len=2048,
                           max_num_batched_tokens=2048, quiet=True,
                           architecture="llama-3.1-8b")
    base, kv_reserve = plan_base(settings)
    spec = PlanSpec(**{**SPEC.__dict__, "kv_reserve": kv_reserve})
    job_ = PlanJob(base, spec, Deadline("10h", 10.0, None), out, jobs=1, resume=False,
                   log=lambda m: None, prune=prune)
    assert run_plan(job_) == 0
    return json.loads((out / "plan.json").read_text())


@pytest.fixture(scope="module")
def sharing(tmp_path_factory):
    """24 requests in six groups of a shared 1,536-token instruction, interleaved."""
    tmp = tmp_path_factory.mktemp("plan-prefix")
    job = write_job(tmp / "six.jsonl", [
        {"prompt_len": 1792, "max_tokens": 8, "prefix_id": f"p{i % 6}", "prefix_len": 1536}
        for i in range(24)])
    return plan(tmp / "plan", job, prune=False)


def test_plan_weighs_caching_on_and_off_and_picks_it_on_a_sharing_job(sharing):
    assert sharing["meta"]["prefix_cache"] == {"prompt_tokens": 24 * 1792,
                                               "bound_tokens": 6 * 3 * 1536}
    rows = sharing["options"]
    on = [r for r in rows if r["prefix_caching"]]
    off = [r for r in rows if not r["prefix_caching"]]
    assert on and off and {r["name"] + " +PC" for r in off} == {r["name"] for r in on}
    best = sharing["recommendation"]
    assert best["prefix_caching"] is True and best["order"] == "prefix"
    assert best["name"].endswith(" +PC") and best["hit_fraction"] > 0.5
    for key in ("command", "layout_command"):
        words = shlex.split(best[key])
        assert "--no-prefix-caching" not in words
        assert words[words.index("--order") + 1] == "prefix"
    assert all("--no-prefix-caching" in shlex.split(r["command"]) for r in off)
    # the bounds of caching on stay below what the runs took (pruning relies on it)
    for r in on:
        assert r["hours_at_least"] <= r["hours"] * (1 + 1e-9)
    # the (prefill x prefix) grid and token generation from 256 under nxdi
    assert all(r["attention_buckets"][0] == 256 and r["prefill_buckets"][0] == 512
               for r in on)


def test_a_plan_whose_prompts_share_nothing_runs_every_option_with_caching_off(tmp_path):
    job = write_job(tmp_path / "nothing.jsonl",
                    [{"prompt_len": 1280, "max_tokens": 8} for _ in range(8)])
    data = plan(tmp_path / "plan", job, prune=True)
    assert data["meta"]["prefix_cache"]["bound_tokens"] == 0
    everything = data["options"] + data["not_simulated"]
    assert everything and not any(r["prefix_caching"] for r in everything)
    assert "--no-prefix-caching" in shlex.split(data["recommendation"]["command"])
    text = (tmp_path / "plan" / "plan.csv").read_text()
    assert "prefix_caching" in text.splitlines()[0]
