"""One JSON request -> one `PromptRecord`: a JSON line's object, or a request of an OpenAI batch
file (`/v1/chat/completions`, `/v1/completions`, `/v1/responses` (responses_body.py) or
`/v1/embeddings` (embeddings_body.py), its `body` as those APIs take it).

Every field is read or refused (request_fields.py): a field neither format knows is named by
line and field, unless `--ignore-field` drops it (`ignored`).
"""

from __future__ import annotations

from collections.abc import Collection

from neuron_batch.inputs.embeddings_body import (
    EMBEDDINGS_FIELDS,
    EMBEDDINGS_URL,
    read_embeddings_body,
)
from neuron_batch.inputs.prompt_records import (
    PROMPT_FIELDS,
    FieldError,
    PromptRecord,
    check_id,
    check_messages,
    check_prompt_text,
    check_token_ids,
    describe_value,
    set_prefix,
    set_prompt,
)
from neuron_batch.inputs.request_fields import (
    REQUEST_FIELDS,
    check_known,
    drop_ignored,
    read_request_fields,
)
from neuron_batch.inputs.responses_body import (
    RESPONSES_FIELDS,
    RESPONSES_URL,
    read_responses_body,
)
from neuron_batch.inputs.tool_calls import OLD_TOOL_FIELDS, read_tools
from neuron_batch.inputs.tool_calls import TOOL_FIELDS as CHAT_TOOL_FIELDS

OPENAI_BATCH_URLS = ("/v1/completions", "/v1/chat/completions", RESPONSES_URL,
                     EMBEDDINGS_URL)
#: Endpoints OpenAI's Batch API takes that are not run here, and why (their lines are refused
#: for that reason, not as an unknown URL).
NOT_RUN_URLS = {
    "/v1/moderations": "moderation is OpenAI's own classifier, not a model run here"}
#: The keys of an OpenAI batch request line.
BATCH_LINE_FIELDS = ("custom_id", "method", "url", "body")
#: Body fields besides the prompt and the request's own: the model name (kept for the output)
#: and two that shape nothing here: `user` (an end-user tag) and `stream` when false.
BODY_FIELDS = ("model", "user", "stream")


#: The fields of a JSON line besides the request's own (request_fields.REQUEST_FIELDS).
LINE_FIELDS = (*PROMPT_FIELDS, "id", "custom_id", "prefix_id", "prefix_len")


#: Fields for tool calling. An OpenAI chat completions line takes them (tool_calls.py: read,
#: and honoured where vLLM can parse the model's calls); a plain JSON line or a responses line
#: does not run them: refused for that reason, by name (rather than as an unknown field).
TOOL_FIELDS = (*CHAT_TOOL_FIELDS, *OLD_TOOL_FIELDS)


def refuse_tools(obj: dict, prefix: str, ignored: Collection[str], what: str) -> None:
    """FieldError for the first tool-calling field `obj` gives (see TOOL_FIELDS); `what`: the
    kind of line, for the words."""
    for name in TOOL_FIELDS:
        if obj.get(name) is not None and name not in ignored and prefix + name not in ignored:
            raise FieldError(prefix + name, f"tool calling is not run from {what}: only an "
                             "OpenAI batch /v1/chat/completions line's tools are (with vLLM's "
                             "tool-call parser for the model); give it as one, or pass "
                             f"--ignore-field {prefix + name} to run the request without tools")


def request_id(obj: dict) -> str | None:
    """The id a request line gives itself (`custom_id`, else `id`), as its error record names it
    even when the line is refused; None where it gives none usable."""
    for key in ("custom_id", "id"):
        value = obj.get(key)
        if isinstance(value, str) and value or isinstance(value, int) and not isinstance(
                value, bool):
            return str(value)
    return None


