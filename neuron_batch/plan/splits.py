"""Options that split the job by length (`run --split-at N`, layout/split.py), for `plan`.

Under a static KV cache (nxdi: inf2, trn1) every slot is sized for the longest request, so a
batch job whose lengths it knows can run the requests that fit in N tokens first in a layout
of max_model_len N with as many slots as fit there, then the rest in the single layout. For
every single-layout option (placement, instances, max_num_seqs) this adds one option per
candidate cut (`cut_candidates`: for each slot count the short layout can have, the largest N
that has it, so every trade between slots and requests served is weighed, cuts need not be
powers of two). Each is bounded like a single option, part by part, with the same bounds
(layout/bounds.py), and counts the compile time of both layouts; the search (search.py) then treats
it like any other option, so a split is recommended only when it is cheaper, or meets a
deadline no single layout meets, and pruning never drops the one an unpruned plan would pick.

The short layout is what `run --split-at` builds for the replica's share: slots =
min(static slots at N, MAX_SHORT_SLOTS, its requests), buckets fitted to its requests
(`fitted_buckets`, whose count `fitted_count` gives without solving, for the compile time);
the long layout keeps the option's own. Pure Python (no vLLM).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from neuron_batch.device.target import NEURON_BLOCK_SIZE
from neuron_batch.layout.bounds import ReplicaBound, ShareStats, replica_bound
from neuron_batch.layout.split import CUT_STEP, MAX_SHORT_SLOTS, cut_candidates, fitted_count
from neuron_batch.plan.candidates import DecodePart, InstanceFit, Option, PlanSpec, SplitLayout
from neuron_batch.runtimes.buckets import nxdi_default_buckets


@dataclass(frozen=True)
class _Cut:
    """One candidate cut of a share on one hardware (`InstanceFit.hardware_key`): what does
    not depend on the instance's host or on the single option split."""

    cut: int
    max_num_seqs: int                   # the short layout's slots
    requests: int                       # of the share, in the short layout
    num_prefill: int                    # its fitted lists' lengths (`fitted_count`)
    num_graphs: int
    short_stats: ShareStats
    long_stats: ShareStats
    short: ReplicaBound                 # the short part's bound (the same for every single)


def split_options(spec: PlanSpec, singles: Sequence[Option], prompt_lens: Sequence[int],
                  output_lens: Sequence[int]) -> list[Option]:
    """A split option per single option under a static KV cache and per candidate cut of
    its share (the first `share_size` requests of the workload, as the single's)."""
    if not spec.splits:
        return []
    out: list[Option] = []
    # Singles of the same hardware and share (other instances of the chip, other slots and
    # prefill lists) have the same cuts and short parts: each is bounded once, each long
    # part once per prefill lists and slots, each layout's start-up once per instance (its
    # host compiles).
    cuts: dict[tuple[Any, ...], list[_Cut]] = {}
    layouts: dict[tuple[Any, ...], list[SplitLayout]] = {}
    longs: dict[tuple[Any, ...], ReplicaBound] = {}
    for single in singles:
        placement = single.placement
        # (whole prompts: the short layout's lists are fitted, layout/split.py; an export's
        # split would be two exports, which layout/split.py does not fit: not weighed yet)
        if (not placement.runtime.static_kv or placement.runtime.chunked_prefill
                or placement.runtime.fixed_export or single.skip_reason):
            continue
        key = (placement.hardware_key(), single.share_size)
        if key not in cuts:
            cuts[key] = _cuts(spec, placement, prompt_lens[:single.share_size],
                              output_lens[:single.share_size])
        on_host = (*key, placement.instance)
        if on_host not in layouts:
            layouts[on_host] = [_layout(spec, placement, cut) for cut in cuts[key]]
        for index, (cut, layout) in enumerate(zip(cuts[key], layouts[on_host])):
            long_key = (*key, index, single.prefill_buckets, single.max_num_seqs)
            if long_key not in longs:
                longs[long_key] = replica_bound(
                    placement.model, cut.long_stats, prefill_buckets=single.prefill_buckets,
                    max_num_seqs=single.max_num_seqs,
                    num_blocks=placement.pool_blocks(single.max_num_seqs),
                    block_size=NEURON_BLOCK_SIZE, max_model_len=placement.max_model_len,
                    kv_reserve=spec.kv_reserve)
            out.append(_option(single, layout, cut, longs[long_key]))
    return out


