"""Tool calling in a chat completions line: `tools`, `tool_choice`, `parallel_tool_calls`, read
and checked here; which of vLLM's tool-call parsers reads a model's calls; whether a model's
chat template shows the model its tools at all. Pure (a model's files are read as text).

vLLM turns a model's output into OpenAI's `tool_calls` with a parser for the model's own format
(`vllm serve --tool-call-parser NAME`; vllm/tool_parsers, ToolParserManager in 0.32). A batch
line's tools are honoured the same way (engine/tool_calls.py runs vLLM's parser on the output)
where three things hold, each refused by line and field otherwise:

- the run's path runs them: vLLM's own engine (inputs/request_paths.py, feature `tools`); the
  simulated device makes no text to parse;
- a parser is known: `--tool-call-parser`, else the one the model's chat template names by its
  format's markers (`guess_parser`); none known: refused, naming the option;
- the model's chat template takes `tools` (the prompt is rendered with them, inputs/prepare.py):
  a template that never mentions them would hide them from the model.

`tool_choice` "required" or a named function makes vLLM hold the output to a call (in the
parser's format, or the tools' JSON, as its server does: engine/tool_calls.py); "auto" lets
the model choose and the parser read its format; "none" runs the line without calls. A
request's own structured output cannot be held beside a forced call: refused. The deprecated
`functions` / `function_call` fields are refused, naming `tools`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from neuron_batch.inputs.prompt_records import FieldError, PromptRecord, describe_value

#: The key of `PromptRecord.sampling` (and of the engine's spec) holding a line's tools:
#: {"tools": [...], "tool_choice": ..., "parallel_tool_calls": bool or None}.
TOOLS = "tools"
#: The chat fields read here.
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")
#: The older OpenAI form of tools, refused naming the new one.
OLD_TOOL_FIELDS = ("functions", "function_call")
TOOL_CHOICES = ("none", "auto", "required")

#: A chat template's markers of a tool-call format, and the vLLM parser that reads it, where
#: the marker is that format's own (Hermes' and Qwen's `<tool_call>` tags; Llama 3.1's
#: `<|python_tag|>`; Mistral's `[TOOL_CALLS]`).
TEMPLATE_PARSERS = (("<tool_call>", "hermes"), ("<|python_tag|>", "llama3_json"),
                    ("[TOOL_CALLS]", "mistral"))


def read_tools(body: dict, record: PromptRecord, prefix: str) -> None:
    """Put a chat body's tools into `record.sampling["tools"]` (nothing when it gives none).
    FieldError names the first bad field."""
    for name in OLD_TOOL_FIELDS:
        if body.get(name) is not None:
            raise FieldError(prefix + name, f"the deprecated form of tool calling; give "
                                            f"'{prefix}tools' (and 'tool_choice') instead, or "
                                            f"pass --ignore-field {prefix + name} to run the "
                                            f"request without it")
    tools = body.get("tools")
    if tools is None:
        for name in ("tool_choice", "parallel_tool_calls"):
            if body.get(name) is not None:
                raise FieldError(prefix + name, f"needs '{prefix}tools'")
        return
    if not isinstance(tools, list) or not tools:
        raise FieldError(prefix + "tools", f"expected a non-empty array of tools, got "
                                           f"{describe_value(tools)}")
    names = [_tool_name(tool, f"{prefix}tools[{i}]") for i, tool in enumerate(tools)]
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict):
        function = choice.get("function")
        if choice.get("type") != "function" or not isinstance(function, dict):
            raise FieldError(prefix + "tool_choice", 'expected {"type": "function", '
                             f'"function": {{"name": ...}}}}, got {describe_value(choice)}')
        if function.get("name") not in names:
            raise FieldError(prefix + "tool_choice.function.name",
                             f"{describe_value(function.get('name'))} is not one of the "
                             f"line's tools ({', '.join(names)})")
    elif choice not in TOOL_CHOICES:
        raise FieldError(prefix + "tool_choice", f"expected one of {', '.join(TOOL_CHOICES)} "
                                                 f"or a named function, got "
                                                 f"{describe_value(choice)}")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise FieldError(prefix + "parallel_tool_calls",
                         f"expected true or false, got {describe_value(parallel)}")
    sampling = dict(record.sampling or {})
    if forced(choice) and "structured" in sampling:
        where = (record.sampling_fields or {}).get("structured", "structured output")
        raise FieldError(prefix + "tool_choice", f"a {_choice_words(choice)} tool_choice forces "
                         f"the output to the tools' JSON, which '{where}' would also shape: "
                         f"give one of them")
    sampling[TOOLS] = {"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel}
    record.sampling = sampling
    record.sampling_fields = {**(record.sampling_fields or {}), TOOLS: prefix + "tools"}


def _tool_name(tool: Any, where: str) -> str:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(
            function, dict):
        raise FieldError(where, 'expected {"type": "function", "function": {"name": ...}}, '
                                f"got {describe_value(tool)}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise FieldError(where + ".function.name", f"expected a name, got {describe_value(name)}")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise FieldError(where + ".function.parameters",
                         f"expected a JSON schema object, got {describe_value(parameters)}")
    return name


def forced(choice: Any) -> bool:
    """Whether a tool_choice forces a call ("required", or a named function)."""
    return choice == "required" or isinstance(choice, dict)


def _choice_words(choice: Any) -> str:
    return "named-function" if isinstance(choice, dict) else repr(choice)


def tools_of(record: PromptRecord) -> dict[str, Any] | None:
    return (record.sampling or {}).get(TOOLS)


def takes_tools(chat_template: str | None) -> bool:
    """Whether a chat template renders the `tools` it is given (it names the variable)."""
    return bool(chat_template) and "tools" in str(chat_template)


def guess_parser(chat_template: str | None) -> str | None:
    """The vLLM tool-call parser a chat template's own markers name, None where none does."""
    for marker, parser in TEMPLATE_PARSERS:
        if chat_template and marker in chat_template:
            return parser
    return None


def chat_template_of(model_dir: str | None) -> str | None:
    """A local model directory's chat template as text (chat_template.jinja, else
    tokenizer_config.json's `chat_template`: one string, or named templates, all joined);
    None for anything else (a hub id, no template)."""
    if not model_dir or not Path(model_dir).is_dir():
        return None
    path = Path(model_dir)
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text(encoding="utf-8", errors="replace")
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):
        return "\n".join(str(item.get("template", "")) for item in template
                         if isinstance(item, dict))
    return template if isinstance(template, str) else None


def parser_for(setting: str | None, model_dir: str | None) -> str | None:
    """The run's tool-call parser: --tool-call-parser, else the model's template's guess."""
    return setting or guess_parser(chat_template_of(model_dir))