def record_from_object(obj: dict, source: str, ignored: Collection[str] = ()
                       ) -> tuple[PromptRecord, str]:
    """A JSON-lines object -> (record without index, the field its id came from). A field not
    known is refused unless `ignored` (--ignore-field) names it."""
    obj = drop_ignored(obj, "", ignored)
    get = obj.get
    given = [name for name in PROMPT_FIELDS if get(name) is not None]
    if len(given) != 1:
        if not given:
            keys = ", ".join(repr(key) for key in list(obj)[:10]) or "none"
            raise FieldError(None, "no prompt: expected one of 'prompt', 'messages', "
                                   f"'prompt_token_ids', 'prompt_len' (keys found: {keys})")
        raise FieldError(given[1], f"conflicts with '{given[0]}': give only one of "
                                   "'prompt', 'messages', 'prompt_token_ids', 'prompt_len'")
    refuse_tools(obj, "", ignored, "a JSON line")
    check_known(obj, (*LINE_FIELDS, *REQUEST_FIELDS), "", ignored, "a JSON line")
    record = PromptRecord(index=-1, id="", source=source)
    set_prompt(record, given[0], obj[given[0]], given[0])
    id_field = "id"
    custom_id = get("custom_id")
    if (value := get("id")) is not None:
        record.id = check_id(value, "id")
        if custom_id is not None and check_id(custom_id, "custom_id") != record.id:
            raise FieldError("custom_id", f"differs from 'id' ({record.id!r}); give one of them")
    elif custom_id is not None:
        id_field = "custom_id"
        record.id = check_id(custom_id, "custom_id")
    read_request_fields(obj, record, style="jsonl")
    if get("prefix_id") is not None or get("prefix_len") is not None:
        set_prefix(record, get("prefix_id"), get("prefix_len"))
    return record, id_field


def record_from_batch_request(obj: dict, source: str, ignored: Collection[str] = ()
                              ) -> tuple[PromptRecord, str]:
    """One request of an OpenAI batch input file -> (record, "custom_id")."""
    check_known(obj, BATCH_LINE_FIELDS, "", ignored, "an OpenAI batch request line")
    if obj.get("custom_id") is None:
        raise FieldError("custom_id", "missing; every request in an OpenAI batch file needs one")
    custom_id = check_id(obj["custom_id"], "custom_id")
    method = obj.get("method", "POST")
    if method != "POST":
        raise FieldError("method", f'expected "POST", got {describe_value(method)}')
    url = obj.get("url")
    if url in NOT_RUN_URLS:
        raise FieldError("url", f"{url} is not run here: {NOT_RUN_URLS[url]}")
    if url not in OPENAI_BATCH_URLS:
        raise FieldError("url", f"expected one of {', '.join(OPENAI_BATCH_URLS)}, "
                                f"got {describe_value(url)}")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise FieldError("body", f"expected an object, got {describe_value(body)}")
    chat = url == "/v1/chat/completions"
    body = drop_ignored(body, "body.", ignored)
    record = PromptRecord(index=-1, id=custom_id, source=source)
    if url == EMBEDDINGS_URL:
        check_known(body, EMBEDDINGS_FIELDS, "body.", ignored, "an embeddings body")
        read_embeddings_body(body, record)
    elif url == RESPONSES_URL:
        refuse_tools(body, "body.", ignored, "a /v1/responses line")
        check_known(body, RESPONSES_FIELDS, "body.", ignored, "a responses body")
        read_responses_body(body, record)
    elif not chat:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], str):
            record.prompt_token_ids = check_token_ids(prompt, "body.prompt")
        else:
            record.prompt = check_prompt_text(prompt, "body.prompt")
        record.prompt_field = "body.prompt"
    else:
        record.messages = check_messages(body.get("messages"), "body.messages")
        record.prompt_field = "body.messages"
    if not chat and url == "/v1/completions":
        refuse_tools(body, "body.", ignored, "a /v1/completions line")
    if url not in (RESPONSES_URL, EMBEDDINGS_URL):
        check_known(body, ("messages" if chat else "prompt", *BODY_FIELDS, *REQUEST_FIELDS,
                           *(TOOL_FIELDS if chat else ())),
                    "body.", ignored, f"a {'chat ' if chat else ''}completions body")
        read_request_fields(body, record, prefix="body.",
                            style="chat" if chat else "completions")
    if chat:
        read_tools(body, record, "body.")
    if body.get("stream") not in (None, False):
        raise FieldError("body.stream", "a batch request's output is written whole; "
                                        "drop stream or set it false")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise FieldError("body.model", f"expected a string, got {describe_value(model)}")
    record.openai = {"custom_id": custom_id, "url": url, "model": model}
    if url == EMBEDDINGS_URL:
        record.openai["encoding_format"] = body.get("encoding_format") or "float"
    return record, "custom_id"
