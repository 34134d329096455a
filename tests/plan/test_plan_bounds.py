"""The decode bound from a share's submission order (layout/bounds.py `ordered_decode_bound`)
against a step-by-step replay of the same first-come-first-served schedule, and plan's
Tightener that applies it. Pure: no engine (tests/plan/test_plan.py checks the bounds against
simulated runs)."""

from __future__ import annotations

import copy
import zlib
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.device.hardware import get_instance
from neuron_batch.device.target import Target
from neuron_batch.inputs.shared_prefix import prefix_order
from neuron_batch.layout.bounds import (
    FifoSchedule,
    ShareStats,
    fifo_starts,
    ordered_decode_bound,
    prefill_seconds,
)
from neuron_batch.plan.candidates import PlanSpec
from neuron_batch.plan.grid import build_options, placements
from neuron_batch.plan.search import Search, objective_key
from neuron_batch.plan.splits import split_options
from neuron_batch.plan.tighten import Tightener
from neuron_batch.runtimes.buckets import bucket_for, nxdi_default_buckets
from neuron_batch.runtimes.runtime import get_runtime

MODEL = Target.resolve(instance=get_instance("inf2.8xlarge"), arch="llama-3.1-8b", tp=2,
                       runtime=get_runtime("nxdi"), max_model_len=4096).cost_model


def replay(prompts, outputs, slots, buckets):
    """(decode steps, seconds) step by step: admit in order while a slot is free, then one
    decode step of every running request, at the bucket of the longest position + 1 (None:
    that position itself)."""
    waiting = list(zip(prompts, outputs))
    running: list[list[int]] = []          # [position + 1 of the next step, steps left]
    steps, seconds = 0, 0.0
    while waiting or running:
        while waiting and len(running) < slots:
            prompt, output = waiting.pop(0)
            if output > 1:                      # (one token: the prefill gives it)
                running.append([prompt + 1, output - 1])
        if not running:
            continue
        longest = max(position for position, _ in running)
        attended = bucket_for(longest, buckets) if buckets else longest
        seconds += MODEL.decode_time(slots, MODEL.decode_kv_tokens(slots, attended, 0))
        steps += 1
        for request in running:
            request[0] += 1
            request[1] -= 1
        running = [r for r in running if r[1] > 0]
    return steps, seconds


requests = st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 400)), min_size=1,
                    max_size=40)


@settings(max_examples=60, deadline=None)
@given(requests, st.integers(1, 12))
def test_the_static_kv_decode_time_is_the_replayed_schedule(pairs, slots):
    prompts, outputs = [p for p, _ in pairs], [min(o, 4096 - p) or 1 for p, o in pairs]
    buckets = nxdi_default_buckets(4096)
    steps, seconds = ordered_decode_bound(MODEL, prompts, outputs, max_num_seqs=slots,
                                          attention_buckets=buckets, static_kv=True)
    want_steps, want_seconds = replay(prompts, outputs, slots, buckets)
    assert steps == want_steps
    assert seconds == pytest.approx(want_seconds, rel=1e-9)


def replayed_positions(prompts, outputs, slots):
    """The longest position + 1 of each decode step of the replayed schedule."""
    waiting, running, out = list(zip(prompts, outputs)), [], []
    while waiting or running:
        while waiting and len(running) < slots:
            prompt, output = waiting.pop(0)
            if output > 1:
                running.append([prompt + 1, output - 1])
        if running:
            out.append(max(position for position, _ in running))
            running = [[position + 1, left - 1] for position, left in running if left > 1]
    return out


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.integers(1, 30)), min_size=0, max_size=80),
       st.integers(1, 5), st.booleans())
def test_the_stretches_walked_or_kept_are_the_replayed_steps(pairs, slots, kept):
    """Each stretch (first, count) is `count` steps at first, first + 1, ...: laid end to end
    they are the replay's steps, whether walked again for a long job (nothing held per
    request) or kept for a short one."""
    prompts, outputs = [p for p, _ in pairs], [o for _, o in pairs]
    schedule = FifoSchedule(prompts, outputs, slots)
    if not kept:
        schedule.CACHED_UP_TO = -1
    want = replayed_positions(prompts, outputs, slots)
    for _ in range(2):      # (a second use reads what the first kept, or walks again)
        got = [first + i for first, count in schedule.stretches() for i in range(count)]
        assert got == want
    assert schedule.length == len(want)


