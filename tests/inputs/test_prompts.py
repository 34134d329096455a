"""Tests for neuron_batch.inputs (load, line_files, tables, records): every input format, every
field, every problem kind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_batch.inputs.load import describe_input, load_prompts
from neuron_batch.inputs.prompt_records import InputError, InputProblem, LoadedPrompts, PromptRecord

AZURE_TRACE = Path(__file__).resolve().parents[2] / "datasets" / "azure-llm-inference-conv-2023.csv"
HI = [{"role": "user", "content": "Hi"}]


def write_jsonl(path: Path, lines: list) -> Path:
    """Objects are dumped as JSON; strings are written as they are (for malformed lines)."""
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    path.write_text(text, encoding="utf-8")
    return path


def only_problem(loaded: LoadedPrompts) -> InputProblem:
    assert len(loaded.problems) == 1, [str(problem) for problem in loaded.problems]
    return loaded.problems[0]


def summary(records: list[PromptRecord], *names: str) -> list[tuple]:
    return [tuple(getattr(record, name) for name in names) for record in records]


# ---------------------------------------------------------------------------------------------
# JSONL: fields


def test_jsonl_every_field(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "Hello", "id": "a", "max_tokens": 5, "temperature": 0.7, "stop": "END"},
        {"messages": HI, "custom_id": 17, "stop": ["x", "y"]},
        {"prompt_token_ids": [0, 5, 9], "temperature": 0},
        {"prompt_len": 128, "max_tokens": 64.0},
    ])
    loaded = load_prompts([path])
    assert loaded.kind == "jsonl" and loaded.problems == []
    first, chat, tokens, synthetic = loaded.records
    assert first == PromptRecord(index=0, id="a", source=f"{path}:1", prompt="Hello",
                                 max_tokens=5, temperature=0.7, stop=["END"])
    assert (chat.messages, chat.id, chat.stop) == (HI, "17", ["x", "y"])
    assert (tokens.prompt_token_ids, tokens.temperature, tokens.id) == ([0, 5, 9], 0.0, "2")
    assert (synthetic.prompt_len, synthetic.max_tokens) == (128, 64)
    assert isinstance(synthetic.max_tokens, int)
    assert summary(loaded.records, "index", "source") == [(n, f"{path}:{n + 1}") for n in range(4)]


def test_jsonl_nulls_count_as_absent_and_unknown_keys_are_refused_unless_ignored(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": None, "messages": [{"role": "user", "content": "Hi", "name": None}],
         "max_tokens": None, "meta": {"x": 1}},
    ])
    problem = only_problem(load_prompts([path]))
    assert (problem.source, problem.field) == (f"{path}:1", "meta")
    assert "--ignore-field meta" in problem.message
    (record,) = load_prompts([path], ignored=["meta"]).records
    assert record.messages == HI and record.max_tokens is None


def test_jsonl_blank_lines_crlf_and_bom(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a"}\r\n\r\n   \n{"prompt": "b\\u2028c"}\r\n{bad\n')
    loaded = load_prompts([path])
    assert summary(loaded.records, "prompt", "source") == [("a", f"{path}:1"),
                                                          ("b\u2028c", f"{path}:4")]
    assert only_problem(loaded).source == f"{path}:5"


def test_jsonl_splits_on_newline_only(tmp_path):
    """Raw U+2028 and U+0085 are legal inside JSON strings; str.splitlines() would split there."""
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a\u2028b\x85c"}\n{"prompt": "e"}\n', encoding="utf-8")
    loaded = load_prompts([path])
    assert [record.prompt for record in loaded.records] == ["a\u2028b\x85c", "e"]
    assert loaded.records[1].source == f"{path}:2"


def test_json_array_file(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps([{"prompt": "a"}, {"prompt": ""}, {"prompt": "c"}], indent=2))
    loaded = load_prompts([path])
    assert [record.prompt for record in loaded.records] == ["a", "c"]
    assert str(only_problem(loaded)) == f"{path}:item 1: field 'prompt': empty prompt"


def test_json_file_with_one_object_a_line(tmp_path):
    path = write_jsonl(tmp_path / "p.json", [{"prompt": "a"}, {"prompt": "b"}])
    assert [record.prompt for record in load_prompts([path]).records] == ["a", "b"]


# ---------------------------------------------------------------------------------------------
# JSONL: problems, each with its line and field

GOOD = {"prompt": "fine"}
X = {"prompt": "x"}

PROBLEM_CASES = [
    # (line 2 of the file, expected field, expected part of the message)
    ('{"prompt": "x"', None, "malformed JSON: Expecting ',' delimiter (column 15)"),
    ('[1, 2]', None, "expected a JSON object, got [1, 2] (array)"),
    ({"text": "x", "max_tokens": 3}, None,
     "no prompt: expected one of 'prompt', 'messages', 'prompt_token_ids', 'prompt_len' "
     "(keys found: 'text', 'max_tokens')"),
    ({"prompt": ""}, "prompt", "empty prompt"),
    ({"prompt": "  \n "}, "prompt", "empty prompt"),
    ({"prompt": 5}, "prompt", "expected a string, got 5 (integer)"),
    ({"prompt": "x", "messages": HI}, "messages", "conflicts with 'prompt'"),
    ({"prompt_len": 5, "prompt_token_ids": [1]}, "prompt_len", "conflicts with 'prompt_token_ids'"),
    ({"messages": []}, "messages", "expected a non-empty array"),
    ({"messages": "hi"}, "messages", "expected a non-empty array"),
    ({"messages": [HI[0], "b"]}, "messages[1]", "expected an object"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "expected a string, got None (null)"),
    ({"messages": [{"role": 1, "content": "a"}]}, "messages[0].role", "expected a string"),
    ({"messages": [{"role": "", "content": "a"}]}, "messages[0].role", "empty role"),
    ({"prompt_token_ids": []}, "prompt_token_ids", "non-empty array of token ids"),
    ({"prompt_token_ids": [1, -2]}, "prompt_token_ids[1]",
     "expected a token id (integer >= 0), got -2"),
    ({"prompt_token_ids": [1, True]}, "prompt_token_ids[1]", "expected a token id"),
    ({"prompt_token_ids": [1, 2.5]}, "prompt_token_ids[1]", "expected a token id"),
    ({"prompt_len": 0}, "prompt_len", "must be >= 1, got 0"),
    ({"prompt_len": "12"}, "prompt_len", "expected an integer >= 1, got '12' (string)"),
    ({**X, "max_tokens": -1}, "max_tokens", "must be >= 1, got -1"),
    ({**X, "max_tokens": 2.5}, "max_tokens", "expected an integer >= 1, got 2.5 (number)"),
    ({**X, "max_tokens": True}, "max_tokens", "expected an integer >= 1, got True (boolean)"),
    ({**X, "temperature": -0.5}, "temperature", "must be >= 0, got -0.5"),
    ({**X, "temperature": "hot"}, "temperature", "expected a number >= 0"),
    ('{"prompt": "x", "temperature": NaN}', "temperature", "expected a number >= 0"),
    ({**X, "stop": 3}, "stop", "expected a non-empty string or an array of them"),
    ({**X, "stop": ["a", 1]}, "stop", "expected a non-empty string or an array of them"),
    ({**X, "stop": ""}, "stop", "expected a non-empty string"),
    ({**X, "id": ""}, "id", "expected a non-empty string or an integer"),
    ({**X, "id": [1]}, "id", "expected a non-empty string or an integer"),
    ({**X, "custom_id": False}, "custom_id", "expected a non-empty string or an integer"),
    ({**X, "id": "a", "custom_id": "b"}, "custom_id", "differs from 'id' ('a')"),
]


@pytest.mark.parametrize("bad_line, field, message", PROBLEM_CASES)
def test_jsonl_problem_names_line_and_field(tmp_path, bad_line, field, message):
    path = write_jsonl(tmp_path / "p.jsonl", [GOOD, bad_line, GOOD])
    loaded = load_prompts([path])
    problem = only_problem(loaded)
    assert problem.source == f"{path}:2"
    assert problem.field == field
    assert message in problem.message
    prefix = f"{path}:2: " if field is None else f"{path}:2: field '{field}': "
    assert str(problem).startswith(prefix)
    # The bad line is left out; good ones keep consecutive indices and their own lines.
    assert summary(loaded.records, "index", "source") == [(0, f"{path}:1"), (1, f"{path}:3")]


def test_invalid_utf8_line_is_a_problem(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
    loaded = load_prompts([path])
    assert len(loaded.records) == 1
    problem = only_problem(loaded)
    assert (problem.source, problem.field) == (f"{path}:2", None)
    assert problem.message.startswith("not valid UTF-8")


def test_duplicate_id_is_a_problem_on_the_second_occurrence(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "id": "x"}, {"prompt": "b"},
                                              {"prompt": "c", "id": "x"}])
    loaded = load_prompts([path])
    assert [record.prompt for record in loaded.records] == ["a", "b"]
    assert str(only_problem(loaded)) == (f"{path}:3: field 'id': duplicate id 'x' "
                                         f"(first used at {path}:1); ids must be unique")


def test_duplicate_ids_across_inputs_and_custom_id_field(tmp_path):
    first = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "a", "custom_id": "req-1"}])
    second = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "b", "custom_id": "req-1"}])
    problem = only_problem(load_prompts([first, second]))
    assert (problem.source, problem.field) == (f"{second}:1", "custom_id")


def test_default_id_colliding_with_an_explicit_id(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "id": "1"}, {"prompt": "b"}])
    problem = only_problem(load_prompts([path]))
    assert problem.source == f"{path}:2" and "give it an explicit id" in problem.message


def test_a_default_id_does_not_shift_after_a_skipped_line(tmp_path):
    # Line 2 is bad and left out: line 3 keeps the id it has once line 2 is fixed, so a resume
    # after the fix finds the same ids (it had "1", line 2's, before).
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": 5}\n{"prompt": "c"}\n')
    loaded = load_prompts([path])
    assert only_problem(loaded).source == f"{path}:2"
    assert summary(loaded.records, "index", "id") == [(0, "0"), (1, "2")]
    path.write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c"}\n')
    assert [record.id for record in load_prompts([path]).records] == ["0", "1", "2"]


# ---------------------------------------------------------------------------------------------
# Order, ids, shuffle, limit, defaults


def numbered_file(tmp_path, count=20) -> Path:
    return write_jsonl(tmp_path / "n.jsonl", [{"prompt": f"p{n}"} for n in range(count)])


def test_limit_keeps_the_first_records(tmp_path):
    loaded = load_prompts([numbered_file(tmp_path)], limit=3)
    assert summary(loaded.records, "index", "id", "prompt") == [
        (0, "0", "p0"), (1, "1", "p1"), (2, "2", "p2")]
    assert load_prompts([numbered_file(tmp_path)], limit=0).records == []


def test_shuffle_is_deterministic_ids_are_stable_and_limit_comes_after(tmp_path):
    path = numbered_file(tmp_path)

    def prompts(records):
        return [record.prompt for record in records]

    shuffled = load_prompts([path], shuffle=True, seed=3).records
    assert prompts(shuffled) == prompts(load_prompts([path], shuffle=True, seed=3).records)
    assert prompts(shuffled) != prompts(load_prompts([path], shuffle=True, seed=4).records)
    assert prompts(shuffled) != [f"p{n}" for n in range(20)]
    assert all(r.id == r.prompt[1:] for r in shuffled)  # the id is the position before shuffling
    assert [r.index for r in shuffled] == list(range(20))
    limited = load_prompts([path], shuffle=True, seed=3, limit=5).records
    assert prompts(limited) == prompts(shuffled[:5])
    assert [r.index for r in limited] == list(range(5))


def test_default_max_tokens_fills_only_missing(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}, {"prompt": "b", "max_tokens": 7}])
    loaded = load_prompts([path], default_max_tokens=100)
    assert [record.max_tokens for record in loaded.records] == [100, 7]


def test_a_single_path_is_one_input(tmp_path):
    path = numbered_file(tmp_path, count=2)
    assert len(load_prompts(path).records) == len(load_prompts(str(path)).records) == 2


def test_bad_arguments():
    with pytest.raises(ValueError, match="limit"):
        load_prompts(["x.txt"], limit=-1)
    with pytest.raises(ValueError, match="default_max_tokens"):
        load_prompts(["x.txt"], default_max_tokens=0)
    with pytest.raises(InputError, match="no inputs"):
        load_prompts([])


def test_several_inputs_are_numbered_in_order(tmp_path):
    jsonl = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "a"}, {"prompt": "b"}])
    text = tmp_path / "b.txt"
    text.write_text("c\nd\n")
    loaded = load_prompts([jsonl, str(text)])
    assert summary(loaded.records, "index", "id", "prompt") == [
        (0, "0", "a"), (1, "1", "b"), (2, "2", "c"), (3, "3", "d")]
    assert loaded.kind == "mixed" and loaded.inputs == [str(jsonl), str(text)]
    assert describe_input(loaded) == "4 prompts from 2 inputs"
    same_kind = load_prompts([text, text])
    assert same_kind.kind == "text"
    assert describe_input(same_kind) == "4 prompts from 2 text inputs"


# ---------------------------------------------------------------------------------------------
# OpenAI batch files


def batch_line(custom_id, url="/v1/chat/completions", **body):
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def chat_line(custom_id="b", **body):
    return batch_line(custom_id, messages=[{"role": "user", "content": "x"}], **body)


def test_openai_batch_completions_and_chat(tmp_path):
    path = write_jsonl(tmp_path / "batch.jsonl", [
        batch_line("c-1", "/v1/completions", model="m", prompt="Once", max_tokens=12,
                   temperature=0.2, stop="\n"),
        batch_line("c-2", model="m", messages=[{"role": "system", "content": "Be brief"}, *HI],
                   max_completion_tokens=30, max_tokens=99),
        batch_line("c-3", "/v1/completions", prompt=[1, 2, 3]),
    ])
    loaded = load_prompts([path])
    assert loaded.kind == "openai-batch" and loaded.problems == []
    completion, chat, tokens = loaded.records
    assert completion == PromptRecord(
        index=0, id="c-1", source=f"{path}:1", prompt="Once", max_tokens=12, temperature=0.2,
        stop=["\n"], openai={"custom_id": "c-1", "url": "/v1/completions", "model": "m"})
    assert chat.messages[1] == HI[0] and chat.max_tokens == 30
    assert chat.openai == {"custom_id": "c-2", "url": "/v1/chat/completions", "model": "m"}
    assert tokens.prompt_token_ids == [1, 2, 3] and tokens.openai["model"] is None
    assert describe_input(loaded) == ("3 prompts from OpenAI batch batch.jsonl "
                                      "(prompt lengths p50 3 / max 3 tokens)")


@pytest.mark.parametrize("bad_line, field, message", [
    ({**batch_line("b", "/v1/completions", prompt="x"), "method": "GET"}, "method",
     'expected "POST"'),
    (batch_line("b", "/v1/moderations", input="x"), "url",
     "/v1/moderations is not run here: moderation is OpenAI's own classifier"),
    (batch_line("b", "/v1/embeddings", input="x", messages=HI), "body.messages",
     "not a field an embeddings body takes"),
    ({"custom_id": "b", "url": "/v1/completions", "body": "x"}, "body", "expected an object"),
    ({"url": "/v1/completions", "body": {"prompt": "x"}}, "custom_id", "missing"),
    (batch_line("b", "/v1/completions", messages=[]), "body.prompt", "missing prompt"),
    (batch_line("b", "/v1/completions", prompt=["a", "b"]), "body.prompt", "expected a string"),
    (batch_line("b", messages=[{"role": "user", "content": 3}]), "body.messages[0].content",
     "expected a string"),
    (chat_line(max_tokens=0), "body.max_tokens", "must be >= 1"),
    (chat_line(max_completion_tokens="5"), "body.max_completion_tokens", "expected an integer"),
    (chat_line(temperature=-1), "body.temperature", ">= 0"),
    (chat_line(stop=[""]), "body.stop", "non-empty string"),
    (chat_line(model=3), "body.model", "expected a string"),
    (chat_line("a"), "custom_id", "duplicate id 'a'"),
])
def test_openai_batch_problems(tmp_path, bad_line, field, message):
    path = write_jsonl(tmp_path / "batch.jsonl", [chat_line("a"), bad_line])
    loaded = load_prompts([path])
    problem = only_problem(loaded)
    assert (problem.source, problem.field) == (f"{path}:2", field)
    assert message in problem.message
    assert [record.id for record in loaded.records] == ["a"]


def test_the_first_object_decides_the_format(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", ["not json", {"prompt": "a"}, chat_line("x")])
    loaded = load_prompts([path])
    assert loaded.kind == "jsonl"
    assert [problem.source for problem in loaded.problems] == [f"{path}:1", f"{path}:3"]
    assert "keys found: 'custom_id', 'method', 'url', 'body'" in loaded.problems[1].message


# ---------------------------------------------------------------------------------------------
# CSV


def test_csv_prompt_column_with_optional_columns(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text('id,prompt,max_tokens,temperature,stop\n'
                    'q1,"Hello, world",8,0.5,END\n'
                    'q2,"two\nlines",,,\n'
                    ',plain,,,\n', encoding="utf-8")
    loaded = load_prompts([path])
    assert loaded.kind == "csv" and loaded.problems == []
    fields = ("id", "prompt", "max_tokens", "temperature", "stop", "source")
    assert summary(loaded.records, *fields) == [
        ("q1", "Hello, world", 8, 0.5, ["END"], f"{path}:2"),
        ("q2", "two\nlines", None, None, None, f"{path}:3"),
        ("2", "plain", None, None, None, f"{path}:5"),  # the quoted value above spans lines 3-4
    ]


def test_csv_named_prompt_column_and_bom(tmp_path):
    path = tmp_path / "p.csv"
    path.write_bytes("\ufeffquestion,other\nWhy?,x\n".encode("utf-8"))
    loaded = load_prompts([path], prompt_column="question")
    assert [record.prompt for record in loaded.records] == ["Why?"]


def test_csv_problems_name_the_real_line_and_column(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text('prompt,max_tokens\n"multi\nline",4\n,4\nok,zero\nok,0\na,b,c\n\nfine,2\n')
    loaded = load_prompts([path])
    assert [str(problem) for problem in loaded.problems] == [
        f"{path}:4: field 'prompt': missing prompt",
        f"{path}:5: field 'max_tokens': expected an integer >= 1, got 'zero' (string)",
        f"{path}:6: field 'max_tokens': must be >= 1, got 0",
        f"{path}:7: 3 values but the header has 2 columns (an unquoted comma?)",
    ]
    assert summary(loaded.records, "prompt", "source") == [("multi\nline", f"{path}:2"),
                                                          ("fine", f"{path}:9")]


def test_csv_messages_and_token_id_columns_hold_json(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text('messages\n"[{""role"": ""user"", ""content"": ""Hi""}]"\nnot json\n')
    loaded = load_prompts([path])
    assert loaded.records[0].messages == HI
    assert str(only_problem(loaded)).startswith(
        f"{path}:3: field 'messages': expected a JSON array")
    path.write_text('prompt_token_ids\n"[1, 2]"\n')
    assert load_prompts([path]).records[0].prompt_token_ids == [1, 2]


def test_tsv(tmp_path):
    path = tmp_path / "p.tsv"
    path.write_text("prompt\tid\nHello, there\tx\n")
    (record,) = load_prompts([path]).records
    assert (record.prompt, record.id) == ("Hello, there", "x")


def test_csv_without_a_usable_column(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("text,label\nhi,1\n")
    with pytest.raises(InputError) as error:
        load_prompts([path])
    message = str(error.value)
    assert message.startswith(f"{path}: no 'prompt' column")
    assert "columns found: 'text', 'label'" in message and "--prompt-column" in message


def test_vidur_trace_csv(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                    "0.0,374,44\n4.5,396,109\n7,0,5\n")
    loaded = load_prompts([path])
    assert loaded.kind == "trace"
    assert summary(loaded.records, "prompt_len", "max_tokens", "arrival_s", "id") == [
        (374, 44, 0.0, "0"), (396, 109, 4.5, "1")]
    assert str(only_problem(loaded)) == (f"{path}:4: field 'num_prefill_tokens': "
                                         "must be >= 1, got 0")
    assert describe_input(loaded) == ("2 prompts from trace trace.csv (prompt lengths p50 374 / "
                                      "max 396 tokens); 1 line with problems left out")


def test_azure_raw_trace_csv(tmp_path):
    path = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:50.9951690,396,109\n"
                    "yesterday,1,1\n"
                    "2023-11-16 18:16:46.6805900,10,\n")
    loaded = load_prompts([path])
    assert summary(loaded.records, "prompt_len", "max_tokens") == [(374, 44), (396, 109)]
    assert loaded.records[0].arrival_s == 0.0
    assert loaded.records[1].arrival_s == pytest.approx(4.314579)
    assert summary(loaded.problems, "source", "field") == [(f"{path}:4", "TIMESTAMP"),
                                                           (f"{path}:5", "GeneratedTokens")]


def test_trace_without_arrival_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens,id\n5,6,r1\n")
    (record,) = load_prompts([path]).records
    assert (record.prompt_len, record.max_tokens, record.arrival_s, record.id) == (5, 6, None, "r1")


@pytest.mark.skipif(not AZURE_TRACE.exists(), reason="the Azure trace copy in datasets/ is missing")
def test_real_azure_trace():
    loaded = load_prompts([AZURE_TRACE])
    assert loaded.kind == "trace" and loaded.problems == []
    assert len(loaded.records) == 19_366
    assert summary(loaded.records[:2], "prompt_len", "max_tokens", "arrival_s", "source") == [
        (374, 44, 0.0, f"{AZURE_TRACE}:2"), (396, 109, 4.314579, f"{AZURE_TRACE}:3")]
    assert all(r.prompt_len >= 1 and r.max_tokens >= 1 and r.arrival_s >= 0
               for r in loaded.records)
    assert describe_input(loaded) == ("19,366 prompts from trace azure-llm-inference-conv-2023.csv "
                                      "(prompt lengths p50 1,020 / max 14,050 tokens)")


# ---------------------------------------------------------------------------------------------
# Parquet


def test_parquet_prompts_and_problem_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    table = pa.table({"prompt": ["a", None, "c"], "max_tokens": [3, 4, -1], "id": [10, 11, 12]})
    pq.write_table(table, path)
    loaded = load_prompts([path])
    assert loaded.kind == "parquet"
    assert summary(loaded.records, "id", "prompt", "max_tokens", "source") == [
        ("10", "a", 3, f"{path}:row 0")]
    assert [str(problem) for problem in loaded.problems] == [
        f"{path}:row 1: field 'prompt': missing prompt",
        f"{path}:row 2: field 'max_tokens': must be >= 1, got -1",
    ]


def test_parquet_messages_and_trace(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    chat = tmp_path / "chat.parquet"
    conversations = [HI, [{"role": "user", "content": "Yo"}, {"role": "assistant", "content": "?"}]]
    pq.write_table(pa.table({"messages": conversations}), chat)
    assert load_prompts([chat]).records[1].messages == conversations[1]
    trace = tmp_path / "trace.parquet"
    pq.write_table(pa.table({"num_prefill_tokens": [10, 20], "num_decode_tokens": [1, 2],
                             "arrived_at": [0.0, 0.5]}), trace)
    loaded = load_prompts([trace])
    assert loaded.kind == "trace"
    assert summary(loaded.records, "prompt_len", "max_tokens", "arrival_s") == [
        (10, 1, 0.0), (20, 2, 0.5)]


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "p.parquet"
    path.write_text("prompt\nhello\n")
    with pytest.raises(InputError, match=f"{path}: not a readable Parquet file"):
        load_prompts([path])


# ---------------------------------------------------------------------------------------------
# Plain text


@pytest.mark.parametrize("name", ["prompts.txt", "prompts.md", "prompts"])
def test_text_one_prompt_a_line(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"First prompt\r\n\r\n   \t\n  Second, indented \nThird")
    loaded = load_prompts([path])
    assert loaded.kind == "text" and loaded.problems == []
    assert summary(loaded.records, "prompt", "source") == [
        ("First prompt", f"{path}:1"), ("  Second, indented ", f"{path}:4"), ("Third", f"{path}:5")]
    assert describe_input(loaded) == f"3 prompts from text {name}"


def test_text_line_that_is_not_utf8(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes("caf\u00e9\n".encode("latin-1") + b"fine\n")
    loaded = load_prompts([path])
    assert [record.prompt for record in loaded.records] == ["fine"]
    assert only_problem(loaded).source == f"{path}:1"


def test_binary_file_is_an_input_error(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\x00\x01\x02garbage")
    with pytest.raises(InputError, match="looks like a binary file"):
        load_prompts([path])


# ---------------------------------------------------------------------------------------------
# Hugging Face data sets


def test_saved_dataset(tmp_path):
    import datasets

    directory = tmp_path / "single"
    datasets.Dataset.from_dict({"prompt": ["a", "b", ""], "id": ["x", "y", "z"]}).save_to_disk(
        directory)
    loaded = load_prompts([directory])
    assert loaded.kind == "hf"
    assert summary(loaded.records, "id", "prompt", "source") == [
        ("x", "a", f"{directory}:row 0"), ("y", "b", f"{directory}:row 1")]
    assert str(only_problem(loaded)) == f"{directory}:row 2: field 'prompt': empty prompt"


def test_saved_dataset_dict_picks_the_split(tmp_path):
    import datasets

    directory = tmp_path / "dict"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"text": ["t1"]}),
        "test": datasets.Dataset.from_dict({"text": ["u1", "u2"]}),
    }).save_to_disk(directory)
    loaded = load_prompts([directory], split="test", prompt_column="text")
    assert summary(loaded.records, "prompt", "source") == [
        ("u1", f"{directory}[test] row 0"), ("u2", f"{directory}[test] row 1")]
    expected = r"no split 'validation' \(splits: train, test\); choose one with --split"
    with pytest.raises(InputError, match=expected):
        load_prompts([directory], split="validation", prompt_column="text")


def test_saved_dataset_with_messages_and_trace_columns(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"messages": [HI], "label": [1]}).save_to_disk(tmp_path / "chat")
    assert load_prompts([tmp_path / "chat"]).records[0].messages == HI
    trace = datasets.Dataset.from_dict({"ContextTokens": [7], "GeneratedTokens": [3]})
    trace.save_to_disk(tmp_path / "trace")
    loaded = load_prompts([tmp_path / "trace"])
    assert loaded.kind == "trace"
    assert summary(loaded.records, "prompt_len", "max_tokens") == [(7, 3)]


def test_hub_dataset_passes_name_config_and_split(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return datasets.Dataset.from_dict({"question": ["q0", "q1"]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    loaded = load_prompts(["hf:org/qa:v2"], split="validation", prompt_column="question")
    assert calls == [("org/qa", "v2", "validation")]
    assert loaded.kind == "hf"
    assert summary(loaded.records, "prompt", "source") == [
        ("q0", "hf:org/qa:v2[validation] row 0"), ("q1", "hf:org/qa:v2[validation] row 1")]
    assert describe_input(loaded) == "2 prompts from data set hf:org/qa:v2"
    load_prompts(["hf:squad"], prompt_column="question")
    assert calls[-1] == ("squad", None, "train")


def test_hub_dataset_load_failure_is_an_input_error(monkeypatch):
    import datasets

    def failing_load_dataset(*args, **kwargs):
        raise FileNotFoundError("Dataset 'nope' doesn't exist on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", failing_load_dataset)
    with pytest.raises(InputError, match="hf:nope: cannot load split 'train': FileNotFoundError"):
        load_prompts(["hf:nope"])


@pytest.mark.parametrize("spec", ["hf:", "hf:a:b:c", "hf:name:"])
def test_bad_hub_syntax(spec):
    with pytest.raises(InputError, match="expected hf:NAME or hf:NAME:CONFIG"):
        load_prompts([spec])


# ---------------------------------------------------------------------------------------------
# Inputs that cannot be used at all


def test_missing_file(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(InputError, match=f"^{path}: no such file or directory$"):
        load_prompts([path])


def test_directory_that_is_not_a_dataset(tmp_path):
    with pytest.raises(InputError, match="not a data set saved with save_to_disk"):
        load_prompts([tmp_path])


@pytest.mark.parametrize("name, content", [
    ("empty.jsonl", ""), ("blank.jsonl", "\n  \n"), ("blank.txt", " \n\t\n"),
    ("header.csv", "prompt\n"), ("nothing.csv", ""),
])
def test_input_without_prompts(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(InputError, match=f"{path}: no prompts found"):
        load_prompts([path])


def test_input_of_only_problems_is_not_an_input_error(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": ""}])
    loaded = load_prompts([path])
    assert loaded.records == [] and len(loaded.problems) == 1
    assert describe_input(loaded) == "0 prompts from JSONL p.jsonl; 1 line with problems left out"


def test_import_is_light():
    """Importing the prompt modules must not pull in vLLM, torch, datasets or pyarrow."""
    code = ("import sys, neuron_batch.inputs.load; "
            "print([m for m in ('vllm', 'torch', 'datasets', 'pyarrow') if m in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, cwd=Path(__file__).resolve().parents[2])
    assert result.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------
# Property: valid JSONL objects load back to the same prompts, in order

any_text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)
prompt_text = any_text.filter(lambda text: text.strip())
message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                 "content": any_text})
prompt_fields = st.one_of(
    st.fixed_dictionaries({"prompt": prompt_text}),
    st.fixed_dictionaries({"messages": st.lists(message, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"prompt_token_ids": st.lists(st.integers(0, 200_000), min_size=1,
                                                         max_size=8)}),
    st.fixed_dictionaries({"prompt_len": st.integers(1, 100_000)}),
)
optional_fields = st.fixed_dictionaries({}, optional={
    "max_tokens": st.integers(1, 4096),
    "temperature": st.floats(0, 2, allow_nan=False),
    "stop": st.one_of(prompt_text, st.lists(prompt_text, min_size=1, max_size=2)),
})
valid_object = st.builds(lambda prompt, extra: {**prompt, **extra}, prompt_fields, optional_fields)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(objects=st.lists(valid_object, min_size=1, max_size=8), ascii_only=st.booleans())
def test_valid_jsonl_round_trips(tmp_path, objects, ascii_only):
    path = tmp_path / "round-trip.jsonl"
    lines = [json.dumps(obj, ensure_ascii=ascii_only) + "\n" for obj in objects]
    path.write_text("".join(lines), encoding="utf-8")
    loaded = load_prompts([path])
    assert loaded.problems == []
    assert len(loaded.records) == len(objects)
    for position, (record, obj) in enumerate(zip(loaded.records, objects)):
        assert (record.index, record.id) == (position, str(position))
        assert record.source == f"{path}:{position + 1}"
        assert record.prompt == obj.get("prompt")
        assert record.messages == obj.get("messages")
        assert record.prompt_token_ids == obj.get("prompt_token_ids")
        assert record.prompt_len == obj.get("prompt_len")
        assert record.max_tokens == obj.get("max_tokens")
        assert record.temperature == obj.get("temperature")
        stop = obj.get("stop")
        assert record.stop == ([stop] if isinstance(stop, str) else stop)
