"""A job's run time from the step-time model, without running it: the requests in their
submission order, the prefix-cache hits that order gives, the compiled shapes. What auto prefix
caching weighs before a run (layout/prefix_decision.py) and what the verdict after a run weighs
its alternatives with (run/verdict.py). Pure Python.

It charges time as the simulated device does (device/executor.py): every step is one prefill
or one decode, so the run is the sum of its prefill steps and its decode steps.
- Prefill: each request's prompt, less its prefix-cache hits, on the graph the runtime picks
  (`Shapes.prefill_step`: NxDI's (prefill, prefix) grid cell under caching, else the prompt's
  bucket; chunks of max_num_batched_tokens where the runtime chunks).
- Hits (`cache_hits`): vLLM's prefix cache over whole blocks, in submission order: a request is
  served its leading blocks that an earlier request computed and the pool still holds (least
  recently used blocks go first; the pool's blocks of running requests are not counted against
  it, so the hits are an upper estimate on a crowded pool), never its last token.
- Decode: the requests admitted first come, first served into max_num_seqs slots
  (layout/bounds.py `FifoSchedule`, the Neuron scheduler's admission); under a static KV cache
  every step runs all slots at the token-generation bucket of the longest running request, plus
  NeuronCore-v2's block-KV gather under caching (`StepCostModel.gathered_tokens`); under a paged
  cache the steps at their mean held KV (the same either way caching goes).
"""

from __future__ import annotations

import itertools
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from neuron_batch.inputs.block_hashes import BlockHashes
from neuron_batch.layout.bounds import FifoSchedule
from neuron_batch.runtimes.buckets import bucket_for


@dataclass(frozen=True)
class Estimate:
    """Seconds a job's steps take on the step model (no start-up), by phase."""

    prefill_s: float
    decode_s: float
    gather_s: float = 0.0           # of decode_s: NeuronCore-v2's gather of block KV
    gather2_s: float = 0.0          # what the gather would add more were its term doubled
    hit_tokens: int = 0             # prompt tokens served from the prefix cache

    @property
    def seconds(self) -> float:
        return self.prefill_s + self.decode_s


#: Prompts whose chains are made together (`iter_block_chains`): a few MB of their tokens at
#: the longest prompts a run takes.
CHAIN_BATCH = 256


def block_chains(prompts: Sequence[Sequence[int]], block: int) -> list[list[int]]:
    """Per prompt, the hash chain of its whole `block`-token blocks (block i's hash covers
    blocks 0..i, as vLLM's block hashes do): equal hashes are equal prefixes."""
    return list(iter_block_chains(prompts, block))


def iter_block_chains(prompts: Iterable[Sequence[int]], block: int) -> Iterator[list[int]]:
    """`block_chains` a prompt at a time: a pass that uses each chain once (`cache_hits` in
    submission order) holds none of them. The prefix hashes of inputs/block_hashes.py, made
    over arrays, CHAIN_BATCH prompts together (a tuple of each block hashed in Python took
    ~20x as long as one prompt's arrays, which took ~7x as long as a batch's)."""
    hashes = BlockHashes(block)
    taken = iter(prompts)
    while batch := list(itertools.islice(taken, CHAIN_BATCH)):
        together, counts = hashes.whole_of(batch)
        ends = np.cumsum(counts).tolist()
        flat = together.tolist()
        for start, end in zip([0, *ends], ends):
            yield flat[start:end]


def cache_hits(prompt_lens: Sequence[int], chains: Iterable[Sequence[int]], block: int,
               capacity: int | None = None) -> Sequence[int]:
    """Per request in submission order, the prompt tokens vLLM's prefix cache serves it:
    its leading whole blocks already computed and still held (`capacity` blocks, least
    recently used evicted; None: unbounded), at most prompt - 1 tokens."""
    held: OrderedDict[int, None] = OrderedDict()
    out = array("i")        # (4 bytes a request: a 10M-request job's hits are 40 MB)
    for length, chain in zip(prompt_lens, chains):
        usable = max(length - 1, 0) // block
        hit = 0
        while hit < min(usable, len(chain)) and chain[hit] in held:
            held.move_to_end(chain[hit])
            hit += 1
        out.append(hit * block)
        for digest in chain[hit:]:
            held[digest] = None
        if capacity is not None:
            while len(held) > capacity:
                held.popitem(last=False)
    return out


def prefill_seconds(model, shapes, prompt_lens: Sequence[int], hits: Sequence[int],
                    chunk: int | None = None) -> float:
    """The prefill steps' time: each prompt after its hits, on the graph `shapes` runs it on
    (`chunk`: the runtime's prefill chunk, None for whole prompts)."""
    times: dict[tuple[int, int], float] = {}
    total = 0.0
    for length, hit in zip(prompt_lens, hits):
        done = hit
        while done < length:
            new = length - done if chunk is None else min(length - done, chunk)
            size, _, _, read = shapes.prefill_step(new, done)
            key = (size, read)
            if key not in times:
                times[key] = model.prefill_time(size, read)
            total += times[key]
            done += new
    return total


def decode_seconds(model, shapes, prompt_lens: Sequence[int],
                   output_lens: Sequence[int]) -> tuple[float, float, float]:
    """(decode seconds, of them the block-KV gather, what doubling the gather's term would
    add) of the requests in submission order."""
    slots = shapes.max_num_seqs
    schedule = FifoSchedule(prompt_lens, output_lens, slots)
    if schedule.length == 0:
        return 0.0, 0.0, 0.0
    if not shapes.runtime.static_kv:
        # paged: a step reads what its requests hold; the same whichever way caching goes
        context = sum(max(o - 1, 0) * p + max(o - 1, 0) * max(o - 2, 0) // 2
                      for p, o in zip(prompt_lens, output_lens))
        steps = schedule.length
        padded = bucket_for(min(slots, -(-sum(max(o - 1, 0) for o in output_lens) // steps)),
                            shapes.decode_buckets)
        return steps * model.decode_time(padded, context / steps), 0.0, 0.0
    buckets = shapes.attention_buckets or (shapes.max_model_len,)
    cost: dict[int, tuple[float, float, float]] = {}

    def step(attended: int) -> tuple[float, float, float]:
        if attended not in cost:
            kv = model.decode_kv_tokens(slots, attended, 0)
            gathered = model.gathered_tokens(slots, attended)
            with_gather = model.decode_time(slots, kv, gathered)
            cost[attended] = (with_gather, with_gather - model.decode_time(slots, kv),
                              model.decode_time(slots, kv, 2 * gathered) - with_gather)
        return cost[attended]

    total = gather = doubled = 0.0
    for first, count in schedule.stretches():     # positions first .. first + count - 1
        while count > 0:
            bucket = bucket_for(min(first, buckets[-1]), buckets)
            here = count if bucket < first else min(count, bucket - first + 1)
            seconds, gathered, more = step(bucket)
            total, gather, doubled = (total + here * seconds, gather + here * gathered,
                                      doubled + here * more)
            first, count = first + here, count - here
    return total, gather, doubled


def estimate(model, shapes, prompt_lens: Sequence[int], output_lens: Sequence[int],
             hits: Sequence[int] | None = None, chunk: int | None = None) -> Estimate:
    """The job's steps on `model` under `shapes` (hits None: no prefix cache)."""
    hits = hits if hits is not None else array("i", [0]) * len(prompt_lens)
    decode, gather, doubled = decode_seconds(model, shapes, prompt_lens, output_lens)
    return Estimate(prefill_seconds(model, shapes, prompt_lens, hits, chunk), decode, gather,
                    doubled, sum(hits))
