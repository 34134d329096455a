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
from typing import Any

from neuron_batch.choices import Order
from neuron_batch.device.target import NEURON_BLOCK_SIZE
from neuron_batch.layout.bounds import (
    FifoSchedule,
    ShareStats,
    jensen_decode_seconds,
    prefill_seconds,
)
from neuron_batch.layout.split import fitted_buckets
from neuron_batch.plan.candidates import DecodePart, InstanceFit, Option, PlanSpec

#: The submission orders a share is replayed in (PlanSpec.in_order): prefix order groups the
#: requests by their tokens, which the bounds do not see, and the schedule of another order is
#: no bound on its run (an option with caching on, or --order prefix, keeps its first bound).
REPLAYED = (Order.INPUT, Order.LENGTH)


class Tightener:
    """Call it with an option: True when its bound rose (the search puts it back in line).
    Ask again until it says False for the whole tightening: an option with a split's short
    part rises in two steps, first with that part at its unpadded sizes (what the first bound
    had), then at the buckets fitted to it, so the fit, the costly part, is only solved for
    the options the first step leaves unpruned."""

    def __init__(self, spec: PlanSpec, prompt_lens: Sequence[int], output_lens: Sequence[int]):
        self.spec = spec
        self.prompt_lens = list(prompt_lens)       # the workload in its (shuffled) order
        self.output_lens = list(output_lens)
        # Per placement (hardware_key), share, cut, part, slots and fit: what `_ordered` gives.
        self._memo: dict[tuple[Any, ...], tuple[int, float, float]] = {}
        # What does not depend on the placement, shared by every one that serves the part:
        self._parts: dict[tuple[Any, ...], tuple[list[int], list[int]]] = {}  # (size, cut, short)
        self._fitted: dict[tuple[Any, ...], tuple[Any, ...] | None] = {}  # (whole?, size, cut)
        self._stats: dict[tuple[Any, ...], ShareStats] = {}        # (size, cut)
        self._schedules: dict[tuple[Any, ...], FifoSchedule] = {}  # (size, cut, short, slots)
        # id(option) -> (option, its first bound's seconds and steps, the first step's rise)
        # for the options between the two steps
        self._halfway: dict[int, tuple[Option, float, int, float]] = {}

    def __call__(self, option: Option) -> bool:
        if option.tightened or not option.decode_parts:
            return False
        if Order.lookup(option.order or self.spec.order) not in REPLAYED:
            return False    # its schedule is not the one replayed here: its first bound stands
        if id(option) in self._halfway:
            _, bound_s, bound_steps, first_rise = self._halfway.pop(id(option))
        else:
            bound_s, bound_steps, first_rise = option.bound_s, option.bound_steps, 0.0
            if any(part.cut is not None and part.short for part in option.decode_parts):
                rise_s, rise_steps = self._rise(option, fit=False)
                if rise_s > 0:
                    option.bound_s, option.bound_steps = bound_s + rise_s, bound_steps + rise_steps
                    self._halfway[id(option)] = (option, bound_s, bound_steps, rise_s)
                    return True
        option.tightened = True
        rise_s, rise_steps = self._rise(option, fit=True)
        # (from the first bound, as one step would: the same figure whatever the steps)
        option.bound_s, option.bound_steps = bound_s + rise_s, bound_steps + rise_steps
        return rise_s > first_rise

    def _rise(self, option: Option, *, fit: bool) -> tuple[float, int]:
        """How much the option's bound (seconds, steps) rises over its first bound; `fit`
        False: a split's short part at its unpadded sizes."""
        rise_s, rise_steps = 0.0, 0
        for part in option.decode_parts:
            steps, seconds, prefill_rise = self._ordered(option, part, fit)
            steps = max(steps, part.decode_steps)
            decode_s = max(part.decode_s, seconds, jensen_decode_seconds(
                option.placement.model, part.context_sum, steps=steps,
                max_num_seqs=part.max_num_seqs))
            rise_s += decode_s - part.decode_s + prefill_rise
            rise_steps += steps - part.decode_steps
        return rise_s, rise_steps

    def _ordered(self, option: Option, part: DecodePart, fit: bool
                 ) -> tuple[int, float, float]:
        """(decode steps, decode seconds, prefill seconds above the first bound's) of a part.
        A split's short layout gets the buckets `run --split-at` fits to its requests
        (layout/split.py fitted_buckets), so its prefill and decode are bounded at them
        (`fit` False: unpadded, a lower bound for any buckets)."""
        placement, size = option.placement, option.share_size
        fit = fit and part.cut is not None and part.short
        key = (placement.hardware_key(), size, part.cut, part.short, part.max_num_seqs,
               part.attention_buckets, fit)
        if key not in self._memo:
            buckets, prefill_rise = part.attention_buckets, 0.0
            fitted = (self._fitted_to(placement, size, part.cut)
                      if fit and part.cut is not None else None)
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

    def _fitted_to(self, placement: InstanceFit, size: int, cut: int) -> tuple[Any, ...] | None:
        """(prefill buckets, attention buckets, ShareStats) of a split's short part at the
        buckets `fitted_buckets` gives it; None where the runtime keeps its defaults. (The
        optimiser's lists depend on the requests, the cut and whether prompts are whole,
        not on the hardware; every prompt of the part is whole in its layout of `cut`.)"""
        whole = not placement.runtime.chunked_prefill
        if (whole, size, cut) not in self._fitted:
            prompts, outputs = self._part(size, cut, True)
            prefill_b, _, fitted = fitted_buckets(
                placement.runtime, prompts, [p + o for p, o in zip(prompts, outputs)], cut)
            self._fitted[whole, size, cut] = None if fitted is None else (prefill_b, fitted)
        lists = self._fitted[whole, size, cut]
        if lists is None:
            return None
        if (size, cut) not in self._stats:
            self._stats[size, cut] = ShareStats.of(
                *self._part(size, cut, True), max_num_batched_tokens=cut, max_model_len=cut,
                block_size=NEURON_BLOCK_SIZE)
        return (*lists, self._stats[size, cut])

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
