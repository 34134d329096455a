"""The OpenAI batch contract's rules without an engine (issue 47): the defaults a line runs
with by its format, tool calling refused for its real reason, stop strings refused up front
where the run has no text to match them in, error records in OpenAI's error-file shape, and
batch.json as OpenAI's Batch object (counts, usage, status, kept current, a full disk)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.inputs.json_requests import record_from_batch_request, record_from_object
from neuron_batch.inputs.prompt_records import FieldError, InputProblem, PromptRecord
from neuron_batch.inputs.request_fields import (
    OPENAI_DEFAULTS,
    apply_openai_defaults,
    default_temperature,
    openai_defaults,
)
from neuron_batch.inputs.request_paths import PATHS, stop_refusals
from neuron_batch.job import batch_object
from neuron_batch.job.batch_object import BatchFile
from neuron_batch.job.folder import OutputError
from neuron_batch.job.outputs import problem_error_row, request_error_row
from neuron_batch.job.outputs_tally import OutputsTally, row_usage


def chat(custom_id: str = "a", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}],
                     **body}}


def batch_record(line: dict) -> PromptRecord:
    return record_from_batch_request(line, "b.jsonl:1")[0]


# -- defaults ----------------------------------------------------------------------------------

def test_an_openai_line_samples_by_default_and_a_plain_line_is_greedy():
    openai = batch_record(chat())
    plain = record_from_object({"prompt": "Hi"}, "p.jsonl:1")[0]
    assert default_temperature(openai, None) == OPENAI_DEFAULTS["temperature"] == 1.0
    assert default_temperature(plain, None) == 0.0
    # --temperature overrides both formats' defaults, never a line's own
    assert default_temperature(openai, 0.0) == default_temperature(plain, 0.0) == 0.0
    own = batch_record(chat(temperature=0.3))
    assert default_temperature(own, 0.0) == 0.3


def test_the_models_generation_config_is_an_openai_lines_default_as_in_vllm(tmp_path):
    assert openai_defaults(str(tmp_path)) == (OPENAI_DEFAULTS, "OpenAI's")
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_new_tokens": 5, "do_sample": True}))
    defaults, source = openai_defaults(str(tmp_path))
    assert defaults == {"temperature": 0.6, "top_p": 0.9, "top_k": 20}
    assert source == "the model's generation_config.json"
    records = [batch_record(chat()), batch_record(chat(top_k=3, temperature=0.0)),
               record_from_object({"prompt": "Hi"}, "p.jsonl:1")[0]]
    sim = PATHS[("sim", None)]
    assert apply_openai_defaults(records, defaults, run_temperature=None,
                                 honours=sim.honours) == 2
    assert (records[0].temperature, records[0].sampling) == (0.6, {"top_p": 0.9, "top_k": 20})
    # a line's own fields stay; a plain line takes no OpenAI default
    assert (records[1].temperature, records[1].sampling) == (0.0, {"top_k": 3, "top_p": 0.9})
    assert (records[2].temperature, records[2].sampling) == (None, None)
    # a default the path cannot honour is not a request it refuses: left out
    optimum = PATHS[("sim", "optimum-neuron")]
    again = batch_record(chat())
    apply_openai_defaults([again], {**defaults, "repetition_penalty": 1.2},
                          run_temperature=0.0, honours=optimum.honours)
    assert again.temperature is None and again.sampling == {"top_p": 0.9, "top_k": 20}


# -- tools and stop strings ---------------------------------------------------------------------

def test_a_chat_lines_tools_are_read_and_the_old_form_refused_for_its_reason():
    tools = [{"type": "function", "function": {"name": "f"}}]
    record = batch_record(chat(tools=tools, tool_choice="required"))
    assert record.sampling == {"tools": {"tools": tools, "tool_choice": "required",
                                         "parallel_tool_calls": None}}
    assert batch_record(chat(tools=tools)).sampling["tools"]["tool_choice"] == "auto"
    for field in ("functions", "function_call"):
        with pytest.raises(FieldError) as refused:
            batch_record(chat(**{field: [tools[0]["function"]]}))
        assert refused.value.field == f"body.{field}"
        assert "give 'body.tools'" in refused.value.message
        assert "not a field" not in refused.value.message
        assert f"--ignore-field body.{field}" in refused.value.message
        # dropped on request, the line runs as plain chat
        line = chat(**{field: [{"type": "function"}]})
        assert record_from_batch_request(line, "b.jsonl:1", ignored=(f"body.{field}",))
    # a completions line takes no tools, for that reason
    completion = {**chat(), "url": "/v1/completions",
                  "body": {"prompt": "Hi", "tools": tools}}
    with pytest.raises(FieldError, match="/v1/chat/completions line's tools"):
        batch_record(completion)


def test_include_stop_str_in_output_is_read_and_checked():
    record = batch_record(chat(stop=["\n"], include_stop_str_in_output=True))
    assert record.stop == ["\n"] and record.sampling == {"include_stop_str_in_output": True}
    with pytest.raises(FieldError, match="expected true or false"):
        batch_record(chat(include_stop_str_in_output="yes"))


def test_stop_strings_are_refused_up_front_where_no_text_is_made():
    records = [batch_record(chat("s", stop=["\n"])), batch_record(chat("t", stop_token_ids=[2])),
               record_from_object({"id": "j", "prompt": "Hi", "stop": "."}, "p.jsonl:4")[0]]
    kept, problems = stop_refusals(records, has_tokenizer=True, simulated=True, on_ray=False)
    assert kept == records and problems == []
    kept, problems = stop_refusals(records, has_tokenizer=False, simulated=False, on_ray=False)
    assert [r.id for r in kept] == ["t"]       # stop_token_ids need no text
    assert [(p.source, p.field, p.custom_id) for p in problems] == [
        ("b.jsonl:1", "body.stop", "s"), ("p.jsonl:4", "stop", "j")]
    assert "no tokenizer" in problems[0].message and "--ignore-field body.stop" in \
        problems[0].message
    _, on_ray = stop_refusals(records, has_tokenizer=True, simulated=True, on_ray=True)
    assert "without --replicas" in on_ray[0].message


# -- error records --------------------------------------------------------------------------------

def test_an_error_record_is_openais_error_file_line_with_the_lines_custom_id():
    from openai.types import BatchError

    problem = InputProblem("b.jsonl:3", "url", "expected one of ...", read_order=2,
                           custom_id="r-3")
    row = problem_error_row(problem, openai=True)
    assert row["custom_id"] == "r-3" and row["response"]["status_code"] == 400
    assert row["error"]["code"] == "invalid_request" and row["error"]["line"] == 3
    assert row["response"]["body"]["error"]["param"] == "url"
    BatchError.model_validate(row["error"])
    too_long = InputProblem("b.jsonl:4", "body.messages", "too long", too_long=True,
                            custom_id="r-4")
    assert problem_error_row(too_long, openai=True)["error"]["code"] == "context_length_exceeded"
    plain = problem_error_row(InputProblem("p.jsonl:2", "prompt", "bad", custom_id="x"),
                              openai=False)
    assert plain == {"id": "x", "error": {"code": "invalid_request", "message": "p.jsonl:2: "
                     "field 'prompt': bad", "param": "prompt", "file": "p.jsonl", "line": 2}}
    failed = request_error_row(batch_record(chat("e")), "engine_error", "too big")
    assert failed["response"]["status_code"] == 500 and failed["custom_id"] == "e"


# -- batch.json ----------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def read(folder: Path) -> dict:
    return json.loads((folder / batch_object.BATCH).read_text())


def test_batch_json_is_openais_batch_object_kept_current(tmp_path):
    from openai.types import Batch

    clock = Clock()
    batch = BatchFile(tmp_path, tmp_path / "errors.jsonl", total=5, inputs=["in.jsonl"],
                      endpoint="/v1/chat/completions", model="m", clock=clock)
    done = {"response": {"body": {"usage": {"prompt_tokens": 10, "completion_tokens": 3,
                                            "prompt_tokens_details": {"cached_tokens": 4}}}}}
    tally = OutputsTally()
    tally.add(done, 100)
    batch.start(tally, failed=1)
    first = read(tmp_path)
    Batch.model_validate(first)
    assert first["status"] == "in_progress" and first["error_file_id"] is None
    assert first["request_counts"] == {"total": 5, "completed": 1, "failed": 1}
    batch.completed(7, 2, 0)
    assert read(tmp_path)["request_counts"]["completed"] == 1    # within the interval: later
    clock.now += 1.5
    (tmp_path / "errors.jsonl").write_text("{}\n")
    batch.failed()
    now = read(tmp_path)
    assert now["request_counts"] == {"total": 5, "completed": 2, "failed": 2}
    assert now["usage"]["input_tokens"] == 17 and now["usage"]["output_tokens"] == 5
    assert now["usage"]["input_tokens_details"]["cached_tokens"] == 4
    assert now["error_file_id"] == "errors.jsonl"
    batch.end("deadline")
    ended = read(tmp_path)
    assert ended["status"] == "expired" and ended["expired_at"] == int(clock.now)
    Batch.model_validate(ended)
    # a --resume keeps the batch's id and creation time
    clock.now += 100
    again = BatchFile(tmp_path, tmp_path / "errors.jsonl", total=5, inputs=["in.jsonl"],
                      endpoint=None, model="m", clock=clock)
    again.start(OutputsTally(), failed=0)
    assert read(tmp_path)["id"] == ended["id"]
    assert read(tmp_path)["created_at"] == first["created_at"] < read(tmp_path)["in_progress_at"]


@pytest.mark.parametrize("ended,status", [("completed", "completed"),
                                          ("interrupted", "cancelled"), ("failed", "failed")])
def test_how_an_attempt_ended_is_the_batch_status(tmp_path, ended, status):
    batch = BatchFile(tmp_path, tmp_path / "errors.jsonl", total=1, inputs=["x"],
                      endpoint=None, model="m")
    batch.start(OutputsTally(), failed=0)
    batch.end(ended)
    assert read(tmp_path)["status"] == status


def test_a_batch_json_that_cannot_be_written_stops_the_run(tmp_path, monkeypatch):
    batch = BatchFile(tmp_path, tmp_path / "errors.jsonl", total=1, inputs=["x"],
                      endpoint=None, model="m")

    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(batch_object, "write_json_atomic", full)
    with pytest.raises(OutputError, match="disk is full"):
        batch.start(OutputsTally(), failed=0)


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**4), st.booleans()),
                max_size=20))
def test_usage_is_read_back_from_either_row_shape(rows):
    for prompt, completion, openai in rows:
        row = ({"response": {"body": {"usage": {"prompt_tokens": prompt,
                                                "completion_tokens": completion}}}}
               if openai else {"num_prompt_tokens": prompt, "num_output_tokens": completion})
        assert row_usage(row) == (prompt, completion, 0)


# -- /v1/responses ---------------------------------------------------------------------------------

def responses(**body) -> dict:
    return {"custom_id": "r", "method": "POST", "url": "/v1/responses",
            "body": {"model": "gpt-4.1", **body}}


def test_a_responses_body_becomes_a_chat_prompt_with_its_fields():
    record = batch_record(responses(
        instructions="Be brief.", input=[{"role": "user", "content": [
            {"type": "input_text", "text": "Hi "}, {"type": "input_text", "text": "there"}]}],
        max_output_tokens=12, temperature=0.2, top_p=0.5,
        text={"format": {"type": "json_schema", "name": "x", "strict": True,
                         "schema": {"type": "object"}}}))
    assert record.messages == [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Hi there"}]
    assert (record.max_tokens, record.temperature) == (12, 0.2)
    assert record.sampling == {"top_p": 0.5, "structured": {"json": {"type": "object"}}}
    assert batch_record(responses(input="Hi")).messages == [{"role": "user", "content": "Hi"}]
    assert batch_record(responses(input="Hi", text={"format": {"type": "text"}})).sampling is None


@pytest.mark.parametrize("body,field,words", [
    ({"input": "Hi", "max_tokens": 5}, "body.max_tokens", "not a field a responses body"),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, "body.tools",
     "/v1/chat/completions line's tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "body.input[0].content[0]", "only text parts"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
     "body.text.format.schema", "missing"),
    ({"input": ""}, "body.input", "empty input"),
])
def test_a_responses_body_is_refused_by_field(body, field, words):
    with pytest.raises(FieldError) as refused:
        batch_record(responses(**body))
    assert refused.value.field == field and words in refused.value.message
