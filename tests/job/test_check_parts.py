"""The check before the run split across processes (job/check_parts.py) leaves the workload one
pass leaves: the same columns, problems (lines and reading order), request rows (default ids
and run seeds shifted), facts, prefix bound and requests read again; for every kind of line,
two inputs, blank and bad lines, sampling asked or not. And the pieces the parts are joined
with, shown on their own: runs of steps, columns, a row's numbers, a prefix bound's counts."""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from neuron_batch.inputs.job_columns import JobColumns, Steps
from neuron_batch.inputs.prefix_bound import PrefixBound
from neuron_batch.job import check_parts, part_hand, part_join
from neuron_batch.job.plain_check import DEFAULT_ID, RUN_SEED
from neuron_batch.job.workload import load_workload
from neuron_batch.settings import RunSettings


def _lines(n: int, seed: int, text: bool = True) -> str:
    """`n` lines of every kind; `text` False: none a tokenizer reads (text, messages), so the
    parts' processes load none (seconds each)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 6
        if not text and kind in (0, 4):
            kind = 2
        if kind == 0:
            line = {"prompt": f"request {i} says hello " * (1 + i % 4), "max_tokens": 3,
                    **({"stop": ["x"], "temperature": 0.7} if i % 12 == 0 else {})}
        elif kind == 1:
            line = {"id": f"q{seed}-{i}", "prompt_len": 10 + i % 90}
        elif kind == 2:
            line = {"prompt_token_ids": [5 + i % 50, 7, 9], "max_tokens": 1 + i % 4,
                    "seed": i, "temperature": 0.5}
        elif kind == 3:
            line = {"id": f"q{seed}-{i}", "prompt_len": 20, "prefix_id": f"p{i % 3}",
                    "prefix_len": 8, "temperature": 1.0}
        elif kind == 4:
            line = {"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 2,
                    "top_p": 0.5, "n": 1 + i % 2, "temperature": 0.8}
        else:
            line = {"id": f"é{seed}-{i}, \"quoted\"", "prompt_len": 9000 if i % 30 == 5 else 30}
        out.append(json.dumps(line, ensure_ascii=False))
        if rng.random() < 0.05:
            out.append("")                               # blank: no item
        if rng.random() < 0.03:
            out.append("{not json")                      # bad: an item, not a record
    return "\n".join(out) + "\n"


def _workload(paths, tiny_model, monkeypatch, processes: int, **values):
    monkeypatch.setenv("NEURON_BATCH_CHECK_PROCESSES", str(processes))
    said: list[str] = []
    settings = RunSettings.of(tuple(str(p) for p in paths), model=tiny_model, device="sim",
                              quiet=True, on_error="skip", **{"max_model_len": 2048, **values})
    return load_workload(settings, said.append), said, settings


def _seen(workload):
    requests = workload.prepared.requests
    columns = requests.columns
    n = len(columns)
    return {
        "rows": list(workload.rows_spool) if workload.rows_spool is not None else None,
        "facts": list(workload._facts.values()),
        "problems": [(str(p), p.read_order, p.too_long) for p in workload.problems],
        "columns": [list(columns.src), list(columns.where), list(columns.line),
                    list(columns.read_order), list(columns.digest), list(columns.prompt_len),
                    list(columns.max_tokens), bytes(columns.clamped), bytes(columns.asks),
                    columns.samples, columns.not_own, [columns.id_of(p) for p in range(n)]],
        "requests": [(r.record.id, r.record.index, r.record.source, r.prompt_token_ids,
                      r.max_tokens, r.record.temperature) for r in requests],
        "bound": {block: (b.tokens(), b.exact) for block, b in workload.prefix_bounds.items()},
    }


@pytest.mark.parametrize("values", [{}, {"temperature": 0.3, "seed": 9, "max_tokens": 5},
                                    {"shuffle": True, "seed": 5}])
def test_a_check_in_parts_is_the_check_in_one_process(tiny_model, tmp_path, monkeypatch,
                                                      split_check, values):
    text = "temperature" not in values     # (the run's seed on every request: no text)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(_lines(700, 1, text))
    second.write_text(_lines(300, 2, text))
    split = split_check(90)
    whole, said_whole, _ = _workload([first, second], tiny_model, monkeypatch, 1, **values)
    assert split == [False]
    parts, said_parts, _ = _workload([first, second], tiny_model, monkeypatch, 2, **values)
    assert split == [False, True]
    assert not any("duplicate" in str(p) for p in whole.problems)   # (no second, exact pass)
    seen_whole, seen_parts = _seen(whole), _seen(parts)
    for key in seen_whole:
        assert seen_parts[key] == seen_whole[key], key
    assert said_parts == said_whole
    # (what the comparison covers is there: problems of both kinds, in both inputs)
    assert any("b.jsonl" in p[0] and "malformed" in p[0] for p in seen_whole["problems"])
    assert any(p[2] for p in seen_whole["problems"])     # a prompt too long
    assert len(whole.prepared.requests) > 800
    if values.get("shuffle"):       # (no rows made: a shuffled job's are made in their order)
        assert seen_whole["rows"] is None
        lines = [int(r[2].rsplit(":", 1)[1]) for r in seen_whole["requests"]
                 if "a.jsonl" in r[2]]
        assert lines != sorted(lines)   # (the job's order is not the file's)
    else:
        assert len(seen_whole["rows"]) == len(whole.prepared.requests)


def test_an_openai_batch_file_in_parts(tiny_model, tmp_path, monkeypatch, split_check):
    """Ids given, the model's defaults applied, requests that sample with the run's seed."""
    lines = [json.dumps({"custom_id": f"c-{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "m", "max_tokens": 4,
                                  "messages": [{"role": "user", "content": f"q {i}"}]}})
             for i in range(400)]
    path = tmp_path / "batch.jsonl"
    path.write_text("\n".join(lines) + "\n")
    split = split_check(60)
    whole = _seen(_workload([path], tiny_model, monkeypatch, 1)[0])
    parts = _seen(_workload([path], tiny_model, monkeypatch, 2)[0])
    assert split == [False, True] and parts == whole
    assert [row[0] for row in whole["rows"][:2]] == ["c-0", "c-1"]


def test_duplicate_ids_in_different_parts_are_named(tiny_model, tmp_path, monkeypatch,
                                                    split_check):
    lines = [json.dumps({"id": f"r{i}", "prompt_len": 5}) for i in range(300)]
    lines[250] = json.dumps({"id": "r3", "prompt_len": 5})
    path = tmp_path / "dup.jsonl"
    path.write_text("\n".join(lines) + "\n")
    split = split_check(50)
    workload = _workload([path], tiny_model, monkeypatch, 2)[0]
    assert split == [True]      # (then the exact pass, in one process, names them)
    assert [str(p) for p in workload.problems] == [
        f"{path}:251: field 'id': duplicate id 'r3' (first used at {path}:4); ids must be unique"]


def test_an_input_of_only_blank_lines_is_named(tiny_model, tmp_path, monkeypatch,
                                               split_check):
    from neuron_batch.errors import RunError

    good, blank = tmp_path / "good.jsonl", tmp_path / "blank.jsonl"
    good.write_text("".join(json.dumps({"prompt_len": 5 + i}) + "\n" for i in range(200)))
    blank.write_text("\n \n\n" * 100)
    split_check(50)
    with pytest.raises(RunError, match="blank.jsonl: no prompts found"):
        _workload([good, blank], tiny_model, monkeypatch, 2)


def test_a_process_that_dies_gives_the_job_back_to_one_pass(tiny_model, tmp_path, monkeypatch,
                                                              split_check):
    """A process of the pool killed (here each exits as it starts, as one the kernel kills
    for memory would stop: a real `BrokenProcessPool`) is not the job's failure: one pass
    checks it, and leaves what it leaves without the split."""
    import contextlib
    import os
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    path = tmp_path / "a.jsonl"
    path.write_text(_lines(400, 5, text=False))
    whole = _seen(_workload([path], tiny_model, monkeypatch, 1)[0])

    @contextlib.contextmanager
    def dying(count):
        pool = ProcessPoolExecutor(count, mp_context=get_context("spawn"), initializer=os._exit,
                                   initargs=(9,))
        try:
            yield pool
        finally:
            pool.shutdown(cancel_futures=True)

    monkeypatch.setattr(check_parts, "_pool", dying)
    split = split_check(60)
    assert _seen(_workload([path], tiny_model, monkeypatch, 2)[0]) == whole
    assert split == [False]     # (tried, given back)


def test_a_small_job_is_checked_in_one_process(tiny_model, tmp_path, monkeypatch):
    path = tmp_path / "small.jsonl"
    path.write_text(_lines(50, 4))
    monkeypatch.setenv("NEURON_BATCH_CHECK_PROCESSES", "2")
    settings = RunSettings.of((str(path),), model=tiny_model, device="sim", quiet=True)
    from neuron_batch.inputs.load import InputScan
    from neuron_batch.job.check import model_source

    inputs = InputScan(settings.inputs, exact_ids=False)
    assert check_parts.read_in_parts(settings, model_source(settings, lambda _: None), inputs,
                                     spool=True, block=None) is None


# The pieces, pure


@given(st.integers(0, 1), st.lists(st.lists(st.integers(0, 50), max_size=40), min_size=1,
                                   max_size=5), st.integers(0, 1000))
def test_steps_extended_hold_the_values_shifted(step, parts, shift):
    whole, joined = Steps(step), Steps(step)
    for values in parts:
        part = Steps(step)
        for value in values:
            part.append(value)
            whole.append(value + shift)
        joined.extend_shifted(part, shift)
    assert list(joined) == list(whole) and len(joined) == len(whole)


@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1 << 33),
                          st.one_of(st.none(), st.text(max_size=5))), min_size=1, max_size=40),
       st.integers(1, 39))
def test_columns_joined_are_the_columns_of_one_pass(records, cut):
    """Two parts' columns, numbered from their own starts, joined: one pass's."""
    cut = min(cut, len(records))
    whole, first, second = JobColumns([]), JobColumns([]), JobColumns([])
    for position, (src, where, given_id) in enumerate(records):
        whole.add(src, where, position + 1, position, given_id, position)
        part, at = (first, position) if position < cut else (second, position - cut)
        part.add(src, where, at + 1, position, given_id, at)
    whole.samples = {p: 2 for p in range(0, len(records), 3)}
    first.samples = {p: 2 for p in range(0, cut, 3)}
    second.samples = {p - cut: 2 for p in range(cut, len(records)) if p % 3 == 0}
    first.extend(second, cut, cut)
    n = len(records)
    assert [first.id_of(p) for p in range(n)] == [whole.id_of(p) for p in range(n)]
    for name in ("src", "where", "line", "read_order", "digest", "prompt_len"):
        assert list(getattr(first, name)) == list(getattr(whole, name)), name
    assert first.samples == whole.samples


@given(st.text(), st.integers(0, 10**6), st.one_of(st.none(), st.integers(0, 2**40)),
       st.integers(0, 3), st.integers(0, 10**6), st.integers(0, 10**6))
def test_a_rows_numbers_shift_and_nothing_else(given_id, read_order, seed, mark, items,
                                               records):
    default = bool(mark & DEFAULT_ID)
    if mark & RUN_SEED and seed is None:
        seed = 17
    row = [str(read_order) if default else given_id, "abc123", 5, 0.7, seed,
           None, "d1e2"]
    line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
    shifted = json.loads(part_join._shifted_row(line, mark, items, records))
    expected = list(row)
    if default:
        expected[0] = str(read_order + items)
    if mark & RUN_SEED:
        expected[4] = seed + records
    assert shifted == expected


@hypothesis_settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=40), max_size=30), st.integers(1, 29),
       st.sampled_from([4, 1 << 19]))
def test_prefix_bounds_merged_count_as_one_pass(prompts, cut, exact_limit):
    """Exact, or estimated (a limit of 4 distinct prefixes): the merged counts are one
    pass's over every prompt (registers merged by their maximum are the registers of all)."""
    whole, first, second = (PrefixBound(4, exact_limit) for _ in range(3))
    for k, prompt in enumerate(prompts):
        whole.add(prompt)
        (first if k < cut else second).add(prompt)
    first.merge(second)
    assert first.tokens() == whole.tokens() and first.exact == whole.exact
    assert first.error_tokens() == whole.error_tokens()


