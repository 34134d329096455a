"""outputs.index: what --resume knows is done without reading every output back, whatever point
a run was killed at (a torn output line, a line without its index entry, a torn entry), and
for a folder written before the index existed."""

import errno
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.job.folder import DONE_INDEX, OUTPUTS, OutputError, RunFolder
from neuron_batch.run.runner import record_killed

IDS = [f"r{i}" for i in range(40)]


def write_run(path, order):
    """A run that finished the requests at `order` (indices into IDS), as a run writes them."""
    folder = RunFolder(path)
    path.mkdir(parents=True, exist_ok=True)
    assert folder.load_done(IDS) == 0
    folder.open_outputs()
    for index in order:
        folder.append_output({"id": IDS[index], "output": "x" * (index % 7)}, index)
    folder.close_outputs()
    return folder


def complete_ids(path):
    data = (path / OUTPUTS).read_bytes()
    return {json.loads(line)["id"] for line in data[:data.rfind(b"\n") + 1].splitlines()}


@settings(max_examples=60, deadline=None)
@given(order=st.permutations(range(40)).map(lambda p: p[:25]),
       cut_outputs=st.integers(0, 400), cut_index=st.integers(0, 400),
       lose_index=st.booleans())
def test_what_is_done_is_every_whole_line_whatever_the_kill_left(tmp_path_factory, order,
                                                                 cut_outputs, cut_index,
                                                                 lose_index):
    path = tmp_path_factory.mktemp("run")
    write_run(path, order)
    outputs, index = path / OUTPUTS, path / DONE_INDEX
    # a kill mid-write: bytes missing off the end of either file, or the index never written
    outputs.write_bytes(outputs.read_bytes()[:max(0, outputs.stat().st_size - cut_outputs)])
    if lose_index:
        index.unlink()
    else:
        index.write_bytes(index.read_bytes()[:max(0, index.stat().st_size - cut_index)])
    expected = complete_ids(path)
    folder = RunFolder(path)
    assert folder.load_done(IDS) == len(expected)
    assert folder.done.ids_in(IDS) == expected
    # the resumed run appends the rest; the next resume reads it all from the index
    folder.open_outputs()
    rest = [i for i in range(40) if IDS[i] not in expected]
    for i in rest:
        folder.append_output({"id": IDS[i]}, i)
    folder.close_outputs()
    again = RunFolder(path)
    assert again.load_done(IDS) == 40 and again.done.ids_in(IDS) == set(IDS)
    lines = [json.loads(line)["id"] for line in outputs.read_text().splitlines()]
    assert sorted(lines) == sorted(IDS)
    assert index.stat().st_size == 40 * 8      # every line has its entry


def test_the_index_is_what_a_resume_reads(tmp_path):
    """With the index whole, outputs.jsonl is not parsed: a line the index names is done even
    where its JSON would not say so."""
    write_run(tmp_path, [3, 1, 2])
    text = (tmp_path / OUTPUTS).read_text().replace('"id": "r1"', '"id": "zz"')
    (tmp_path / OUTPUTS).write_text(text)
    folder = RunFolder(tmp_path)
    assert folder.load_done(IDS) == 3
    assert folder.done.ids_in(IDS) == {"r1", "r2", "r3"}


def test_an_index_that_does_not_fit_its_outputs_is_rebuilt_from_them(tmp_path):
    write_run(tmp_path, [5, 6, 7])
    (tmp_path / OUTPUTS).write_text(json.dumps({"id": "r9"}) + "\n")   # another file now
    folder = RunFolder(tmp_path)
    assert folder.load_done(IDS) == 1 and folder.done.ids_in(IDS) == {"r9"}
    assert (tmp_path / DONE_INDEX).stat().st_size == 8


def test_a_folder_from_before_the_index_resumes_and_gets_one(tmp_path):
    rows = [{"id": IDS[i]} for i in (4, 0, 9)] + [{"custom_id": IDS[11]}]
    (tmp_path / OUTPUTS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    folder = RunFolder(tmp_path)
    assert folder.load_done(IDS) == 4
    assert folder.done.ids_in(IDS) == {"r4", "r0", "r9", "r11"}
    assert (tmp_path / DONE_INDEX).stat().st_size == 4 * 8


def test_a_line_written_without_its_index_gives_the_index_up(tmp_path):
    folder = write_run(tmp_path, [1])
    folder.load_done(IDS)
    folder.open_outputs()
    folder.append_output({"id": "r2"})          # (a writer that cannot name the request)
    folder.close_outputs()
    assert not (tmp_path / DONE_INDEX).exists()
    again = RunFolder(tmp_path)
    assert again.load_done(IDS) == 2 and again.done.ids_in(IDS) == {"r1", "r2"}


def test_lines_left_out_of_the_job_hold_no_index(tmp_path):
    """A request's index is its place in the job; a line --on-error skip left out has none."""
    ids = ["a", None, "c"]
    folder = RunFolder(tmp_path)
    folder.load_done(ids)
    folder.open_outputs()
    folder.append_output({"id": "c"}, 2)
    folder.close_outputs()
    again = RunFolder(tmp_path)
    assert again.load_done(ids) == 1 and again.done.ids_in(ids) == {"c"}


def test_a_killed_attempt_is_recorded_when_the_next_one_starts(tmp_path):
    folder = write_run(tmp_path, [0, 1, 2, 3, 4])
    folder.write_attempts([{"attempt": 1, "ended": "interrupted", "requests_finished": 2}])
    folder.records_path(1).write_text("")
    folder.records_path(2).write_text("")      # attempt 2 was killed -9: records, no line
    folder.load_done(IDS)
    attempts = record_killed(folder, folder.attempts())
    assert attempts[-1] == {"attempt": 2, "ended": "killed", "requests_finished": 3}
    assert folder.attempts() == attempts
    assert record_killed(folder, attempts) == attempts      # once


class _FullDisk:
    """A file that takes `room` more bytes, then fails as a full disk does (part of the last
    write kept)."""

    def __init__(self, handle, room):
        self.handle, self.room = handle, room

    def write(self, data):
        if len(data) > self.room:
            self.handle.write(data[:self.room])
            self.handle.flush()
            self.room = 0
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)


