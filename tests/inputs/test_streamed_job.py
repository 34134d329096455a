"""A job streamed (issue 46): the check before the run keeps compact arrays and no prompt; the
requests read again, a window at a time, are the ones a job read whole would run, in every
format and order; an input that changes between the check and the run stops it, naming the
input or the line; and a real run stopped so finishes on --resume."""

import json
import os
import tracemalloc
from array import array

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.cli import main
from neuron_batch.inputs import job_requests
from neuron_batch.inputs.load import InputScan, load_prompts
from neuron_batch.inputs.prepare import in_order, prepare_requests
from neuron_batch.inputs.prompt_records import InputChanged
from neuron_batch.job.workload import load_workload
from neuron_batch.settings import RunSettings


def _workload(inputs, model, **values):
    settings = RunSettings.of(tuple(str(i) for i in inputs), model=model, device="sim",
                              quiet=True, on_error="skip", **values)
    return load_workload(settings, lambda _: None), settings


def _held_whole(workload, settings):
    """What the job read whole into memory runs (load_prompts + prepare_requests)."""
    loaded = load_prompts(settings.inputs, prompt_column=settings.prompt_column,
                          limit=settings.limit, shuffle=settings.shuffle, seed=settings.seed,
                          default_max_tokens=settings.max_tokens)
    prepared = prepare_requests(loaded.records, tokenizer=workload.tokenizer,
                                tokenizer_name=None,
                                vocab_size=workload.prepared.requests.columns.vocab_size,
                                max_model_len=settings.max_model_len,
                                default_max_tokens=settings.max_tokens)
    return loaded, prepared


def _rows(requests):
    return [(r.record.id, r.record.index, r.record.source, r.prompt_token_ids, r.max_tokens,
             r.max_tokens_clamped, r.record.arrival_s) for r in requests]


def _mixed_lines(n):
    lines = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            lines.append({"prompt": f"request {i} says hello " * (1 + i % 5), "max_tokens": 3})
        elif kind == 1:
            lines.append({"id": f"q{i}", "prompt_len": 10 + i % 90})
        elif kind == 2:
            lines.append({"prompt_token_ids": [5 + i % 50, 7, 9], "max_tokens": 1 + i % 4})
        else:
            lines.append({"id": f"q{i}", "prompt_len": 20, "prefix_id": f"p{i % 3}",
                          "prefix_len": 8})
    text = [json.dumps(line) for line in lines]
    text[7] = "{not json"                                   # a malformed line
    text[13] = json.dumps({"prompt_len": 100_000})          # too long
    return "\n".join(text) + "\n"


@pytest.mark.parametrize("values", [{}, {"order": "length"}, {"shuffle": True, "seed": 3},
                                    {"shuffle": True, "limit": 150}, {"limit": 40}])
def test_a_streamed_job_runs_what_the_job_read_whole_runs(tiny_model, tmp_path, monkeypatch,
                                                          values):
    monkeypatch.setattr(job_requests, "WINDOW", 64)     # many windows, each its own read
    path = tmp_path / "mixed.jsonl"
    path.write_text(_mixed_lines(300))
    order = values.pop("order", "input")
    workload, settings = _workload([path], tiny_model, **values)
    loaded, prepared = _held_whole(workload, settings)
    assert _rows(in_order(workload.prepared.requests, order)) == _rows(
        in_order(prepared.requests, order))
    problems = sorted(loaded.problems + prepared.problems, key=lambda p: p.read_order)
    assert [str(p) for p in workload.problems] == [str(p) for p in problems]
    assert any("malformed JSON" in str(p) for p in workload.problems)
    requests = workload.prepared.requests
    assert requests[5].record.id == list(requests)[5].record.id     # random access too


