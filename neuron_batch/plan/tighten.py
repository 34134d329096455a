"""An option's decode bound tightened on demand, by the order its replica submits its share.

The bounds every option gets up front (grid.py, splits.py) need only sums over the share, so
the whole grid, splits included, is bounded in seconds. `plan` then simulates every option
whose bound beats the best found, and with compile in minutes those sums leave many: they
count decode steps as if every slot stayed full, and under nxdi KV as the requests hold it,
where each step attends the longest request's bucket. `Tightener` replaces an option's decode
bound with `ordered_decode_bound` (layout/bounds.py: the share's first-come-first-served
schedule; under a static KV cache its time step by step, what the simulated device charges)
when the search reaches the option and before it would simulate it (search.py), so only the
options the cheap bound could not prune pay for it (O(n log n) a part, memoised by
hardware, share, cut and slots). The bound only rises: it stays a lower bound. Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence

from neuron_batch.device.target import NEURON_BLOCK_SIZE
from neuron_batch.layout.bounds import (
    ShareStats,
    jensen_decode_seconds,
    ordered_decode_bound,
    prefill_seconds,
)
from neuron_batch.layout.split import fitted_buckets
from neuron_batch.plan.options import DecodePart, Option, PlanSpec


class Tightener:
    """Call it with an option: True when its bound rose (the search puts it back in line)."""

    def __init__(self, spec: PlanSpec, prompt_lens: Sequence[int], output_lens: Sequence[int]):
        self.spec = spec
        self.prompt_lens = list(prompt_lens)       # the workload in its (shuffled) order
        self.output_lens = list(output_lens)
        self._memo: dict[tuple, tuple[int, float]] = {}

    def __call__(self, option: Option) -> bool:
        if option.tightened or not option.decode_parts:
            return False
        option.tightened = True
        rise_s, rise_steps = 0.0, 0
        for part in option.decode_parts:
            steps, seconds, prefill_rise = self._ordered(option, part)
            steps = max(steps, part.decode_steps)
            decode_s = max(part.decode_s, seconds, jensen_decode_seconds(
                option.placement.model, part.context_sum, steps=steps,
                max_num_seqs=part.max_num_seqs))
            rise_s += decode_s - part.decode_s + prefill_rise
            rise_steps += steps - part.decode_steps
        option.bound_s += rise_s
        option.bound_steps += rise_steps
        return rise_s > 0

    def _ordered(self, option: Option, part: DecodePart) -> tuple[int, float, float]:
        """(decode steps, decode seconds, prefill seconds above the first bound's) of a part.
        A split's short layout gets the buckets `run --split-at` fits to its requests
        (layout/split.py fitted_buckets), so its prefill and decode are bounded at them."""
        placement, size = option.placement, option.share_size
        key = (placement.hardware_key(), size, part.cut, part.short, part.max_num_seqs,
               part.attention_buckets)
        if key not in self._memo:
            prompts, outputs = self.prompt_lens[:size], self.output_lens[:size]
            if part.cut is not None:        # the split's part: its requests, in share order
                picked = [i for i in range(size)
                          if (prompts[i] + outputs[i] <= part.cut) == part.short]
                prompts, outputs = [prompts[i] for i in picked], [outputs[i] for i in picked]
            buckets, prefill_rise = part.attention_buckets, 0.0
            if part.cut is not None and part.short and prompts:
                prefill_b, _, fitted = fitted_buckets(
                    placement.runtime, prompts, [p + o for p, o in zip(prompts, outputs)],
                    part.cut)
                if fitted is not None:
                    mml = placement.max_model_len
                    stats = ShareStats.of(prompts, outputs, max_num_batched_tokens=mml,
                                          max_model_len=mml, block_size=NEURON_BLOCK_SIZE)
                    buckets = fitted
                    prefill_rise = max(0.0, prefill_seconds(placement.model, stats, prefill_b)
                                       - prefill_seconds(placement.model, stats, None))
            self._memo[key] = (*ordered_decode_bound(
                placement.model, *self.spec.in_order(prompts, outputs),
                max_num_seqs=part.max_num_seqs, attention_buckets=buckets,
                static_kv=placement.runtime.static_kv), prefill_rise)
        return self._memo[key]

def bound_is_exact(option: Option) -> bool:
    """Whether the option's bound is what its simulation gives: under a static KV cache,
    tightened (prefill exact, decode the schedule the scheduler runs, a split's short layout
    at the buckets the run fits)."""
    return option.tightened and option.runtime.static_kv
