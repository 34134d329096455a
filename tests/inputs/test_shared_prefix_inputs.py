"""Inputs that share prefixes: Mooncake traces (512-token blocks named by hash id) and
`prompt_len` records that name a shared prefix; their token ids share exactly what they name."""

from __future__ import annotations

import itertools
import json
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.inputs.load import describe_input, load_prompts
from neuron_batch.inputs.prepare import SyntheticTokens, prepare_requests
from neuron_batch.inputs.prompt_records import PromptRecord

REPO = Path(__file__).resolve().parents[2]
MOONCAKE_SLICE = REPO / "datasets" / "mooncake-conversation-trace-300.jsonl"
MOONCAKE_FULL = REPO.parent / "shared" / "datasets" / "mooncake-conversation-trace.jsonl"


def write_jsonl(path: Path, lines: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines), encoding="utf-8")
    return path


def prepare(records, vocab_size: int = 32_000, max_model_len: int = 1 << 20):
    return prepare_requests(records, tokenizer=None, tokenizer_name=None, vocab_size=vocab_size,
                            max_model_len=max_model_len, default_max_tokens=16)


def shared_blocks(a: list[int], b: list[int], block: int) -> int:
    """Leading full `block`-token blocks two prompts have in common."""
    n = 0
    while (n + 1) * block <= min(len(a), len(b)) and a[n * block:(n + 1) * block] == \
            b[n * block:(n + 1) * block]:
        n += 1
    return n


# ---------------------------------------------------------------------------------------------
# Mooncake traces


def test_mooncake_lines_become_prompt_len_records_with_their_blocks(tmp_path):
    path = write_jsonl(tmp_path / "trace.jsonl", [
        {"timestamp": 0, "input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]},
        {"timestamp": 1500, "input_length": 1024, "output_length": 3, "hash_ids": [0, 1]},
        {"timestamp": 2500, "input_length": 600, "output_length": 9, "hash_ids": [5, 6],
         "id": "x"},
    ])
    loaded = load_prompts([path])
    assert loaded.kind == "mooncake" and loaded.problems == []
    first, second, third = loaded.records
    assert (first.prompt_len, first.max_tokens, first.arrival_s, first.hash_ids, first.id) == (
        1100, 7, 0.0, [0, 1, 2], "0")
    assert (second.arrival_s, third.id, third.prompt_field) == (1.5, "x", "input_length")
    assert describe_input(loaded) == ("3 prompts from Mooncake trace trace.jsonl (prompt "
                                      "lengths p50 1,024 / max 1,100 tokens)")
    a, b, c = (r.prompt_token_ids for r in prepare(loaded.records).requests)
    assert (len(a), len(b), len(c)) == (1100, 1024, 600)
    assert a[:1024] == b                      # hash ids 0 and 1: the same 1,024 tokens
    assert shared_blocks(a, c, 32) == 0       # nothing named in common: nothing shared


def test_the_last_hash_id_covers_the_remainder_as_a_prefix_of_its_block():
    tokens = SyntheticTokens(32_000)
    whole = tokens.blocks([3, 9], 1024)
    assert tokens.blocks([3, 9], 700) == whole[:700]
    assert tokens.blocks([9], 100) == whole[512:612]
    assert tokens.blocks([4], 512) != whole[:512]


@cache
def synthetic(vocab_size: int) -> SyntheticTokens:
    return SyntheticTokens(vocab_size)


@settings(deadline=None)        # (the first example of each vocabulary builds its pool)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=6),
       st.lists(st.integers(0, 50), min_size=1, max_size=6), st.sampled_from([512, 32_000]))
def test_mooncake_prompts_share_exactly_their_common_leading_ids(ids_a, ids_b, vocab_size):
    tokens = synthetic(vocab_size)
    a = tokens.blocks(ids_a, 512 * len(ids_a))
    b = tokens.blocks(ids_b, 512 * len(ids_b))
    common = 0
    while common < min(len(ids_a), len(ids_b)) and ids_a[common] == ids_b[common]:
        common += 1
    assert shared_blocks(a, b, 512) == common
    assert all(100 <= t < vocab_size for t in a + b)


