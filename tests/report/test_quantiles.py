"""Latency distributions kept as values arrive (report/quantiles.py): the same figures as the
full sort while the values are held, each percentile within the stated relative error once
they are bucketed, merges that agree with adding everything to one, and memory that stops
growing with the run."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.report.metrics import distribution
from neuron_batch.report.quantiles import PERCENTILES, RELATIVE_ERROR, Quantiles

latencies = st.floats(0.0, 1e4, allow_nan=False, allow_infinity=False)
batches = st.lists(st.lists(latencies, max_size=20), max_size=12)


def fed(parts: list[list[float]], limit: int) -> Quantiles:
    q = Quantiles(limit)
    for part in parts:
        q.add(part)
    return q


@settings(deadline=None)
@given(batches)
def test_held_exactly_they_are_the_full_sorts_figures(parts):
    q = fed(parts, limit=10 ** 6)
    assert q.exact
    assert q.describe() == distribution([v for part in parts for v in part])


@settings(deadline=None)
@given(batches, st.integers(0, 30))
def test_bucketed_each_percentile_is_within_its_relative_error(parts, limit):
    values = [v for part in parts for v in part]
    q = fed(parts, limit)
    exact = distribution(values)
    got = q.describe()
    assert q.exact == (len(values) <= limit)
    if not values:
        assert got == exact
        return
    assert got["mean"] == pytest.approx(exact["mean"], rel=1e-12, abs=1e-300)
    for key, _ in PERCENTILES:
        assert abs(got[key] - exact[key]) <= RELATIVE_ERROR * exact[key] * (1 + 1e-9)


@settings(deadline=None)
@given(batches, batches, st.integers(0, 30), st.integers(0, 30))
def test_merged_is_as_if_added_to_one(first, second, limit_a, limit_b):
    a, b = fed(first, limit_a), fed(second, limit_b)
    a.merge(b)
    values = [v for part in first + second for v in part]
    exact = distribution(values)
    got = a.describe()
    assert a.count == len(values)
    for key, _ in PERCENTILES:
        if values:
            assert abs(got[key] - exact[key]) <= RELATIVE_ERROR * exact[key] * (1 + 1e-9)
    if a.exact:     # (nothing was bucketed on either side: the figures themselves)
        assert got == exact


def test_its_memory_stops_growing_with_the_run():
    rng = np.random.default_rng(3)

    def peak(n: int) -> int:
        tracemalloc.start()
        try:
            q = Quantiles(limit=1_000)
            for _ in range(n // 1_000):
                q.add(rng.uniform(0.5, 2.0, 1_000))
            q.describe()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak(50_000), peak(500_000)
    # the buckets (139 from 0.5 to 2 s, all filled by 50,000 values) and a batch's
    # transients, however many values
    assert large < 1.2 * small