def _cuts(spec: PlanSpec, placement: InstanceFit, prompts: Sequence[int],
          outputs: Sequence[int]) -> list[_Cut]:
    """Each candidate cut of this share, with both parts' statistics and the short part's
    bound. The requests are grouped by the cuts they fall between, each group's statistics
    computed once and summed (every prompt is whole under both layouts' budgets, so a
    group's figures do not depend on the layout it runs in)."""
    lengths = [p + o for p, o in zip(prompts, outputs)]
    mml = placement.max_model_len
    fits = sorted(lengths)

    def slots_at(cut: int) -> int:
        return min(placement.target.static_slots(cut) or 0, MAX_SHORT_SLOTS,
                   max(bisect_right(fits, cut), 1))

    cuts = [(cut, slots) for cut, slots in cut_candidates(lengths, slots_at, mml, CUT_STEP)
            if slots >= 1]
    if not cuts:
        return []
    edges = [cut for cut, _ in cuts]
    groups: list[list[int]] = [[] for _ in range(len(edges) + 1)]
    for i, n in enumerate(lengths):
        groups[bisect_left(edges, n)].append(i)
    stats = [ShareStats.of([prompts[i] for i in g], [outputs[i] for i in g],
                           max_num_batched_tokens=mml, max_model_len=mml,
                           block_size=NEURON_BLOCK_SIZE) for g in groups]
    shorts = ShareStats.running_sums(stats[:-1])
    longs = ShareStats.running_sums(stats[:0:-1])[::-1]
    out = []
    members = 0
    prompt_sizes: set[int] = set()     # the short part's distinct sizes so far (what
    length_sizes: set[int] = set()     # fitted_count counts), grown group by group
    for index, (cut, slots) in enumerate(cuts):
        members += len(groups[index])
        prompt_sizes.update(prompts[i] for i in groups[index])
        length_sizes.update(lengths[i] for i in groups[index])
        per_list = len(nxdi_default_buckets(cut))
        num_prefill = fitted_count(prompt_sizes, per_list, cut)
        graphs = placement.runtime.num_graphs(num_prefill, 1,
                                              fitted_count(length_sizes, per_list, cut))
        bound = replica_bound(placement.model, shorts[index], prefill_buckets=None,
                              max_num_seqs=slots,
                              num_blocks=slots * -(-cut // NEURON_BLOCK_SIZE) + 1,
                              block_size=NEURON_BLOCK_SIZE, max_model_len=cut,
                              kv_reserve=spec.kv_reserve)
        out.append(_Cut(cut, slots, members, num_prefill, graphs, shorts[index], longs[index],
                        bound))
    return out


def _layout(spec: PlanSpec, placement: InstanceFit, cut: _Cut) -> SplitLayout:
    """The short layout of `cut` on this placement's instance, with its start-up there."""
    compile_s = float(placement.target.compile_estimate(
        cut.num_prefill, 1, cut.num_graphs, compiled=spec.compiled)["estimated_compile_s"])
    return SplitLayout(cut.cut, cut.max_num_seqs, cut.requests, cut.num_graphs, compile_s)


def _option(single: Option, layout: SplitLayout, cut: _Cut, long: ReplicaBound) -> Option:
    """`single` with the requests of length <= layout.cut moved to the short layout first
    (`long`: the bound of the rest in the single's layout)."""
    short = cut.short
    parts = (DecodePart(layout.cut, True, layout.max_num_seqs, None, short.decode_s,
                        short.decode_steps, cut.short_stats.context_sum),
             DecodePart(layout.cut, False, single.max_num_seqs, single.attention_buckets,
                        long.decode_s, long.decode_steps, cut.long_stats.context_sum))
    return replace(single, name=f"{single.name} split{layout.cut}xS{layout.max_num_seqs}",
                   compile_s=single.compile_s + layout.compile_s,
                   bound_s=short.seconds + long.seconds, bound_steps=short.steps + long.steps,
                   sim_key=(*single.sim_key, "split", layout.cut), split=layout,
                   result=None, pruned_by=None, decode_parts=parts, tightened=False)
