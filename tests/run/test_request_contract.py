"""The request contract end to end (issue 38): what a batch request asks for is honoured on the
real CPU engine with the built-in SmolLM2 model (a JSON schema obeyed from the first token, n
samples, seeds, logprobs), its output parses as OpenAI's and vLLM's own types do, the files of
vLLM's `run-batch` docs and OpenAI's Batch API guide run unchanged, and a bad or unknown
field is refused before anything runs or kept in skipped.jsonl under --on-error skip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")

from neuron_batch.cli import main  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
ASK = [{"role": "user", "content": "Give me a JSON object with a name and an age."}]
SIM = ["--device", "sim", "--instance", "inf2.xlarge", "--architecture", "tinyllama-1.1b",
       "--max-model-len", "2048", "--max-num-seqs", "4"]

#: The input file of vLLM's `run-batch` documentation (examples/offline_inference/
#: openai_batch/openai_example_batch.jsonl), written out from the format, not fetched.
VLLM_RUN_BATCH_EXAMPLE = [
    {"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "meta-llama/Meta-Llama-3-8B-Instruct",
              "messages": [{"role": "system", "content": "You are a helpful assistant."},
                           {"role": "user", "content": "Hello world!"}],
              "max_completion_tokens": 1000}},
    {"custom_id": "request-2", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "meta-llama/Meta-Llama-3-8B-Instruct",
              "messages": [{"role": "system", "content": "You are an unhelpful assistant."},
                           {"role": "user", "content": "Hello world!"}],
              "max_completion_tokens": 1000}},
]
#: The input file of OpenAI's Batch API guide ("Preparing your batch file").
OPENAI_BATCH_GUIDE = [
    {"custom_id": f"request-{i}", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "gpt-3.5-turbo-0125",
              "messages": [{"role": "system", "content": system},
                           {"role": "user", "content": "Hello world!"}],
              "max_tokens": 1000}}
    for i, system in ((1, "You are a helpful assistant."), (2, "You are an unhelpful assistant."))
]


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def outputs(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "outputs.jsonl").read_text().splitlines()]


def parse_like_openai(line: dict) -> None:
    """A batch output line through vLLM's run-batch output type and its body through the openai
    client's own response types (what a user's parser does). (vLLM 0.32's run-batch type has
    no completions body: that body is checked against vLLM's completions response instead.)"""
    from openai.types import Completion
    from openai.types.chat import ChatCompletion
    from vllm.entrypoints.launchers.run_batch import BatchRequestOutput

    body = line["response"]["body"]
    if body["object"] == "chat.completion":
        BatchRequestOutput.model_validate(line)
        ChatCompletion.model_validate(body)
        return
    from vllm.entrypoints.openai.completion.protocol import CompletionResponse

    BatchRequestOutput.model_validate({**line, "response": {**line["response"], "body": None}})
    CompletionResponse.model_validate(body)
    Completion.model_validate(body)


@pytest.mark.parametrize("rows", [VLLM_RUN_BATCH_EXAMPLE, OPENAI_BATCH_GUIDE],
                         ids=["vllm-run-batch-docs", "openai-batch-guide"])
def test_the_tools_own_example_files_run_unchanged(tmp_path, rows):
    out = tmp_path / "run"
    result = invoke(["run", write_jsonl(tmp_path / "batch.jsonl", rows), *SIM, "-o", str(out),
                     "-q"])
    assert result.exit_code == 0, result.output
    lines = outputs(out)
    assert sorted(line["custom_id"] for line in lines) == ["request-1", "request-2"]
    for line in lines:
        parse_like_openai(line)
        # the model that ran, not the one the file names (issue 47)
        assert line["response"]["body"]["model"] == "SmolLM2-135M-Instruct"


def test_a_bad_field_is_refused_before_anything_runs_or_skipped_with_its_reason(tmp_path):
    rows = [*OPENAI_BATCH_GUIDE,
            {**OPENAI_BATCH_GUIDE[0], "custom_id": "bad",
             "body": {**OPENAI_BATCH_GUIDE[0]["body"], "top_logprobs": 3}},
            {**OPENAI_BATCH_GUIDE[0], "custom_id": "typo",
             "body": {**OPENAI_BATCH_GUIDE[0]["body"], "temprature": 0.5}}]
    path = write_jsonl(tmp_path / "batch.jsonl", rows)
    refused = invoke(["run", path, *SIM, "-o", str(tmp_path / "refused")])
    assert refused.exit_code == 2
    assert f"{path}:3: field 'body.top_logprobs': needs logprobs: true" in refused.output
    assert f"{path}:4: field 'body.temprature'" in refused.output
    assert "did you mean 'temperature'?" in refused.output
    assert not (tmp_path / "refused" / "outputs.jsonl").exists()

    out = tmp_path / "skipped"
    result = invoke(["run", path, *SIM, "-o", str(out), "--on-error", "skip", "-q"])
    assert result.exit_code == 3, result.output
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert [(row["file"], row["line"], row["field"]) for row in skipped] == [
        (path, 3, "body.top_logprobs"), (path, 4, "body.temprature")]
    assert "--ignore-field body.temprature" in skipped[1]["reason"]
    assert sorted(line["custom_id"] for line in outputs(out)) == ["request-1", "request-2"]

    dropped = invoke(["run", path, *SIM, "-o", str(tmp_path / "dropped"), "-q",
                      "--ignore-field", "body.temprature", "--ignore-field", "top_logprobs"])
    assert dropped.exit_code == 0, dropped.output
    assert len(outputs(tmp_path / "dropped")) == 4


def test_greedy_n_samples_are_refused_naming_the_fix(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Hi", "n": 3}])
    result = invoke(["run", path, *SIM, "-o", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert f"{path}:1: field 'n': 3 samples need sampling" in result.output
    assert "--temperature" in result.output


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One CPU run of the built-in model over a JSON-lines file and an OpenAI batch file."""
    tmp_path = tmp_path_factory.mktemp("contract")
    lines = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "schema", "messages": ASK, "max_tokens": 60,
         "response_format": {"type": "json_schema",
                             "json_schema": {"name": "person", "schema": SCHEMA}}},
        {"id": "free", "messages": ASK, "max_tokens": 60},
        {"id": "sampled", "prompt": "The capital of France is", "max_tokens": 6, "n": 3,
         "temperature": 1.0, "seed": 5, "logprobs": 2},
        {"id": "sampled-again", "prompt": "The capital of France is", "max_tokens": 6, "n": 3,
         "temperature": 1.0, "seed": 5, "logprobs": 2},
        {"id": "choice", "prompt": "Is the sky blue? Answer:", "max_tokens": 4,
         "structured_outputs": {"choice": ["yes", "no"]}},
    ])
    batch = write_jsonl(tmp_path / "b.jsonl", [
        {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": ASK, "max_completion_tokens": 8, "n": 2,
                  "temperature": 0.9, "seed": 1, "logprobs": True, "top_logprobs": 2}},
        {"custom_id": "legacy", "method": "POST", "url": "/v1/completions",
         "body": {"model": "m", "prompt": "One, two,", "max_tokens": 4, "logprobs": 3}},
    ])
    out = tmp_path / "run"
    result = invoke(["run", lines, batch, "--device", "cpu", "--max-model-len", "1024",
                     "--max-num-seqs", "8", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    rows = {row.get("id") if "custom_id" not in row else row["custom_id"]: row
            for row in outputs(out)}
    return rows | {"report": json.loads((out / "report.json").read_text())}


def test_the_report_counts_what_the_requests_asked_for(cpu_run):
    assert cpu_run["report"]["requests"]["asked"] == {
        "constrained": 2, "sampled_n": 3, "samples": 8, "logprobs": 4}


def test_a_json_schema_is_obeyed_and_the_same_prompt_without_is_not_json(cpu_run):
    import jsonschema

    constrained = cpu_run["schema"]["output"]
    jsonschema.validate(json.loads(constrained), SCHEMA)
    assert constrained.lstrip().startswith("{")   # the first token is constrained too
    with pytest.raises(ValueError):
        json.loads(cpu_run["free"]["output"])
    assert cpu_run["choice"]["output"] in ("yes", "no")


def test_n_samples_seeds_and_logprobs_in_json_lines(cpu_run):
    sampled, again = cpu_run["sampled"], cpu_run["sampled-again"]
    assert [c["index"] for c in sampled["choices"]] == [0, 1, 2]
    assert sampled["output"] == sampled["choices"][0]["output"]
    # the request's own seed: the same request twice gives the same three samples
    assert [c["output"] for c in sampled["choices"]] == [c["output"] for c in again["choices"]]
    assert sampled["usage"]["completion_tokens"] == sum(c["num_output_tokens"]
                                                        for c in sampled["choices"])
    for choice in sampled["choices"]:
        assert len(choice["logprobs"]) == choice["num_output_tokens"]
        assert "".join(t["token"] for t in choice["logprobs"]) == choice["output"]
        for token in choice["logprobs"]:
            assert token["logprob"] <= 0 and len(token["top_logprobs"]) == 2
            tops = [t["logprob"] for t in token["top_logprobs"]]
            assert tops == sorted(tops, reverse=True) and token["logprob"] <= tops[0] + 1e-6


def test_openai_outputs_parse_with_n_choices_and_logprobs_in_each_apis_shape(cpu_run):
    chat, legacy = cpu_run["chat"], cpu_run["legacy"]
    for line in (chat, legacy):
        parse_like_openai(line)
    body = chat["response"]["body"]
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for choice in body["choices"]:
        content = choice["logprobs"]["content"]
        assert "".join(t["token"] for t in content) == choice["message"]["content"]
        assert all(len(t["top_logprobs"]) == 2 and bytes(t["bytes"]).decode() == t["token"]
                   for t in content)
    assert body["usage"]["completion_tokens"] == sum(
        len(c["logprobs"]["content"]) for c in body["choices"])
    (choice,) = legacy["response"]["body"]["choices"]
    logprobs = choice["logprobs"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert len(logprobs["token_logprobs"]) == len(logprobs["tokens"]) == 4
    assert all(len(top) == 3 for top in logprobs["top_logprobs"])
    assert logprobs["text_offset"][0] == 0
    assert all(b - a == len(t) for a, b, t in zip(logprobs["text_offset"],
                                                 logprobs["text_offset"][1:],
                                                 logprobs["tokens"]))


def test_ignore_field_is_a_job_file_key_too(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Hi", "meta": {"team": "x"}}])
    job = tmp_path / "job.toml"
    job.write_text('ignore-field = ["meta"]\n')
    result = invoke(["run", path, *SIM, "--config", str(job), "-o", str(tmp_path / "run"),
                     "-q"])
    assert result.exit_code == 0, result.output
    assert len(outputs(tmp_path / "run")) == 1