def test_tables_streamed_csv_parquet_saved_and_hub_data_sets(tiny_model, tmp_path,
                                                             monkeypatch):
    import datasets

    # (windows of 16 rows: a shuffled job's windows go back, and a Parquet file's are then
    # read from its spilled copy, inputs/table_spill.py)
    monkeypatch.setattr(job_requests, "WINDOW", 16)

    rows = {"TIMESTAMP": [f"2023-11-16 18:15:{10 + i % 40:02d}.5" for i in range(120)],
            "ContextTokens": [20 + i % 300 for i in range(120)],
            "GeneratedTokens": [1 + i % 9 for i in range(120)]}
    csv = tmp_path / "trace.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"{t},{c},{g}\n" for t, c, g in zip(*rows.values())))
    prompts = {"prompt": [f"hello number {i} " * (1 + i % 4) for i in range(90)],
               "max_tokens": [1 + i % 5 for i in range(90)]}
    table = datasets.Dataset.from_dict(prompts)
    table.to_parquet(str(tmp_path / "prompts.parquet"))
    table.save_to_disk(str(tmp_path / "saved"))
    hub = tmp_path / "hub"
    hub.mkdir()
    table.to_parquet(str(hub / "train.parquet"))
    for spec in (csv, tmp_path / "prompts.parquet", tmp_path / "saved", f"hf:{hub}"):
        workload, settings = _workload([spec], tiny_model, shuffle=True, seed=1)
        _, prepared = _held_whole(workload, settings)
        assert len(workload.prepared.requests) in (120, 90)
        assert _rows(workload.prepared.requests) == _rows(prepared.requests), spec


def test_the_check_keeps_arrays_not_the_prompts(tiny_model, tmp_path):
    """What the check leaves in memory is ~15 bytes a request of a trace without ids (the
    columns: job_columns.py), not its record (~500 bytes a trace row when the job was held
    whole) nor its text (43 before, with every id and line number); and at its peak ~21 (54
    before: a sorted copy of the lengths, every default id's hash). Marginal figures: 40k
    requests against 10k, so that what does not grow with the job (a chunk of records
    checked at once) is left out."""
    figures = {}
    for count in (10_000, 40_000):
        path = tmp_path / f"trace-{count}.csv"
        path.write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n" + "".join(
            f"{100 + i % 900},{1 + i % 50},{i * 0.01:.2f}\n" for i in range(count)))
        _workload([path], tiny_model)       # (imports and the model's files, once)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        workload, _ = _workload([path], tiny_model)
        figures[count] = [figure - before for figure in tracemalloc.get_traced_memory()]
        tracemalloc.stop()
        assert len(workload.prepared.requests) == count
        del workload
    held, peak = ((figures[40_000][k] - figures[10_000][k]) / 30_000 for k in (0, 1))
    assert held < 20, f"{held:.0f} bytes a request held"
    assert peak < 30, f"{peak:.0f} bytes a request at the peak"


def _changed(path, line_number, new_line, *, same_stamp):
    lines = path.read_text().split("\n")
    assert len(lines[line_number - 1]) == len(new_line)
    info = os.stat(path)
    lines[line_number - 1] = new_line
    path.write_text("\n".join(lines))
    if same_stamp:      # (size and time as before: only the line's digest tells)
        os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


@pytest.mark.parametrize("same_stamp", [False, True])
def test_an_input_that_changes_after_the_check_is_named(tiny_model, tmp_path, same_stamp):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt_len": 10 + i}) + "\n"
                            for i in range(50)))
    workload, _ = _workload([path], tiny_model)
    _changed(path, 30, json.dumps({"id": "r29", "prompt_len": 99}), same_stamp=same_stamp)
    with pytest.raises(InputChanged) as caught:
        list(workload.prepared.requests)
    assert str(path) in str(caught.value)
    if same_stamp:
        assert f"{path}:30" in str(caught.value)


def test_a_run_whose_input_changes_stops_and_resume_finishes_it(tiny_model, tmp_path,
                                                                monkeypatch):
    path = tmp_path / "p.jsonl"
    original = "".join(json.dumps({"id": f"r{i}", "prompt_len": 10 + i % 20,
                                   "max_tokens": 2}) + "\n" for i in range(60))
    path.write_text(original)
    from neuron_batch.job.folder import RunFolder

    monkeypatch.setattr(job_requests, "WINDOW", 8)
    real_append = RunFolder.append_output
    written = [0]

    def append_output(self, *args):
        written[0] += 1
        if written[0] == 10:    # ten outputs written: a line the feed has not read changes
            _changed(path, 55, json.dumps({"id": "r54", "prompt_len": 11, "max_tokens": 3}),
                     same_stamp=True)
        return real_append(self, *args)

    monkeypatch.setattr(RunFolder, "append_output", append_output)
    out = tmp_path / "run"
    args = ["run", str(path), "--model", tiny_model, "--device", "sim", "--max-num-seqs", "2",
            "-q", "-o", str(out)]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 1, first.output
    assert "the input changed while the job ran" in first.output
    kept = [_id_of(line) for line in (out / "outputs.jsonl").open()]
    assert 0 < len(kept) < 60
    monkeypatch.setattr(RunFolder, "append_output", real_append)
    path.write_text(original)
    second = CliRunner().invoke(main, [*args, "--resume"])
    assert second.exit_code == 0, second.output
    ids = [_id_of(line) for line in (out / "outputs.jsonl").open()]
    assert sorted(ids) == sorted(f"r{i}" for i in range(60))