def _csv(n: int, quoted_newline_at: int | None = None) -> str:
    out = ["arrived_at,num_prefill_tokens,num_decode_tokens,id"]
    for i in range(n):
        out.append(f"{i * 0.01:.2f},{10 + i % 700},{1 + i % 30},\"r,{i}\"")
        if i % 97 == 3:
            out.append("")
        if i % 211 == 7:
            out.append(f"{i},x,3,bad{i}")
    if quoted_newline_at is not None:
        out[quoted_newline_at] = f"1.0,20,3,\"two\nlines {quoted_newline_at}\""
    return "\ufeff" + "\n".join(out) + "\n"


@pytest.mark.parametrize("quoted_newline_at", [None, 700])
def test_a_csv_trace_in_parts_is_the_csv_in_one_process(tiny_model, tmp_path, monkeypatch,
                                                        split_check, quoted_newline_at):
    """A CSV is cut at line starts too (a BOM, blank and bad rows, quoted commas); one with
    a quoted value over two lines is given back to one pass, whatever part meets it."""
    path = tmp_path / "trace.csv"
    path.write_text(_csv(900, quoted_newline_at))
    split = split_check(100)
    whole = _seen(_workload([path], tiny_model, monkeypatch, 1)[0])
    parts = _seen(_workload([path], tiny_model, monkeypatch, 2)[0])
    assert split == [False, quoted_newline_at is None]
    assert parts == whole
    assert len(whole["problems"]) >= 4 and whole["requests"][0][0] == "r,0"


