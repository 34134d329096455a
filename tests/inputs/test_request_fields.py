"""Every request field a JSON line or an OpenAI batch body may give (inputs/request_fields.py,
structured.py, json_requests.py): read into the record, or refused naming line and field;
and the one table of which path honours what (request_paths.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neuron_batch.inputs.load import load_prompts
from neuron_batch.inputs.prompt_records import PromptRecord
from neuron_batch.inputs.request_fields import MAX_LOGPROBS, REQUEST_FIELDS, sampling_spec
from neuron_batch.inputs.request_paths import (
    FEATURES,
    PATHS,
    VLLM_ONLY,
    RequestPath,
    asked_in,
    asks,
    path_key,
    refusals,
    request_path,
)
from neuron_batch.runtimes.runtime import NXDI, RUNTIMES, VLLM_NEURON

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
HI = [{"role": "user", "content": "Hi"}]


def write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def chat(custom_id="r", **body):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": HI, **body}}


def completion(custom_id="c", **body):
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions",
            "body": {"model": "m", "prompt": "Once", **body}}


def one(tmp_path, line, **load):
    loaded = load_prompts([write(tmp_path / "in.jsonl", [line])], **load)
    return loaded.records, [str(problem) for problem in loaded.problems]


EVERY_FIELD = dict(n=3, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, seed=7,
                   presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.1,
                   logit_bias={"42": -100, "7": 2.5}, stop=["END"], stop_token_ids=[2, 3],
                   min_tokens=2, ignore_eos=True, max_tokens=30)
EVERY_SAMPLING = dict(n=3, top_p=0.9, top_k=40, min_p=0.05, seed=7, presence_penalty=0.5,
                      frequency_penalty=-0.5, repetition_penalty=1.1,
                      logit_bias={"42": -100.0, "7": 2.5}, stop_token_ids=[2, 3], min_tokens=2,
                      ignore_eos=True)


def test_issue_38s_batch_line_keeps_every_field(tmp_path):
    """The line of the issue: n, logprobs, top_p, seed and a json_schema all reach the record."""
    (record,), problems = one(tmp_path, chat(
        "r1", max_tokens=20, top_p=0.9, seed=7, logprobs=True, n=2,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}))
    assert problems == []
    assert record.sampling == {"n": 2, "top_p": 0.9, "seed": 7, "logprobs": 0,
                               "structured": {"json": SCHEMA}}
    assert record.sampling_fields["structured"] == "body.response_format"


@pytest.mark.parametrize("make", [
    lambda: {"prompt": "Hi", **EVERY_FIELD, "logprobs": 5},
    lambda: chat(**EVERY_FIELD, logprobs=True, top_logprobs=5),
    lambda: completion(**EVERY_FIELD, logprobs=5),
], ids=["jsonl", "chat", "completions"])
def test_every_field_of_every_format_is_read(tmp_path, make):
    (record,), problems = one(tmp_path, make())
    assert problems == []
    assert (record.max_tokens, record.temperature, record.stop) == (30, 0.7, ["END"])
    assert record.sampling == {**EVERY_SAMPLING, "logprobs": 5}


@pytest.mark.parametrize("given, form", [
    ({"response_format": {"type": "json_object"}}, {"json_object": True}),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "p", "schema": SCHEMA, "strict": True}}},
     {"json": SCHEMA}),
    ({"structured_outputs": {"regex": "[a-z]+"}}, {"regex": "[a-z]+"}),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, {"choice": ["yes", "no"]}),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, {"grammar": 'root ::= "a"'}),
    ({"guided_json": json.dumps(SCHEMA)}, {"json": SCHEMA}),
    ({"guided_choice": ["a", "b"]}, {"choice": ["a", "b"]}),
    ({"guided_regex": "\\d+"}, {"regex": "\\d+"}),
])
def test_structured_output_forms_become_one(tmp_path, given, form):
    (record,), problems = one(tmp_path, chat(**given))
    assert problems == [] and record.sampling == {"structured": form}
    (record,), problems = one(tmp_path, {"prompt": "Hi", **given})
    assert problems == [] and record.sampling == {"structured": form}


def test_a_text_response_format_asks_for_nothing(tmp_path):
    (record,), problems = one(tmp_path, chat(response_format={"type": "text"}))
    assert problems == [] and record.sampling is None


BAD = [
    # (the line, the field named, part of the message): the issue's "Bad input" list and more
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "p"}}),
     "body.response_format.json_schema.schema", "missing: the JSON schema"),
    (chat(response_format={"type": "json_schema"}), "body.response_format.json_schema",
     "missing"),
    (chat(response_format={"type": "xml"}), "body.response_format.type", "expected"),
    (chat(response_format={"type": "json_schema", "json_schema": {
        "name": "p", "schema": {"type": "objekt"}}}),
     "body.response_format.json_schema.schema.type", "not a valid JSON schema"),
    (chat(response_format={"type": "json_schema", "json_schema": {
        "name": "p", "schema": {"properties": {"a": {"minLength": "two"}}}}}),
     "body.response_format.json_schema.schema.properties.a.minLength",
     "not a valid JSON schema"),
    (chat(structured_outputs={"regex": "(unclosed"}), "body.structured_outputs.regex",
     "not a regular expression"),
    (chat(structured_outputs={"regex": "a", "choice": ["b"]}), "body.structured_outputs",
     "exactly one"),
    (chat(guided_json=SCHEMA, response_format={"type": "json_object"}), "body.guided_json",
     "conflicts with 'body.response_format'"),
    (chat(n=0), "body.n", "must be >= 1"),
    (chat(n=1.5), "body.n", "expected an integer"),
    (chat(top_logprobs=3), "body.top_logprobs", "needs logprobs: true"),
    (chat(logprobs=False, top_logprobs=3), "body.top_logprobs", "needs logprobs: true"),
    (chat(logprobs=True, top_logprobs=MAX_LOGPROBS + 1), "body.top_logprobs",
     f"between 0 and {MAX_LOGPROBS}"),
    (chat(logprobs=3), "body.logprobs", "expected true or false"),
    (completion(logprobs=MAX_LOGPROBS + 1), "body.logprobs", f"between 0 and {MAX_LOGPROBS}"),
    (completion(logprobs=True), "body.logprobs", "expected an integer"),
    (completion(top_logprobs=2), "body.top_logprobs", "a chat field"),
    (chat(seed="7"), "body.seed", "expected an integer"),
    (chat(seed=1.5), "body.seed", "expected an integer"),
    (chat(seed=True), "body.seed", "expected an integer"),
    (chat(top_p=0), "body.top_p", "must be > 0"),
    (chat(top_p=1.5), "body.top_p", "<= 1"),
    (chat(min_p=-0.1), "body.min_p", ">= 0"),
    (chat(top_k=-2), "body.top_k", "must be >= -1"),
    (chat(presence_penalty=3), "body.presence_penalty", "<= 2"),
    (chat(repetition_penalty=0), "body.repetition_penalty", "> 0"),
    (chat(logit_bias={"x": 1}), "body.logit_bias.x", "token id"),
    (chat(logit_bias={"5": 101}), "body.logit_bias.5", "<= 100"),
    (chat(stop_token_ids=[1, -1]), "body.stop_token_ids[1]", "token id"),
    (chat(min_tokens=9, max_tokens=4), "body.min_tokens", "more than max_tokens"),
    (chat(ignore_eos="yes"), "body.ignore_eos", "true or false"),
    (chat(stream=True), "body.stream", "written whole"),
    (chat(temprature=0.5), "body.temprature", "did you mean 'temperature'?"),
    (chat(functions=[]), "body.functions", "--ignore-field body.functions"),
    ({**chat(), "extra": 1}, "extra", "an OpenAI batch request line"),
    ({"prompt": "Hi", "tempreture": 1}, "tempreture", "did you mean 'temperature'?"),
    ({"prompt": "Hi", "n": "2"}, "n", "expected an integer"),
]


@pytest.mark.parametrize("line, field, message", BAD)
def test_bad_fields_are_named_by_line_and_field(tmp_path, line, field, message):
    records, problems = one(tmp_path, line)
    assert records == []
    assert len(problems) == 1
    assert problems[0].startswith(f"{tmp_path / 'in.jsonl'}:1: field '{field}': "), problems
    assert message in problems[0]


def test_ignore_field_drops_what_it_names_and_nothing_else(tmp_path):
    line = chat(logprobs=True, functions=[], user="u1")
    records, problems = one(tmp_path, line)
    assert records == [] and "body.functions" in problems[0]
    (record,), problems = one(tmp_path, line, ignored=["body.functions"])
    assert problems == [] and record.sampling == {"logprobs": 0}
    (record,), problems = one(tmp_path, line, ignored=["functions", "logprobs"])
    assert problems == [] and record.sampling is None


def test_every_request_field_has_a_feature_or_a_column():
    """A field read is either one of the record's own (max_tokens, temperature, stop) or a
    feature the path table decides on: none escapes the table."""
    record_columns = {"max_tokens", "max_completion_tokens", "temperature", "stop",
                      "top_logprobs", "response_format", "structured_outputs"}
    structured = {name for name in REQUEST_FIELDS if name.startswith("guided_")}
    assert set(REQUEST_FIELDS) - record_columns - structured <= set(FEATURES)


# ---------------------------------------------------------------------------------------------
# Which path honours what


def test_the_table_keys_devices_and_runtimes():
    nxdi, paged = RUNTIMES[NXDI], RUNTIMES[VLLM_NEURON]
    assert path_key("cpu", nxdi) == path_key("cuda", paged) == ("vllm", None)
    assert path_key("sim", nxdi) == ("sim", None)
    assert path_key("neuron", nxdi) == ("neuron", NXDI)
    assert path_key("neuron", paged) == ("neuron", VLLM_NEURON)
    # Every path's declaration covers exactly the features there are.
    for path in PATHS.values():
        assert set(path.honoured) <= set(FEATURES)
    assert "CPU sampling" in request_path("neuron", nxdi).honoured["structured"]
    assert "CPU sampling" in request_path("neuron", nxdi).honoured["logprobs"]
    assert all(request_path(d, nxdi).honours(f) for d in ("cpu", "sim") for f in FEATURES
               if f not in VLLM_ONLY)
    # embeddings: vLLM's own engine only (its pooling runner)
    assert [key for key, path in PATHS.items() if path.honours("embed")] == [("vllm", None)]


def record_asking(**sampling) -> PromptRecord:
    return PromptRecord(0, "a", "in.jsonl:3", prompt="Hi", sampling=sampling,
                        sampling_fields={key: f"body.{key}" for key in sampling})


def test_a_path_that_cannot_honour_a_field_refuses_it_saying_where_it_runs():
    structured = record_asking(structured={"json": {}})
    plain = record_asking(top_p=0.5)
    one_sample = record_asking(n=1)
    without = RequestPath("a path without structured outputs",
                          {f: "" for f in FEATURES if f != "structured"})
    paths = {**PATHS, ("neuron", NXDI): without}
    kept, problems = refusals([structured, plain, one_sample], without, paths)
    assert kept == [plain, one_sample]
    (problem,) = problems
    assert (problem.source, problem.field) == ("in.jsonl:3", "body.structured")
    assert "structured outputs cannot run on a path without structured outputs" in str(problem)
    assert "it runs on vLLM's own engine" in str(problem)
    assert "--ignore-field body.structured" in str(problem)


def test_sampling_spec_fills_the_runs_defaults():
    record = PromptRecord(4, "a", "x:1", prompt="Hi", temperature=None, stop=["x"],
                          sampling={"n": 2, "top_k": 5})
    spec = sampling_spec(record, max_tokens=8, temperature=0.5, seed=11, ignore_eos=False)
    assert spec == {"max_tokens": 8, "temperature": 0.5, "stop": ["x"], "n": 2, "top_k": 5,
                    "seed": 11}
    greedy = sampling_spec(PromptRecord(0, "b", "x:2", prompt="Hi"), max_tokens=8,
                           temperature=0.0, seed=11, ignore_eos=True)
    assert greedy["seed"] is None and greedy["ignore_eos"] is True
    own_seed = PromptRecord(0, "c", "x:3", prompt="Hi", temperature=1.0, sampling={"seed": 3})
    assert sampling_spec(own_seed, max_tokens=1, temperature=0.0, seed=11,
                         ignore_eos=False)["seed"] == 3
    own_seed.temperature = 0.0      # greedy: one answer whatever the seed
    assert sampling_spec(own_seed, max_tokens=1, temperature=0.0, seed=11,
                         ignore_eos=False)["seed"] is None


def test_asked_counts_what_changes_a_requests_cost():
    records = [record_asking(structured={"regex": "a"}), record_asking(n=3, logprobs=0),
               record_asking(n=1), record_asking(top_p=0.5)]
    assert asked_in(map(asks, records)) == {"constrained": 1, "sampled_n": 1, "samples": 3,
                                            "logprobs": 1}
    assert asked_in(map(asks, records[2:])) is None


def test_optimum_neuron_refuses_what_its_runner_drops():
    """optimum-neuron 0.4.5's runner returns no logprobs, applies no bitmask, no per-request
    generator and no logits processors: the table refuses those fields on its host path, and
    keeps what vLLM's engine around the runner does (n, top_k, stop_token_ids)."""
    from neuron_batch.runtimes.runtime import OPTIMUM_NEURON

    optimum = request_path("neuron", RUNTIMES[OPTIMUM_NEURON])
    assert path_key("neuron", RUNTIMES[OPTIMUM_NEURON]) == ("neuron", OPTIMUM_NEURON)
    for feature in ("structured", "logprobs", "seed", "min_p", "logit_bias", "min_tokens"):
        assert not optimum.honours(feature), feature
    kept = record_asking(n=2, top_k=5, stop_token_ids=[2])
    refused = record_asking(logprobs=3)
    ran, problems = refusals([kept, refused], optimum)
    assert ran == [kept]
    (problem,) = problems
    assert problem.field == "body.logprobs"
    assert "logprobs cannot run on Hugging Face's optimum-neuron plugin" in str(problem)
    assert "vLLM's own engine" in str(problem) and "AWS's NxDI plugin" in str(problem)