@pytest.mark.parametrize("which", ["outputs", "index"])
@pytest.mark.parametrize("room", [0, 5, 40, 100])
def test_a_full_disk_names_the_folder_and_resume_finishes_once_there_is_room(tmp_path, which,
                                                                            room):
    folder = RunFolder(tmp_path)
    folder.load_done(IDS)
    folder.open_outputs()
    for i in range(3):
        folder.append_output({"id": IDS[i]}, i)
        folder.done.add(i, IDS[i])
    attribute = "_outputs" if which == "outputs" else "_index"
    setattr(folder, attribute, _FullDisk(getattr(folder, attribute), room))
    with pytest.raises(OutputError) as error:
        for i in range(3, 40):
            folder.append_output({"id": IDS[i]}, i)
            folder.done.add(i, IDS[i])
    assert error.value.exit_code == 1 and str(tmp_path) in str(error.value)
    assert "the disk is full" in str(error.value) and "--resume" in str(error.value)
    getattr(folder, attribute).handle.close()
    folder.close_outputs()
    # room again: the resume runs what is not whole in outputs.jsonl, once
    again = RunFolder(tmp_path)
    done = again.load_done(IDS)
    assert again.done.ids_in(IDS) == complete_ids(tmp_path) and done == len(again.done) >= 3
    again.open_outputs()
    for i in range(40):
        if not again.done.has(i):
            again.append_output({"id": IDS[i]}, i)
    again.close_outputs()
    ids = [json.loads(line)["id"] for line in (tmp_path / OUTPUTS).read_text().splitlines()]
    assert sorted(ids) == sorted(IDS)
    last = RunFolder(tmp_path)
    assert last.load_done(IDS) == 40 and (tmp_path / DONE_INDEX).stat().st_size == 40 * 8


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 5000)), st.text(max_size=3)),
                max_size=60))
def test_what_is_done_is_a_bit_a_request_and_ids_only_where_no_index_names_one(adds):
    """job/done.py: a request is done by its index in the job (or, where none names it, by
    its id), counted once however often it is added."""
    from neuron_batch.job.done import DoneRequests

    done = DoneRequests()
    for index, rid in adds:
        done.add(index, rid)
    indices = {index for index, _ in adds if index is not None}
    by_id = {rid for index, rid in adds if index is None}
    assert len(done) == len(indices) + len(by_id)
    assert set(done.indices()) == indices and done.by_id == bool(by_id)
    assert all(done.has(index) for index in indices)
    assert not any(done.has(index) for index in range(0, 5002, 7) if index not in indices)
    assert all(done.has(None, rid) for rid in by_id)


def test_a_million_requests_done_are_a_bitmap_not_a_set_of_strings():
    from neuron_batch.job.done import DoneRequests

    many = DoneRequests()
    for index in range(0, 1_000_000, 97):
        many.add(index, "")
    assert len(many) == len(range(0, 1_000_000, 97)) and len(many._bits) < 200_000


def test_openai_lines_without_an_index_are_found_by_custom_id(tmp_path):
    """A staging folder rebuilt from a bucket, or one from before outputs.index: OpenAI batch
    lines name their request by custom_id only; past the first few, a table of the ids' hashes
    finds them (not a scan each), and the index built says the same on the next resume."""
    order = [39 - i for i in range(30)]
    lines = [json.dumps({"id": f"batch_req_{n}", "custom_id": IDS[i], "response": None})
             for n, i in enumerate(order)]
    (tmp_path / OUTPUTS).write_text("\n".join(lines) + "\n")
    (tmp_path / "outputs.idx").write_bytes(b"\x00" * 24)   # (an older folder's: given up)
    folder = RunFolder(tmp_path)
    assert folder.load_done(IDS) == 30
    assert sorted(folder.done.indices()) == sorted(order)
    assert not (tmp_path / "outputs.idx").exists()
    assert (tmp_path / DONE_INDEX).stat().st_size == 30 * 8
    again = RunFolder(tmp_path)
    assert again.load_done(IDS) == 30
    assert sorted(again.done.indices()) == sorted(order)


def test_a_line_of_no_request_of_the_job_ends_the_index_there(tmp_path):
    (tmp_path / OUTPUTS).write_text(json.dumps({"id": "r1", "index": 1}) + "\n"
                                    + json.dumps({"id": "stranger", "index": 2}) + "\n")
    folder = RunFolder(tmp_path)
    assert folder.load_done(IDS) == 2
    assert folder.done.has(1) and folder.done.has(None, "stranger")
    folder.open_outputs()
    folder.close_outputs()
    assert not (tmp_path / DONE_INDEX).exists()
