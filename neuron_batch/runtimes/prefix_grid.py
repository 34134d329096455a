"""NxDI's compiled shapes under prefix caching: the 2-D (prefill, prefix) grid of context-encoding
graphs, the token-generation buckets of the block layout, and the rule that picks one grid cell
for a prefill whose prompt is partly cached.

With prefix caching NxDI keeps KV in blocks and compiles each context-encoding graph for a pair
(prefill bucket, prefix bucket): the prefill bucket holds the tokens computed in the step, the
prefix bucket the cached KV they attend. Given the new tokens and the cached ones, NxDI takes the
smallest prefill bucket that holds the new tokens, then moves cached tokens off the end of the
prefix into the prefill bucket's spare room (they are computed again; their KV is not rewritten)
and takes the smallest prefix bucket that holds what is left. So a hit only saves work when the
new tokens are too many for the cached ones to fit in the prefill padding.

Sources (../shared/notes/neuron-runtimes.md, "Prefix caching under NxDI"): NxDI
`modules/autobucketing.py` (prefill buckets from 512, "minimal 512 to use the FA kernel"; prefix
buckets 0 then from 512; token generation from 256, "minimal 256 to use the block attn nki
kernel"), `models/model_wrapper.py` `get_target_2d_bucket_for_prefix_caching` and
`_pad_prefix_caching_inputs` (the cell rule, including its corner case: a prompt of 257-512
tokens in all runs as (512, 0), wholly recomputed, "based on perf collection results").

Pure Python: the scheduler's records, the simulated device, the Neuron host's configuration and
plan share it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from neuron_batch.runtimes.buckets import BucketError, nxdi_default_buckets

#: Smallest prefill bucket of the grid NxDI generates by default (its flash-attention kernel).
MIN_PREFILL_BUCKET = 512
#: Smallest non-zero prefix bucket NxDI generates by default.
MIN_PREFIX_BUCKET = 512
#: Smallest token-generation bucket NxDI generates with the block layout (its block-attention
#: kernel), instead of 128 for the contiguous layout.
MIN_TKG_BUCKET = 256
#: Block sizes the block layout takes (NxDI recommends 32; the vLLM guide says 32 or 16).
BLOCK_SIZES = (16, 32)
#: NxDI's config key of the prefix bucket list (beside `context_encoding_buckets`).
PREFIX_BUCKETS_KEY = "prefix_buckets"
#: The corner case of NxDI's rule: a prompt whose total length lies in (256, 512] runs as the
#: (512, 0) cell when the grid has it.
_CORNER = (256, 512)


def default_prefill_buckets(max_model_len: int) -> list[int]:
    """NxDI's default prefill buckets of the grid: `generate_buckets(512, max_model_len)`."""
    return nxdi_default_buckets(max_model_len, MIN_PREFILL_BUCKET)


def default_prefix_buckets(max_model_len: int) -> list[int]:
    """NxDI's default prefix buckets: 0 (no cached KV attended), then
    `generate_buckets(512, max_model_len)`."""
    return [0] + nxdi_default_buckets(max_model_len, MIN_PREFIX_BUCKET)


def default_tkg_buckets(max_model_len: int) -> list[int]:
    """NxDI's default token-generation buckets with the block layout: from 256."""
    return nxdi_default_buckets(max_model_len, MIN_TKG_BUCKET)


def grid_size(prefill_buckets: Sequence[int], prefix_buckets: Sequence[int]) -> int:
    """Context-encoding graphs the grid compiles: one per (prefill, prefix) pair."""
    return len(prefill_buckets) * len(prefix_buckets)


def validate_prefix_buckets(buckets: Sequence[int], max_model_len: int, block_size: int,
                            flag: str = "--prefix-buckets") -> list[int]:
    """A user's prefix bucket list as NxDI needs it: whole numbers, strictly ascending, each a
    multiple of the KV block size (the prefix is read in whole blocks), the last equal to
    max_model_len. 0 is always compiled, so it is added when missing. BucketError names the
    flag and says what to give."""
    values = list(buckets)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BucketError(f"{flag} must hold whole numbers >= 0, got {value!r}")
        if value % block_size:
            raise BucketError(f"{flag}: {value} is not a multiple of the KV block size "
                              f"{block_size} (NxDI reads the prefix in whole blocks)")
    if values != sorted(set(values)):
        raise BucketError(f"{flag} must be strictly ascending, got {values}")
    if not values or values[-1] != max_model_len:
        raise BucketError(f"{flag} must end at max_model_len = {max_model_len} (a prompt may "
                          f"have up to that many tokens cached), got {values}")
    return values if values[0] == 0 else [0] + values


@dataclass(frozen=True, slots=True)
class GridCell:
    """The context-encoding graph one prefill runs on, and what it computes."""

    prefill_bucket: int     # tokens computed in the step, padded
    prefix_bucket: int      # cached KV tokens attended, padded
    computed: int           # tokens computed: the new ones plus the recomputed cached ones
    recomputed: int         # cached tokens moved into the prefill bucket and computed again
    prefix_tokens: int      # cached tokens read from the KV cache (padded to prefix_bucket)


def grid_cell(new_tokens: int, cached_tokens: int, prefill_buckets: Sequence[int],
              prefix_buckets: Sequence[int]) -> GridCell:
    """The (prefill, prefix) cell NxDI runs a prefill of `new_tokens` on, whose first
    `cached_tokens` prompt tokens are in the prefix cache (both lists ascending; the prefix list
    starts at 0). ValueError where no cell holds it (NxDI raises too)."""
    if new_tokens < 1 or cached_tokens < 0:
        raise ValueError(f"a prefill computes at least one token with >= 0 cached, got "
                         f"{new_tokens} new and {cached_tokens} cached")
    total = new_tokens + cached_tokens
    if (_CORNER[0] < total <= _CORNER[1] and _CORNER[1] in prefill_buckets
            and 0 in prefix_buckets):
        return GridCell(_CORNER[1], 0, total, cached_tokens, 0)
    index = bisect_left(prefill_buckets, new_tokens)
    if index == len(prefill_buckets):
        raise ValueError(f"{new_tokens} new tokens exceed the largest prefill bucket "
                         f"{prefill_buckets[-1]}")
    prefill = prefill_buckets[index]
    kept = max(0, cached_tokens - (prefill - new_tokens))
    index = bisect_left(prefix_buckets, kept)
    if index == len(prefix_buckets):
        raise ValueError(f"{kept} cached tokens exceed the largest prefix bucket "
                         f"{prefix_buckets[-1]}")
    recomputed = cached_tokens - kept
    return GridCell(prefill, prefix_buckets[index], new_tokens + recomputed, recomputed, kept)
