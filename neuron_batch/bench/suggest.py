"""`neuron-batch buckets suggest` and the sweep's optimised sets: the optimiser's best bucket
list for a workload next to the default buckets, as a dict for tables and JSON. Pure Python."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from neuron_batch.layout.optimiser import (
    BucketPlan,
    Cost,
    evaluate,
    optimal_buckets,
    prefill_chunk_lengths,
    size_histogram,
)
from neuron_batch.runtimes.buckets import (
    default_decode_buckets,
    default_prefill_buckets,
    effective_max_prefill_tokens,
)
from neuron_batch.runtimes.runtime import Runtime


def _summary(plan: BucketPlan, unit: str) -> dict:
    out = {
        "buckets": list(plan.buckets),
        f"actual_{unit}": plan.actual,
        f"padded_{unit}": plan.padded,
    }
    if unit != "tokens":  # decode: one token per sequence, so tokens == seqs
        out["actual_tokens"] = plan.actual
        out["padded_tokens"] = plan.padded
    out["waste_fraction"] = plan.waste_fraction
    out["cost"] = plan.cost
    return out


def suggest_prefill(prompt_lengths: Iterable[int], *, max_buckets: int,
                    max_num_batched_tokens: int, max_model_len: int, cost: Cost | None = None,
                    candidates: Iterable[int] | None = None,
                    runtime: Runtime | None = None) -> dict:
    """Best prefill buckets for a workload's prompt lengths under `runtime` (None: the
    chunked prefill of vllm-neuron), next to its default buckets: a runtime that prefills
    whole prompts (nxdi) buckets the prompts, not chunks of max_num_batched_tokens.

    Returns {"buckets", "actual_tokens", "padded_tokens", "waste_fraction", "cost",
    "default": {same keys for the runtime's default list}, "num_chunks", "max_buckets",
    "runtime", "flag" (the option that takes the list)}.
    """
    if runtime is not None and not runtime.chunked_prefill:
        max_num_batched_tokens = max_model_len      # (whole prompts: one chunk each)
    chunks = prefill_chunk_lengths(prompt_lengths, max_num_batched_tokens, max_model_len)
    maximum = effective_max_prefill_tokens(max_num_batched_tokens, max_model_len)
    plan = optimal_buckets(chunks, max_buckets, maximum, cost=cost, candidates=candidates)
    defaults = (default_prefill_buckets(max_num_batched_tokens, max_model_len) if runtime is None
                else list(runtime.shapes({}, max_num_seqs=1,
                                         max_num_batched_tokens=max_num_batched_tokens,
                                         max_model_len=max_model_len).prefill_buckets))
    default = evaluate(chunks, defaults, cost=cost)
    out = _summary(plan, "tokens")
    out["default"] = _summary(default, "tokens")
    out["num_chunks"] = sum(chunks.values())
    out["max_buckets"] = max_buckets
    out["runtime"] = runtime.name if runtime is not None else None
    out["flag"] = runtime.prefill.flag if runtime is not None else "--prefill-buckets"
    return out


def suggest_decode(batch_size_counts: Mapping[int, int], *, max_buckets: int, max_num_seqs: int,
                   cost: Cost | None = None, candidates: Iterable[int] | None = None) -> dict:
    """Best decode buckets for a histogram of decode batch sizes, next to the defaults.

    Returns {"buckets", "actual_seqs", "padded_seqs", "actual_tokens", "padded_tokens",
    "waste_fraction", "cost", "default": {same keys}, "num_steps", "max_buckets"}; the token
    figures equal the sequence figures (a decode step adds one token per sequence).
    """
    plan = optimal_buckets(batch_size_counts, max_buckets, max_num_seqs, cost=cost,
                           candidates=candidates)
    default = evaluate(batch_size_counts, default_decode_buckets(max_num_seqs), cost=cost)
    out = _summary(plan, "seqs")
    out["default"] = _summary(default, "seqs")
    out["num_steps"] = sum(count for size, count in size_histogram(batch_size_counts, None))
    out["max_buckets"] = max_buckets
    return out