def _id_of(line):
    row = json.loads(line)
    return row.get("custom_id") or row["id"]


def test_duplicate_ids_are_named_by_the_check_that_holds_only_their_hashes(tiny_model, tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [{"id": f"r{i}", "prompt_len": 10} for i in range(30)]
    lines[20]["id"] = "r3"
    lines[25] = {"prompt_len": 12}          # no id: its place in reading order, 25 (the bad
    lines[26]["id"] = "25"                  # line 21 counted), which an explicit id takes again
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    workload, settings = _workload([path], tiny_model)
    loaded, _ = _held_whole(workload, settings)
    assert [str(p) for p in workload.problems] == [str(p) for p in loaded.problems]
    assert [str(p) for p in workload.problems] == [
        f"{path}:21: field 'id': duplicate id 'r3' (first used at {path}:4); ids must be unique",
        f"{path}:27: field 'id': duplicate id '25' (first used at {path}:26); ids must be "
        f"unique"]
    assert list(job_requests.job_ids(workload.prepared.requests)) == [
        r.id for r in loaded.records]


def test_only_the_ids_lines_give_are_hashed_for_duplicates(tiny_model, tmp_path):
    """A default id (the record's reading order) is unique by construction: a trace without
    ids hashes none (8 bytes a line at the check's peak); a given id that is a number, beside
    default ids, is looked at exactly, and is no problem where it takes no default's place."""
    from neuron_batch.inputs.load import InputScan

    trace = tmp_path / "t.csv"
    trace.write_text("prompt_len\n" + "".join(f"{10 + i}\n" for i in range(50)))
    scan = InputScan([str(trace)], exact_ids=False)
    assert sum(1 for _ in scan) == 50 and len(scan.id_hashes) == 0
    assert not scan.has_duplicates()
    path = tmp_path / "p.jsonl"
    lines = [{"prompt_len": 10} for _ in range(10)] + [{"id": "500", "prompt_len": 10}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    scan = InputScan([str(path)], exact_ids=False)
    assert sum(1 for _ in scan) == 11 and scan.has_duplicates()   # (the exact pass decides)
    workload, _ = _workload([path], tiny_model)
    assert workload.problems == []
    assert list(job_requests.job_ids(workload.prepared.requests)) == [
        *map(str, range(10)), "500"]


@pytest.mark.parametrize("values", [{}, {"limit": 5}, {"shuffle": True, "seed": 1, "limit": 7}])
def test_the_reports_input_figures_come_from_the_arrays(tiny_model, tmp_path, values):
    """What the report says of the requests as read (OpenAI lines, max_tokens cut, samples,
    logprobs, structured output) comes from the check's arrays, not from reading the job again:
    the same as reading it again, for the run's requests only."""
    def chat(i, **body):
        return {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}],
                         **body}}
    lines = [chat(0, n=3), {"prompt_len": 30, "max_tokens": 10**6}, chat(2, logprobs=True),
             chat(3, response_format={"type": "json_object"}), {"prompt_len": 12},
             chat(5, n=2, logprobs=True), {"prompt_len": 40, "max_tokens": 10**6}, chat(7),
             {"prompt_len": 9, "max_tokens": 2}, chat(9, max_tokens=10**6)]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    workload, _ = _workload([path], tiny_model, **values)
    requests = workload.prepared.requests
    assert isinstance(requests, job_requests.JobRequests)
    from_arrays = job_requests.job_figures(requests)
    read_again = job_requests.job_figures(list(requests))
    assert from_arrays == read_again
    if not values:
        assert from_arrays.openai and from_arrays.clamped
        assert from_arrays.asked == {"constrained": 1, "sampled_n": 2, "samples": 5,
                                     "logprobs": 2}