def test_the_simulated_optimum_neuron_refuses_what_its_host_refuses():
    """A plan made on the simulated device must hold on the host: under optimum-neuron the sim
    refuses structured outputs as its host does, and under nxdi it charges them."""
    from neuron_batch.runtimes.runtime import OPTIMUM_NEURON

    optimum = RUNTIMES[OPTIMUM_NEURON]
    assert path_key("sim", optimum) == ("sim", OPTIMUM_NEURON)
    sim = request_path("sim", optimum)
    assert set(sim.honoured) == set(request_path("neuron", optimum).honoured)
    _, problems = refusals([record_asking(structured={"json": {}})], sim)
    assert "the simulated device under optimum-neuron" in str(problems[0])
    assert request_path("sim", RUNTIMES[NXDI]).honours("structured")


def test_the_optimum_neuron_refusal_is_said_once_naming_its_lines_and_agrees_with_itself():
    """Every line asking for a seed under the simulated optimum-neuron got the same refusal,
    once per line, and that refusal said the request runs on "the simulated Neuron device
    (--device sim)", the device it was refused on: now one line names the lines, and the
    places it runs are named by their runtimes."""
    from neuron_batch.inputs.prompt_records import said_once
    from neuron_batch.runtimes.runtime import OPTIMUM_NEURON

    sim = request_path("sim", RUNTIMES[OPTIMUM_NEURON])
    records = [PromptRecord(n, str(n), f"in.jsonl:{n + 1}", prompt="Hi",
                            sampling={"seed": n}, sampling_fields={"seed": "seed"})
               for n in range(3)]
    records.append(PromptRecord(3, "3", "in.jsonl:4", prompt="Hi", sampling={"logprobs": 1},
                                sampling_fields={"logprobs": "logprobs"}))
    _, problems = refusals(records, sim)
    assert len(problems) == 4                 # one per request: its error record names it
    seed, logprobs = said_once(problems)
    assert seed.startswith("in.jsonl:1, 2, 3: field 'seed': a per-request seed cannot run on "
                           "the simulated device under optimum-neuron")
    assert logprobs.startswith("in.jsonl:4: field 'logprobs': ")
    runs_on = seed.split("; it runs on ")[1]
    assert "the simulated device under nxdi or vllm-neuron" in runs_on
    assert "(--device sim)" not in runs_on and "optimum-neuron" not in runs_on


def test_said_once_names_at_most_ten_lines_and_keeps_other_sources_whole():
    from neuron_batch.inputs.prompt_records import InputProblem, said_once

    many = [InputProblem(f"a.jsonl:{n}", "seed", "refused") for n in range(1, 14)]
    (line,) = said_once(many)
    assert line == ("a.jsonl:1, 2, 3, 4, 5, 6, 7, 8, 9, 10 and 3 more lines: field 'seed': "
                    "refused")
    rows = [InputProblem("t.csv:row 2", None, "empty"), InputProblem("b.jsonl:4", None, "empty")]
    assert said_once(rows) == ["t.csv:row 2, b.jsonl:4: empty"]
