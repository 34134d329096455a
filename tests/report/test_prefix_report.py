"""The report's prefix-cache figures: the `prefix_cache` section from the records, its line in
the summary and its Prometheus gauges, and under nxdi the prefill padding by (prefill, prefix)
bucket; hand-made records, every figure worked out by hand."""

from __future__ import annotations

from dataclasses import replace

from neuron_batch.report.metrics import summarize
from neuron_batch.report.prometheus import prometheus_text
from neuron_batch.report.summary import format_summary
from neuron_batch.scheduler.records import Records, RequestRecord, RunConfig, StepRecord

CONFIG = RunConfig(max_num_seqs=4, max_num_batched_tokens=2048, max_model_len=2048,
                   block_size=32, num_kv_blocks=256, max_kv_concurrent=4,
                   prefill_buckets=[512, 1024, 2048], decode_buckets=[4],
                   scheduler_cls="NeuronScheduler", enable_prefix_caching=True,
                   runtime="nxdi", attention_buckets=[1024, 2048])


def prefill(index: int, req_id: str, new: int, bucket: int, *, cached: int = 0,
            recomputed: int = 0, prefix_bucket: int | None = None) -> StepRecord:
    return StepRecord(index, "ACTIVE_PREFILL", "prefill", [req_id], new, bucket, 1, 1, bucket,
                      0, None, 0, 1, 0.0, float(index), index + 1.0, cached_tokens=cached,
                      recomputed_tokens=recomputed, prefix_bucket=prefix_bucket)


def words(text: str) -> str:
    """The summary with its line breaks and alignment undone."""
    return " ".join(text.split())


def request(req_id: str, prompt: int, cached: int) -> RequestRecord:
    return RequestRecord(req_id, prompt, 0.0, admitted=0.0, first_token=1.0, finished=5.0,
                         num_output_tokens=4, num_cached_tokens=cached, finish_reason="length")


def shared_instruction_run(prefix_buckets: bool) -> Records:
    """Three 1,300-token prompts sharing a 1,024-token instruction: the first computes all of
    it, the next two are served 1,024 tokens each and compute 276 new ones; under the grid
    the second recomputes 236 cached tokens in its 512 bucket's spare room."""
    grid = (lambda x: x) if prefix_buckets else (lambda x: None)
    steps = [prefill(0, "a", 1300, 2048, prefix_bucket=grid(0)),
             prefill(1, "b", 276, 512, cached=1024, recomputed=236 if prefix_buckets else 0,
                     prefix_bucket=grid(1024)),
             prefill(2, "c", 276, 512, cached=1024, prefix_bucket=grid(1024))]
    return Records(CONFIG, steps, [request("a", 1300, 0), request("b", 1300, 1024),
                                   request("c", 1300, 1024)], {})


def test_the_prefix_cache_section_counts_hits_and_what_the_device_computed():
    report = summarize(shared_instruction_run(prefix_buckets=True))
    assert report["prefix_cache"] == {
        "enabled": True, "prompt_tokens": 3900, "hit_tokens": 2048,
        "hit_fraction": 2048 / 3900, "recomputed_tokens": 236,
        "computed_tokens": 3900 - 2048 + 236, "bound_tokens": None, "bound_fraction": None}


def test_under_the_grid_the_prefill_padding_is_by_prefill_and_prefix_bucket():
    padding = summarize(shared_instruction_run(prefix_buckets=True))["padding"]["prefill"]
    assert padding["by"] == "prefill x prefix"
    assert padding["by_bucket"] == {
        "2048x0": {"chunks": 1, "actual_tokens": 1300, "padded_tokens": 2048,
                   "recomputed_tokens": 0, "prefill_bucket": 2048, "prefix_bucket": 0},
        "512x1024": {"chunks": 2, "actual_tokens": 552, "padded_tokens": 1024,
                     "recomputed_tokens": 236, "prefill_bucket": 512, "prefix_bucket": 1024}}
    assert (padding["actual_tokens"], padding["padded_tokens"]) == (1852, 3072)
    assert padding["waste_fraction"] == (3072 - 1852) / 3072
    text = format_summary(summarize(shared_instruction_run(prefix_buckets=True)))
    assert "(bucket: prefill x prefix)" in text and "512x1024" in text


def test_without_prefix_buckets_the_prefill_table_stays_one_dimensional():
    padding = summarize(shared_instruction_run(prefix_buckets=False))["padding"]["prefill"]
    assert "by" not in padding
    assert list(padding["by_bucket"]) == ["512", "1024", "2048"]   # every configured bucket
    assert padding["by_bucket"]["512"]["chunks"] == 2


def test_the_summary_line_and_the_gauges():
    report = summarize(shared_instruction_run(prefix_buckets=True))
    report["prefix_cache"].update(bound_tokens=2048, bound_fraction=2048 / 3900)
    text = format_summary(report)
    assert all(len(line) <= 100 for line in text.splitlines())
    assert ("Prefixes 52.5% of prompt tokens served from the prefix cache (bound 52.5%); "
            "2,088 tokens computed (236 of them cached, computed again)") in words(text)
    metrics = prometheus_text(report, timestamp=0)
    for line in ('neuron_batch_prefix_cache_enabled 1',
                 'neuron_batch_prefix_cache_tokens{kind="prompt"} 3900',
                 'neuron_batch_prefix_cache_tokens{kind="hit"} 2048',
                 'neuron_batch_prefix_cache_tokens{kind="computed"} 2088',
                 'neuron_batch_prefix_cache_tokens{kind="bound"} 2048',
                 'neuron_batch_prefix_cache_hit_ratio 0.525'):
        assert any(row.startswith(line) for row in metrics.splitlines()), line


def test_caching_off_says_what_sharing_there_was_and_only_then():
    run = shared_instruction_run(prefix_buckets=False)
    off = Records(replace(CONFIG, enable_prefix_caching=False),
                  [replace(s, cached_tokens=0) for s in run.steps],
                  [replace(r, num_cached_tokens=0) for r in run.requests], {})
    report = summarize(off)
    assert report["prefix_cache"]["enabled"] is False
    assert report["prefix_cache"]["computed_tokens"] == 3900
    assert "Prefixes" not in format_summary(report)        # nothing shared known: no line
    report["prefix_cache"].update(bound_tokens=2048, bound_fraction=2048 / 3900)
    assert ("Prefixes prefix caching off; an unbounded cache could serve 52.5% of prompt "
            "tokens Steps") in words(format_summary(report))
    assert 'neuron_batch_prefix_cache_enabled 0' in prometheus_text(report, timestamp=0)