MOONCAKE = {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}
MOONCAKE_PROBLEMS = [
    ({**MOONCAKE, "input_length": None}, "input_length", "missing"),
    ({k: v for k, v in MOONCAKE.items() if k != "output_length"}, "output_length", "missing"),
    ({k: v for k, v in MOONCAKE.items() if k != "hash_ids"}, "hash_ids", "missing"),
    ({**MOONCAKE, "input_length": "1000"}, "input_length", "expected an integer >= 1"),
    ({**MOONCAKE, "output_length": 2.5}, "output_length", "expected an integer >= 1"),
    ({**MOONCAKE, "hash_ids": [1]}, "hash_ids", "1 block id(s) for input_length 1,000, which "
                                                "takes 2 block(s) of 512 tokens"),
    ({**MOONCAKE, "hash_ids": [1, 2, 3]}, "hash_ids", "3 block id(s)"),
    ({**MOONCAKE, "hash_ids": [1, "2"]}, "hash_ids[1]", "expected a block id"),
    ({**MOONCAKE, "hash_ids": [1, -2]}, "hash_ids[1]", "expected a block id"),
    ({**MOONCAKE, "hash_ids": "1,2"}, "hash_ids", "expected an array of block ids"),
    ({**MOONCAKE, "timestamp": "soon"}, "timestamp", "expected a number >= 0"),
]


@pytest.mark.parametrize("bad_line, field, message", MOONCAKE_PROBLEMS)
def test_a_bad_mooncake_line_is_named_by_file_line_and_field(tmp_path, bad_line, field, message):
    path = write_jsonl(tmp_path / "trace.jsonl", [MOONCAKE, bad_line, MOONCAKE])
    loaded = load_prompts([path])
    assert loaded.kind == "mooncake"
    [problem] = loaded.problems
    assert (problem.source, problem.field) == (f"{path}:2", field)
    assert message in problem.message
    assert str(problem).startswith(f"{path}:2: field '{field}': ")
    assert [r.source for r in loaded.records] == [f"{path}:1", f"{path}:3"]


def test_the_repository_slice_of_the_mooncake_trace():
    loaded = load_prompts([MOONCAKE_SLICE])
    assert loaded.kind == "mooncake" and loaded.problems == []
    assert len(loaded.records) == 300
    first = loaded.records[0]
    assert (first.prompt_len, first.max_tokens, first.hash_ids[:3]) == (6758, 500, [0, 1, 2])
    assert loaded.records[-1].arrival_s == 102.0


@pytest.mark.skipif(not MOONCAKE_FULL.exists(), reason="../shared/datasets is not here")
def test_the_whole_mooncake_trace_reads_without_problems():
    loaded = load_prompts([MOONCAKE_FULL])
    assert loaded.kind == "mooncake" and loaded.problems == []
    assert len(loaded.records) == 12_031


# ---------------------------------------------------------------------------------------------
# prompt_len records that name a shared prefix


def test_records_naming_a_prefix_share_its_tokens_and_nothing_else(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt_len": 1300, "prefix_id": "instruction", "prefix_len": 1000},
        {"prompt_len": 1200, "prefix_id": "instruction", "prefix_len": 1000},
        {"prompt_len": 1300, "prefix_id": 7, "prefix_len": 1000},
        {"prompt_len": 1300},
        {"prompt_len": 1000, "prefix_id": "instruction", "prefix_len": 1000},
    ])
    loaded = load_prompts([path])
    assert loaded.problems == []
    assert (loaded.records[0].prefix_id, loaded.records[2].prefix_id) == ("instruction", "7")
    a, b, other, plain, whole = (r.prompt_token_ids for r in prepare(loaded.records).requests)
    assert a[:1000] == b[:1000] == whole
    assert a[1000:1032] != b[1000:1032]       # each record's own tokens are its own
    assert shared_blocks(a, other, 32) == shared_blocks(a, plain, 32) == 0
    # a plain prompt_len record keeps the tokens it always had
    assert plain == SyntheticTokens(32_000).make(3, 1300)


PREFIX_PROBLEMS = [
    ({"prompt_len": 100, "prefix_id": "a", "prefix_len": 101}, "prefix_len",
     "101 is longer than the prompt (prompt_len 100)"),
    ({"prompt_len": 100, "prefix_id": "a"}, "prefix_len", "missing: prefix_id needs prefix_len"),
    ({"prompt_len": 100, "prefix_len": 10}, "prefix_id", "missing: prefix_len needs the prefix_id"),
    ({"prompt_len": 100, "prefix_id": "a", "prefix_len": 0}, "prefix_len", "must be >= 1"),
    ({"prompt_len": 100, "prefix_id": "", "prefix_len": 10}, "prefix_id",
     "expected a non-empty string or an integer"),
    ({"prompt": "hi", "prefix_id": "a", "prefix_len": 1}, "prefix_id",
     "a shared prefix is for prompt_len records"),
]


