"""What comes out of an OpenAI batch file is what OpenAI's Batch API and `vllm run-batch` give
(issue 47), on the real engines: the round trip (a batch file in; outputs.jsonl and errors.jsonl
joined back by custom_id, nothing missing, nothing twice) with the model that ran named in every
response, OpenAI's defaults where a body says nothing, refused lines and vLLM's own refusals
as error records, batch.json's counts and usage; and stop strings on the simulated device under
each Neuron runtime, from every input format."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")

from neuron_batch.cli import main  # noqa: E402

SERVED = "tiny-served"


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


COLOUR = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}},
          "required": ["colour"], "additionalProperties": False}


def line(custom_id: str, url: str = "/v1/chat/completions", **body) -> dict:
    if url == "/v1/chat/completions" and "prompt" not in body:
        body.setdefault("messages", [{"role": "user", "content": "Name a colour."}])
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": "gpt-4o-mini", **body}}


#: What the round trip sends, and how each line must end: "ok" a response, else its error code.
ROUND_TRIP = [
    *[(line(f"same-{i}", max_tokens=8), "ok") for i in range(4)],
    (line("stop", "/v1/completions", prompt="Count with me: 1, 2, 3, 4,", max_tokens=12,
          temperature=0, stop=[","], include_stop_str_in_output=True), "ok"),
    (line("greedy", max_tokens=6, temperature=0), "ok"),
    (line("moderation", "/v1/moderations", input="hi"), "invalid_request"),
    # (the built-in model's template takes no tools: no parser is known for it)
    (line("tools", max_tokens=4, tools=[{"type": "function", "function": {"name": "f"}}]),
     "unsupported_field"),
    (line("wrong-endpoint", prompt="Hi", max_tokens=4), "invalid_request"),
    (line("too-long", messages=[{"role": "user", "content": "word " * 400}], max_tokens=4),
     "context_length_exceeded"),
    (line("bias", max_tokens=4, logit_bias={"99999999": 5}), "engine_refused"),
    (line("responses", "/v1/responses", instructions="Answer in JSON.",
          input=[{"role": "user", "content": [{"type": "input_text", "text": "Sky colour?"}]}],
          max_output_tokens=30, temperature=0,
          text={"format": {"type": "json_schema", "name": "c", "schema": COLOUR}}), "ok"),
    (line("responses-short", "/v1/responses", input="Tell me a story.", max_output_tokens=3),
     "ok"),
    (line("responses-chat-field", "/v1/responses", input="Hi", max_tokens=3),
     "invalid_request"),
]


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("round-trip")
    path = write_jsonl(tmp_path / "batch.jsonl", [row for row, _ in ROUND_TRIP])
    args = ["run", path, "--device", "cpu", "--max-model-len", "256", "--max-num-seqs", "8",
            "--served-model-name", SERVED]
    refused = invoke([*args, "-o", str(tmp_path / "refused"), "-q"])
    out = tmp_path / "run"
    result = invoke([*args, "-o", str(out), "-q", "--on-error", "skip"])
    return {"refused": refused, "result": result, "out": out, "path": path}


def test_the_default_refuses_the_bad_lines_before_anything_runs(round_trip):
    refused = round_trip["refused"]
    assert refused.exit_code == 2
    assert "field 'url'" in refused.output and "field 'body.tools'" in refused.output
    assert "field 'body.max_tokens'" in refused.output
    assert not (round_trip["out"].parent / "refused" / "outputs.jsonl").exists()


def test_every_line_ends_in_exactly_one_record_joined_by_custom_id(round_trip):
    result, out = round_trip["result"], round_trip["out"]
    assert result.exit_code == 3, result.output      # some lines failed: not a clean success
    outputs, errors = read_jsonl(out / "outputs.jsonl"), read_jsonl(out / "errors.jsonl")
    ids = Counter([row["custom_id"] for row in outputs] + [row["custom_id"] for row in errors])
    assert ids == Counter(row["custom_id"] for row, _ in ROUND_TRIP)   # none lost, none twice
    ended = {row["custom_id"]: "ok" for row in outputs}
    ended |= {row["custom_id"]: row["error"]["code"] for row in errors}
    assert ended == {row["custom_id"]: how for row, how in ROUND_TRIP}
    for row in outputs:
        assert row["response"]["status_code"] == 200 and row["error"] is None
        assert row["response"]["body"]["model"] == SERVED        # not the file's gpt-4o-mini
    for row in errors:
        status = row["response"]["status_code"]
        assert status == 400 and row["response"]["body"]["error"]["code"] == row["error"]["code"]
        assert row["error"]["message"] and row["error"]["file"] == round_trip["path"]
    # skipped.jsonl names the lines refused before anything ran, by custom_id too
    skipped = read_jsonl(out / "skipped.jsonl")
    assert {row["custom_id"] for row in skipped} == {
        "moderation", "tools", "wrong-endpoint", "too-long", "responses-chat-field"}


def test_the_outputs_parse_as_openais_and_vllms_types(round_trip):
    from openai.types import BatchError, Completion
    from openai.types.chat import ChatCompletion
    from vllm.entrypoints.launchers.run_batch import BatchRequestOutput

    out = round_trip["out"]
    from openai.types.responses import Response

    for row in read_jsonl(out / "outputs.jsonl"):
        body = row["response"]["body"]
        if body["object"] == "response":
            Response.model_validate(body)
        elif body["object"] == "chat.completion":
            BatchRequestOutput.model_validate(row)
            ChatCompletion.model_validate(body)
        else:
            Completion.model_validate(body)
    for row in read_jsonl(out / "errors.jsonl"):
        BatchError.model_validate(row["error"])


def test_openai_lines_sample_by_default_and_stop_where_asked(round_trip):
    outputs = {row["custom_id"]: row["response"]["body"]
               for row in read_jsonl(round_trip["out"] / "outputs.jsonl")}
    same = [outputs[f"same-{i}"]["choices"][0]["message"]["content"] for i in range(4)]
    assert len(set(same)) > 1, same   # temperature 1 (OpenAI's default), not greedy
    (stopped,) = outputs["stop"]["choices"]
    assert stopped["finish_reason"] == "stop", stopped
    assert stopped["text"].endswith(",") and stopped["text"].count(",") == 1


def test_responses_lines_are_answered_in_the_responses_shape(round_trip):
    outputs = {row["custom_id"]: row["response"]["body"]
               for row in read_jsonl(round_trip["out"] / "outputs.jsonl")}
    answer = outputs["responses"]
    assert (answer["object"], answer["status"], answer["model"]) == ("response", "completed",
                                                                     SERVED)
    (message,) = answer["output"]
    assert json.loads(message["content"][0]["text"])["colour"] in ("red", "blue")
    short = outputs["responses-short"]
    assert short["status"] == "incomplete"
    assert short["incomplete_details"] == {"reason": "max_output_tokens"}
    assert short["usage"]["output_tokens"] == 3
    errors = {row["custom_id"]: row for row in read_jsonl(round_trip["out"] / "errors.jsonl")}
    assert errors["responses-chat-field"]["error"]["param"] == "body.max_tokens"
    assert "a responses body" in errors["responses-chat-field"]["error"]["message"]


def test_batch_json_counts_what_the_files_hold(round_trip):
    from openai.types import Batch

    out = round_trip["out"]
    batch = json.loads((out / "batch.json").read_text())
    Batch.model_validate(batch)
    outputs, errors = read_jsonl(out / "outputs.jsonl"), read_jsonl(out / "errors.jsonl")
    assert batch["status"] == "completed" and batch["completed_at"] >= batch["created_at"]
    # (the file mixes chat and completions lines, which OpenAI takes in two batches)
    assert batch["endpoint"] == "/v1/chat/completions,/v1/completions,/v1/responses"
    assert batch["model"] == SERVED
    assert batch["request_counts"] == {"total": len(ROUND_TRIP), "completed": len(outputs),
                                       "failed": len(errors)}
    usage = [row["response"]["body"]["usage"] for row in outputs]
    assert batch["usage"]["input_tokens"] == sum(u.get("prompt_tokens", u.get("input_tokens"))
                                                 for u in usage)
    assert batch["usage"]["output_tokens"] == sum(
        u.get("completion_tokens", u.get("output_tokens")) for u in usage)
    assert (batch["output_file_id"], batch["error_file_id"]) == ("outputs.jsonl", "errors.jsonl")
    report = json.loads((out / "report.json").read_text())
    assert "OpenAI's defaults" in report["config"]["defaults"]


def test_a_resume_runs_the_failed_request_again_and_keeps_one_record_each(round_trip, tmp_path):
    out = round_trip["out"]
    again = invoke(["run", round_trip["path"], "--device", "cpu", "--max-model-len", "256",
                    "--max-num-seqs", "8", "--served-model-name", SERVED, "-o", str(out), "-q",
                    "--on-error", "skip", "--resume"])
    assert again.exit_code == 3, again.output
    outputs, errors = read_jsonl(out / "outputs.jsonl"), read_jsonl(out / "errors.jsonl")
    ids = [row["custom_id"] for row in outputs] + [row["custom_id"] for row in errors]
    assert sorted(ids) == sorted(row["custom_id"] for row, _ in ROUND_TRIP)
    batch = json.loads((out / "batch.json").read_text())
    assert batch["request_counts"]["completed"] == len(outputs)


# -- stop strings on the simulated device ---------------------------------------------------------

@pytest.mark.parametrize("runtime", ["nxdi", "optimum-neuron"])
def test_stop_strings_run_on_the_simulated_device_from_every_format(tmp_path, runtime):
    batch = write_jsonl(tmp_path / "batch.jsonl", [
        line("openai", messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
             stop=["\n"])])
    lines = write_jsonl(tmp_path / "lines.jsonl", [{"id": "jsonl", "prompt": "Hi",
                                                     "max_tokens": 6, "stop": ["\n"]}])
    table = tmp_path / "table.csv"
    with table.open("w", newline="") as handle:
        csv.writer(handle).writerows([["id", "prompt", "max_tokens", "stop"],
                                      ["csv", "Hi", "6", "\n"]])
    out = tmp_path / "run"
    result = invoke(["run", batch, lines, str(table), "--device", "sim", "--architecture",
                     "tinyllama-1.1b", "--instance", "inf2.8xlarge", "--runtime", runtime,
                     "--max-model-len", "512", "--max-num-seqs", "4", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    rows = read_jsonl(out / "outputs.jsonl")
    assert len(rows) == 3 and not (out / "errors.jsonl").exists()
    # the simulated tokens were detokenized (text to match the stop strings in)
    texts = [row["response"]["body"]["choices"][0]["message"]["content"] if "response" in row
             else row["output"] for row in rows]
    assert all(isinstance(text, str) and text for text in texts)


def test_stop_strings_without_a_tokenizer_are_refused_before_anything_loads(tmp_path,
                                                                             tiny_model):
    path = write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prompt_len": 8, "stop": ["x"]},
                                              {"id": "b", "prompt_len": 8,
                                               "stop_token_ids": [2]}])
    result = invoke(["run", path, "--device", "cpu", "--model", tiny_model, "-o",
                     str(tmp_path / "run")])
    assert result.exit_code == 2
    assert f"{path}:1: field 'stop': stop strings are matched in the text" in result.output
    assert "no tokenizer" in result.output and f"{path}:2" not in result.output