def test_a_containers_cpu_quota_caps_the_processes(tmp_path, monkeypatch):
    quota = tmp_path / "cpu.max"
    quota.write_text("250000 100000\n")
    assert check_parts._cgroup_cpus(str(quota)) == 3
    quota.write_text("max 100000\n")
    assert check_parts._cgroup_cpus(str(quota)) is None
    assert check_parts._cgroup_cpus(str(tmp_path / "none")) is None
    monkeypatch.delenv("NEURON_BATCH_CHECK_PROCESSES", raising=False)
    monkeypatch.setattr(check_parts, "_cgroup_cpus", lambda: 1)
    assert check_parts.processes() == 1


@pytest.mark.parametrize("line, text", [({"prompt": "hello"}, True),
                                        ({"messages": [{"role": "user", "content": "hi"}]}, True),
                                        ({"prompt_len": 7}, False),
                                        ({"prompt_token_ids": [1, 2]}, False)])
def test_a_text_job_is_checked_on_more_processes(tmp_path, monkeypatch, tiny_model,
                                                 split_check, line, text):
    # a text line's check is its tokenizer's (~150 us): up to MAX_TEXT_PROCESSES keep the
    # join busy; a count's (~2 us) no more than MAX_PROCESSES
    monkeypatch.delenv("NEURON_BATCH_CHECK_PROCESSES", raising=False)
    monkeypatch.setattr(check_parts, "cores", lambda: 500)
    assert check_parts.processes() == check_parts.MAX_PROCESSES
    assert check_parts.processes(text=True) == check_parts.MAX_TEXT_PROCESSES
    asked: list[bool] = []

    class Counted(Exception):
        pass

    def counted(text: bool = False) -> int:
        asked.append(text)
        if len(asked) > 1:      # (the count the parts are cut by: asked, nothing spawned)
            raise Counted
        return 2

    monkeypatch.setattr(check_parts, "processes", counted)
    job = tmp_path / "job.jsonl"
    job.write_text("".join(json.dumps({**line, "id": f"r{i}"}) + "\n" for i in range(50)))
    split_check(10)
    settings = RunSettings.of((str(job),), model=tiny_model, device="sim", quiet=True)
    with pytest.raises(Counted):
        load_workload(settings, lambda _: None)
    assert asked == [True, text]


