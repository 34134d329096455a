"""Inputs at s3:// URLs on a real S3 endpoint (moto's server): every format read through the
same readers as a local file, globs as one job in a stable order, problems named by URL and
line, and a URL that names nothing refused before any engine starts."""

from __future__ import annotations

import io
import json

import pytest
from click.testing import CliRunner

from neuron_batch.cli import main
from neuron_batch.inputs.load import load_prompts
from neuron_batch.inputs.prompt_records import InputProblem
from neuron_batch.storage.urls import StorageError


def _put(bucket: str, key: str, data: bytes) -> str:
    import s3fs

    s3fs.S3FileSystem().pipe_file(f"{bucket}/{key}", data)
    return f"s3://{bucket}/{key}"


def _spy_fetches(monkeypatch) -> list[tuple[int, int]]:
    """The (start, end) of each byte range an s3fs file fetches from here on."""
    import s3fs

    fetched: list[tuple[int, int]] = []
    fetch = s3fs.core.S3File._fetch_range

    def spied(self, start, end):
        fetched.append((start, end))
        return fetch(self, start, end)

    monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", spied)
    return fetched


def _bytes(fetched: list[tuple[int, int]]) -> int:
    return sum(end - start for start, end in fetched)


def _jsonl(rows) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def test_each_format_reads_as_from_a_local_file(bucket, tmp_path):
    import pyarrow
    import pyarrow.parquet

    rows = [{"id": f"r{i}", "prompt": f"question {i}"} for i in range(5)]
    table = pyarrow.table({"id": [r["id"] for r in rows], "prompt": [r["prompt"] for r in rows]})
    parquet = io.BytesIO()
    pyarrow.parquet.write_table(table, parquet)
    urls = {
        "jsonl": _put(bucket, "in/a.jsonl", _jsonl(rows)),
        "csv": _put(bucket, "in/a.csv", ("\ufeffid,prompt\n" + "".join(
            f"{r['id']},{r['prompt']}\n" for r in rows)).encode()),
        "parquet": _put(bucket, "in/a.parquet", parquet.getvalue()),
        "text": _put(bucket, "in/a.txt", "".join(f"{r['prompt']}\n" for r in rows).encode()),
    }
    for kind, url in urls.items():
        loaded = load_prompts([url])
        assert [r.prompt for r in loaded.records] == [r["prompt"] for r in rows], kind
        assert loaded.inputs == [url]
        local = tmp_path / url.rsplit("/", 1)[1]
        import s3fs

        local.write_bytes(s3fs.S3FileSystem().cat(url))
        assert [r.id for r in load_prompts([str(local)]).records] == [r.id for r in
                                                                      loaded.records], kind


def test_a_glob_is_one_job_in_a_stable_order(bucket):
    for name, first in (("b", 10), ("a", 0), ("c", 20)):
        _put(bucket, f"night/{name}.jsonl", _jsonl({"prompt": f"p{first + i}"}
                                                  for i in range(3)))
    loaded = load_prompts([f"s3://{bucket}/night/*.jsonl"])
    assert [r.prompt for r in loaded.records] == [f"p{i}" for i in (0, 1, 2, 10, 11, 12, 20,
                                                                     21, 22)]
    assert [r.id for r in loaded.records] == [str(i) for i in range(9)]
    assert loaded.inputs == [f"s3://{bucket}/night/{n}.jsonl" for n in "abc"]


def test_a_bad_line_is_named_by_url_and_line(bucket):
    url = _put(bucket, "bad.jsonl", b'{"prompt": "ok"}\n{"prompt": \n{"prompt": "ok too"}\n')
    loaded = load_prompts([url])
    assert len(loaded.records) == 2
    [problem] = loaded.problems
    assert isinstance(problem, InputProblem) and problem.source == f"{url}:2"


def test_a_missing_object_is_refused_before_any_engine_starts(bucket, tmp_path):
    with pytest.raises(StorageError, match="NoSuchKey"):
        load_prompts([f"s3://{bucket}/missing.jsonl"])
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", f"s3://{bucket}/missing.jsonl", "--device", "sim",
                                       "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert f"s3://{bucket}/missing.jsonl: NoSuchKey" in result.output
    assert not (out / "engine.log").exists()


