"""Where the two parts of a `run --split-at N --replicas R` go: in turn or side by side.

In turn, each part runs across all R replicas, one after the other: every instance compiles
both layouts, one after the other, and the long layout's compile waits for the short part to
end. Side by side, K replicas serve the short part while the other R - K serve the long one,
at the same time: an instance compiles only the layouts of its own replicas, so on separate
instances the two compiles overlap. What side by side can lose is balance: with few replicas
one part's pool may finish long before the other's.

`choose` weighs both with an estimate of each part's time on n engines (`seconds_on`, from
the step-time model of the run's Target: BoundEstimate, built from `plan`'s per-replica
bounds) and the compile time of each layout, over every K, and picks the shorter makespan
(compile wall time + run time; the run is billed for every instance throughout, so shorter
is cheaper). Without an
estimate (no step-time model: neither the simulated device nor a Neuron host that knows its
instance) `auto` stays in turn. Pure Python.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from neuron_batch.choices import PlacementMode
from neuron_batch.inputs.job_requests import job_ids, lengths_of

IN_TURN, SIDE_BY_SIDE, AUTO = (PlacementMode.IN_TURN, PlacementMode.SIDE_BY_SIDE,
                               PlacementMode.AUTO)
PLACEMENTS = PlacementMode.values()


@dataclass(frozen=True)
class PartTime:
    """What placing one part needs: its compile time and its run time on n engines."""

    compile_s: float
    seconds_on: Callable[[int], float] | None     # None: no estimate


@dataclass(frozen=True)
class SplitPlacement:
    mode: str                           # IN_TURN or SIDE_BY_SIDE
    short_replicas: int                 # side by side: K; in turn: R (every replica)
    estimated_s: float | None = None    # compile wall + run, as estimated (None: unknown)
    in_turn_s: float | None = None      # the in-turn estimate, for the log and the report
    compile_s: float | None = None      # compile wall time of this placement
    parts_s: tuple[float, float] | None = None   # each part's estimated run time, placed so

    def describe(self, replicas: int) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, "short_replicas": self.short_replicas,
               "long_replicas": replicas - self.short_replicas if self.mode == SIDE_BY_SIDE
               else replicas}
        if (self.estimated_s is not None and self.in_turn_s is not None
                and self.compile_s is not None and self.parts_s is not None):   # (all or none)
            out.update(estimated_s=round(self.estimated_s, 1),
                       estimated_in_turn_s=round(self.in_turn_s, 1),
                       compile_wall_s=round(self.compile_s, 1),
                       estimated_parts_s=[round(x, 1) for x in self.parts_s])
        return out


def compile_wall_s(short_replicas: int, replicas: int, per_instance: int,
                   short_compile_s: float, long_compile_s: float) -> float:
    """Compile wall time side by side: replicas fill one instance before the next (short
    first); an instance compiles the layouts of its replicas one after the other, instances
    at once."""
    per_instance = max(per_instance, 1)
    worst = 0.0
    for first in range(0, replicas, per_instance):
        last = min(first + per_instance, replicas) - 1
        wall = (short_compile_s if first < short_replicas else 0.0) + \
            (long_compile_s if last >= short_replicas else 0.0)
        worst = max(worst, wall)
    return worst


def _seconds(part: PartTime, engines: int) -> float:
    assert part.seconds_on is not None, "placed by the estimate only where both parts have one"
    return part.seconds_on(engines)


def in_turn_s(replicas: int, short: PartTime, long: PartTime) -> float:
    return short.compile_s + long.compile_s + _seconds(short, replicas) + \
        _seconds(long, replicas)


def side_by_side_s(k: int, replicas: int, per_instance: int, short: PartTime,
                   long: PartTime) -> float:
    return compile_wall_s(k, replicas, per_instance, short.compile_s, long.compile_s) + \
        max(_seconds(short, k), _seconds(long, replicas - k))


def choose(mode: str, replicas: int, per_instance: int, short: PartTime | None,
           long: PartTime | None) -> SplitPlacement:
    """The placement for `mode` (PLACEMENTS). short/long None: that part has no requests
    (nothing to place side by side). A part's PartTime with `seconds_on` None: no estimate:
    side by side then splits the replicas by nothing better than half and half, and auto
    stays in turn."""
    if mode not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {mode!r}")
    if mode == IN_TURN or replicas < 2 or short is None or long is None:
        return SplitPlacement(IN_TURN, replicas)
    if short.seconds_on is None or long.seconds_on is None:
        if mode == AUTO:
            return SplitPlacement(IN_TURN, replicas)
        return SplitPlacement(SIDE_BY_SIDE, replicas // 2)
    best = min(range(1, replicas),
               key=lambda k: (side_by_side_s(k, replicas, per_instance, short, long), k))
    side = side_by_side_s(best, replicas, per_instance, short, long)
    turn = in_turn_s(replicas, short, long)
    if mode == AUTO and turn <= side:
        return SplitPlacement(IN_TURN, replicas, turn, turn, short.compile_s + long.compile_s,
                         (_seconds(short, replicas), _seconds(long, replicas)))
    return SplitPlacement(SIDE_BY_SIDE, best, side, turn,
                     compile_wall_s(best, replicas, per_instance, short.compile_s,
                                    long.compile_s),
                     (_seconds(short, best), _seconds(long, replicas - best)))


class BoundEstimate:
    """A part's time from the step-time model, built from `plan`'s per-replica pieces
    (layout/bounds.py) for one engine's share (every n-th request when n engines serve the
    part): its prefills exactly at the part's buckets; its decode steps at least as many as
    its slots allow and as its longest output needs, each costed at the shape the runtime
    compiles (under a static KV cache every slot attends the token-generation bucket of the
    requests' lengths, weighted by their decode steps; else what they hold). An estimate, not
    a bound: it assumes full slots and no tail, so it runs short of the simulated time, alike
    for both parts; the placement needs its ratios."""

    def __init__(self, target, compiled_of: Callable | None = None,
                 compiled: bool | None = None, memo: dict | None = None):
        self.target = target                        # device.target.Target: its objects
        self.model = target.cost_model              # device.cost_model.StepCostModel
        self.per_instance = target.engines_per_instance
        # part -> whether its layout's graphs are compiled already (--compiled, the
        # artifacts folder); None: none is
        self._compiled_of = compiled_of
        self.compiled = compiled            # an assumption for every layout, or None
        self._memo = {} if memo is None else memo     # shared by `assuming` copies

    def compile_of(self, part) -> float | None:
        """The estimated start-up of a part's layout on the target: tracing, compiling what is
        not compiled yet, loading (None where the host cannot compile it). It depends on the
        graphs and the weights, not on the layout's length or slots."""
        compiled = self.compiled
        if compiled is None:
            compiled = bool(self._compiled_of(part)) if self._compiled_of else False
        return self.target.compile_s(part.settings.shapes(self.target.runtime),
                                     compiled=compiled)

    def assuming(self, compiled: bool) -> BoundEstimate:
        """The same estimate with every layout compiled before (True) or fresh (False)."""
        return BoundEstimate(self.target, self._compiled_of, compiled, self._memo)

    def seconds(self, part) -> float:
        """A part's run time (memoised: a cut's parts are weighed under several
        assumptions about compile)."""
        share = part.requests[::max(part.settings.replicas, 1)]
        ids = job_ids(share)
        key = (part.settings, len(share), ids[0] if share else None,
               ids[-1] if share else None)
        if key not in self._memo:
            self._memo[key] = self._seconds(part)
        return self._memo[key]

    def _seconds(self, part) -> float:
        from neuron_batch.device.target import NEURON_BLOCK_SIZE
        from neuron_batch.layout.bounds import (
            ShareStats,
            decode_seconds_bound,
            decode_steps_bound,
            prefill_seconds,
        )
        from neuron_batch.runtimes.buckets import bucket_for

        settings = part.settings
        share = part.requests[::max(settings.replicas, 1)]
        if not share:
            return 0.0
        mml, slots = settings.max_model_len, settings.max_num_seqs
        shapes = settings.shapes()
        chunk = settings.max_num_batched_tokens if shapes.runtime.chunked_prefill else mml
        prompts, outputs = lengths_of(share)      # (a streamed job's: not read again)
        stats = ShareStats.of(prompts, outputs, max_num_batched_tokens=chunk,
                              max_model_len=mml, block_size=NEURON_BLOCK_SIZE)
        steps = max(decode_steps_bound(stats, max_num_seqs=slots,
                                       num_blocks=slots * -(-mml // NEURON_BLOCK_SIZE) + 1,
                                       block_size=NEURON_BLOCK_SIZE, max_model_len=mml,
                                       kv_reserve=settings.kv_reserve),
                    max(outputs) - 1)
        prefill = prefill_seconds(self.model, stats, shapes.prefill_buckets or None)
        if steps <= 0:
            return prefill
        attention = shapes.attention_buckets
        if shapes.runtime.static_kv and attention and stats.decode_tokens:
            weighted = sum((o - 1) * bucket_for(p + o, attention)
                           for p, o in zip(prompts, outputs))
            return prefill + steps * self.model.decode_time(
                slots, slots * weighted / stats.decode_tokens)
        return prefill + decode_seconds_bound(self.model, stats, steps=steps, max_num_seqs=slots)
