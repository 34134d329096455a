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
      the steps they are held, over the usable blocks;
    - the FIFO list schedule's length (`ordered_decode_bound`): requests are admitted in
      the order they are submitted, into at most S slots, and a request holds its slot for
      its o - 1 decode steps. Admitting each as soon as a slot frees starts every request at
      the earliest step any such admission can (by induction: with every earlier request
      started no later, at least as many slots are free at every step), so its last finish
      is the fewest decode steps there can be.
- Static KV (nxdi), from the same schedule: every slot of a decode step attends the
  token-generation bucket of the longest running request's position + 1, and the Neuron
  scheduler admits first come, first served, a prompt a step, whenever a slot is free: the
  schedule above is the one it runs, so its decode time is computed step by step, each at
  decode_time(S, S x that bucket) (buckets None: the position itself, a bound for any
  buckets fitted later). tests/test_plan_bounds.py and test_plan.py check it.

Pure Python; the cost model is any object with `prefill_time(padded, context)` and
`decode_time(padded_seqs, context)`.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from neuron_batch.choices import KvReserve
from neuron_batch.runtimes.buckets import bucket_for


@dataclass(frozen=True)
class ShareStats:
    """What the bounds need of the requests one replica serves."""

    num_requests: int
    output_tokens: int          # sum(o)
    input_tokens: int           # sum(p)
    decode_tokens: int          # sum(o - 1): tokens produced by decode steps
    context_sum: int            # X: KV tokens held, summed over every decode participation
    reserve_request_area: int   # sum(blocks(p + o) * (o - 1)), for the "request" rule
    chunks: Counter[tuple[int, int]]  # (chunk tokens, prior tokens) -> how many prefill steps

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
        return ShareStats(*self._counts_plus(other), self.chunks + other.chunks)

    def _counts_plus(self, other: ShareStats) -> tuple[int, int, int, int, int, int]:
        return (self.num_requests + other.num_requests, self.output_tokens + other.output_tokens,
                self.input_tokens + other.input_tokens, self.decode_tokens + other.decode_tokens,
                self.context_sum + other.context_sum,
                self.reserve_request_area + other.reserve_request_area)

    @classmethod
    def running_sums(cls, groups: Sequence[ShareStats]) -> list[ShareStats]:
        """groups[0], groups[0] + groups[1], ...: what `+` gives (its chunks in the same
        order, so sums over them come out the same), each from the one before by adding only
        the next group's chunks."""
        out, total = [], cls.empty()
        for group in groups:
            chunks = Counter(total.chunks)      # (a copy: the sums before keep theirs)
            chunks.update(group.chunks)         # (counts are positive, as `+` keeps them)
            total = cls(*total._counts_plus(group), chunks)
            out.append(total)
        return out

    @classmethod
    def empty(cls) -> ShareStats:
        return cls(0, 0, 0, 0, 0, 0, Counter())