@hypothesis_settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.booleans(), min_size=1, max_size=60),
                          st.booleans()), min_size=1, max_size=3),
       st.integers(1, 9))
def test_each_parts_guess_is_the_items_before_it(inputs, parts):
    """`PartHand`: each part's guess is the items (lines but blank ones and a CSV's header) of the
    files before it, the files cut as a split check cuts them, with or without a newline at a
    file's end; the same for the files in object storage (fsspec's memory://), each part
    copied to a local file first, its bytes at their offsets, and removed once taken. Right,
    no part's rows are rewritten when the parts are joined."""
    import tempfile
    from pathlib import Path
    from types import SimpleNamespace

    import fsspec

    from neuron_batch.inputs.csv_file import CsvInput
    from neuron_batch.inputs.line_files import LineInput, cut_spans

    store = fsspec.filesystem("memory")
    with tempfile.TemporaryDirectory() as folder:
        tasks = {"local": [], "url": []}
        truth, texts = [], {}
        before = 0
        for number, (is_csv, lines, last_newline) in enumerate(inputs):
            name = f"in{number}.{'csv' if is_csv else 'jsonl'}"
            body = ["prompt_len,max_tokens"] if is_csv else []
            body += ['{"prompt_len": %d}' % i if filled else "" for i, filled in enumerate(lines)]
            text = ("\n".join(body) + ("\n" if last_newline else "")).encode()
            path, url = Path(folder) / name, f"memory://guesses/{name}"
            path.write_bytes(text)
            store.pipe(url, text)
            texts[number] = text
            for start, end in cut_spans(path, name, parts):
                for where, spec in (("local", path), ("url", url)):
                    reader = (CsvInput(spec, name, "prompt") if is_csv
                              else LineInput(spec, name))
                    tasks[where].append(SimpleNamespace(reader=reader, span=(start, end),
                                                        number=number, base=None))
                head = text[:start].decode().split("\n")[:-1] if start else []
                truth.append(before + sum(1 for line in head[1 if is_csv else 0:] if line))
            before += sum(1 for line in body[1 if is_csv else 0:] if line)
        copies = Path(folder) / "copies"
        copies.mkdir()
        for where, given in tasks.items():
            with part_hand.PartHand(copies, given, counting=True, window=2) as hand:
                for task in given:
                    hand.give(task)
                    local = Path(task.reader.path)
                    assert local.parent == (copies if where == "url" else Path(folder))
                    start, end = task.span
                    assert local.read_bytes()[start:end] == texts[task.number][start:end]
                    hand.taken(task)
            assert [task.base for task in given] == [(items, items) for items in truth], where
        assert not any(copies.iterdir())
        store.rm("memory://guesses", recursive=True)


