"""The readers' chunks of nothing but plain rows, read as columns all at once (csv_file.py
`CsvInput._plain_columns`, line_files.py `_plain_columns`), give what the same rows read a row
at a time give: the same blocks, each row's offset, line, digest, counts and text, and every
other row, problem or error in its place. Shown over traces and JSON lines hypothesis makes
(all plain, or plain but for a zero count, a blank line, a carriage return, a date the row
path reads its own way), read whole and in parts whose end falls inside a chunk, in chunks
and blocks of many sizes."""

from __future__ import annotations

import json
import random
import re

from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from neuron_batch.inputs import csv_file, line_files, plain_rows
from neuron_batch.inputs.csv_file import CsvInput
from neuron_batch.inputs.line_files import LineInput, cut_spans
from neuron_batch.inputs.plain_rows import PlainRows
from tests.job.test_plain_rows import HEADERS, JSON_NOT_PLAIN, _trace

_NEVER = re.compile(rb"(?!)")


def _flat(items) -> list:
    """A scan's items as values to compare: a block as its columns, a row as itself; an error
    raised part way as its text, after what came before it."""
    seen: list = []
    try:
        for item in items:
            if isinstance(item, PlainRows):
                seen.append(("block", list(item.where), list(item.line), list(item.digest),
                             list(item.prompt_len), list(item.max_tokens), list(item.texts)))
            else:
                where, line, digest, each = item
                seen.append((where, line, digest, repr(each)))
    except Exception as error:      # (Uncut, InputError: the same either way)
        seen.append(("error", type(error).__name__, str(error)))
    return seen


def _scans(reader, path, parts: int, plain: bool = True) -> list:
    """`reader`'s scan of the whole (its header first), then of each of `parts` parts."""
    seen = [_flat(reader.scan(plain=plain))]
    for span in cut_spans(path, "t", parts):
        seen.append(_flat(reader.scan(span, plain=plain)) + [reader.span_lines])
    return seen


def _both(monkeypatch, make, chunk: int, block: int, slow) -> tuple[list, list]:
    """What `make()` (a reader, its path) reads with chunks of `chunk` bytes and blocks of
    `block` rows: with plain chunks read at once, and a row at a time (`slow` patches it)."""
    seen = []
    for at_once in (True, False):
        with monkeypatch.context() as patched:
            for module in (csv_file, line_files):
                patched.setattr(module, "_PLAIN_CHUNK", chunk)
            for module in (plain_rows, csv_file, line_files):
                patched.setattr(module, "BLOCK_ROWS", block)
            if not at_once:
                slow(patched)
            reader, path, parts = make()
            seen.append(_scans(reader, path, parts))
    return seen[0], seen[1]


#: Rows of the kinds `_trace` makes, and "near" (a plain row with one cell not quite one):
#: plain most, so that many chunks are plain but for one row.
KINDS = st.lists(st.sampled_from(["plain"] * 10 + ["near"] * 4 + ["blank", "other", "switch"]),
                 min_size=1, max_size=150)
#: A cell that makes a plain row one the row path reads (or that leaves it plain: a count's
#: leading zeros, a date with no time).
NEAR = ["0"] * 4 + ["00", "", "0000000000", "1234567890"] * 2 + [
        "999999999", "0000000012", "1.5", "-1",
        "+1", " 1", "1 ", ".", "1..2", "1.", ".5", "1e3", "x", "2023-11-16", "2023-11-16 25:00",
        "2023-11-16T18:15:46Z"]


def _near_trace(header, kinds: list[str], seed: int, crlf: bool, last_end: bool) -> str:
    """`_trace` with each "near" row a plain one with a cell from NEAR."""
    text = _trace(header, ["plain" if kind == "near" else kind for kind in kinds], seed, crlf,
                  last_end)
    end = "\r\n" if crlf else "\n"
    lines = text.split(end)
    rng = random.Random(seed)
    for i, kind in enumerate(kinds, 1):
        if kind == "near":
            cells = lines[i].split(",")
            cells[rng.randrange(len(cells))] = rng.choice(NEAR)
            lines[i] = ",".join(cells)
    return end.join(lines)


@hypothesis_settings(max_examples=400, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=KINDS, header=st.sampled_from(HEADERS), crlf=st.booleans(),
       last_end=st.booleans(), seed=st.integers(0, 99), parts=st.integers(1, 4),
       chunk=st.sampled_from([7, 64, 200, 1 << 16]), block=st.sampled_from([1, 5, 4096]),
       tab=st.booleans())
