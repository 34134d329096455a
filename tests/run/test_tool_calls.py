"""Tool calling in OpenAI chat lines, honoured where vLLM can parse the model's calls: the built-in
SmolLM2 weights and tokenizer under a Hermes-style chat template written here (SmolLM2's own
template takes no tools), run on the real CPU engine, its calls read by vLLM's own `hermes`
parser, guessed from the template's `<tool_call>` tags.

What is proven, and what is not: a forced tool_choice ("required", a named function) is held to
the tools' format by vLLM's structural tag, so its call is the model's real output parsed; with
`strict` tools the arguments follow the tool's schema. An "auto" line whose output a regex
forces into the Hermes format shows the parser reading a call the model emitted. A plain "auto"
line is whatever this 135M model says (it does not call by itself): only its shape is checked.
Refusals: no parser known, a template without tools, the deprecated `functions`, a named
function not among the tools, the simulated device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")

from neuron_batch.cli import main  # noqa: E402
from neuron_batch.inputs.json_requests import record_from_batch_request  # noqa: E402
from neuron_batch.inputs.prompt_records import FieldError  # noqa: E402
from neuron_batch.inputs.request_paths import refusals, request_path  # noqa: E402
from neuron_batch.runtimes.runtime import NXDI, RUNTIMES  # noqa: E402

#: A Hermes-style template (the tools in <tools>, a call in <tool_call> tags), ChatML turns.
HERMES_TEMPLATE = """{%- if tools %}<|im_start|>system
You can call functions. The functions you may call, as JSON schemas, are inside <tools></tools>:
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>
To call one, answer with its name and arguments inside <tool_call></tool_call> tags:
<tool_call>
{"name": "the function's name", "arguments": {"an argument": "its value"}}
</tool_call><|im_end|>
{% endif %}{%- for message in messages %}<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}
PARIS_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def chat(custom_id: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user",
                                                 "content": "What is the weather in Paris?"}],
                     "tools": [WEATHER], "max_tokens": 60, "temperature": 0, **body}}


def regex_of(text: str) -> str:
    return "".join("\\" + c if c in "{}[]().*+?^$|\\" else c for c in text)


LINES = [
    chat("required", tool_choice="required"),
    chat("named", tool_choice={"type": "function", "function": {"name": "get_weather"}}),
    chat("auto-forced", tool_choice="auto", structured_outputs={"regex": regex_of(PARIS_CALL)}),
    chat("auto"),
    chat("none", tool_choice="none"),
    chat("functions", functions=[WEATHER["function"]]),
    chat("unknown-tool", tool_choice={"type": "function", "function": {"name": "other"}}),
]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def tools_model(tmp_path_factory):
    """The built-in model's files (linked) with HERMES_TEMPLATE as its chat template."""
    from neuron_batch.engine.models import resolve_model

    builtin = Path(resolve_model(None).path)
    path = tmp_path_factory.mktemp("smollm2-tools")
    for name in ("config.json", "generation_config.json", "model.safetensors",
                 "tokenizer.json", "tokenizer_config.json"):
        if (builtin / name).exists():
            (path / name).symlink_to(builtin / name)
    (path / "chat_template.jinja").write_text(HERMES_TEMPLATE)
    return str(path)


@pytest.fixture(scope="module")
def called(tmp_path_factory, tools_model):
    tmp_path = tmp_path_factory.mktemp("tools")
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in LINES))
    out = tmp_path / "run"
    result = CliRunner().invoke(main, [
        "run", str(path), "--model", tools_model, "--device", "cpu", "--max-model-len", "1024",
        "--on-error", "skip", "-q", "-o", str(out)], catch_exceptions=False)
    bodies = {row["custom_id"]: row["response"]["body"]
              for row in read_jsonl(out / "outputs.jsonl")}
    errors = {row["custom_id"]: row["error"] for row in read_jsonl(out / "errors.jsonl")}
    return {"result": result, "bodies": bodies, "errors": errors}


def only_choice(body: dict) -> dict:
    (choice,) = body["choices"]
    return choice


