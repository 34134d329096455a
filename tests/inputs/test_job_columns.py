"""A job's columns (inputs/job_columns.py): each gives back exactly what was put in, whatever
the shape of the values, in less than a plain array where the values say it already."""

from __future__ import annotations

from array import array

from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.inputs.job_columns import JobColumns, Steps


@given(st.integers(0, 1), st.lists(st.tuples(st.integers(0, 2**40), st.integers(1, 300)),
                                   max_size=40))
def test_steps_give_back_every_value_appended(step, runs):
    """Runs of line numbers (step 1) or input numbers (step 0), of any lengths, a value past
    2**31 among them: every value read back is the one appended, runs or dense."""
    values = [first + step * k for first, length in runs for k in range(length)]
    steps = Steps(step)
    for value in values:
        steps.append(value)
    assert len(steps) == len(values)
    assert list(steps) == values
    assert steps[-1:] == values[-1:]


def test_steps_keep_runs_and_turn_dense_only_where_runs_come_often():
    lines = Steps(1)
    for line in range(2, 100_002):          # a CSV's lines after its header
        lines.append(line)
    assert lines.runs == 1 and lines[99_999] == 100_001
    blanks = Steps(1)
    for line in range(1, 4000, 2):          # a blank line after every line
        blanks.append(line)
    assert blanks.runs == 0 and list(blanks) == list(range(1, 4000, 2))


def test_ids_are_stored_only_where_a_line_gives_one_not_its_default():
    """A trace without ids stores none (each is its reading order); the first id a line gives
    starts the id column, and every id reads back as it was, defaults included."""
    columns = JobColumns([])
    for position in range(5):
        columns.add(0, position * 10, position + 2, position, None, position)
    assert columns._id_ends is None
    columns.add(0, 50, 7, 5, "given", 5)
    columns.add(0, 60, 9, 6, None, 7)       # (a bad line before it: reading order 7)
    assert [columns.id_of(p) for p in range(7)] == ["0", "1", "2", "3", "4", "given", "7"]
    assert list(columns.line) == [2, 3, 4, 5, 6, 7, 9]


def test_the_columns_hold_offsets_past_4_gib_and_lengths_past_2_bytes():
    """Offsets and id ends take 4 bytes a request while they fit and 8 past that (a 10M-line
    input is tens of GB): a line at 5 GiB is found again where it is; lengths take 2 bytes
    until one needs 4."""
    from neuron_batch.inputs.prepare import PreparedRequest
    from neuron_batch.inputs.prompt_records import PromptRecord

    columns = JobColumns([])
    columns.add(0, 100, 2, 0xABCD, "first", 0)
    columns.add(0, 5 << 30, 3, 0xABCE, "second", 1)
    assert list(columns.where) == [100, 5 << 30] and columns.where.itemsize == 8
    assert [columns.id_of(0), columns.id_of(1)] == ["first", "second"]
    assert columns._id_ends.itemsize == 4       # (ids of 11 bytes: still narrow)
    assert columns.prompt_len.itemsize == columns.max_tokens.itemsize == 2
    columns.prepared(1, PreparedRequest(PromptRecord(1, "second", "s", prompt_len=70_000),
                                        None, 131_000))
    assert list(columns.prompt_len) == [0, 70_000] and list(columns.max_tokens) == [0, 131_000]


def test_a_job_run_as_read_is_numbered_by_ranges_and_any_other_order_by_arrays():
    columns = JobColumns([])
    for position in range(6):
        columns.add(0, position, position + 1, 0, None, position)
    every = bytearray([1] * 6)
    assert columns.number(None, every) == range(6) and columns.index == range(6)
    some = bytearray([1, 1, 0, 1, 1, 1])
    assert list(columns.number(None, some)) == [0, 1, 3, 4, 5]
    positions = columns.number([4, 2, 0], some)     # (--shuffle --limit 3)
    assert list(positions) == [4, 0] and isinstance(positions, array)
    assert list(columns.index) == [2, -1, 1, -1, 0, -1] and columns.indexed == 3


@given(st.integers(0, 1), st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 30)),
                                   min_size=1, max_size=30), st.data())
def test_steps_take_what_one_at_a_time_gives(step, runs, data):
    """A window of consecutive positions, taken run by run, or any positions: the values one
    at a time give."""
    steps = Steps(step)
    for first, length in runs:
        for k in range(length):
            steps.append(first + step * k)
    start = data.draw(st.integers(0, len(steps) - 1))
    stop = data.draw(st.integers(start, len(steps)))
    assert steps.take(range(start, stop)) == [steps[p] for p in range(start, stop)]
    picked = data.draw(st.lists(st.integers(0, len(steps) - 1), max_size=10))
    assert steps.take(picked) == [steps[p] for p in picked]


def test_ids_by_index_hold_no_slot_a_request_for_a_job_run_as_read():
    from neuron_batch.inputs.job_requests import JobRequests

    columns = JobColumns([])
    for position in range(6):
        columns.add(0, position, position + 1, 0, f"id{position}", position)
    as_read = JobRequests(columns, columns.number(None, bytearray([1] * 6))).ids_by_index()
    assert as_read._at == range(6) and list(as_read) == [f"id{p}" for p in range(6)]
    shuffled = JobRequests(columns, columns.number([5, 0, 3], bytearray([1] * 6))).ids_by_index()
    assert isinstance(shuffled._at, array) and list(shuffled) == ["id5", "id0", "id3"]