def test_a_clean_trace_in_parts_rewrites_no_row(tiny_model, tmp_path, monkeypatch, split_check):
    """A trace of good lines only, in two files: every part's guess is right, so its rows go to
    the spool as written (no row read again), and they are the rows of one pass."""
    first, second = tmp_path / "a.csv", tmp_path / "b.jsonl"
    first.write_text("prompt_len,max_tokens\n" + "".join(f"{10 + i % 90},{1 + i % 7}\n"
                                                           for i in range(600)))
    second.write_text("".join('{"prompt_len": %d}\n' % (5 + i % 50) for i in range(400)))
    split = split_check(90)
    missed: list[tuple[int, int]] = []
    add = part_join.Join.add

    def spied(self, task, part):
        missed.append((self.items - task.base[0], self.records - task.base[1]))
        return add(self, task, part)

    monkeypatch.setattr(part_join.Join, "add", spied)
    values = {"temperature": 0.4, "seed": 5}      # (a run seed in every row too)
    whole = _seen(_workload([first, second], tiny_model, monkeypatch, 1, **values)[0])
    parts = _seen(_workload([first, second], tiny_model, monkeypatch, 2, **values)[0])
    assert split == [False, True] and len(missed) > 4
    assert set(missed) == {(0, 0)}
    assert parts == whole and len(whole["rows"]) == 1000


