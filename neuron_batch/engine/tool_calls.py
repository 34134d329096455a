"""A chat line's tool calls, read from its output by vLLM's own parser, as vLLM's OpenAI server
reads them (vllm/entrypoints/openai/chat_completion/serving.py, 0.32): the parser that
`--tool-call-parser` names (composed by vLLM's ParserManager), given the request's tools and
tool_choice as vLLM's ChatCompletionRequest.

- every request gets what the parser's `adjust_request` sets, as in the server: vLLM 0.32 holds
  calls to the parser's own format by a structural tag where the parser has one (hermes,
  llama, ...; with `"strict": true` on a tool its arguments to its schema too), else a forced
  tool_choice to the tools' JSON (`get_json_schema_from_tools`);
- "required" or a named function: the call is read from that output; finish_reason
  "tool_calls" for "required" (a call that ran to its end), the output's own for a named
  function, as OpenAI and vLLM do;
- "auto": the parser reads the model's own format; finish_reason "tool_calls" where it found
  a call;
- "none": the output as it is.

What the line asked (inputs/tool_calls.py) is plain data in its spec; the calls come back as
plain data: {"id", "type": "function", "function": {"name", "arguments"}}. vLLM is imported
when a reader is made.
"""

from __future__ import annotations

from typing import Any

#: The StructuredOutputsParams fields a request's constraint may come back in (the one form's
#: kinds, inputs/structured.py, and vLLM's structural tag).
STRUCTURED_KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


def known_parsers() -> list[str]:
    """vLLM's tool-call parser names."""
    from vllm.tool_parsers import ToolParserManager

    return sorted(ToolParserManager.list_registered())


class ToolCallReader:
    """vLLM's parser for one run's model (`name`), reading each tools request's output."""

    def __init__(self, name: str, tokenizer: Any, model_config: Any = None):
        from vllm.parser.parser_manager import ParserManager

        if name not in known_parsers():
            raise ValueError(f"--tool-call-parser {name}: not one of vLLM's tool-call parsers "
                             f"({', '.join(known_parsers())})")
        self.name = name
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.parser_cls = ParserManager.get_parser(tool_parser_name=name, enable_auto_tools=True,
                                                   tokenizer=tokenizer)

    @staticmethod
    def request(tools: dict[str, Any], structured: dict[str, Any] | None = None):
        """vLLM's ChatCompletionRequest for what a line asked (its messages are in the prompt
        already; the parser reads the tools, tool_choice and the line's own structured
        output)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        body: dict[str, Any] = {"model": "", "messages": [], "tools": tools["tools"],
                                "tool_choice": tools["tool_choice"]}
        if tools.get("parallel_tool_calls") is not None:
            body["parallel_tool_calls"] = tools["parallel_tool_calls"]
        if structured is not None:
            body["structured_outputs"] = structured
        return ChatCompletionRequest.model_validate(body)

    def sampling(self, tools: dict[str, Any], structured: dict[str, Any] | None
                 ) -> dict[str, Any]:
        """What the request's sampling gets for its tools, as vLLM's server sets it (the
        parser's `adjust_request`): its structured output (a forced tool_choice's JSON schema,
        or the parser's structural tag for its format, which vLLM 0.32 holds tool calls to;
        `structured`, the line's own, where the parser keeps it), and special tokens kept
        where the parser reads them (Hermes' tags are special tokens in some models)."""
        request = self.parser_cls(self.tokenizer, None).adjust_request(
            self.request(tools, structured))
        out: dict[str, Any] = {}
        params = request.structured_outputs
        if params is not None:
            form = {kind: getattr(params, kind) for kind in STRUCTURED_KINDS
                    if getattr(params, kind, None) not in (None, False)}
            if form:
                out["structured"] = form
        if request.skip_special_tokens is False:
            out["skip_special_tokens"] = False
        return out

    def read(self, tools: dict[str, Any], text: str | None, token_ids: list[int],
             finish_reason: str | None) -> tuple[str | None, list[dict[str, Any]], str | None]:
        """(the message's content, its tool calls, the finish reason) of one completion."""
        from vllm.renderers.chat_utils import make_tool_call_id

        if text is None or tools["tool_choice"] == "none":
            return text, [], finish_reason
        request = self.request(tools)
        parser = self.parser_cls(self.tokenizer, request.tools, model_config=self.model_config)
        _, content, calls = parser.parse(text, request, enable_auto_tools=True,
                                         model_output_token_ids=token_ids)
        out = [{"id": call.id or make_tool_call_id(), "type": "function",
                "function": {"name": call.name, "arguments": call.arguments}}
               for call in calls or ()]
        choice = tools["tool_choice"]
        if out and (choice == "auto" or (choice == "required" and finish_reason == "stop")):
            finish_reason = "tool_calls"
        return content, out, finish_reason