@given(st.integers(0, 2), st.lists(st.tuples(st.integers(0, 2**40), st.integers(1, 50)),
                                   max_size=20), st.data())
def test_steps_extended_hold_what_appending_holds(step, runs, data):
    """A block's values added at once (`extend`, a trace's plain rows) leave the runs (or the
    dense array) that appending them one at a time leaves, after any values before."""
    values = [first + step * k for first, length in runs for k in range(length)]
    before = data.draw(st.lists(st.integers(0, 2**33), max_size=70))
    one, block = Steps(step), Steps(step)
    for value in before:
        one.append(value)
        block.append(value)
    for value in values:
        one.append(value)
    block.extend(values)
    assert list(block) == list(one) == before + values
    assert block.runs == one.runs


@given(st.data())
def test_the_requests_done_are_picked_by_their_bits_as_one_at_a_time(data):
    """`pending_of` / `done_of` over a streamed job read the done bits against the job's
    indices at once (`JobRequests.where_done`): the requests `has` picks one at a time, in
    order, whatever the job's order (as read, shuffled, lines left out) and bits past it."""
    from neuron_batch.inputs.job_requests import JobRequests, done_of, pending_of
    from neuron_batch.job.done import DoneRequests

    count = data.draw(st.integers(0, 60))
    columns = JobColumns([])
    for position in range(count):
        columns.add(0, position, position + 1, 0, None, position)
    order = data.draw(st.none() | st.permutations(range(count)).flatmap(
        lambda p: st.integers(0, len(p)).map(lambda n: p[:n])))
    ok = bytearray(data.draw(st.lists(st.sampled_from([0, 1]), min_size=count,
                                      max_size=count)))
    requests = JobRequests(columns, columns.number(order, ok))
    done = DoneRequests()
    for index in data.draw(st.lists(st.integers(0, count + 20), max_size=30)):
        done.add(index, f"r{index}")
    positions = list(requests.positions)
    for want, picked in ((True, done_of(requests, done)), (False, pending_of(requests, done))):
        expected = [p for p in positions if done.has(
            columns.index[p] if columns.index[p] >= 0 else None) == want]
        assert list(picked.positions) == expected


def test_the_input_fingerprint_is_the_ids_each_ended_by_a_nul():
    """Hashed a batch at a time, the same bytes as an id at a time (folders made before keep
    their fingerprint)."""
    import hashlib

    from neuron_batch.job.folder import input_fingerprint

    for ids in ([], ["a"], [str(i) for i in range(140_000)], ["é", "", "x\0y"]):
        digest = hashlib.sha256()
        for item in ids:
            digest.update(item.encode("utf-8") + b"\0")
        assert input_fingerprint(iter(ids)) == digest.hexdigest()[:16]


@given(st.lists(st.one_of(st.none(), st.text(max_size=4)), max_size=40), st.data())
def test_ids_read_a_batch_at_a_time_are_each_ones_id(given_ids, data):
    """`ids_of` (and a job's ids iterated: `_Ids`) give what `id_of` gives, position by
    position, with every id its default or some given."""
    from neuron_batch.inputs.job_requests import JobRequests

    columns = JobColumns([])
    for position, record_id in enumerate(given_ids):
        columns.add(0, position, position + 1, 0, record_id, 3 * position)
    positions = data.draw(st.lists(st.integers(0, max(0, len(given_ids) - 1)), max_size=30)
                          if given_ids else st.just([]))
    assert columns.ids_of(positions) == [columns.id_of(p) for p in positions]
    assert columns.ids_of(range(len(given_ids))) == [columns.id_of(p)
                                                      for p in range(len(given_ids))]
    requests = JobRequests(columns, array("i", positions))
    assert list(requests.ids()) == [columns.id_of(p) for p in positions]


@given(st.lists(st.tuples(st.integers(1, 2**20), st.integers(1, 70_000)), max_size=30),
       st.data())
def test_lengths_taken_at_once_are_each_ones(lengths, data):
    """A column's values at positions (`taken`: a range, or any positions), in 2 bytes a value
    or widened past 65,535, are what indexing gives one at a time."""
    columns = JobColumns([])
    for position, (prompt, most) in enumerate(lengths):
        columns.add(0, position, position + 1, 0, None, position)
        columns.prompt_len = _stored_widened(columns.prompt_len, position, prompt)
        columns.max_tokens = _stored_widened(columns.max_tokens, position, most)
    positions = data.draw(st.lists(st.integers(0, max(0, len(lengths) - 1)), max_size=30)
                          if lengths else st.just([]))
    for chosen in (positions, range(len(lengths)), range(len(lengths) // 2, len(lengths))):
        for name in ("prompt_len", "max_tokens"):
            column = getattr(columns, name)
            assert list(columns.taken(name, chosen)) == [column[p] for p in chosen]


def _stored_widened(values: array, position: int, value: int) -> array:
    from neuron_batch.inputs.job_columns import _stored

    return _stored(values, position, value)