def test_csv_chunks_at_once_are_rows_at_a_time(tmp_path, monkeypatch, kinds, header, crlf,
                                               last_end, seed, parts, chunk, block, tab):
    text = _near_trace(header, kinds, seed, crlf, last_end)
    if tab:     # (a TSV: the delimiter the pattern and the split are made of)
        text = text.replace(",", "\t")
    path = tmp_path / ("trace.tsv" if tab else "trace.csv")
    path.write_text(text, newline="")

    def make():
        return CsvInput(path, path.name, "prompt", delimiter="\t" if tab else ","), path, parts

    fast, slow = _both(monkeypatch, make, chunk, block, lambda patched: patched.setattr(
        csv_file, "_plain_lines", lambda *_: _NEVER))
    assert fast == slow


def test_csv_chunks_are_read_at_once(tmp_path, monkeypatch):
    """(what the comparison above compares is the lane: most of a plain trace's rows come by
    `_plain_columns`)"""
    rows = [f"{i / 10:.1f},{1 + i % 50},{1 + i % 7}" for i in range(3000)]
    path = tmp_path / "trace.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows)
                    + "\n")
    read = []
    columns = CsvInput._plain_columns

    def spied(self, data, *args):
        found = columns(self, data, *args)
        read.append(0 if found is None else len(found[-1]))
        return found

    monkeypatch.setattr(csv_file, "_PLAIN_CHUNK", 1000)
    monkeypatch.setattr(CsvInput, "_plain_columns", spied)
    blocks = _flat(CsvInput(path, "t", "prompt").scan(plain=True))
    assert sum(read) == 3000 and len(read) > 30
    assert [len(block[1]) for block in blocks] == [3000]


def _json_lines(kinds: list[str], seed: int, first: str, crlf: bool, last_end: bool) -> str:
    rng = random.Random(seed)
    lines = [first]
    for kind in kinds:
        if kind == "plain":
            line = {"prompt_len": rng.choice((1, 2047, 31, 999_999_999))}
            if rng.random() < 0.7:
                line["max_tokens"] = rng.choice((5, 60))
            lines.append(json.dumps(line, separators=rng.choice(((", ", ": "), (",", ":")))))
        elif kind == "blank":
            lines.append("")
        elif kind == "switch":      # (a line plain but for what is around it)
            lines.append(rng.choice(['x{"prompt_len": 5}', '{"prompt_len": 5}\r',
                                     '{"prompt_len": 5}{"prompt_len": 6}']))
        else:
            lines.append(rng.choice(JSON_NOT_PLAIN))
    end = "\r\n" if crlf else "\n"
    return end.join(lines) + (end if last_end else "")


@hypothesis_settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kinds=KINDS, crlf=st.booleans(), last_end=st.booleans(), seed=st.integers(0, 99),
       parts=st.integers(1, 4), chunk=st.sampled_from([7, 64, 200, 1 << 16]),
       block=st.sampled_from([1, 5, 4096]),
       first=st.sampled_from(['{"prompt_len": 4, "max_tokens": 2}', '{"prompt": "hi"}',
                              '{"custom_id": "a", "body": {}}']))
def test_json_chunks_at_once_are_lines_at_a_time(tmp_path, monkeypatch, kinds, crlf,
                                                 last_end, seed, parts, chunk, block, first):
    path = tmp_path / "job.jsonl"
    path.write_bytes(_json_lines(kinds, seed, first, crlf, last_end).encode())

    def make():
        return LineInput(path, path.name), path, parts

    fast, slow = _both(monkeypatch, make, chunk, block, lambda patched: patched.setattr(
        line_files, "_PLAIN_FOUND", _NEVER))
    assert fast == slow
    # (and a chunk's lines a line at a time are the file's lines as a scan not for plain
    # lines reads them, from the file: but for the blocks)
    with monkeypatch.context() as patched:
        patched.setattr(line_files, "_PLAIN_CHUNK", chunk)
        patched.setattr(line_files, "_PLAIN_FOUND", _NEVER)
        patched.setattr(line_files, "_PLAIN_LINE", _NEVER)
        chunked = _scans(LineInput(path, path.name), path, parts)
    assert chunked == _scans(LineInput(path, path.name), path, parts, plain=False)