def prefill_seconds(model, stats: ShareStats, buckets: Sequence[int] | None) -> float:
    """Exactly what the prefill steps cost: every chunk at its padded bucket and prior KV.
    Buckets None: each chunk at its own size, a lower bound for any buckets (a prefill's
    time grows with its padded size)."""
    if not buckets:
        return sum(count * model.prefill_time(size, prior)
                   for (size, prior), count in stats.chunks.items())
    # Many chunks share a bucket: each (bucket, prior)'s step time is asked of the model once
    # (the same terms, summed in the same order, as without the memo).
    times: dict[tuple[int, int], float] = {}

    def step_s(padded: int, prior: int) -> float:
        key = (padded, prior)
        if key not in times:
            times[key] = model.prefill_time(padded, prior)
        return times[key]

    return sum(count * step_s(bucket_for(size, buckets), prior)
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


def fifo_starts(decode_steps: Sequence[int], max_num_seqs: int) -> list[int]:
    """Each request's first decode step when the requests are admitted in this order into
    max_num_seqs slots, each as soon as a slot frees (the earliest any in-order admission
    can start it; module docstring)."""
    return list(iter_fifo_starts(decode_steps, max_num_seqs))


def iter_fifo_starts(decode_steps: Iterable[int], max_num_seqs: int) -> Iterator[int]:
    """`fifo_starts` a request at a time (nondecreasing: each takes the slot that frees
    first), holding only the slots."""
    free = [0] * max(max_num_seqs, 1)
    for steps in decode_steps:
        start = free[0]
        heapq.heapreplace(free, start + steps)
        yield start


class FifoSchedule:
    """Requests in their submission order admitted first come, first served into
    `max_num_seqs` slots (`fifo_starts`): its length in decode steps and, for a static KV
    cache, the stretches its time is summed over. What it holds depends on the requests and
    the slots only, so a plan computes it once for every placement that serves them.

    It keeps the caller's two sequences, not copies, and walks them again for each use: a
    job of millions of requests costs it the slots, not lists of every start (the stretches
    of up to CACHED_UP_TO requests are kept, 16 bytes each, for a plan that asks again)."""

    CACHED_UP_TO = 1 << 18

    def __init__(self, prompt_lens: Sequence[int], output_lens: Sequence[int],
                 max_num_seqs: int):
        self.max_num_seqs = max_num_seqs
        self._prompts, self._outputs = prompt_lens, output_lens
        self.length = max((s + d for s, d in zip(iter_fifo_starts(self._steps(), max_num_seqs),
                                                  self._steps())), default=0)
        self._stretches: tuple[array, array] | None = None

    def _steps(self) -> Iterator[int]:
        return (max(o - 1, 0) for o in self._outputs)

    def stretches(self) -> Iterator[tuple[int, int]]:
        """(first, count) for each stretch between two starts or finishes with a request
        running: its set of running requests is fixed, so the longest position + 1 is
        `first` at its first step and grows by one a step, for `count` steps (the request
        with the largest prompt + 1 - start)."""
        if self._stretches is not None:
            return zip(*self._stretches)
        if len(self._outputs) > self.CACHED_UP_TO:
            return self._walk()
        firsts, counts = array("q"), array("q")
        for first, count in self._walk():
            firsts.append(first)
            counts.append(count)
        self._stretches = (firsts, counts)
        return zip(firsts, counts)

    def _walk(self) -> Iterator[tuple[int, int]]:
        """The stretches in one pass: the times where the running set changes are the starts
        (nondecreasing) merged with the ends of the requests started (a heap of at most the
        slots), so nothing is held per request."""
        slots = max(self.max_num_seqs, 1)
        requests = zip(iter_fifo_starts(self._steps(), slots), self._steps(), self._prompts)
        waiting = next(requests, None)       # the next request to start
        ends: list[int] = []                 # started requests' ends (min-heap)
        running: list[tuple[int, int]] = []  # (-(prompt + 1 - start), end): a max-heap
        at: int | None = None
        while waiting is not None or ends:
            # the next time anything starts or ends
            after = min(waiting[0] if waiting is not None else math.inf,
                        ends[0] if ends else math.inf)
            if at is not None:
                while running and running[0][1] <= at:
                    heapq.heappop(running)
                if running:
                    yield at - running[0][0], int(after) - at
            at = int(after)
            while waiting is not None and waiting[0] <= at:
                start, steps, prompt = waiting
                if steps:
                    heapq.heappush(running, (-(prompt + 1 - start), start + steps))
                    heapq.heappush(ends, start + steps)
                waiting = next(requests, None)
            while ends and ends[0] <= at:
                heapq.heappop(ends)
            if len(running) > 4 * slots:    # (ended entries wait for the top: drop them)
                running = [entry for entry in running if entry[1] > at]
                heapq.heapify(running)

    def bound(self, model, *, attention_buckets: Sequence[int] | None, static_kv: bool
              ) -> tuple[int, float]:
        """`ordered_decode_bound` of this schedule on `model`."""
        if not static_kv or self.length == 0:
            return self.length, 0.0
        return self.length, _static_decode_seconds(model, self.stretches(), self.max_num_seqs,
                                                   attention_buckets)


def ordered_decode_bound(model, prompt_lens: Sequence[int], output_lens: Sequence[int], *,
                         max_num_seqs: int, attention_buckets: Sequence[int] | None,
                         static_kv: bool) -> tuple[int, float]:
    """(decode steps, decode seconds) at least, for requests in the order they are submitted:
    the FIFO schedule's length and, under a static KV cache, its time step by step (module
    docstring); 0 seconds otherwise (the caller's Jensen bound over those steps applies)."""
    return FifoSchedule(prompt_lens, output_lens, max_num_seqs).bound(
        model, attention_buckets=attention_buckets, static_kv=static_kv)


def _static_decode_seconds(model, stretches: Iterable[tuple[int, int]], slots: int,
                           buckets: Sequence[int] | None) -> float:
    """The decode time of a FIFO schedule's `stretches` (`FifoSchedule.stretches`) under a
    static KV cache: each costs the steps in each bucket it crosses (buckets None: by
    convexity at least its steps at the stretch's mean position)."""
    cost: dict[int, float] = {}

    def step_s(attended: float) -> float:
        return model.decode_time(slots, model.decode_kv_tokens(slots, attended, 0))

    def bucketed(attended: int) -> float:
        if attended not in cost:
            cost[attended] = step_s(attended)
        return cost[attended]

    total = 0.0
    for first, count in stretches:      # positions first .. first+count-1
        if not buckets:
            total += count * step_s(first + (count - 1) / 2)
            continue
        while count > 0:
            bucket = bucket_for(first, buckets)
            here = count if bucket < first else min(count, bucket - first + 1)
            total += here * bucketed(bucket)
            first, count = first + here, count - here
    return total


def decode_seconds_bound(model, stats: ShareStats, *, steps: int, max_num_seqs: int) -> float:
    """At least what `steps` decode steps padded to max_num_seqs cost (Jensen)."""
    return jensen_decode_seconds(model, stats.context_sum, steps=steps,
                                 max_num_seqs=max_num_seqs)


def jensen_decode_seconds(model, context_sum: int, *, steps: int, max_num_seqs: int) -> float:
    """`decode_seconds_bound` from the share's KV context sum (X) alone."""
    if steps == 0:
        return 0.0
    return steps * model.decode_time(max_num_seqs, context_sum / steps)


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
                  kv_reserve: KvReserve | str,
                  ordered: tuple[int, float] | None = None) -> ReplicaBound:
    """Lower bound on the simulated run time of one replica serving `stats`' requests with
    one decode bucket (max_num_seqs). `ordered`: `ordered_decode_bound` of the same requests
    in their submission order, where known."""
    steps = decode_steps_bound(stats, max_num_seqs=max_num_seqs, num_blocks=num_blocks,
                               block_size=block_size, max_model_len=max_model_len,
                               kv_reserve=kv_reserve)
    steps = max(steps, ordered[0]) if ordered else steps
    decode_s = decode_seconds_bound(model, stats, steps=steps, max_num_seqs=max_num_seqs)
    return ReplicaBound(prefill_seconds(model, stats, prefill_buckets),
                        max(decode_s, ordered[1]) if ordered else decode_s,
                        steps, sum(stats.chunks.values()))
