"""KV reservations: how many KV blocks an admitted request may come to hold, and the running
total the fourth admission check (`kv_saturated`) compares with the cache.

Neuron cannot preempt, so a request may only start if every running request can still grow to
its end without running out of blocks. Two rules say what "its end" is
(`additional_config["neuron_batch"]["kv_reserve"]`):

- `"max_model_len"`: the seed design's rule. Every request is assumed to grow to
  `max_model_len`, so at most `usable_blocks // blocks_per_max_model_len_request` run at once.
  Safe, but batch jobs know each request's length: a conversation request needs about 1,400
  tokens, not 16,384, and most of the cache stays empty.
- `"request"` (the default): a request reserves what it can actually reach, prompt plus
  `max_tokens` clamped to `max_model_len` (TensorRT-LLM's GUARANTEED_NO_EVICT), and the head of
  the queue is admitted while the reservations of the running requests plus its own fit. No
  admitted request can run out of blocks, so there is still no preemption and no deadlock.

Why `prompt + max_tokens` tokens are enough, also with async scheduling: the last sampled
token is never fed back, so a request writes at most `prompt + max_tokens - 1` KV slots; the
one slot to spare covers the step async scheduling may plan ahead of the output it waits for
(vLLM skips that step when it knows max_tokens is reached, and clamps at `max_model_len - 1`).
Prefix-cache hits share blocks between requests; reserving without sharing only over-counts.

Pure Python (no vLLM): the rule names are read by the configuration and the CLI as well.
"""

from __future__ import annotations

from collections.abc import Sequence

from neuron_batch.choices import KvReserve

REQUEST = KvReserve.REQUEST
MAX_MODEL_LEN = KvReserve.MAX_MODEL_LEN
#: The rules, the default first.
KV_RESERVE_RULES = tuple(KvReserve)
DEFAULT_KV_RESERVE = REQUEST
#: The rules as the command line and job files spell them.
CLI_NAMES = {rule: rule.cli for rule in KvReserve}
#: Short names for sweep configuration names (K=req, K=mml).
#: A rule's short name by its name (a StrEnum member is its name too).
SHORT_NAMES: dict[str, str] = {rule: rule.short for rule in KvReserve}


def parse_kv_reserve(value: str) -> KvReserve:
    """A rule as written on the command line, in a job file or in the scheduler config
    ('request', 'max-model-len', 'max_model_len', or the short 'req' / 'mml') -> its member;
    ValueError naming the rules otherwise."""
    return KvReserve.parse(value, "kv-reserve")


def reachable_tokens(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> int:
    """The most tokens a request can reach: prompt + max_tokens, never past max_model_len
    (vLLM stops a request there); no max_tokens means it may run to max_model_len."""
    if max_tokens is None:
        return max_model_len
    return min(num_prompt_tokens + max_tokens, max_model_len)


def blocks_for_tokens(num_tokens: int, groups: Sequence[tuple[int, int]]) -> int:
    """KV blocks a request of `num_tokens` tokens holds, summed over the KV cache groups, as
    vLLM allocates them: each group `(block_size, most_blocks)` gives ceil(tokens /
    block_size) blocks, at most `most_blocks` (what the group holds for a max_model_len
    request; smaller for sliding-window groups)."""
    return sum(min(-(-num_tokens // block_size), most) for block_size, most in groups)


class KVLedger:
    """The reservations of the admitted requests: a running total, so the admission check is
    O(1) however many requests run (no re-summing `running` each step)."""

    __slots__ = ("usable_blocks", "total", "peak", "_held")

    def __init__(self, usable_blocks: int) -> None:
        self.usable_blocks = usable_blocks
        self.total = 0
        self.peak = 0
        self._held: dict[str, int] = {}

    def fits(self, num_blocks: int) -> bool:
        """Whether a request reserving `num_blocks` may start next to those admitted."""
        return self.total + num_blocks <= self.usable_blocks

    def reserve(self, req_id: str, num_blocks: int) -> None:
        if req_id in self._held:
            return
        self._held[req_id] = num_blocks
        self.total += num_blocks
        if self.total > self.peak:
            self.peak = self.total

    def release(self, req_id: str) -> int:
        """Give a request's blocks back (it finished, was aborted or was preempted); 0 if it
        held none."""
        num_blocks = self._held.pop(req_id, 0)
        self.total -= num_blocks
        return num_blocks

    def held(self, req_id: str) -> int:
        return self._held.get(req_id, 0)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._held

    def __len__(self) -> int:
        return len(self._held)


def too_big_message(req_id: str, num_prompt_tokens: int, max_tokens: int | None,
                    max_model_len: int, num_blocks: int, usable_blocks: int,
                    block_size: int) -> str:
    """Why a request can never start: its reservation alone exceeds the KV cache."""
    reach = reachable_tokens(num_prompt_tokens, max_tokens, max_model_len)
    wanted = "no max_tokens, so up to max_model_len" if max_tokens is None else (
        f"max_tokens {max_tokens:,}")
    return (f"request {req_id} cannot start: {num_prompt_tokens:,} prompt tokens + {wanted} "
            f"reach {reach:,} tokens = {num_blocks:,} KV blocks, but the KV cache has only "
            f"{usable_blocks:,} usable blocks of {block_size} tokens "
            f"({usable_blocks * block_size:,} tokens); shorten the prompt or max_tokens, or give "
            f"the KV cache more memory")


def small_cache_warning(usable_blocks: int, block_size: int, max_model_len: int) -> str:
    """Start-up warning under the `request` rule when not even one max_model_len request fits:
    the run goes on, requests that fit run, longer ones are refused one by one."""
    capacity = usable_blocks * block_size
    return (f"the KV cache holds {usable_blocks:,} blocks x {block_size} tokens = {capacity:,} "
            f"tokens, less than one request of max_model_len = {max_model_len:,} tokens; with "
            f"kv_reserve=request, requests whose prompt + max_tokens fit in {capacity:,} tokens "
            f"run, longer ones are refused with an error")
