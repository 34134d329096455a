"""Bucket arithmetic: default bucket lists, validation, and padding lookups.

A bucket is a shape the Neuron compiler built a graph for. Prefill chunks are padded up to
the smallest `num_batched_tokens_buckets` entry that holds them; decode batches are padded up
to the smallest `num_seqs_buckets` entry. Pure Python, no vLLM: tested in milliseconds.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence

#: Smallest default prefill bucket, as in the AWS plugin and NxD Inference.
MIN_DEFAULT_PREFILL_BUCKET = 128
#: max_model_len values this project works out itself (plan's tightest that holds every
#: request, the one a too-long-prompt error suggests) are rounded up to a multiple of this, so
#: that the suggestion and plan's candidate agree.
MODEL_LEN_STEP = 128


class BucketError(ValueError):
    """A bucket list that the scheduler cannot use; the message says how to fix it."""


def effective_max_prefill_tokens(max_num_batched_tokens: int, max_model_len: int) -> int:
    """The largest prefill chunk a step can carry, so the largest prefill bucket."""
    return min(max_num_batched_tokens, max_model_len)


def default_prefill_buckets(max_num_batched_tokens: int, max_model_len: int) -> list[int]:
    """Powers of two from 128 below the effective max, then the max itself.

    The max need not be a power of two (e.g. 3000 -> [128, ..., 2048, 3000]).
    """
    maximum = effective_max_prefill_tokens(max_num_batched_tokens, max_model_len)
    return _powers_of_two_then(MIN_DEFAULT_PREFILL_BUCKET, maximum)


def default_decode_buckets(max_num_seqs: int) -> list[int]:
    """Powers of two from 1 below max_num_seqs, then max_num_seqs itself."""
    return _powers_of_two_then(1, max_num_seqs)


def _powers_of_two_then(start: int, maximum: int) -> list[int]:
    if maximum < 1:
        raise BucketError(f"the largest bucket must be positive, got {maximum}")
    buckets = []
    current = start
    while current < maximum:
        buckets.append(current)
        current *= 2
    buckets.append(maximum)
    return buckets


def validate_buckets(buckets: Sequence[int], maximum: int, *, name: str,
                     max_name: str) -> list[int]:
    """Check a user's bucket list and return it as a list of ints.

    Rules (the AWS plugin's): positive integers, strictly ascending (so no duplicates), and
    the last bucket equal to `maximum`, the largest count a step can produce. Errors say what
    is wrong and give a valid list to use instead.
    """
    buckets = list(buckets)
    fitting = fitting_buckets(buckets, maximum)
    # An option's error suggests the option as it is typed, so it can be pasted back.
    suggestion: str | list[int] = (f"{name} {','.join(map(str, fitting))}"
                                   if name.startswith("--") else fitting)
    if not buckets:
        raise BucketError(f"{name} is empty; it needs at least one bucket, e.g. {suggestion}")
    for value in buckets:
        if isinstance(value, bool) or not isinstance(value, int):
            raise BucketError(f"{name} must hold whole numbers, got {value!r} in {buckets}")
        if value <= 0:
            raise BucketError(f"{name} must hold positive numbers, got {value} in {buckets}; "
                              f"try {suggestion}")
    if len(set(buckets)) != len(buckets):
        dupes = sorted({b for b in buckets if buckets.count(b) > 1})
        raise BucketError(f"{name} has duplicates {dupes} in {buckets}; try {suggestion}")
    if buckets != sorted(buckets):
        raise BucketError(f"{name} must be in ascending order, got {buckets}; try {suggestion}")
    if buckets[-1] != maximum:
        raise BucketError(
            f"the last bucket of {name} must equal {max_name} = {maximum}, got {buckets[-1]} "
            f"in {buckets}; try {suggestion}")
    return buckets


def fitting_buckets(buckets: Sequence[int], maximum: int) -> list[int]:
    """A valid list close to what the user wrote: their usable values, then the max."""
    usable = sorted({b for b in buckets if isinstance(b, int) and not isinstance(b, bool)
                     and 0 < b < maximum})
    return usable + [maximum]


def bucket_for(count: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= count; 0 for 0; the largest bucket if count is above all.

    A count above the largest bucket cannot happen when the last bucket is the max a step can
    carry (validate_buckets enforces that); the clamp mirrors the AWS plugin for safety.
    """
    if count <= 0:
        return 0
    index = bisect_left(buckets, count)
    if index == len(buckets):
        return buckets[-1]
    return buckets[index]


def parse_bucket_list(text: str, *, name: str) -> list[int]:
    """Parse '128,256,512' (spaces allowed) into ints with an error naming the option."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise BucketError(f"{name}: no buckets given in {text!r}; write them like 128,256,512")
    values = []
    for part in parts:
        try:
            values.append(int(part))
        except ValueError:
            raise BucketError(f"{name}: {part!r} is not a whole number (in {text!r}); "
                              f"write buckets like 128,256,512") from None
    return values


def round_model_len(tokens: int) -> int:
    """`tokens` rounded up to a whole number of MODEL_LEN_STEP."""
    return -(-tokens // MODEL_LEN_STEP) * MODEL_LEN_STEP


def max_kv_concurrent_requests(num_blocks: int, block_size: int, max_model_len: int) -> int:
    """How many requests the KV cache holds if each grows to max_model_len tokens."""
    blocks_per_request = -(-max_model_len // block_size)
    return num_blocks // blocks_per_request


def kv_too_small_message(num_blocks: int, block_size: int, max_model_len: int) -> str:
    """What to tell a user whose KV cache cannot hold one request of max_model_len tokens."""
    capacity = num_blocks * block_size
    fitting_len = capacity // block_size * block_size
    return (
        f"the KV cache holds {num_blocks} blocks x {block_size} tokens = {capacity:,} tokens, "
        f"less than one request of max_model_len = {max_model_len:,} tokens, so no request "
        f"could be admitted safely (the AWS plugin silently switches its KV admission cap off "
        f"here and risks a deadlock). Lower max_model_len to at most {fitting_len:,} "
        f"(--max-model-len {fitting_len}), or give the KV cache more memory (more "
        f"NeuronCores; raise VLLM_NEURON_KV_GMU_BUDGET_CAP_FRACTION on Neuron, or "
        f"gpu_memory_utilization / the KV cache space elsewhere). (kv_reserve=request would "
        f"not help: vLLM's own start-up refuses a cache smaller than one max_model_len.)")


#: Smallest NxDI bucket its `generate_buckets` starts from (context encoding and token
#: generation alike, without prefix caching).
NXDI_MIN_BUCKET = 128
#: The Beta plugin's decode context-length buckets must be multiples of this.
DECODE_CONTEXT_MULTIPLE = 128


def nxdi_default_buckets(max_length: int, min_length: int = NXDI_MIN_BUCKET) -> list[int]:
    """NxDI's `generate_buckets(min, max)`: powers of two from `min` up to (not including)
    2**round(log2(max)), then `max` itself; rounding drops a power of two too close to the
    maximum (4352 -> [..., 2048, 4352], 3000 -> [..., 2048, 3000])."""
    if max_length < 1:
        raise BucketError(f"the largest bucket must be positive, got {max_length}")
    if max_length <= min_length:
        return [max_length]
    low, high = int(math.log2(min_length)), round(math.log2(max_length))
    return [2 ** i for i in range(low, high) if 2 ** i < max_length] + [max_length]


def validate_context_buckets(buckets: list[int], max_model_len: int, flag: str) -> list[int]:
    """The Beta plugin's rules for decode context-length buckets: ascending, each below
    max_model_len and a multiple of 128 (the max_model_len graph is always compiled too)."""
    for value in buckets:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise BucketError(f"{flag} must hold positive whole numbers, got {value!r}")
        if value % DECODE_CONTEXT_MULTIPLE:
            raise BucketError(f"{flag}: {value} is not a multiple of "
                              f"{DECODE_CONTEXT_MULTIPLE} (the plugin's rule)")
        if value >= max_model_len:
            raise BucketError(f"{flag}: {value} is not below max_model_len = {max_model_len} "
                              f"(the max_model_len graph is always there)")
    if buckets != sorted(set(buckets)):
        raise BucketError(f"{flag} must be strictly ascending, got {buckets}")
    return buckets
