"""The report's prefix-cache figures (the `prefix_cache` section) and NxDI's prefill padding
by (prefill, prefix) bucket. Pure Python.

`prefix_cache`: `prompt_tokens` of the completed requests; `hit_tokens`, those vLLM's prefix
cache served (each request's `num_cached_tokens`); `hit_fraction`; `recomputed_tokens`, cached
tokens the device computed again anyway (nxdi moves a prefix into the prefill bucket's spare
room); `computed_tokens` = prompt - hits + recomputed, what the device prefilled;
`bound_tokens`, the most an unbounded cache could serve these prompts (every shared whole KV
block computed once: inputs/prefix_bound.py, from the prompts' token ids, added where the run
knows them), `bound_fraction`, and `bound_error_tokens` where a job too large to count exactly
estimated the bound (one standard error); `enabled`, whether the run had prefix
caching on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from neuron_batch.report.model import PrefixCache
from neuron_batch.report.schema import or_none
from neuron_batch.scheduler.records import PREFILL, RequestRecord, StepRecord


def prefix_cache_section(steps: Iterable[StepRecord], completed: Sequence[RequestRecord],
                         enabled: bool, bound_tokens: int | None = None) -> dict[str, Any]:
    """The `prefix_cache` section of a run's records (`bound_tokens` None: not known here)."""
    return prefix_cache_figures(sum(r.num_prompt_tokens for r in completed),
                                sum(r.num_cached_tokens for r in completed),
                                sum(s.recomputed_tokens for s in steps if s.kind == PREFILL),
                                enabled, bound_tokens)


def prefix_cache_figures(prompt: int, hits: int, recomputed: int, enabled: bool,
                         bound_tokens: int | None = None) -> dict[str, Any]:
    """The section from its sums (the completed requests' prompt and hit tokens, the prefill
    steps' recomputed tokens)."""
    section = PrefixCache(enabled=bool(enabled), prompt_tokens=prompt, hit_tokens=hits,
                          hit_fraction=hits / prompt if prompt else 0.0,
                          recomputed_tokens=recomputed,
                          computed_tokens=prompt - hits + recomputed)
    section.with_bound(bound_tokens)
    return section.to_dict()


def has_prefix_buckets(steps: Iterable[StepRecord]) -> bool:
    """Whether any prefill ran on a (prefill, prefix) grid cell (nxdi with prefix caching)."""
    return any(s.prefix_bucket is not None for s in steps if s.kind == PREFILL)


def grid_key(prefill_bucket: int, prefix_bucket: int) -> str:
    """A grid cell's key in the padding table: "2048x512" (prefill bucket x prefix bucket)."""
    return f"{prefill_bucket}x{prefix_bucket}"


def grid_padding(steps: Iterable[StepRecord]) -> dict[str, Any]:
    """The prefill padding table by (prefill, prefix) grid cell, as `metrics._padding_phase`
    lays out the 1-D one: per cell the prefills that ran on it, their new tokens, the tokens
    it computed (its prefill bucket) and the cached ones among them computed again. Only the
    cells that ran are listed (the records do not hold the grid's prefix buckets)."""
    cells: dict[tuple[int, int], list[int]] = {}
    for step in steps:
        if step.kind != PREFILL:
            continue
        prefill = step.bucket if step.bucket is not None else step.num_tokens_padded
        row = cells.setdefault((prefill, step.prefix_bucket or 0), [0, 0, 0, 0])
        row[0] += 1
        row[1] += step.num_tokens
        row[2] += step.num_tokens_padded
        row[3] += step.recomputed_tokens
    return grid_table(cells)


def grid_table(cells: Mapping[tuple[int, int], Sequence[int]]) -> dict[str, Any]:
    """The table from its cells: (prefill bucket, prefix bucket) -> [prefills, new tokens,
    tokens computed, cached tokens computed again]."""
    actual = sum(row[1] for row in cells.values())
    padded = sum(row[2] for row in cells.values())
    return {
        "actual_tokens": actual, "padded_tokens": padded,
        "waste_fraction": (padded - actual) / padded if padded else 0.0,
        "by": "prefill x prefix",
        "by_bucket": {grid_key(*cell): {"chunks": row[0], "actual_tokens": row[1],
                                        "padded_tokens": row[2], "recomputed_tokens": row[3],
                                        "prefill_bucket": cell[0], "prefix_bucket": cell[1]}
                      for cell, row in sorted(cells.items())},
    }


def summary_words(section: PrefixCache | Mapping[str, Any] | None) -> str | None:
    """The summary's prefix-cache line (None when caching was off and nothing is shared), e.g.
    "37.1% of prompt tokens served from the prefix cache (bound 41.0%); 1,234,567 tokens
    computed"."""
    if not section:
        return None
    if not isinstance(section, PrefixCache):
        section = PrefixCache.from_dict(dict(section))
    bound = or_none(section.bound_fraction)
    error = or_none(section.bound_error_tokens)
    prompt = or_none(section.prompt_tokens)
    # (estimated past inputs/prefix_bound.py's exact count: its standard error said too)
    spread = f" +/- {_percent(error / prompt)}" if error and prompt else ""
    if not section.enabled:
        if not section.bound_tokens:
            return None
        # (no flag named: off may be --no-prefix-caching or a layout without it)
        return (f"prefix caching off; an unbounded cache could serve {_percent(bound)}{spread} "
                f"of prompt tokens")
    words = (f"{_percent(or_none(section.hit_fraction))} of prompt tokens served from the "
             f"prefix cache")
    if bound is not None:
        words += f" (bound {_percent(bound)}{spread})"
    words += f"; {section.computed_tokens or 0:,} tokens computed"
    if section.recomputed_tokens:
        words += f" ({section.recomputed_tokens:,} of them cached, computed again)"
    return words


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.1f}%"