def test_parts_are_given_out_while_meanwhile_runs():
    """`meanwhile` (a run's import of vLLM) runs beside the hand-out of parts: every part
    can come back before it returns (run in line, it held the parts after the first `ahead`
    until it ended), and it has ended when the parts have all been taken."""
    import threading
    from concurrent.futures import Future
    from types import SimpleNamespace

    class AtOnce:       # (a pool whose parts are done as soon as they are given)
        def submit(self, fn, task):
            future: Future = Future()
            future.set_result(f"part {task.n}")
            return future

    tasks = [SimpleNamespace(n=n, base=None) for n in range(9)]
    all_back, ended = threading.Event(), threading.Event()

    def meanwhile():
        if all_back.wait(5):
            ended.set()

    class Hand:         # (each task's base its number as it is given; the order taken)
        def __init__(self):
            self.order = []

        def give(self, task):
            task.base = (task.n, task.n)

        def taken(self, task):
            self.order.append(task.n)

    hand = Hand()
    got = []
    for _task, part in check_parts._in_order(AtOnce(), tasks, 2, meanwhile, hand):
        got.append(part)
        if len(got) == len(tasks):
            all_back.set()
    assert ended.is_set()
    assert got == [f"part {n}" for n in range(9)]
    assert [t.base for t in tasks] == [(n, n) for n in range(9)]
    assert hand.order == list(range(9))


def test_parts_of_an_object_are_checked_from_their_copies(tiny_model, tmp_path, monkeypatch,
                                                          split_check):
    """An input in object storage checked in parts (fsspec's memory://, which the pool's
    processes, started fresh, cannot see: only this process holds its objects) is the local
    file's check in one process, offsets, lines, problems and rows alike, its sources named by
    URL: each part's process reads the local copy it was given, never the object."""
    import fsspec

    lines = [json.dumps({"prompt": f"say {i} " + "word " * (i % 9), "max_tokens": 1 + i % 5})
             if i % 3 else json.dumps({"prompt_len": 4 + i % 30}) for i in range(500)]
    lines[123], lines[321] = "{bad", ""
    data = ("\n".join(lines) + "\n").encode()
    url = "memory://parts/in.jsonl"
    fsspec.filesystem("memory").pipe(url, data)
    local = tmp_path / "in.jsonl"
    local.write_bytes(data)
    split = split_check(90)

    def full(*_):
        raise part_hand.NoRoom("No space left on device")

    try:
        remote = _seen(_workload([url], tiny_model, monkeypatch, 2)[0])
        # (no disk for a copy: the check goes back to one pass, which streams the object)
        monkeypatch.setattr(part_hand, "copied", full)
        streamed = _seen(_workload([url], tiny_model, monkeypatch, 2)[0])
    finally:
        fsspec.filesystem("memory").rm("memory://parts", recursive=True)
    whole = _seen(_workload([local], tiny_model, monkeypatch, 1)[0])
    assert split == [True, False, False]
    assert streamed == remote

    def named(seen, spec):      # (memory:// names an object memory:///...)
        text = json.dumps(seen, default=repr)
        return json.loads(re.sub(re.escape(str(spec)).replace("//", "//+"), "INPUT", text))

    assert named(remote, url) == named(whole, local)
    assert len(whole["problems"]) == 1 and len(whole["requests"]) == 498