def test_read_ahead_hands_over_the_job_in_order_tokenized_on_its_own_thread(
        tiny_model, tmp_path, monkeypatch):
    """Text read ahead on a thread (what the engine takes): the same requests, in the same
    order and with the same tokens, as the job walked in the caller's thread; each window's
    text tokenized before it is handed over (on the reading thread); a token-count job is
    walked as it is (no thread to share the GIL with)."""
    import threading

    monkeypatch.setattr(job_requests, "WINDOW", 16)
    path = tmp_path / "mixed.jsonl"
    path.write_text(_mixed_lines(200))
    workload, _ = _workload([path], tiny_model, shuffle=True, seed=2)
    requests = workload.prepared.requests
    tokenized_on = set()
    real = job_requests._Window.tokenize

    def tokenize(window):
        tokenized_on.add(threading.current_thread().name)
        real(window)

    monkeypatch.setattr(job_requests._Window, "tokenize", tokenize)
    ahead = job_requests.read_ahead(requests)
    assert isinstance(ahead, job_requests.ReadAhead)
    got = list(ahead)
    assert tokenized_on == {"neuron-batch-read-ahead"}
    assert all(r.window is None for r in got)               # (made whole before handed over)
    assert _rows(got) == _rows(requests)
    assert next(ahead, None) is None                        # (the end, asked again)
    ahead.close()
    trace = tmp_path / "trace.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n" + "".join(
        f"{10 + i},{1 + i % 3}\n" for i in range(40)))
    tokens, _ = _workload([trace], tiny_model)
    assert not isinstance(job_requests.read_ahead(tokens.prepared.requests),
                          job_requests.ReadAhead)


def test_read_ahead_raises_a_changed_input_where_the_caller_reaches_it(tiny_model, tmp_path,
                                                                        monkeypatch):
    """The windows before a changed line are handed over; the change is raised in the
    caller's thread when it reaches that window; close() ends the thread of a run that stops
    early."""
    monkeypatch.setattr(job_requests, "WINDOW", 10)
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"say {i:03d} words"}) + "\n"
                            for i in range(60)))
    workload, _ = _workload([path], tiny_model)
    _changed(path, 35, json.dumps({"id": "r34", "prompt": "say 999 words"}), same_stamp=True)
    ahead = job_requests.read_ahead(workload.prepared.requests)
    got = []
    with pytest.raises(InputChanged) as caught:
        for request in ahead:
            got.append(request.record.id)
    assert got == [f"r{i}" for i in range(30)]
    assert f"{path}:35" in str(caught.value)
    ahead.close()
    stopped = job_requests.read_ahead(workload.prepared.requests)
    next(stopped)
    stopped.close()     # (its thread blocked on a full queue: it ends)
    assert not stopped._thread.is_alive()


