"""The resume check's comparison of request digests (job/resume_check.py): streamed row by row
while the two lists agree, by id from the first row where they part. Pure: no vLLM."""

from __future__ import annotations

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.job.resume_check import SHOWN, Changes, _compare_requests

WIDTH = 6       # (REQUEST_FIELDS)


def reference(stored: list[list], rows: list[list]) -> tuple:
    """What the comparison must find, by the plainest means: every row held, matched by id."""
    before = {row[0]: row[1:] for row in stored}
    after = {row[0]: row[1:] for row in rows}
    changed = [rid for rid, values in after.items()
               if rid in before and before[rid] != values]
    added = [row[0] for row in rows if row[0] not in before]
    removed = [row[0] for row in stored if row[0] not in after]
    reordered = not (added or removed) and [r[0] for r in stored] != [r[0] for r in rows]
    return changed, added, removed, reordered


def row(rid: str, prompt: str) -> list:
    return [rid, prompt, 16, 0.0, None, None, None]


jobs = st.lists(st.tuples(st.integers(0, 30), st.sampled_from("xyz")), max_size=25,
                unique_by=lambda t: t[0])


@settings(max_examples=300, deadline=None)
@given(jobs, jobs)
def test_streamed_comparison_finds_what_holding_every_row_finds(old, new):
    stored = [row(str(i), p) for i, p in old]
    rows = [row(str(i), p) for i, p in new]
    changes = Changes()
    _compare_requests(changes, iter(stored), iter(rows))
    changed, added, removed, reordered = reference(stored, rows)
    assert changes.num_changed == len(changed)
    assert [rid for rid, _ in changes.changed] == changed[:SHOWN]
    assert all(what == ["prompt"] for _, what in changes.changed)
    assert changes.added == added and changes.removed == removed
    assert changes.reordered == reordered
    assert changes.total == len(stored)
    assert bool(changes) == bool(changed or added or removed or reordered)


def test_an_older_row_without_the_last_columns_reads_as_none_there():
    changes = Changes()
    _compare_requests(changes, iter([["a", "p", 16, 0.0, None]]), iter([row("a", "p")]))
    assert not changes


def test_a_resume_holds_one_row_at_a_time():
    """200,000 matching rows from two generators: the comparison's memory does not grow with
    them (a list of the rows alone would take ~40 MB)."""
    count = 200_000

    def rows():
        return (row(str(i), "%012x" % i) for i in range(count))

    tracemalloc.start()
    try:
        changes = Changes()
        _compare_requests(changes, rows(), rows())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert not changes and changes.total == count
    assert peak < 1_000_000, peak
