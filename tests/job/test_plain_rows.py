"""A trace's plain rows read as blocks (inputs/plain_rows.py, csv_file.py `CsvInput._plain`) and
checked a pair of counts at a time (job/plain_check.py `PlainCheck.block`) leave the workload
the row path leaves, field by field: columns, problems (text, reading order, too long or not),
request rows (byte for byte), facts, log lines, requests read again. Shown over traces hypothesis
makes of plain rows and every kind of row that is not one (a problem, a quote, a carriage
return, a byte that is not ASCII, a count with a point or a sign), under settings that seed,
clamp, limit and shuffle; and split across processes."""

from __future__ import annotations

import gzip
import json
import random
import re

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from neuron_batch.errors import RunError
from neuron_batch.inputs import csv_file, line_files, plain_rows, tables
from neuron_batch.inputs.csv_file import CsvInput
from neuron_batch.job import plain_check
from neuron_batch.job.plain_check import PlainCheck
from tests.job.test_check_parts import _seen, _workload

HEADERS = (("num_prefill_tokens", "num_decode_tokens", "arrived_at"),
           ("ContextTokens", "GeneratedTokens"),          # (no arrival column)
           ("arrived_at", "num_decode_tokens", "note", "num_prefill_tokens"),
           ("ContextTokens", "GeneratedTokens", "TIMESTAMP"))     # (Azure's raw: dates)
#: Arrivals in a TIMESTAMP column: with and without a fraction or a time zone, and no date.
TIMES = ("2023-11-16 18:15:46.6800000", "2023-11-16 18:15:47", "2023-11-16T18:15:48.5",
         "2023-11-16 18:15:49+00:00", "2023-13-16 18:15:46")

#: Rows that are not plain: each goes the row path (a problem, or a record it reads its way).
NOT_PLAIN = ["0,5,1.0", "12,0,1", "12.0,5,1", " 12,5,1", "12,5", "12,5,1,9", "-3,5,1",
             "12,5,-1", "1e3,5,1", "12,5,abc", "12,,1", "1234567890,5,1", "12,5,1e2",
             "12,5,.", "0012,05,1.5", "12,5,nan", "9000,5,1"]
#: Rows that make the reader hand the rest of its part to the csv module.
SWITCH = ['"12",5,1', "12,5,1\r", "\u0661\u0662,5,1", '12,"5\n",1']


def _row(kind: str, rng: random.Random, width: int, dated: bool = False) -> str:
    if kind == "plain":
        # (few pairs: most rows take the outcome of another row's record)
        cells = [str(rng.choice((1, 2047, 2100))), str(rng.choice((5, 60))),
                 rng.choice(TIMES if dated else ("0", "12", "0.25", "3.", ".5"))]
    elif kind == "blank":
        return ""
    elif kind == "switch":
        return rng.choice(SWITCH)
    else:
        return rng.choice(NOT_PLAIN)
    return ",".join(cells[:width])


def _trace(header: tuple[str, ...], kinds: list[str], seed: int, crlf: bool,
           last_end: bool = True) -> str:
    rng = random.Random(seed)
    width = min(len(header), 3)
    lines = []
    for kind in kinds:
        line = _row(kind, rng, width, dated=header[-1] == "TIMESTAMP")
        if len(header) == 4 and line and kind == "plain":     # (a column the trace ignores)
            prompt, most, arrival = line.split(",")
            line = f"{arrival},{most},n{seed},{prompt}"
        lines.append(line)
    end = "\r\n" if crlf else "\n"
    return ",".join(header) + end + end.join(lines) + (end if last_end else "")


def _compare(tmp_path, tiny_model, monkeypatch, text, values: dict, processes: int = 1,
             name: str = "trace.csv"):
    """The workload of `text` (a file's text, or a table and its row groups' rows: None, a
    saved data set) by the row path and with plain rows: equal, or the same error."""
    path = tmp_path / name
    if isinstance(text, str):
        path.write_text(text, newline="")
    elif text[1] is None:   # (a table saved as a data set)
        import datasets

        datasets.Dataset(text[0]).save_to_disk(str(path))
    else:       # (a table and its row groups' rows: Parquet)
        import pyarrow.parquet

        pyarrow.parquet.write_table(text[0], path, row_group_size=text[1])
    plain_at = CsvInput._plain_at
    with monkeypatch.context() as patched:
        patched.setattr(CsvInput, "_plain_at", lambda self: None)     # the row path only
        patched.setattr(line_files, "_PLAIN_LINE", re.compile(rb"(?!)"))
        patched.setattr(line_files, "_PLAIN_FOUND", re.compile(rb"(?!)"))
        patched.setattr(tables, "plain_columns", lambda layout: None)
        whole = _seen_of(path, tiny_model, patched, 1, values, tmp_path / "whole.gz")
    assert CsvInput._plain_at is plain_at
    blocks = _seen_of(path, tiny_model, monkeypatch, processes, values, tmp_path / "blocks.gz")
    assert blocks.keys() == whole.keys()
    for key in whole:
        assert blocks[key] == whole[key], key
    return whole