def test_every_line_ends_once_and_parses_as_a_chat_completion(called):
    from openai.types.chat import ChatCompletion

    assert called["result"].exit_code == 3, called["result"].output     # two lines refused
    assert set(called["bodies"]) == {"required", "named", "auto-forced", "auto", "none"}
    assert set(called["errors"]) == {"functions", "unknown-tool"}
    assert "give 'body.tools'" in called["errors"]["functions"]["message"]
    assert called["errors"]["unknown-tool"]["param"] == "body.tool_choice.function.name"
    for body in called["bodies"].values():
        ChatCompletion.model_validate(body)


def test_a_forced_tool_choice_comes_back_as_a_call_with_the_tools_arguments(called):
    required = only_choice(called["bodies"]["required"])
    named = only_choice(called["bodies"]["named"])
    # "required": finish_reason tool_calls; a named function: the output's own (stop), as
    # OpenAI and vLLM's server give them
    assert (required["finish_reason"], named["finish_reason"]) == ("tool_calls", "stop")
    for choice in (required, named):
        message = choice["message"]
        assert message["content"] is None
        (call,) = message["tool_calls"]
        assert call["type"] == "function" and call["id"]
        assert call["function"]["name"] == "get_weather"
        arguments = json.loads(call["function"]["arguments"])
        assert set(arguments) == {"city"} and isinstance(arguments["city"], str)   # strict


def test_the_parser_reads_a_call_the_model_emitted_in_its_format(called):
    choice = only_choice(called["bodies"]["auto-forced"])
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_auto_and_none_lines_answer_as_chat(called):
    none = only_choice(called["bodies"]["none"])
    assert "tool_calls" not in none["message"] and none["finish_reason"] in ("stop", "length")
    assert isinstance(none["message"]["content"], str)
    auto = only_choice(called["bodies"]["auto"])     # whatever the model said: a call or text
    assert auto["finish_reason"] in ("stop", "length", "tool_calls")
    assert auto["message"].get("tool_calls") or isinstance(auto["message"]["content"], str)


def test_tools_are_refused_where_nothing_can_read_their_calls(tmp_path):
    path = tmp_path / "batch.jsonl"
    path.write_text(json.dumps(chat("a", tool_choice="required")) + "\n")

    def run(*extra: str):
        return CliRunner().invoke(main, ["run", str(path), "--device", "cpu", *extra,
                                         "-o", str(tmp_path / "run")], catch_exceptions=False)

    # the built-in model's template names no tool-call format: no parser known
    unknown = run()
    assert unknown.exit_code == 2
    assert "field 'body.tools'" in unknown.output and "--tool-call-parser NAME" in unknown.output
    # a parser given, but the template never shows the model its tools
    hidden = run("--tool-call-parser", "hermes")
    assert hidden.exit_code == 2 and "takes no tools" in hidden.output
    assert not (tmp_path / "run" / "outputs.jsonl").exists()


def test_the_simulated_device_refuses_tools_naming_the_engine_that_runs_them():
    record, _ = record_from_batch_request(chat("a"), "f.jsonl:1")
    kept, (problem,) = refusals([record], request_path("sim", RUNTIMES[NXDI]))
    assert not kept and problem.field == "body.tools"
    assert "tool calling (vLLM's tool-call parser) cannot run on the simulated" in str(problem)
    assert "--ignore-field body.tools" in str(problem)


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"tools": []}, "body.tools", "non-empty array"),
    ({"tools": [{"type": "function"}]}, "body.tools[0]", "expected"),
    ({"tool_choice": "sometimes"}, "body.tool_choice", "expected one of none, auto, required"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}},
     "body.tool_choice", "give one of them"),
    ({"tools": None, "tool_choice": "auto"}, "body.tool_choice", "needs 'body.tools'"),
])
def test_bad_tool_fields_are_refused_by_field(body, field, words):
    line = chat("x", **body)
    line["body"] = {key: value for key, value in line["body"].items() if value is not None}
    with pytest.raises(FieldError) as caught:
        record_from_batch_request(line, "f:1")
    assert caught.value.field == field and words in caught.value.message