def test_a_trace_in_s3_runs_on_the_simulated_device(bucket, tmp_path):
    """The whole path from a URL: a token-count trace in the bucket, run on the simulated
    inf2.8xlarge, every request answered, the URL named in the run's settings."""
    from pathlib import Path

    trace = Path(__file__).resolve().parents[2] / "datasets" / "azure-llm-inference-conv-2023.csv"
    lines = trace.read_text().splitlines()[:13]
    url = _put(bucket, "traces/conv.csv", ("\n".join(lines) + "\n").encode())
    out = tmp_path / "run"
    result = CliRunner().invoke(main, [
        "run", url, "--device", "sim", "--instance", "inf2.8xlarge", "--architecture",
        "llama-3.1-8b", "--max-model-len", "8192", "--max-tokens", "16", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert result.output == ""
    assert len((out / "outputs.jsonl").read_text().splitlines()) == 12
    assert url in (out / "run.json").read_text()


def test_a_run_folder_in_another_store_is_refused_by_name(tmp_path):
    """A run folder's lock needs S3's conditional writes: --output gs://... is refused at once
    (exit 2), not made as a local folder named like the URL (s3:// run folders:
    test_s3_run_folder.py)."""
    result = CliRunner().invoke(main, ["run", "--device", "sim", "-o", "gs://b/runs/night/"],
                                catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert "--output gs://b/runs/night/: a run folder in object storage is an s3:// prefix" \
        in result.output


def test_doctor_lists_an_input_url_and_names_who_reads_it(bucket):
    _put(bucket, "night/a.jsonl", b'{"prompt": "x"}\n')
    _put(bucket, "night/b.jsonl", b'{"prompt": "y"}\n')
    good = CliRunner().invoke(main, ["doctor", "--no-platform", "--input",
                                     f"s3://{bucket}/night/*.jsonl"])
    assert f"s3://{bucket}/night/*.jsonl: 2 object(s), read as arn:aws:" in good.output
    bad = CliRunner().invoke(main, ["doctor", "--no-platform", "--input",
                                    f"s3://{bucket}/nothing/"])
    assert bad.exit_code == 1
    assert f"s3://{bucket}/nothing/: NoSuchKey" in bad.output
    assert "testing-secret" not in good.output + bad.output


def test_an_object_is_checked_in_parts_as_a_local_file_in_one(bucket, tmp_path, tiny_model,
                                                              monkeypatch, split_check):
    """A big input in S3 is cut into byte ranges read by processes of their own (issue 48: a
    10M-line file's check on every core): the workload is the local file's, checked in one
    process, problems named by URL and line."""
    from neuron_batch.job.workload import load_workload
    from neuron_batch.settings import RunSettings

    lines = [json.dumps({"id": f"r{i}", "prompt_len": 5 + i % 40, "temperature": 0.5})
             for i in range(600)]
    lines[450] = "{bad"
    data = ("\n".join(lines) + "\n").encode()
    url = _put(bucket, "big/in.jsonl", data)
    local = tmp_path / "in.jsonl"
    local.write_bytes(data)
    split = split_check(100)

    def checked(spec, processes):
        monkeypatch.setenv("NEURON_BATCH_CHECK_PROCESSES", str(processes))
        settings = RunSettings.of((spec,), model=tiny_model, device="sim", quiet=True,
                                  on_error="skip")
        workload = load_workload(settings, lambda _: None)
        requests = workload.prepared.requests
        return (list(workload.rows_spool), [str(p) for p in workload.problems],
                [(r.record.id, r.record.source, r.prompt_len) for r in requests])

    in_parts, in_one = checked(url, 2), checked(str(local), 1)
    assert split == [True, False]
    assert in_parts[0] == in_one[0]
    assert in_parts[1] == [f"{url}:451: malformed JSON: Expecting property name enclosed in "
                           "double quotes (column 2)"]
    assert [r[0] for r in in_parts[2]] == [r[0] for r in in_one[2]]
    assert in_parts[2][-1][1] == f"{url}:600"


def test_an_objects_parts_are_read_once_each_and_need_no_rewrite(bucket, tmp_path, tiny_model,
                                                                 monkeypatch, split_check):
    """A clean trace in S3, in parts: each part's bytes are copied to a local file as it is
    given out (the object read once, a part no more than a read: COPY_CHUNK, one line more at
    most), every part's guess of the items before it is right (no row read again when the
    parts are joined), the rows, lengths and sources are the local file's in one pass, and no
    copy is left behind."""
    from neuron_batch.job import part_hand, part_join
    from neuron_batch.job.workload import load_workload
    from neuron_batch.settings import RunSettings

    data = ("prompt_len,max_tokens\n" + "".join(f"{10 + i % 90},{1 + i % 7}\n"
                                                for i in range(700))).encode()
    url = _put(bucket, "big/trace.csv", data)
    local = tmp_path / "trace.csv"
    local.write_bytes(data)
    split = split_check(100)
    missed, copies, read = [], [], []
    add, copied = part_join.Join.add, part_hand.copied

    def spied_add(self, task, part):
        missed.append((self.items - task.base[0], self.records - task.base[1]))
        return add(self, task, part)

    def spied_copy(reader, span, path):
        read.append(span)
        made = copied(reader, span, path)
        copies.append(path)
        return made

    monkeypatch.setattr(part_join.Join, "add", spied_add)
    monkeypatch.setattr(part_hand, "copied", spied_copy)
    monkeypatch.setattr(part_hand, "COPY_CHUNK", 500)     # (a part's bytes at most)

    def checked(spec, processes):
        monkeypatch.setenv("NEURON_BATCH_CHECK_PROCESSES", str(processes))
        settings = RunSettings.of((spec,), model=tiny_model, device="sim", quiet=True,
                                  temperature=0.5, seed=3)
        workload = load_workload(settings, lambda _: None)
        return (list(workload.rows_spool),
                [(r.record.source, r.prompt_len) for r in workload.prepared.requests])

    in_parts, in_one = checked(url, 2), checked(str(local), 1)
    assert split == [True, False]
    assert len(read) >= len(data) / 500 and sorted(read) == read
    assert max(end - start for start, end in read) <= 500 + len("99,7\n")
    assert read[0][0] == 0 and read[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(read, read[1:]))     # each byte once
    assert set(missed) == {(0, 0)}
    assert in_parts[0] == in_one[0] and len(in_one[0]) == 700
    assert [source.replace(url, "L") for source, _ in in_parts[1]] == \
        [source.replace(str(local), "L") for source, _ in in_one[1]]
    assert [n for _, n in in_parts[1]] == [n for _, n in in_one[1]]
    assert copies and not any(path.exists() for path in copies)


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_window_read_again_fetches_its_lines_not_a_block(bucket, tmp_path, monkeypatch,
                                                              kind):
    """The requests of a running job are read again from their input a window at a time
    (inputs/job_requests.py): from S3, a window's lines are fetched with LINE_SLACK more in
    one read, not s3fs's 50 MB block (~450 kB of text prompts fetched 50 MB), a window spread
    across the file a line at a time; the lines read are the local file's."""

    from neuron_batch.inputs.csv_file import CsvInput
    from neuron_batch.inputs.line_files import LineInput
    from neuron_batch.storage.urls import LINE_SLACK, locate

    text = [json.dumps({"prompt": f"line {i} " + "x" * 200}) for i in range(20_000)]
    if kind == "csv":
        text = ["prompt"] + [f"line {i} " + "x" * 200 for i in range(20_000)]
    data = ("\n".join(text) + "\n").encode()
    url = _put(bucket, f"window/in.{kind}", data)
    local = tmp_path / f"in.{kind}"
    local.write_bytes(data)
    reader = LineInput(url, url) if kind == "jsonl" else CsvInput(url, url, "prompt")
    list(reader.scan())                     # (the kind, a CSV's header: as the check reads)
    fetched = _spy_fetches(monkeypatch)     # (an s3fs file's reads)
    store = locate(url).fs      # (fsspec keeps one: its sync methods are bound as it is made)
    cat = store.cat_file

    def spied_cat(path, start=None, end=None, **options):
        fetched.append((start, end))
        return cat(path, start=start, end=end, **options)

    monkeypatch.setattr(store, "cat_file", spied_cat)
    monkeypatch.setattr("neuron_batch.storage.urls.LINES_AT_ONCE", 1 << 20)
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    first = 5_001 if kind == "csv" else 5_000       # (a line's number is its index + 1)
    spots = [(starts[k], k + 1) for k in range(first, first + 1024)]
    got = list(reader.read(spots))
    same = LineInput(local, url) if kind == "jsonl" else CsvInput(local, url, "prompt")
    list(same.scan())
    assert got == list(same.read(spots)) and len(got) == 1024
    assert all(item is not None for _, item in got)
    assert len(fetched) == 1
    assert _bytes(fetched) <= spots[-1][0] - spots[0][0] + LINE_SLACK < len(data) / 4
    fetched.clear()         # (a window out of input order: each line where it is)
    scattered = spots[::97] + [(starts[19_000], 19_001)]
    got = list(reader.read(scattered))
    assert len(got) == len(scattered) and all(item is not None for _, item in got)
    assert _bytes(fetched) <= len(scattered) * LINE_SLACK < len(data) / 4


def test_an_object_read_as_a_stream_is_fetched_once_in_blocks(bucket, monkeypatch):
    """A one-pass check reads an object as a stream, through a buffer of its own over
    STREAM_BLOCK fetches: each byte fetched once, the items the object's, and a line read
    fetches a buffer's worth, not the object (s3fs's own file read a line by reading and
    slicing a 50 MB block: a 200k-line text job's check took 4x the local file's)."""

    from neuron_batch.inputs.line_files import LineInput
    from neuron_batch.storage.urls import open_binary

    data = "".join(json.dumps({"prompt": f"p {i} " + "y" * (i % 900)}) + "\n"
                   for i in range(7000)).encode()
    url = _put(bucket, "stream/in.jsonl", data)
    fetched = _spy_fetches(monkeypatch)
    monkeypatch.setattr("neuron_batch.storage.urls.STREAM_BLOCK", 1 << 16)
    items = [item for *_, item in LineInput(url, url).scan()]
    assert len(items) == 7000 and items[-1][0].prompt.startswith("p 6999 ")
    assert len(data) > 3 << 20
    assert _bytes(fetched) <= len(data) + 2 * (1 << 16)
    assert all(a[1] <= b[0] for a, b in zip(fetched, fetched[1:]))     # none twice
    fetched.clear()
    with open_binary(url) as handle:
        assert handle.readline() == data[:data.index(b"\n") + 1]
    assert _bytes(fetched) < 1.2 * (1 << 20)


def test_a_shuffled_parquet_job_fetches_its_object_a_few_times_not_once_a_window(
        bucket, tmp_path, monkeypatch, tiny_model):
    """A Parquet job run in another order than its rows' reads its rows again from a spilled
    copy (inputs/table_spill.py): the object is fetched for the check, the first window and
    the spill, where reading each window from the top fetched it once a window (here 30);
    the requests are the local file's."""
    import pyarrow
    import pyarrow.parquet

    from neuron_batch.inputs import job_requests
    from neuron_batch.job.workload import load_workload
    from neuron_batch.settings import RunSettings

    table = pyarrow.table({"prompt": [f"question {i} " + "z" * (i % 50) for i in range(3000)],
                           "max_tokens": [1 + i % 9 for i in range(3000)]})
    local = tmp_path / "in.parquet"
    pyarrow.parquet.write_table(table, local)
    url = _put(bucket, "shuffled/in.parquet", local.read_bytes())
    monkeypatch.setattr(job_requests, "WINDOW", 100)
    fetched = _spy_fetches(monkeypatch)
    read = {}
    for job in (url, str(local)):
        settings = RunSettings.of((job,), model=tiny_model, device="sim", quiet=True,
                                  shuffle=True, seed=4)
        requests = load_workload(settings, lambda _: None).prepared.requests
        read[job] = [(r.record.id, r.record.prompt, r.max_tokens) for r in requests]
    assert read[url] == read[str(local)] and len(read[url]) == 3000
    assert _bytes(fetched) <= 4 * local.stat().st_size


def test_a_parquet_object_is_checked_in_parts_of_whole_row_groups(bucket, tmp_path, tiny_model,
                                                                  monkeypatch, split_check):
    """A Parquet object in S3 checked in parts: each part's process reads its own row groups
    from the store (cut only between groups: no group's bytes fetched by two parts), and the
    workload is the local file's in one process, problems named by URL and row."""
    import pyarrow
    import pyarrow.parquet

    from neuron_batch.inputs.tables import ParquetInput
    from neuron_batch.job.workload import load_workload
    from neuron_batch.settings import RunSettings

    table = pyarrow.table({"prompt": [f"question {i} " + "z" * (i % 30) if i != 333 else ""
                                      for i in range(700)],
                           "max_tokens": [1 + i % 9 for i in range(700)]})
    local = tmp_path / "in.parquet"
    pyarrow.parquet.write_table(table, local, row_group_size=64)
    url = _put(bucket, "parts/in.parquet", local.read_bytes())
    split = split_check(100)
    cuts: list[list[tuple[int, int]]] = []
    spans = ParquetInput.spans

    def spied(self, parts, *, whole_groups):
        cuts.append(spans(self, parts, whole_groups=whole_groups))
        return cuts[-1]

    monkeypatch.setattr(ParquetInput, "spans", spied)

    def checked(spec, processes):
        monkeypatch.setenv("NEURON_BATCH_CHECK_PROCESSES", str(processes))
        settings = RunSettings.of((spec,), model=tiny_model, device="sim", quiet=True,
                                  on_error="skip")
        workload = load_workload(settings, lambda _: None)
        return (list(workload.rows_spool), [str(p) for p in workload.problems],
                [(r.record.id, r.record.source, r.prompt_len)
                 for r in workload.prepared.requests])

    in_parts, in_one = checked(url, 2), checked(str(local), 1)
    assert split == [True, False] and len(cuts) == 1 and len(cuts[0]) > 1
    assert all(start % 64 == 0 for start, _ in cuts[0])
    assert in_parts[0] == in_one[0] and len(in_one[0]) == 699
    assert in_parts[1] == [p.replace(str(local), url) for p in in_one[1]]
    assert in_parts[1][0].startswith(f"{url}:row 333:")
    assert [(i, s.replace(url, "L"), n) for i, s, n in in_parts[2]] == \
        [(i, s.replace(str(local), "L"), n) for i, s, n in in_one[2]]