def _seen_of(path, tiny_model, monkeypatch, processes: int, values: dict, spool) -> dict:
    try:
        workload, said, _ = _workload([path], tiny_model, monkeypatch, processes, **values)
    except RunError as error:
        return {"error": str(error)}
    return {**_seen(workload), "said": said, "spooled": _spooled(workload, spool)}


def _spooled(workload, path) -> bytes | None:
    if workload.rows_spool is None:
        return None
    workload.rows_spool.copy_to(path)
    return gzip.decompress(path.read_bytes())


SETTINGS = [{}, {"temperature": 0.7, "seed": 11}, {"limit": 9}, {"shuffle": True, "seed": 2},
            {"max_model_len": 2060}]


@hypothesis_settings(max_examples=40, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(["plain"] * 6 + ["blank", "other", "switch"]),
                      min_size=1, max_size=60),
       header=st.sampled_from(HEADERS), values=st.sampled_from(SETTINGS),
       crlf=st.booleans(), last_end=st.booleans(), seed=st.integers(0, 99),
       chunk=st.sampled_from([5, 64, 1 << 16]), small=st.booleans())
def test_plain_rows_leave_what_the_row_path_leaves(tiny_model, tmp_path, monkeypatch, kinds,
                                                    header, values, crlf, last_end, seed, chunk,
                                                    small):
    monkeypatch.setattr(csv_file, "_PLAIN_CHUNK", chunk)   # (lines across chunks, or longer)
    if small:
        _small_blocks(monkeypatch)
    _compare(tmp_path, tiny_model, monkeypatch, _trace(header, kinds, seed, crlf, last_end),
             values)


def _small_blocks(monkeypatch) -> None:
    """Blocks of a few rows, and a few pairs' outcomes kept (plain_check.py `_OUTCOMES`): a run of
    rows across blocks, the pairs kept started again mid-block (a block read a row at a time)
    and between blocks (found again by numpy)."""
    for module in (plain_rows, csv_file, line_files):
        monkeypatch.setattr(module, "BLOCK_ROWS", 7)
    monkeypatch.setattr(plain_check, "_OUTCOMES", 3)


def _spy_outcomes(monkeypatch) -> list[str]:
    """The source of each record a pair of counts is checked on (`PlainCheck._outcome`)."""
    checked: list[str] = []
    outcome = PlainCheck._outcome

    def spied(self, record):
        checked.append(record.source)
        return outcome(self, record)

    monkeypatch.setattr(PlainCheck, "_outcome", spied)
    return checked


def test_each_pair_of_counts_is_checked_once(tiny_model, tmp_path, monkeypatch):
    """The rows go as blocks (what the comparisons above cover is the lane, not the row path
    twice): 3,000 rows of 40 pairs, one record checked a pair; a row too long is named at its
    own line, once a row."""
    checked = _spy_outcomes(monkeypatch)
    rows = [f"{3000 if i % 40 == 39 else 10 + i % 40},{1 + i % 8},{i / 100:.2f}"
            for i in range(3000)]
    text = "num_prefill_tokens,num_decode_tokens,arrived_at\n" + "\n".join(rows) + "\n"
    seen = _compare(tmp_path, tiny_model, monkeypatch, text, {"seed": 5, "temperature": 1.0})
    assert len(checked) == 40
    assert [p[0].split(":")[1].split(" ")[0] for p in seen["problems"]] == [
        str(i + 2) for i in range(3000) if i % 40 == 39]
    assert len(seen["rows"]) == 3000 - 3000 // 40


@pytest.mark.parametrize("switch", [False, True])
def test_plain_rows_in_parts(tiny_model, tmp_path, monkeypatch, split_check, switch):
    """Split across two processes (job/check_parts.py), each part's blocks numbered from its
    own start and shifted as they join; with a quoted row late in the file, the part that
    holds it reads on with the csv module."""
    rng = random.Random(3)
    kinds = ["plain"] * 1500 + ["other"] * 40 + ["blank"] * 20
    rng.shuffle(kinds)
    text = _trace(HEADERS[0], kinds, 4, crlf=False)
    if switch:
        text += '"40",2,9\n' + "".join(f"{5 + i},{1 + i % 3},9.5\n" for i in range(200))
    split = split_check(300)
    _compare(tmp_path, tiny_model, monkeypatch, text, {"temperature": 0.5, "seed": 1},
             processes=2)
    assert split == [False, True]


