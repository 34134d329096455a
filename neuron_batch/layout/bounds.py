"""Lower bounds on one replica's simulated run time, from the cost model alone (no engine).

`plan` prunes a configuration without simulating it when even this bound cannot beat the
best configuration simulated so far, so the bound must never exceed what the simulated device
would charge. It holds because of how the simulated device charges time:

- Every step is either a prefill of one chunk of one request or a decode of the running
  requests, never both, and all requests arrive at once: the run time is the sum of the
  prefill steps' times plus the sum of the decode steps' times (empty steps cost nothing).
- Prefill: a prompt of p tokens is prefilled in chunks of min(remaining, M) tokens
  (M = max_num_batched_tokens), each padded to its bucket, after the chunks before it. That
  sum is computed exactly here (`prefill_seconds`).
- Decode: with one decode bucket S (what `plan` compiles), every decode step is padded to S.
  A request with o output tokens takes part in o - 1 decode steps (the prefill samples its
  first token), holding p + j - 1 tokens of KV at its j-th; call X the sum of those
  context sizes over all requests. The cost model's decode_time(S, C) is convex in C and
  a fixed cost plus a part that grows with C, so by Jensen's inequality n steps holding X in
  total cost at least n * decode_time(S, X / n), which grows with n. And n is at least:
    - sum(o - 1) / S (at most S requests decode at once);
    - X / (block_size * usable_blocks): the running requests' KV must fit in the cache
      every step, whatever the admission rule;
    - with admission reserving max_model_len per request: sum(o - 1) / the requests that fit;
    - with admission reserving prompt + max_tokens ("request"): the blocks reserved times
      the steps they are held, over the usable blocks.

Pure Python; the cost model is any object with `prefill_time(padded, context)` and
`decode_time(padded_seqs, context)`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from neuron_batch.buckets import bucket_for
from neuron_batch.choices import KvReserve


@dataclass(frozen=True)
class ShareStats:
    """What the bounds need of the requests one replica serves."""

    num_requests: int
    output_tokens: int          # sum(o)
    input_tokens: int           # sum(p)
    decode_tokens: int          # sum(o - 1): tokens produced by decode steps
    context_sum: int            # X: KV tokens held, summed over every decode participation
    reserve_request_area: int   # sum(blocks(p + o) * (o - 1)), for the "request" rule
    chunks: Counter             # (chunk tokens, prior tokens) -> how many prefill steps

    @classmethod
    def of(cls, prompt_lens: Sequence[int], output_lens: Sequence[int], *,
           max_num_batched_tokens: int, max_model_len: int, block_size: int) -> ShareStats:
        chunks: Counter = Counter()
        context = reserve = decode = 0
        for p, o in zip(prompt_lens, output_lens):
            done = 0
            while done < p:
                size = min(p - done, max_num_batched_tokens)
                chunks[(size, done)] += 1
                done += size
            steps = max(o - 1, 0)
            decode += steps
            context += steps * p + steps * (steps - 1) // 2
            reserve += -(-min(p + o, max_model_len) // block_size) * steps
        return cls(len(prompt_lens), sum(output_lens), sum(prompt_lens), decode, context,
                   reserve, chunks)

    def __add__(self, other: ShareStats) -> ShareStats:
        """The statistics of both groups of requests together (every field is a sum), for
        groups computed with the same max_num_batched_tokens and a max_model_len that holds
        every request of both."""
        return ShareStats(*(a + b for a, b in zip(
            (self.num_requests, self.output_tokens, self.input_tokens, self.decode_tokens,
             self.context_sum, self.reserve_request_area, self.chunks),
            (other.num_requests, other.output_tokens, other.input_tokens, other.decode_tokens,
             other.context_sum, other.reserve_request_area, other.chunks))))

    @classmethod
    def empty(cls) -> ShareStats:
        return cls(0, 0, 0, 0, 0, 0, Counter())


def prefill_seconds(model, stats: ShareStats, buckets: Sequence[int] | None) -> float:
    """Exactly what the prefill steps cost: every chunk at its padded bucket and prior KV.
    Buckets None: each chunk at its own size, a lower bound for any buckets (a prefill's
    time grows with its padded size)."""
    return sum(count * model.prefill_time(bucket_for(size, buckets) if buckets else size,
                                          prior)
               for (size, prior), count in stats.chunks.items())


def decode_steps_bound(stats: ShareStats, *, max_num_seqs: int, num_blocks: int,
                       block_size: int, max_model_len: int, kv_reserve: KvReserve | str) -> int:
    """The fewest decode steps the share can take (see the module docstring). `kv_reserve`:
    the admission rule, in any spelling; a value that names none (e.g. "none") leaves only the
    bounds every rule obeys."""
    if stats.decode_tokens == 0:
        return 0
    rule = KvReserve.lookup(kv_reserve)
    usable = max(num_blocks - 1, 1)     # vLLM keeps one block back (its null block)
    bounds = [stats.decode_tokens / max_num_seqs,
              stats.context_sum / (block_size * usable)]
    if rule is KvReserve.MAX_MODEL_LEN:
        fit = usable // -(-max_model_len // block_size)
        bounds.append(stats.decode_tokens / max(fit, 1))
    elif rule is KvReserve.REQUEST:
        bounds.append(stats.reserve_request_area / usable)
    return math.ceil(max(bounds) - 1e-9)


def decode_seconds_bound(model, stats: ShareStats, *, steps: int, max_num_seqs: int) -> float:
    """At least what `steps` decode steps padded to max_num_seqs cost (Jensen)."""
    if steps == 0:
        return 0.0
    return steps * model.decode_time(max_num_seqs, stats.context_sum / steps)


@dataclass(frozen=True)
class ReplicaBound:
    prefill_s: float            # exact
    decode_s: float             # a lower bound
    decode_steps: int           # a lower bound
    prefill_steps: int

    @property
    def seconds(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def steps(self) -> int:
        return self.prefill_steps + self.decode_steps


def replica_bound(model, stats: ShareStats, *, prefill_buckets: Sequence[int] | None,
                  max_num_seqs: int, num_blocks: int, block_size: int, max_model_len: int,
                  kv_reserve: KvReserve | str) -> ReplicaBound:
    """Lower bound on the simulated run time of one replica serving `stats`' requests with
    one decode bucket (max_num_seqs)."""
    steps = decode_steps_bound(stats, max_num_seqs=max_num_seqs, num_blocks=num_blocks,
                               block_size=block_size, max_model_len=max_model_len,
                               kv_reserve=kv_reserve)
    return ReplicaBound(prefill_seconds(model, stats, prefill_buckets),
                        decode_seconds_bound(model, stats, steps=steps,
                                             max_num_seqs=max_num_seqs),
                        steps, sum(stats.chunks.values()))