@pytest.mark.parametrize("caching", ["auto", "off"])
def test_a_run_reads_its_job_once_per_need_after_the_check(tiny_model, tmp_path, monkeypatch,
                                                           caching):
    """After the check, a fresh run reads its job again only where it must: as the engine
    takes it, for the verdict's sample and under auto, the prompts sharing blocks, for the
    step model's weighing of the cache. The request rows, what the job asks beyond its tokens
    (job/facts.py) and the prefix bound auto and the report read are made by the check itself
    as it tokenizes (each was a pass of its own before). What the sampler is asked, the
    OpenAI endpoint, the prompt and output lengths and the report's bound each read every
    line again (minutes each at 10M lines; text tokenized again each time). What the check
    learnt is what a pass of its own finds; the report's bound is what a count of its own
    finds."""
    from neuron_batch.inputs.prefix_bound import prefix_bound
    from neuron_batch.inputs.prepare import PromptTokens
    from neuron_batch.job.facts import job_facts
    from neuron_batch.job.workload import Workload

    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": "m", "prompt": "a shared system prompt " * 8 + f"say {i}",
                       "max_tokens": 2, **({"stop": ["x"]} if i == 3 else {}),
                       **({"logprobs": 1} if i % 5 == 0 else {})}} for i in range(40)]
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    read = []
    real_read = job_requests.JobRequests._read
    monkeypatch.setattr(job_requests.JobRequests, "_read",
                        lambda self, positions: read.extend(positions) or real_read(
                            self, positions))
    learnt = []
    real_learnt = Workload.learnt
    monkeypatch.setattr(Workload, "learnt", lambda self, settings, facts: learnt.append(
        (self, settings, facts)) or real_learnt(self, settings, facts))
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", str(path), "--model", tiny_model, "--device",
                                       "sim", "--prefix-caching", caching, "-q", "-o",
                                       str(out)])
    assert result.exit_code == 0, result.output
    # (the rows and the prefix bound are the check's: job/rows_spool.py, job/workload.py)
    passes = 3 if caching == "auto" else 2
    assert sorted(read) == sorted(list(range(40)) * passes)
    [(workload, settings, facts)] = learnt
    read.clear()
    assert facts == job_facts(settings, workload.prepared.requests)
    assert facts.endpoint == "/v1/completions" and facts.stop_strings
    assert facts.sampling.logprob_requests == 8 and facts.sampling.num_requests == 40
    assert json.loads((out / "batch.json").read_text())["endpoint"] == "/v1/completions"
    report = json.loads((out / "report.json").read_text())
    counted = prefix_bound(PromptTokens(workload.prepared.requests),
                           report["config"]["block_size"]).tokens()
    assert report["prefix_cache"]["bound_tokens"] == counted > 0


@pytest.mark.parametrize("caching", ["auto", "off"])
def test_a_token_count_job_is_not_walked_for_a_prefix_bound(tiny_model, tmp_path, monkeypatch,
                                                            caching):
    """A token-count trace without block ids or named prefixes shares nothing by construction
    (inputs/prepare.py SyntheticTokens): neither auto's decision nor the report walks its
    prompts for a bound (at 10M requests those walks took over 12 minutes), and the bound it
    says, 0, is what the walk finds; its verdict reads only the requests it weighs."""
    from neuron_batch.inputs.prefix_bound import prefix_bound
    from neuron_batch.run import verdict

    path = tmp_path / "trace.csv"
    path.write_text("prompt_len,max_tokens\n"
                    + "".join(f"{20 + i * 7 % 90},{1 + i % 3}\n" for i in range(40)))
    read = []
    real_read = job_requests.JobRequests._read
    monkeypatch.setattr(job_requests.JobRequests, "_read",
                        lambda self, positions: read.extend(positions) or real_read(
                            self, positions))
    monkeypatch.setattr(verdict.weighed_sample, "__defaults__", (10,))   # (a sample of 40)
    made = []
    monkeypatch.setattr(job_requests.JobRequests, "own_prompts", lambda self, real=(
        job_requests.JobRequests.own_prompts): made.append(self) or real(self))
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", str(path), "--model", tiny_model, "--device",
                                       "sim", "--prefix-caching", caching, "-q", "-o",
                                       str(out)])
    assert result.exit_code == 0, result.output
    # the engine's and the verdict's sample of every 4th (the rows are the check's)
    assert sorted(read) == sorted(list(range(40)) + list(range(0, 40, 4)))
    assert made     # (asked, and learnt from the arrays)
    report = json.loads((out / "report.json").read_text())
    assert report["prefix_cache"]["bound_tokens"] == 0
    assert report["verdict"]["sampled"] == {"requests": 10, "of": 40}
    walked = prefix_bound([list(r.prompt_token_ids) for r in made[0]],
                          report["config"]["block_size"])
    assert walked.tokens() == 0
    if caching == "auto":
        assert "share no KV block" in json.dumps(report["prefix_caching"])


@given(st.lists(st.integers(-2**63, 2**63 - 1), max_size=40))
def test_the_hashes_say_duplicates_exactly_when_two_are_equal(hashes):
    """The check's duplicate test over its id hashes (sorted where they lie, no copy)."""
    scan = InputScan([os.devnull], exact_ids=False)
    scan.id_hashes = array("q", hashes)
    assert scan.has_duplicates() == (len(set(hashes)) < len(hashes))