#: JSON lines that are not plain: each goes the line path (a problem, or a record it reads).
JSON_NOT_PLAIN = ['{"prompt_len": 0}', '{"prompt_len": 5, "max_tokens": 0}',
                  '{"prompt_len": 012}', '{"prompt_len": 5, "temperature": 0.5}',
                  '{"max_tokens": 5, "prompt_len": 7}', '{not json', '{"id": "x", "prompt_len": 5}',
                  '{"prompt_len": 5, "max_tokens": 3, "max_tokens": 4}', '{"prompt_len": 9000}',
                  '{"prompt_len": 1e3}', '{"prompt_len": 5 }', '  ', '[1]']


@hypothesis_settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(["plain"] * 6 + ["blank", "other"]), min_size=1,
                      max_size=60),
       values=st.sampled_from(SETTINGS), crlf=st.booleans(), seed=st.integers(0, 99),
       first=st.sampled_from(['{"prompt_len": 4, "max_tokens": 2}', '{"prompt": "hi"}']),
       chunk=st.sampled_from([5, 64, 1 << 16]), small=st.booleans())
def test_plain_json_lines_leave_what_the_line_path_leaves(tiny_model, tmp_path, monkeypatch,
                                                          kinds, values, crlf, seed, first,
                                                          chunk, small):
    """JSON lines of a prompt_len (and max_tokens), as json.dumps writes them or without its
    spaces, among lines of every other kind; the first line decides the file's kind and
    always goes the line path."""
    rng = random.Random(seed)
    lines = [first]
    for kind in kinds:
        if kind == "plain":
            line = {"prompt_len": rng.choice((1, 2047, 2100))}
            if rng.random() < 0.7:
                line["max_tokens"] = rng.choice((5, 60))
            lines.append(json.dumps(line, separators=rng.choice(((", ", ": "), (",", ":")))))
        elif kind == "blank":
            lines.append("")
        else:
            lines.append(rng.choice(JSON_NOT_PLAIN))
    end = "\r\n" if crlf else "\n"
    monkeypatch.setattr(line_files, "_PLAIN_CHUNK", chunk)
    if small:
        _small_blocks(monkeypatch)
    _compare(tmp_path, tiny_model, monkeypatch, end.join(lines) + end, values,
             name="job.jsonl")


def test_plain_json_lines_in_parts(tiny_model, tmp_path, monkeypatch, split_check):
    rng = random.Random(8)
    lines = [json.dumps({"prompt_len": 1 + rng.randrange(40), "max_tokens": 1 + i % 3})
             if i % 50 else rng.choice(JSON_NOT_PLAIN) for i in range(1600)]
    split = split_check(300)
    seen = _compare(tmp_path, tiny_model, monkeypatch, "\n".join(lines) + "\n",
                    {"temperature": 0.5, "seed": 1}, processes=2, name="job.jsonl")
    assert split == [False, True]
    assert len(seen["rows"]) > 1500


#: A Parquet table's layouts: (prompt count, max_tokens, arrival, another column).
TABLE_LAYOUTS = [("num_prefill_tokens", "num_decode_tokens", "arrived_at", None),
                 ("ContextTokens", "GeneratedTokens", None, None),
                 ("ContextTokens", "GeneratedTokens", "TIMESTAMP", None),
                 ("prompt_len", "max_tokens", None, None),
                 ("prompt_len", None, None, None),
                 ("prompt_len", "max_tokens", None, "id")]
#: Rows that are not plain, by what is wrong (each goes the row path: a problem, or a row
#: too long for the run, whose pair is then checked row by row).
TABLE_NOT_PLAIN = ["prompt gap", "prompt 0", "prompt -3", "prompt 10**9", "prompt 9000",
                   "most gap", "most 0", "most 10**9", "arrival gap", "arrival -1",
                   "arrival nan", "arrival inf"]


def _table(layout, kinds: list[str], seed: int, floats: bool):
    """A table of `layout` whose rows are plain, or not as `kinds` says (TABLE_NOT_PLAIN)."""
    from datetime import datetime, timedelta, timezone

    import pyarrow as pa

    prompt, most, arrival, other = layout
    rng = random.Random(seed)
    start = datetime(2023, 11, 16, 18, 15, 46, tzinfo=timezone.utc if seed % 2 else None)
    values = {"gap": None, "0": 0, "-3": -3, "10**9": 10**9, "9000": 9000, "-1": -1.0,
              "nan": float("nan"), "inf": float("inf")}
    cells: dict[str, list] = {name: [] for name in layout if name}
    for i, kind in enumerate(kinds):
        where, _, what = kind.partition(" ")
        cells[prompt].append(values[what] if where == "prompt" else rng.choice((1, 2047, 2100)))
        if most:
            cells[most].append(values[what] if where == "most" else rng.choice((5, 60)))
        if arrival == "TIMESTAMP":
            cells[arrival].append(None if kind == "arrival gap"
                                  else start + timedelta(seconds=i))
        elif arrival:
            cells[arrival].append(values[what] if where == "arrival"
                                  else rng.choice((0, 0.25, 12)))
        if other:
            cells[other].append(f"r{i}")
    counts = pa.float64() if floats else pa.int64()
    types = {prompt: counts, most: counts, "arrived_at": pa.float64(),
             "TIMESTAMP": pa.timestamp("us", tz="UTC" if seed % 2 else None)}
    return pa.table({name: pa.array(column, type=types.get(name, pa.string()))
                     for name, column in cells.items()})


