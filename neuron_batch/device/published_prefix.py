"""AWS's published prefix-caching figures (trn2, NxDI) and how the step model reproduces
their ratio of time to first token with and without prefix caching.

The only published figures (../shared/notes/neuron-runtimes.md, "Prefix caching under NxDI":
`tutorials/trn2-llama3.3-70b-apc-tutorial.ipynb`, `llama70b_apc_perf_comparison.csv`):
Llama-3.3-70B on trn2.48xlarge, TP 64, batch 4, seq 8192, block 32, prefix buckets
512/1024/2048, TTFT p50 without -> with prefix caching on four workloads. Nothing is
published for inf2 or trn1 (so nothing for the decode-time block-KV gather either).

AWS gives each workload's hit rate but not its prompt length, so the lengths below are
assumptions, stated per row: the sonnet data sets by their names (1k, 2k prompt tokens),
HumanEval's short code prompts, and the math few-shot prompt between the two sonnets (its
TTFT without caching lies between theirs). The model's TTFT is the request's own prefill step
(queueing behind the batch's other prefills is left out), so the comparison is of the ratio
with/without, which queueing changes less than the absolute times; trn2's cost profile is a
hardware-ratio estimate, not a fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from neuron_batch.runtimes.buckets import bucket_for, nxdi_default_buckets
from neuron_batch.runtimes.prefix_grid import default_prefill_buckets, grid_cell

#: The tutorial's layout.
INSTANCE, ARCH, TP, MAX_MODEL_LEN, BLOCK = "trn2.48xlarge", "llama-3.3-70b", 64, 8192, 32
#: The tutorial's prefix buckets (0 is always compiled).
PREFIX_BUCKETS = (0, 512, 1024, 2048)


@dataclass(frozen=True)
class PublishedAPC:
    """One published row, with the prompt length assumed for it."""

    workload: str
    hit_fraction: float         # AWS's words: ">90%", "~25%", "0%"
    ttft_without_ms: float
    ttft_with_ms: float
    prompt_tokens: int          # assumed (not published)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens vLLM serves from the cache: whole blocks, at most prompt - 1."""
        hits = int(self.hit_fraction * self.prompt_tokens) // BLOCK * BLOCK
        return min(hits, (self.prompt_tokens - 1) // BLOCK * BLOCK)

    @property
    def published_ratio(self) -> float:
        return self.ttft_without_ms / self.ttft_with_ms


PUBLISHED = (
    PublishedAPC("math.math (>90% hits)", 0.92, 342.8, 107.8, 1536),
    PublishedAPC("dynamic sonnet 1k (~25%)", 0.25, 123.1, 102.2, 1024),
    PublishedAPC("sonnet 2k (~25%)", 0.25, 592.8, 377.2, 2048),
    PublishedAPC("HumanEval (0%)", 0.0, 89.7, 91.8, 150),
)


def ttft_pair(model: Any, row: PublishedAPC) -> tuple[float, float]:
    """(TTFT without, with prefix caching), seconds, of `row`'s prompt on `model` (a
    StepCostModel of the tutorial's layout): without, the whole prompt padded to NxDI's
    contiguous-layout bucket; with, the (prefill, prefix) grid cell of its new tokens."""
    without = model.prefill_time(bucket_for(row.prompt_tokens,
                                            nxdi_default_buckets(MAX_MODEL_LEN)), 0)
    cached = row.cached_tokens
    cell = grid_cell(row.prompt_tokens - cached, cached,
                     default_prefill_buckets(MAX_MODEL_LEN), PREFIX_BUCKETS)
    return without, model.prefill_time(cell.prefill_bucket, cell.prefix_bucket)


def apc_check(model: Any) -> list[dict[str, Any]]:
    """Per published row: the assumed prompt, the model's TTFT with and without, its ratio,
    the published ratio, and the ratio's relative error (model / published - 1)."""
    rows = []
    for row in PUBLISHED:
        without, with_ = ttft_pair(model, row)
        ratio = without / with_
        rows.append({"workload": row.workload, "prompt_tokens": row.prompt_tokens,
                     "cached_tokens": row.cached_tokens,
                     "model_ms": (round(without * 1e3, 1), round(with_ * 1e3, 1)),
                     "published_ms": (row.ttft_without_ms, row.ttft_with_ms),
                     "model_ratio": round(ratio, 2), "published_ratio":
                     round(row.published_ratio, 2),
                     "ratio_error": round(ratio / row.published_ratio - 1, 3)})
    return rows


def apc_model() -> Any:
    """The step model of the tutorial's layout (nxdi on trn2.48xlarge, prefix caching on)."""
    from neuron_batch.device.hardware import INSTANCES
    from neuron_batch.device.target import Target
    from neuron_batch.runtimes.runtime import NXDI, RUNTIMES

    return Target.resolve(instance=INSTANCES[INSTANCE], arch=ARCH, tp=TP,
                          max_model_len=MAX_MODEL_LEN, max_num_seqs=4, runtime=RUNTIMES[NXDI],
                          prefix_caching=True).cost_model