@settings(max_examples=60, deadline=None)
@given(requests, st.integers(1, 12))
def test_without_buckets_the_decode_time_is_a_lower_bound(pairs, slots):
    """Buckets fitted later (a split's short layout) pad at least to each position."""
    prompts, outputs = [p for p, _ in pairs], [o for _, o in pairs]
    steps, seconds = ordered_decode_bound(MODEL, prompts, outputs, max_num_seqs=slots,
                                          attention_buckets=None, static_kv=True)
    want_steps, want_seconds = replay(prompts, outputs, slots, None)
    assert steps == want_steps and seconds <= want_seconds * (1 + 1e-9)


def test_in_order_admission_starts_each_request_as_early_as_it_can():
    # two slots: the third request waits for the first to finish, the fourth for the second
    assert fifo_starts([5, 2, 4, 1], 2) == [0, 0, 2, 5]
    # a request with no decode step frees its slot at once
    assert fifo_starts([0, 3, 3], 1) == [0, 0, 3]
    steps, seconds = ordered_decode_bound(MODEL, [10] * 4, [6, 3, 5, 2], max_num_seqs=2,
                                          attention_buckets=None, static_kv=False)
    assert (steps, seconds) == (6, 0.0)     # paged KV: the steps only (Jensen applies)


@pytest.mark.parametrize("order", ["input", "length"])
def test_one_tightener_for_every_placement_gives_each_option_its_own_bound(order):
    """What a Tightener keeps across placements (a part's requests, its schedule, the buckets
    fitted to it) depends on the requests alone: tightening every option with one gives the
    bounds a fresh Tightener gives each."""
    spec = PlanSpec(architecture="llama-3.1-8b", instances=("inf2.8xlarge", "inf2.48xlarge",
                                                            "trn1.32xlarge"),
                    max_num_instances=2, seqs_values=(4, 16), max_model_len=4096,
                    max_num_batched_tokens=4096, compiled=True, order=order)
    prompts = [30 + (i * 761) % 2500 for i in range(240)]
    outputs = [1 + (i * 97) % 600 for i in range(240)]
    singles = build_options(spec, placements(spec)[0], prompts, outputs, seed=0)
    options = singles + split_options(spec, singles, prompts, outputs)
    first = [(o.bound_s, o.bound_steps) for o in options]
    alone = [copy.copy(o) for o in options]
    shared = Tightener(spec, prompts, outputs)
    for option in options:
        shared(option)
    for option in alone:
        Tightener(spec, prompts, outputs)(option)
    assert [(o.bound_s, o.bound_steps) for o in options] == \
        [(o.bound_s, o.bound_steps) for o in alone]
    # (and it tightens: the split options' bounds rise to their fitted buckets)
    assert any(o.split and o.bound_s > before[0] for o, before in zip(options, first))