def test_a_processes_parts_share_the_tokenizer_its_first_part_loaded(tiny_model, monkeypatch):
    """Each part's Scan loads the tokenizer when a record first needs it; the parts a pool
    process checks after its first keep that one (check_parts._TOKENIZERS), where each loaded
    its own before (~0.5 s a part). A Scan given no such dict loads its own."""
    from neuron_batch.engine import models
    from neuron_batch.job.check import Scan, model_source

    loads = []
    real = models.load_tokenizer
    monkeypatch.setattr(models, "load_tokenizer",
                        lambda source: loads.append(source.path) or real(source))
    settings = RunSettings.of(("x.jsonl",), model=tiny_model, device="sim", quiet=True)
    source = model_source(settings, lambda _: None)
    held: dict = {}
    first, second = (Scan(settings, source, tokenizers=held) for _ in range(2))
    assert first.tokenizer() is second.tokenizer() is not None
    assert len(loads) == 1 and list(held) == loads
    alone = Scan(settings, source)
    assert alone.tokenizer() is not None and alone.tokenizer() is not first.tokenizer()
    assert len(loads) == 2
    assert first.tokenizer_name == alone.tokenizer_name == source.tokenizer_name


def _parquet(path, n: int, *, group_rows: int, trace: bool = False) -> None:
    """`_table(n, trace)` in row groups of `group_rows`."""
    import pyarrow.parquet as pq

    pq.write_table(_table(n, trace), path, row_group_size=group_rows)


def _table(n: int, trace: bool = False):
    """`n` rows: prompts (some empty, some too long, a max_tokens of 0 here and there, ids
    given or not), or a trace timed by TIMESTAMP."""
    from datetime import datetime, timedelta

    import pyarrow as pa

    if trace:
        start = datetime(2023, 11, 16, 18, 15, 46)
        table = pa.table({
            "TIMESTAMP": [start + timedelta(seconds=0.37 * i) for i in range(n)],
            "ContextTokens": [10 + i % 700 for i in range(n)],
            "GeneratedTokens": [1 + i % 30 if i % 113 != 9 else 0 for i in range(n)]})
    else:
        table = pa.table({
            "prompt": ["" if i % 151 == 4 else "word " * (3000 if i % 233 == 8 else 1 + i % 9)
                       + f"row {i}" for i in range(n)],
            "max_tokens": [0 if i % 127 == 11 else 1 + i % 5 for i in range(n)],
            "id": [f"p-{i}" if i % 3 else None for i in range(n)]})
    return table


@pytest.mark.parametrize("values", [{}, {"shuffle": True, "seed": 5}])
def test_parquet_files_in_parts_are_the_files_in_one_process(tiny_model, tmp_path, monkeypatch,
                                                           split_check, values):
    """Parquet files are cut by rows, across and within row groups: each part decodes its
    groups only, its rows keeping their own numbers (a problem's row, a request's source),
    and a TIMESTAMP's time zero is the file's first row in every part."""
    text, trace = tmp_path / "text.parquet", tmp_path / "trace.parquet"
    _parquet(text, 700, group_rows=97)
    _parquet(trace, 500, group_rows=1000, trace=True)
    split = split_check(90)
    whole, said_whole, _ = _workload([text, trace], tiny_model, monkeypatch, 1, **values)
    parts, said_parts, _ = _workload([text, trace], tiny_model, monkeypatch, 2, **values)
    assert split == [False, True]
    seen_whole, seen_parts = _seen(whole), _seen(parts)
    for key in seen_whole:
        assert seen_parts[key] == seen_whole[key], key
    assert said_parts == said_whole
    problems = [p[0] for p in seen_whole["problems"]]
    assert any("text.parquet:row 4:" in p for p in problems)           # in the first part
    assert any("text.parquet:row 608:" in p for p in problems)         # in a later one
    assert any("trace.parquet:row 461:" in p for p in problems)
    assert any(p[2] for p in seen_whole["problems"])                    # a prompt too long
    def arrivals(workload):
        return [(r.record.source, r.record.arrival_s) for r in workload.prepared.requests
                if "trace.parquet" in r.record.source]

    assert arrivals(parts) == arrivals(whole)
    times = {int(source.rsplit("row ", 1)[1]): at for source, at in arrivals(parts)}
    assert times[0] == 0 and times[499] == pytest.approx(0.37 * 499)


