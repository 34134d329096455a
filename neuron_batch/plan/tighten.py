"""An option's decode bound tightened on demand, by the order its replica submits its share.

The bounds every option gets up front (grid.py, splits.py) need only sums over the share, so
the whole grid, splits included, is bounded in seconds. `plan` then simulates every option
whose bound beats the best found, and with compile in minutes those sums leave many: they
count decode steps as if every slot stayed full, and under nxdi KV as the requests hold it,
where each step attends the longest request's bucket. `Tightener` replaces an option's decode
bound with `ordered_decode_bound` (layout/bounds.py: the share's first-come-first-served
schedule; under a static KV cache its time step by step, what the simulated device charges)
when the search reaches the option and before it would simulate it (search.py), so only the
options the cheap bound could not prune pay for it (O(n log n) a part). What depends on the
requests alone (a part's requests, its schedule, the buckets a split's short part is fitted)
is computed once for every placement that serves them, its time once per hardware. The bound
only rises: it stays a lower bound. Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence

from neuron_batch.device.target import NEURON_BLOCK_SIZE
from neuron_batch.layout.bounds import (
    FifoSchedule,
    ShareStats,
    jensen_decode_seconds,
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
        # Per placement (hardware_key), share, cut, part and slots: what `_ordered` returns.
        self._memo: dict[tuple, tuple[int, float, float]] = {}
        # What does not depend on the placement, shared by every one that serves the part:
        self._parts: dict[tuple, tuple[list[int], list[int]]] = {}   # (size, cut, short)
        self._fitted: dict[tuple, tuple | None] = {}     # (whole prompts?, size, cut)
        self._stats: dict[tuple, ShareStats] = {}        # (size, cut, max_model_len)
        self._schedules: dict[tuple, FifoSchedule] = {}  # (size, cut, short, slots)

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
            buckets, prefill_rise = part.attention_buckets, 0.0
            if part.cut is not None and part.short:
                fitted = self._fitted_to(placement, size, part.cut)
                if fitted is not None:
                    prefill_b, buckets, stats = fitted
                    model = placement.model
                    prefill_rise = max(0.0, prefill_seconds(model, stats, prefill_b)
                                       - prefill_seconds(model, stats, None))
            schedule = self._schedule(size, part.cut, part.short, part.max_num_seqs)
            self._memo[key] = (*schedule.bound(placement.model, attention_buckets=buckets,
                                               static_kv=placement.runtime.static_kv),
                               prefill_rise)
        return self._memo[key]

    def _part(self, size: int, cut: int | None, short: bool) -> tuple[list[int], list[int]]:
        """The (prompt, output) lengths of a share's part (a split's: the requests on its side
        of the cut), in share order."""
        key = (size, cut, short)
        if key not in self._parts:
            prompts, outputs = self.prompt_lens[:size], self.output_lens[:size]
            if cut is not None:
                picked = [i for i in range(size) if (prompts[i] + outputs[i] <= cut) == short]
                prompts, outputs = [prompts[i] for i in picked], [outputs[i] for i in picked]
            self._parts[key] = prompts, outputs
        return self._parts[key]

    def _fitted_to(self, placement, size: int, cut: int) -> tuple | None:
        """(prefill buckets, attention buckets, ShareStats) of a split's short part at the
        buckets `fitted_buckets` gives it; None where the runtime keeps its defaults. (The
        optimiser's lists depend on the requests, the cut and whether prompts are whole,
        not on the hardware.)"""
        whole = not placement.runtime.chunked_prefill
        if (whole, size, cut) not in self._fitted:
            prompts, outputs = self._part(size, cut, True)
            prefill_b, _, fitted = fitted_buckets(
                placement.runtime, prompts, [p + o for p, o in zip(prompts, outputs)], cut)
            self._fitted[whole, size, cut] = None if fitted is None else (prefill_b, fitted)
        lists, mml = self._fitted[whole, size, cut], placement.max_model_len
        if lists is None:
            return None
        if (size, cut, mml) not in self._stats:
            prompts, outputs = self._part(size, cut, True)
            self._stats[size, cut, mml] = ShareStats.of(
                prompts, outputs, max_num_batched_tokens=mml, max_model_len=mml,
                block_size=NEURON_BLOCK_SIZE)
        return (*lists, self._stats[size, cut, mml])

    def _schedule(self, size: int, cut: int | None, short: bool, slots: int) -> FifoSchedule:
        """The part's FIFO schedule in the order its replica submits it."""
        key = (size, cut, short, slots)
        if key not in self._schedules:
            self._schedules[key] = FifoSchedule(*self.spec.in_order(*self._part(size, cut, short)),
                                                slots)
        return self._schedules[key]


def bound_is_exact(option: Option) -> bool:
    """Whether the option's bound is what its simulation gives: under a static KV cache,
    tightened (prefill exact, decode the schedule the scheduler runs, a split's short layout
    at the buckets the run fits)."""
    return option.tightened and option.runtime.static_kv