def test_tightening_in_two_steps_simulates_what_one_step_would():
    """A split option's bound rises first with its short part unpadded, then at the buckets
    fitted to it: the search simulates the same options in the same order, to the same
    recommendation, as when each option rose at once (the last step gives the same figure),
    having solved fewer fits."""
    spec = PlanSpec(architecture="llama-3.1-8b", instances=("inf2.8xlarge", "inf2.48xlarge"),
                    max_num_instances=2, seqs_values=(4, 16), max_model_len=4096,
                    max_num_batched_tokens=4096, compiled=True)
    # a few long requests among short ones: splits are worth simulating, some win
    prompts = [3300 if i % 40 == 7 else 60 + (i * 37) % 400 for i in range(240)]
    outputs = [40 + (i * 97) % 200 for i in range(240)]
    singles = build_options(spec, placements(spec)[0], prompts, outputs, seed=0)
    built = singles + split_options(spec, singles, prompts, outputs)
    # a simulation takes at least the whole bound: here 0..30% more, by name
    whole = {}
    for option in map(copy.copy, built):
        tighten = Tightener(spec, prompts, outputs)
        while tighten(option):
            pass
        whole[option.name] = option.bound_s * (1 + zlib.crc32(option.name.encode()) % 31 / 100)
    hours = sorted(o.hours_for(whole[o.name]) for o in built)

    def search(deadline_h, tighten, options):
        found = Search(options, deadline_h, tighten=tighten)
        simulated = []
        while (option := found.next()) is not None:
            simulated.append((option.name, option.bound_s))
            found.done(option, {"replica_s": whole[option.name]})
        return simulated, found.best_option.name, len(found.pruned)

    def at_once(tighten):
        """`tighten` taken to its end at each call."""
        def tighten_all(option):
            rose = False
            while tighten(option):
                rose = True
            return rose
        return tighten_all

    halfway = wins = 0
    for deadline_h in (hours[0] / 2, hours[len(hours) // 3], hours[-1] * 2):
        staged = [copy.copy(o) for o in built]
        got = search(deadline_h, Tightener(spec, prompts, outputs), staged)
        wins += " split" in got[1]
        assert got == search(deadline_h, at_once(Tightener(spec, prompts, outputs)),
                             [copy.copy(o) for o in built])
        assert got[1] == min(built, key=lambda o: (objective_key(
            o.hours_for(whole[o.name]), o.usd_for(whole[o.name]), deadline_h), o.name)).name
        halfway += sum(o.split is not None and not o.tightened and o.bound_s > first.bound_s
                       for o, first in zip(staged, built))
    assert halfway and wins     # some splits pruned without their fit, and one recommended


def test_an_order_the_tightener_cannot_replay_keeps_its_first_bound():
    """Prefix order (an option with caching on, --order prefix) groups requests by their
    tokens, which the bounds do not see. Here it runs the long request beside the first one
    (they share a prefix) and finishes sooner than input order does: the input order's
    schedule would bound it above its run, so its first bound stands."""
    spec = PlanSpec(architecture="llama-3.1-8b", instances=("inf2.8xlarge",),
                    max_num_instances=1, seqs_values=(2,), max_model_len=1024,
                    max_num_batched_tokens=1024, compiled=True, splits=False)
    shared = list(range(64))            # two whole 32-token blocks
    tokens = [shared + [1000] * 36] + [[2000 + i] * 100 for i in range(4)] + [shared + [3000] * 36]
    outputs = [20, 20, 20, 20, 20, 100]
    prompts = [len(t) for t in tokens]
    order = prefix_order(tokens)
    assert order == [0, 5, 1, 2, 3, 4]

    def tightened(spec, prompts, outputs, **changes):
        option = replace(build_options(spec, placements(spec)[0], prompts, outputs,
                                       seed=0)[0], **changes)
        first = option.bound_s
        while Tightener(spec, prompts, outputs)(option):
            pass
        return first, option.bound_s

    # the prefix-order run's own bound: its requests replayed in the order it submits them
    _, prefix_run = tightened(spec, [prompts[i] for i in order], [outputs[i] for i in order])
    first, input_run = tightened(spec, prompts, outputs)
    assert input_run > prefix_run > first
    for option_order, plan_order in (("prefix", "input"), (None, "prefix")):
        kept, bound = tightened(PlanSpec(**{**spec.__dict__, "order": plan_order}), prompts,
                                outputs, order=option_order)
        assert bound == kept == first <= prefix_run


@settings(max_examples=60, deadline=None)
@given(st.lists(requests, min_size=1, max_size=6))
def test_running_sums_are_the_sums_in_the_same_order(groups):
    """A split's parts sum their groups' statistics cut by cut (plan/splits.py): the running
    sums are what `+` gives, their chunks in the same order (a sum over them the same bits)."""
    stats = [ShareStats.of([p for p, _ in g], [o for _, o in g], max_num_batched_tokens=512,
                           max_model_len=4096, block_size=32) for g in groups]
    total = ShareStats.empty()
    for group, running in zip(stats, ShareStats.running_sums(stats)):
        total = total + group
        assert running == total and list(running.chunks.items()) == list(total.chunks.items())
        assert prefill_seconds(MODEL, running, None) == prefill_seconds(MODEL, total, None)
