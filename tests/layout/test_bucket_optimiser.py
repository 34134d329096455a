"""Tests for neuron_batch.layout.optimiser: exact optimum against brute force, DP variants
against each other, chunking, evaluation of the defaults and the report shapes."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_batch.bench.suggest import suggest_decode, suggest_prefill
from neuron_batch.layout.optimiser import (
    BucketPlan,
    evaluate,
    optimal_buckets,
    plans_for_each_k,
    prefill_chunk_lengths,
)
from neuron_batch.runtimes.buckets import (
    bucket_for,
    default_decode_buckets,
    default_prefill_buckets,
)

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ----------------------------------------------------------------------------- oracles

def brute_force(counts, max_buckets, maximum, cost=None, extra=()):
    """Best (cost, len, buckets) over every subset of the candidate values, the last = maximum."""
    price = (lambda b: b) if cost is None else cost
    pool = sorted(({s for s, c in counts.items() if c > 0 and s > 0} | set(extra)) - {maximum})
    best = None
    for r in range(0, max_buckets):
        for subset in itertools.combinations(pool, r):
            buckets = list(subset) + [maximum]
            total = sum(c * price(bucket_for(s, buckets)) for s, c in counts.items() if c and s)
            key = (total, len(buckets), tuple(buckets))
            if best is None or key < best:
                best = key
    return best


def assert_valid(plan: BucketPlan, max_buckets: int, maximum: int):
    b = plan.buckets
    assert isinstance(b, tuple) and b
    assert list(b) == sorted(set(b)), b
    assert b[-1] == maximum
    assert len(b) <= max_buckets
    assert all(isinstance(x, int) and x >= 1 for x in b)


@st.composite
def small_cases(draw, with_cost: bool, with_extra: bool = False):
    maximum = draw(st.integers(1, 40))
    sizes = draw(st.lists(st.integers(1, maximum), min_size=0, max_size=8, unique=True))
    counts = {s: draw(st.integers(1, 20)) for s in sizes}
    k = draw(st.integers(1, 4))
    cost = None
    if with_cost:  # integer table, deliberately non-monotone, so comparisons are exact
        table = draw(st.lists(st.integers(0, 60), min_size=maximum + 1, max_size=maximum + 1))
        cost = table.__getitem__
    extra = []
    if with_extra:
        extra = draw(st.lists(st.integers(1, maximum), max_size=3))
    return counts, k, maximum, cost, extra


# ----------------------------------------------------------------------------- exactness

@FAST
@given(small_cases(with_cost=False), st.sampled_from(["auto", "plain", "dc"]))
def test_matches_brute_force_padded_tokens(case, method):
    counts, k, maximum, _, _ = case
    plan = optimal_buckets(counts, k, maximum, method=method)
    assert_valid(plan, k, maximum)
    total, length, buckets = brute_force(counts, k, maximum)
    assert plan.cost == total == plan.padded
    # Tie-breaking too: fewer buckets, then lexicographically smallest.
    assert plan.buckets == buckets and len(plan.buckets) == length


@FAST
@given(small_cases(with_cost=True, with_extra=True), st.sampled_from(["auto", "plain"]))
def test_matches_brute_force_non_monotone_cost(case, method):
    counts, k, maximum, cost, extra = case
    plan = optimal_buckets(counts, k, maximum, cost=cost, candidates=extra, method=method)
    assert_valid(plan, k, maximum)
    total, _, buckets = brute_force(counts, k, maximum, cost, extra)
    assert plan.cost == total
    assert plan.buckets == buckets
    assert plan == evaluate(counts, plan.buckets, cost=cost)


@FAST
@given(small_cases(with_cost=True))
def test_float_cost_matches_brute_force(case):
    counts, k, maximum, table, _ = case
    cost = lambda b: table(b) * 0.37 + 0.1  # noqa: E731
    plan = optimal_buckets(counts, k, maximum, cost=cost)
    assert_valid(plan, k, maximum)
    total, _, _ = brute_force(counts, k, maximum, cost)
    assert plan.cost == pytest.approx(total, rel=1e-9, abs=1e-9)


def test_every_integer_candidate_is_exact_for_any_cost():
    rng = random.Random(7)
    for _ in range(30):
        maximum = rng.randint(1, 30)
        counts = {s: rng.randint(1, 9) for s in rng.sample(range(1, maximum + 1),
                                                            rng.randint(0, min(6, maximum)))}
        table = [rng.randint(0, 50) for _ in range(maximum + 1)]
        k = rng.randint(1, 4)
        everything = range(1, maximum + 1)
        plan = optimal_buckets(counts, k, maximum, cost=table.__getitem__, candidates=everything)
        total, _, buckets = brute_force(counts, k, maximum, table.__getitem__, everything)
        assert (plan.cost, plan.buckets) == (total, buckets)


def test_extra_candidate_helps_only_a_non_monotone_cost():
    table = {10: 50, 12: 1, 100: 100}
    cost = lambda b: table.get(b, 999)  # noqa: E731
    assert optimal_buckets({10: 5}, 2, 100, cost=cost).buckets == (10, 100)
    plan = optimal_buckets({10: 5}, 2, 100, cost=cost, candidates=[12, 3, 100])
    assert plan.buckets == (12, 100) and plan.cost == 5 and plan.padded == 60
    # For padded tokens an extra candidate never beats the observed size below it.
    assert optimal_buckets({10: 5}, 2, 100, candidates=[12, 50]).buckets == (10, 100)


def test_ties_prefer_fewer_then_smaller_buckets():
    flat = lambda b: 1  # noqa: E731  every bucket costs the same: one bucket is enough
    assert optimal_buckets({3: 1, 9: 2}, 4, 20, cost=flat).buckets == (20,)
    # An extra candidate that costs the same as the observed size below it loses the tie.
    table = {5: 2, 6: 2, 7: 2, 20: 50}
    plan = optimal_buckets({5: 1}, 2, 20, cost=table.__getitem__, candidates=[7, 6])
    assert plan.buckets == (5, 20) and plan.cost == 2
    # Two equally good lists of the same length: the lexicographically smaller one wins.
    # Sizes {1, 3}: (1, 4) costs 0 + 10 and (3, 4) costs 5 + 5; (4,) alone costs 20.
    for method in ("plain", "auto"):
        plan = optimal_buckets({1: 1, 3: 1}, 2, 4, cost=[0, 0, 7, 5, 10].__getitem__,
                               method=method)
        assert plan.buckets == (1, 4) and plan.cost == 10


@pytest.mark.parametrize("seed", range(6))
def test_divide_and_conquer_matches_plain_dp(seed):
    rng = random.Random(seed)
    maximum = rng.choice([512, 3000, 8192])
    n = rng.randint(50, 250)
    counts = {s: rng.randint(1, 400) for s in rng.sample(range(1, maximum + 1), n)}
    k = rng.randint(1, 8)
    for cost in (None, lambda b: 3 * b + (b // 128) * 50 + 7):  # both non-decreasing integers
        dc = plans_for_each_k(counts, k, maximum, cost=cost, method="dc")
        plain = plans_for_each_k(counts, k, maximum, cost=cost, method="plain")
        assert dc == plain
    # A monotone float cost: equal up to rounding.
    fcost = lambda b: 0.25 + b * 1e-3 + (b > 1024) * 0.5  # noqa: E731
    dc = plans_for_each_k(counts, k, maximum, cost=fcost, method="dc")
    plain = plans_for_each_k(counts, k, maximum, cost=fcost, method="plain")
    assert [p.cost for p in dc] == pytest.approx([p.cost for p in plain], rel=1e-12)


@FAST
@given(small_cases(with_cost=True), st.booleans())
def test_plans_for_each_k_non_increasing(case, use_cost):
    counts, k, maximum, cost, _ = case
    cost = cost if use_cost else None
    plans = plans_for_each_k(counts, k + 2, maximum, cost=cost)
    assert len(plans) == k + 2
    for i, plan in enumerate(plans, 1):
        assert_valid(plan, i, maximum)
        assert plan == optimal_buckets(counts, i, maximum, cost=cost)
    assert all(a.cost >= b.cost for a, b in zip(plans, plans[1:]))


def test_dc_refuses_a_non_monotone_cost():
    with pytest.raises(ValueError, match="non-decreasing"):
        optimal_buckets({1: 1, 2: 1}, 2, 3, cost=[0, 5, 1, 9].__getitem__, method="dc")


# ----------------------------------------------------------------------------- edges, errors

def test_empty_counts_give_just_the_maximum():
    for cost in (None, lambda b: 2.5 * b):
        plan = optimal_buckets({}, 4, 512, cost=cost)
        assert plan.buckets == (512,) and plan.actual == plan.padded == 0 and plan.cost == 0
        assert plan.waste_fraction == 0.0
    assert optimal_buckets({0: 7, 5: 0}, 3, 64).buckets == (64,)  # empty steps are ignored


def test_input_errors():
    with pytest.raises(ValueError, match="513"):
        optimal_buckets({513: 1}, 2, 512)
    with pytest.raises(ValueError, match="max_buckets"):
        optimal_buckets({1: 1}, 0, 512)
    with pytest.raises(ValueError, match="negative"):
        optimal_buckets({-1: 1}, 2, 512)
    with pytest.raises(ValueError, match="negative"):
        optimal_buckets({1: -1}, 2, 512)
    with pytest.raises(ValueError, match="candidate"):
        optimal_buckets({1: 1}, 2, 512, candidates=[600])
    with pytest.raises(ValueError, match="finite"):
        optimal_buckets({1: 1}, 2, 512, cost=lambda b: float("nan"))
    with pytest.raises(ValueError, match="method"):
        optimal_buckets({1: 1}, 2, 512, method="fast")
    with pytest.raises(ValueError):
        evaluate({10: 1}, [8])  # a size above the largest bucket
    with pytest.raises(ValueError):
        evaluate({10: 1}, [64, 32])  # not ascending


def test_evaluate_defaults_by_hand():
    counts = {100: 2, 129: 1, 300: 3}
    buckets = default_prefill_buckets(512, 1024)
    assert buckets == [128, 256, 512]
    plan = evaluate(counts, buckets)
    # 2 x 128 + 1 x 256 + 3 x 512 = 2048 padded; 200 + 129 + 900 = 1229 real
    assert (plan.actual, plan.padded, plan.cost) == (1229, 2048, 2048)
    assert plan.waste_fraction == pytest.approx(819 / 2048)
    timed = evaluate(counts, buckets, cost=lambda b: b / 128)
    assert timed.cost == pytest.approx(2 * 1 + 1 * 2 + 3 * 4)
    # The optimiser with the same budget does at least as well as the defaults.
    assert optimal_buckets(counts, 3, 512).padded <= plan.padded
    assert optimal_buckets(counts, 4, 512).padded == 1229  # every size its own bucket


def test_prefill_chunk_lengths():
    assert prefill_chunk_lengths([32000], 8192, 32768) == {8192: 3, 7424: 1}
    assert prefill_chunk_lengths([8192, 8193, 5, 5], 8192, 16384) == {8192: 2, 1: 1, 5: 2}
    assert prefill_chunk_lengths([], 8192, 16384) == {}
    with pytest.raises(ValueError, match="40000"):
        prefill_chunk_lengths([100, 40000], 8192, 32768)
    with pytest.raises(ValueError, match="0"):
        prefill_chunk_lengths([0], 8192, 32768)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        prefill_chunk_lengths([10], 0, 32768)


@FAST
@given(st.lists(st.integers(1, 5000), max_size=30), st.integers(1, 1500))
def test_chunks_add_up(lengths, step):
    chunks = prefill_chunk_lengths(lengths, step, 5000)
    assert sum(size * count for size, count in chunks.items()) == sum(lengths)
    assert sum(chunks.values()) == sum(-(-n // step) for n in lengths)
    assert all(1 <= size <= step for size in chunks)


# ----------------------------------------------------------------------------- reports

def test_suggest_prefill_shape():
    lengths = [32000, 100, 200, 200, 3000, 7000]
    out = suggest_prefill(lengths, max_buckets=3, max_num_batched_tokens=8192, max_model_len=32768)
    keys = {"buckets", "actual_tokens", "padded_tokens", "waste_fraction", "default",
            "num_chunks", "max_buckets"}
    assert keys <= set(out)
    assert out["num_chunks"] == 4 + 5 and out["max_buckets"] == 3
    assert out["buckets"][-1] == 8192 and len(out["buckets"]) <= 3
    assert out["actual_tokens"] == sum(lengths) == out["default"]["actual_tokens"]
    assert out["default"]["buckets"] == default_prefill_buckets(8192, 32768)
    assert {"buckets", "actual_tokens", "padded_tokens", "waste_fraction"} <= set(out["default"])
    assert out["padded_tokens"] >= out["actual_tokens"]
    assert 0.0 <= out["waste_fraction"] < 1.0


def test_suggest_decode_shape():
    counts = {1: 10, 3: 5, 7: 2, 30: 40, 32: 3}
    out = suggest_decode(counts, max_buckets=2, max_num_seqs=32)
    # [3, 32] pads (10 + 5) x 3 + (2 + 40 + 3) x 32 = 1485; [30, 32] would pad 57 x 30 + 96 = 1806
    assert out["buckets"] == [3, 32]
    assert out["actual_seqs"] == out["actual_tokens"] == 10 + 15 + 14 + 1200 + 96
    assert out["padded_seqs"] == out["padded_tokens"] == 1485
    assert out["default"]["buckets"] == default_decode_buckets(32)
    for key in ("actual_seqs", "padded_seqs", "actual_tokens", "padded_tokens", "waste_fraction"):
        assert key in out and key in out["default"]
    assert out["default"]["padded_seqs"] == 10 * 1 + 5 * 4 + 2 * 8 + 43 * 32
    assert out["num_steps"] == 60 and out["max_buckets"] == 2


def test_large_histogram_gives_plans_for_every_k():
    # (Its speed is measured by scripts/bench_optimiser.py, not asserted here.)
    rng = random.Random(1)
    counts = {s: rng.randint(1, 50) for s in rng.sample(range(1, 8193), 4000)}
    plans = plans_for_each_k(counts, 8, 8192)
    assert plans[-1].padded <= plans[0].padded