@hypothesis_settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=6), st.integers(1, 12),
       st.booleans())
def test_parquet_spans_cover_the_rows_once(tmp_path_factory, groups, parts, whole_groups):
    """A Parquet file's spans: contiguous, none empty, every row once; with `whole_groups`,
    cut only between row groups; and the rows each span reads are the file's rows there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from neuron_batch.inputs.tables import ParquetInput

    path = tmp_path_factory.mktemp("spans") / "t.parquet"
    total = sum(groups)
    with pq.ParquetWriter(path, pa.schema([("prompt_len", pa.int64())])) as writer:
        first = 0
        for rows in groups:
            writer.write_table(pa.table({"prompt_len": range(first + 1, first + rows + 1)}))
            first += rows
    reader = ParquetInput(path, "t.parquet", "prompt")
    assert reader.group_rows() == groups
    spans = reader.spans(parts, whole_groups=whole_groups)
    assert spans[0][0] == 0 and spans[-1][1] == total
    assert all(a < b for a, b in spans) and all(b == c for (_, b), (c, _) in zip(spans, spans[1:]))
    assert len(spans) <= max(parts, 1)
    if whole_groups:
        bounds = {sum(groups[:k]) for k in range(len(groups) + 1)}
        assert {a for a, _ in spans} <= bounds
    for start, end in spans:
        got = [(where, line, item[0].prompt_len) for where, line, _, item
               in reader.scan((start, end))]
        assert got == [(n, n - start, n + 1) for n in range(start, end)]
        assert reader.span_lines == end - start


def test_a_tables_rows_read_again_out_of_order_keep_the_first_rows_time_zero(tmp_path):
    """A TIMESTAMP trace read again from a later row first (a shuffled job's first window,
    or a run after a check in parts) times each row from the table's first row, not from the
    first row read."""
    from neuron_batch.inputs.tables import ParquetInput

    path = tmp_path / "trace.parquet"
    _parquet(path, 50, group_rows=20, trace=True)
    reader = ParquetInput(path, "trace.parquet", "prompt")
    got = {number: item[0].arrival_s
           for number, (_, item) in zip((31, 5, 0), reader.read([(31, 31), (5, 5), (0, 0)]))}
    assert got == pytest.approx({31: 0.37 * 31, 5: 0.37 * 5, 0: 0.0})


def test_a_saved_data_set_in_parts_is_the_data_set_in_one_process(tiny_model, tmp_path,
                                                                 monkeypatch, split_check):
    """A data set saved with save_to_disk (memory-mapped Arrow) is cut by rows too, each
    part's process mapping the same files; one streamed from the hub is not (its rows come
    only in order)."""
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "saved"
    datasets.Dataset(_table(600)).save_to_disk(str(folder))
    split = split_check(90)
    whole = _seen(_workload([folder], tiny_model, monkeypatch, 1)[0])
    parts = _seen(_workload([folder], tiny_model, monkeypatch, 2)[0])
    assert split == [False, True]
    assert parts == whole
    assert any("saved:row 457:" in p[0] for p in whole["problems"])
    streamed = datasets.Dataset(_table(10)).to_iterable_dataset()
    from neuron_batch.inputs.tables import DatasetInput

    assert not DatasetInput(streamed, "hf:x", "prompt", "hf:x[train] row ").cuttable()