@hypothesis_settings(max_examples=80, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(["plain"] * 20 + TABLE_NOT_PLAIN), min_size=1,
                      max_size=60),
       layout=st.sampled_from(TABLE_LAYOUTS), values=st.sampled_from(SETTINGS),
       seed=st.integers(0, 99), groups=st.sampled_from([3, 16, 1000]),
       batch=st.sampled_from([4, 4096]), floats=st.booleans(), small=st.booleans())
def test_plain_table_rows_leave_what_the_row_path_leaves(tiny_model, tmp_path, monkeypatch,
                                                         kinds, layout, values, seed, groups,
                                                         batch, floats, small):
    """A Parquet table's batches of nothing but plain counts (inputs/plain_tables.py) among
    batches that hold a row that is not one (a gap, a count below 1 or too big, an arrival
    that is not a time or a number >= 0), in row groups and batches of a few rows or many,
    counts as integers (or floats: the row path only), with another column (the row path)."""
    monkeypatch.setattr(tables, "ROWS_AT_ONCE", batch)
    if small:
        _small_blocks(monkeypatch)
    _compare(tmp_path, tiny_model, monkeypatch, (_table(layout, kinds, seed, floats), groups),
             values, name="trace.parquet")


def test_a_parquet_traces_rows_go_as_blocks_and_in_parts(tiny_model, tmp_path, monkeypatch,
                                                         split_check):
    """What the comparison above covers is the lane: 3,000 rows of 40 pairs, one record
    checked a pair; a row too long named at its own row; not split across processes, unless
    it is (as beside an input that is not counts only)."""
    import pyarrow as pa

    checked = _spy_outcomes(monkeypatch)
    table = pa.table({"num_prefill_tokens": [3000 if i % 40 == 39 else 10 + i % 40
                                             for i in range(3000)],
                      "num_decode_tokens": [1 + i % 8 for i in range(3000)],
                      "arrived_at": [i / 100 for i in range(3000)]})
    values = {"seed": 5, "temperature": 1.0}
    seen = _compare(tmp_path, tiny_model, monkeypatch, (table, 700), values,
                    name="trace.parquet")
    assert len(checked) == 40
    assert [int(p[0].split(":row ")[1].split(":")[0]) for p in seen["problems"]] == [
        i for i in range(3000) if i % 40 == 39]
    assert len(seen["rows"]) == 3000 - 3000 // 40
    # (a table of integer counts only is checked in one pass however big: its blocks take
    # about what a split's join would; its parts are read as blocks too, beside another input)
    split = split_check(500)
    _compare(tmp_path, tiny_model, monkeypatch, (table, 700), values, processes=2,
             name="trace.parquet")
    monkeypatch.setattr(tables.ParquetInput, "counts_only", lambda self: False)
    _compare(tmp_path, tiny_model, monkeypatch, (table, 700), values, processes=2,
             name="trace.parquet")
    assert split == [False, False, False, True]


def test_a_saved_data_sets_plain_rows_go_as_blocks(tiny_model, tmp_path, monkeypatch):
    """A data set saved with save_to_disk (Arrow tables, not Parquet batches) of a trace's
    counts: blocks too, one record checked a pair, the row path's workload."""
    pytest.importorskip("datasets")
    monkeypatch.setattr(tables, "ROWS_AT_ONCE", 64)
    checked = _spy_outcomes(monkeypatch)
    kinds = ["plain"] * 300
    kinds[7], kinds[150] = "prompt 0", "arrival -1"
    table = _table(TABLE_LAYOUTS[0], kinds, 4, False)
    seen = _compare(tmp_path, tiny_model, monkeypatch, (table, None), {"seed": 3},
                    name="saved")
    assert 0 < len(checked) <= 6 * 3        # (a pair a batch at most: 6 pairs)
    assert [int(p[0].split(":row ")[1].split(":")[0]) for p in seen["problems"]
            if not p[2]] == [7, 150]             # (the rest: prompts too long)
