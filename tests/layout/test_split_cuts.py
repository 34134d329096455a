"""The cut points a split is weighed at (layout/split.py `cut_candidates`): pure, milliseconds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.layout.split import cut_candidates

STEP = 128


def static_slots(capacity: int):
    """Slots of n tokens in a cache of `capacity` tokens (falls as n grows, like NxDI's)."""
    return lambda n: max(1, capacity // n)


@given(st.lists(st.integers(1, 9000), min_size=1, max_size=60),
       st.integers(2_000, 200_000), st.integers(1_024, 10_000))
def test_each_slot_count_is_weighed_once_at_its_largest_cut(lengths, capacity, max_model_len):
    slots_at = static_slots(capacity)
    cuts = cut_candidates(lengths, slots_at, max_model_len, STEP)
    shortest, longest = min(lengths), max(lengths)
    eligible = [n for n in range(STEP, max_model_len, STEP) if shortest <= n < longest]
    # every slot count reachable by an eligible cut appears, at its largest cut, once
    expected = {}
    for n in eligible:
        expected[slots_at(n)] = n
    assert {s: c for c, s in cuts} == expected
    assert [c for c, _ in cuts] == sorted(c for c, _ in cuts)
    for cut, slots in cuts:
        assert cut % STEP == 0 and slots == slots_at(cut) and cut < max_model_len
        assert any(n <= cut for n in lengths) and any(n > cut for n in lengths)


def test_no_cut_when_every_request_has_one_length():
    assert cut_candidates([300, 300], static_slots(10_000), 4096) == []


@given(st.lists(st.integers(1, 4096), min_size=1, max_size=80), st.integers(1, 12),
       st.sampled_from([128, 1000, 2176, 4096]))
def test_the_fitted_bucket_count_is_the_optimiser_s(sizes, count, maximum):
    from collections import Counter

    from neuron_batch.layout.optimiser import optimal_buckets
    from neuron_batch.layout.split import fitted_count

    sizes = [min(s, maximum) for s in sizes]
    assert fitted_count(sizes, count, maximum) == len(
        optimal_buckets(Counter(sizes), count, maximum).buckets)