@pytest.mark.parametrize("bad_line, field, message", PREFIX_PROBLEMS)
def test_a_bad_prefix_is_named_by_file_line_and_field(tmp_path, bad_line, field, message):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt_len": 5}, bad_line])
    [problem] = load_prompts([path]).problems
    assert (problem.source, problem.field) == (f"{path}:2", field)
    assert message in problem.message


def test_a_record_digest_holds_what_it_shares():
    from types import SimpleNamespace

    from neuron_batch.job.resume_check import iter_request_rows

    def row(**fields):
        record = PromptRecord(0, "a", "p:1", prompt_len=100, **fields)
        request = SimpleNamespace(record=record, max_tokens=4)
        return next(iter_request_rows([request], SimpleNamespace(
            temperature=0.0, seed=0, simulated=False, ignore_eos=False)))[1]

    plain = row()
    assert len({plain, row(prefix_id="p", prefix_len=10), row(prefix_id="p", prefix_len=11),
                row(prefix_id="q", prefix_len=10), row(hash_ids=[1]), row(hash_ids=[2])}) == 6


def test_csv_and_parquet_rows_name_a_prefix_as_json_lines_do(tmp_path):
    """(the prefix_id / prefix_len columns of a table, empty or null where a row shares none)"""
    import pyarrow as pa
    import pyarrow.parquet as pq

    csv_path = tmp_path / "p.csv"
    csv_path.write_text("prompt_len,max_tokens,prefix_id,prefix_len\n1300,8,instruction,1000\n"
                        "1200,8,instruction,1000\n1300,8,,\n", encoding="utf-8")
    parquet_path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"prompt_len": [1300, 1200, 1300], "max_tokens": [8, 8, 8],
                             "prefix_id": ["instruction", "instruction", None],
                             "prefix_len": [1000.0, 1000.0, float("nan")]}), parquet_path)
    jsonl_path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt_len": 1300, "max_tokens": 8, "prefix_id": "instruction", "prefix_len": 1000},
        {"prompt_len": 1200, "max_tokens": 8, "prefix_id": "instruction", "prefix_len": 1000},
        {"prompt_len": 1300, "max_tokens": 8}])
    tokens = {}
    for path in (csv_path, parquet_path, jsonl_path):
        loaded = load_prompts([path])
        assert loaded.problems == []
        assert [(r.prefix_id, r.prefix_len) for r in loaded.records] == [
            ("instruction", 1000), ("instruction", 1000), (None, None)]
        tokens[path.suffix] = [r.prompt_token_ids for r in prepare(loaded.records).requests]
    assert tokens[".csv"] == tokens[".parquet"] == tokens[".jsonl"]
    a, b, plain = tokens[".csv"]
    assert a[:1000] == b[:1000] and shared_blocks(a, plain, 32) == 0


@pytest.mark.parametrize("bad_row, field, message", [
    ("100,a,101", "prefix_len", "101 is longer than the prompt (prompt_len 100)"),
    ("100,a,", "prefix_len", "missing: prefix_id needs prefix_len"),
    ("100,,ten", "prefix_id", "missing: prefix_len needs the prefix_id"),
    ("100,a,ten", "prefix_len", "an integer >= 1"),
])
def test_a_bad_prefix_cell_is_named_by_file_line_and_column(tmp_path, bad_row, field, message):
    path = tmp_path / "p.csv"
    path.write_text(f"prompt_len,prefix_id,prefix_len\n5,,\n{bad_row}\n", encoding="utf-8")
    [problem] = load_prompts([path]).problems
    assert (problem.source, problem.field) == (f"{path}:3", field)
    assert message in problem.message


def test_plain_synthetic_prompts_stay_apart_past_the_pool_s_lap():
    """Offsets into the pool repeat every 65,536 requests; a job of millions still gives each
    request a first block of its own (a job of fewer keeps the tokens it always had)."""
    tokens = SyntheticTokens(32_000)
    for index in (0, 1, 12_345):
        later = [tokens.make(index + lap * 65_536, 96) for lap in range(4)]
        assert all(len(t) == 96 for t in later)
        assert all(shared_blocks(a, b, 32) == 0 for a, b in itertools.combinations(later, 2))
    assert tokens.make(7, 40) == tokens._window(7 * 7919 % 65_536, 40)
