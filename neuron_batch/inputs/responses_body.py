"""A `/v1/responses` body of an OpenAI batch file -> the record's chat prompt and fields.

The Responses API is what new OpenAI code is written against, and OpenAI's Batch API takes it
(../shared/notes/batch-formats.md). What a body may say here, each read or refused by name:

- `input`: a string (one user message), or a list of messages (`role` and `content`: a string,
  or a list of `input_text` / `output_text` parts, joined); `instructions`: a system message
  put first;
- `max_output_tokens` (default: up to the context, as OpenAI), `temperature`, `top_p`;
- `text.format`: `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema",
  "name", "schema", "strict"}` (flat, as this API writes it) -> the one structured form;
- `model`, `user`, `stream` (false), `metadata`, `store` (false) as chat takes them.

Tool calling is refused (json_requests.TOOL_FIELDS: chat lines run tools); images, files, previous
responses (`previous_response_id`, `reasoning`, ...) are fields this offline batch does not
run, so unknown here and refused by name (--ignore-field drops one). A chat field such as
`max_tokens` or `messages` is another endpoint's: refused, naming this API's own. Pure.
"""

from __future__ import annotations

from typing import Any

from neuron_batch.inputs.prompt_records import (
    FieldError,
    PromptRecord,
    check_int,
    check_messages,
    describe_value,
)
from neuron_batch.inputs.request_fields import read_request_fields
from neuron_batch.inputs.structured import read_structured

RESPONSES_URL = "/v1/responses"
#: The body fields read here (besides the tool-calling ones refused for their reason).
RESPONSES_FIELDS = ("input", "instructions", "max_output_tokens", "temperature", "top_p", "text",
                    "model", "user", "stream", "metadata", "store")
#: Content part types whose text is the message's (input text; an assistant's earlier answer).
TEXT_PARTS = ("input_text", "output_text", "text")


def read_responses_body(body: dict, record: PromptRecord) -> None:
    """Fill `record` (prompt, max_tokens, temperature, sampling) from a Responses body whose
    keys are known (check_known ran). FieldError names the first bad field."""
    messages = _input_messages(body.get("input"), "body.input")
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise FieldError("body.instructions",
                             f"expected a string, got {describe_value(instructions)}")
        messages.insert(0, {"role": "system", "content": instructions})
    record.messages = check_messages(messages, "body.input")
    record.prompt_field = "body.input"
    if body.get("store") not in (None, False):
        raise FieldError("body.store", "nothing is stored: a batch's responses are its output "
                                       "file; drop store or set it false")
    # temperature and top_p as chat reads them; max_output_tokens is this API's max_tokens
    read_request_fields({key: body[key] for key in ("temperature", "top_p") if key in body},
                        record, prefix="body.", style="chat")
    if body.get("max_output_tokens") is not None:
        record.max_tokens = check_int(body["max_output_tokens"], "body.max_output_tokens",
                                      minimum=1)
    structured = _text_format(body.get("text"))
    if structured is not None:
        record.sampling = {**(record.sampling or {}), "structured": structured}
        record.sampling_fields = {**(record.sampling_fields or {}),
                                  "structured": "body.text.format"}


def _input_messages(value: Any, where: str) -> list[dict]:
    if isinstance(value, str):
        if not value:
            raise FieldError(where, "empty input")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise FieldError(where, f"expected a string or a non-empty array of messages, got "
                                f"{describe_value(value)}")
    messages = []
    for position, item in enumerate(value):
        at = f"{where}[{position}]"
        if not isinstance(item, dict):
            raise FieldError(at, f"expected a message object, got {describe_value(item)}")
        if item.get("type", "message") != "message":
            raise FieldError(f"{at}.type", f"only messages are run here, got "
                                           f"{describe_value(item.get('type'))}")
        content = item.get("content")
        if isinstance(content, list):
            content = _joined_text(content, f"{at}.content")
        messages.append({"role": item.get("role"), "content": content})
    return messages


def _joined_text(parts: list, where: str) -> str:
    texts = []
    for position, part in enumerate(parts):
        at = f"{where}[{position}]"
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS:
            kind = part.get("type") if isinstance(part, dict) else part
            raise FieldError(at, f"only text parts ({', '.join(TEXT_PARTS)}) are run here, "
                                 f"got {describe_value(kind)}")
        if not isinstance(part.get("text"), str):
            raise FieldError(f"{at}.text", f"expected a string, got "
                                           f"{describe_value(part.get('text'))}")
        texts.append(part["text"])
    return "".join(texts)


def _text_format(text: Any) -> dict | None:
    """`text.format` as the one structured form (None: free text)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise FieldError("body.text", f"expected an object, got {describe_value(text)}")
    unknown = [key for key in text if key != "format"]
    if unknown:
        raise FieldError(f"body.text.{unknown[0]}", "not a field of text; expected format")
    form = text.get("format")
    if form is None:
        return None
    if not isinstance(form, dict):
        raise FieldError("body.text.format", f"expected an object with a type, got "
                                             f"{describe_value(form)}")
    if form.get("type") == "json_schema":
        # (flat here; chat's response_format nests the same under json_schema)
        form = {"type": "json_schema", "json_schema": {
            key: form[key] for key in ("name", "schema", "strict") if key in form}}
    try:
        return read_structured({"response_format": form}, "body.text.")
    except FieldError as error:   # (name the field as this API spells it)
        field = (error.field or "").replace("body.text.response_format", "body.text.format")
        raise FieldError(field.replace(".json_schema.schema", ".schema"),
                         error.message) from None
