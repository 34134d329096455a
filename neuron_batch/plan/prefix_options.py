"""Prefix caching in `plan`: what the job's prompts share, and each option again with caching on
in prefix order (name ending " +PC"), with its own graphs and lower bounds. Pure Python.

Where nothing is shared (an unbounded cache would serve no prompt token) no option is added:
caching then only costs (nxdi's grid of prefill x prefix graphs, and on NeuronCore-v2 a gather
of block KV before every decode), so every option runs with it off.

The bounds of an option with caching on stay lower bounds (search.py prunes on them): each
request's prefill is bounded by its prompt less the leading whole blocks it shares with any
other request of the job (at least what the cache could spare it, in any order and pool),
prefilled with no prior KV; the decode bound is the option's own without the gather, which
only adds time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from neuron_batch.device.target import NEURON_BLOCK_SIZE
from neuron_batch.layout.bounds import ShareStats, replica_bound
from neuron_batch.layout.step_estimate import block_chains
from neuron_batch.plan.candidates import Option, PlanSpec
from neuron_batch.runtimes.prefix_grid import (
    default_prefill_buckets,
    default_prefix_buckets,
    default_tkg_buckets,
    grid_size,
)

#: The order an option with caching on runs in: requests sharing a prefix together.
CACHING_ORDER = "prefix"
#: What ends the name of an option with caching on.
CACHING_SUFFIX = " +PC"


def shareable_tokens(prompts: Sequence[Sequence[int]], block: int = NEURON_BLOCK_SIZE
                     ) -> list[int]:
    """Per prompt, the tokens of its leading whole `block`-token blocks that some other prompt
    starts with too (never the last token: vLLM computes at least one), by a chain of block
    hashes: linear in the tokens."""
    chains = block_chains(prompts, block)
    counts: Counter[int] = Counter()
    for chain in chains:
        counts.update(chain)
    out = []
    for ids, chain in zip(prompts, chains):
        shared = 0
        while shared < len(chain) and counts[chain[shared]] > 1:
            shared += 1
        out.append(min(shared * block, max(len(ids) - 1, 0)))
    return out


def caching_options(spec: PlanSpec, singles: Sequence[Option], prompt_lens: Sequence[int],
                    output_lens: Sequence[int], shared: Sequence[int]) -> list[Option]:
    """Each single option (not skipped, not split) again with prefix caching on in prefix
    order: under nxdi NxDI's default grid (prefill and prefix buckets from 512) and
    token-generation buckets from 256 (runtimes/prefix_grid.py), compile time for those graphs, and
    bounds over the prompts less what they share (`shared`, from `shareable_tokens`, in the
    workload's order)."""
    reduced = [max(p - s, 1) for p, s in zip(prompt_lens, shared)]
    stats: dict[tuple[Any, ...], ShareStats] = {}
    out = []
    for single in singles:
        if (single.skip_reason or single.split or single.prefix_caching
                or not single.runtime.prefix_caching):    # (its platform turns it off)
            continue
        placement, mml, size = single.placement, single.max_model_len, single.share_size
        budget = (spec.max_num_batched_tokens if placement.runtime.chunked_prefill else mml)
        key = (size, budget, mml)
        if key not in stats:
            full, less = (ShareStats.of(lens[:size], output_lens[:size],
                                        max_num_batched_tokens=budget, max_model_len=mml,
                                        block_size=NEURON_BLOCK_SIZE)
                          for lens in (prompt_lens, reduced))
            # only the prefills shrink: decode attends whole prompts, cached or not
            stats[key] = replace(full, chunks=less.chunks)
        grid = placement.runtime.prefix_grid
        # nxdi: NxDI's own grid buckets (from 512), not the set fitted to whole prompts: with
        # one bucket as long as the prompts, the new tokens' cell has room for every cached
        # one, which NxDI then computes again (prefix_grid.grid_cell), and the cache saves
        # nothing
        prefill = (tuple(default_prefill_buckets(mml)) if grid else single.prefill_buckets)
        bound = replica_bound(placement.model, stats[key], prefill_buckets=prefill,
                              max_num_seqs=single.max_num_seqs,
                              num_blocks=placement.pool_blocks(single.max_num_seqs),
                              block_size=NEURON_BLOCK_SIZE, max_model_len=mml,
                              kv_reserve=spec.kv_reserve)
        attention = (tuple(default_tkg_buckets(mml)) if grid else single.attention_buckets)
        compile_s = single.compile_s
        if grid and not spec.compiled:
            prefixes = default_prefix_buckets(mml)
            graphs = placement.runtime.num_graphs(len(prefill), 1, len(attention), len(prefixes))
            compile_s = placement.target.compile_estimate(   # (the grid's cells are prefills)
                grid_size(prefill, prefixes), 1, graphs)["estimated_compile_s"]
        out.append(replace(single, name=single.name + CACHING_SUFFIX, prefill_buckets=prefill,
                           attention_buckets=attention,
                           compile_s=compile_s, bound_s=bound.seconds, bound_steps=bound.steps,
                           sim_key=(*single.sim_key, "prefix-caching", CACHING_ORDER),
                           prefix_caching=True, order=CACHING_ORDER, result=None,
                           pruned_by=None))
    return out
