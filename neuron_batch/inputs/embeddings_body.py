"""A `/v1/embeddings` body of an OpenAI batch file -> the record's prompt and what it asks.

OpenAI's Batch API takes embeddings lines (../shared/notes/batch-formats.md); here they run on
vLLM's pooling runner (`runner="pooling"`, engine/engine.py), on vLLM's own engine only (the
table of which path honours what: request_paths.py, feature `embed`). What a body may say,
each read or refused by name:

- `input`: a string, an array of token ids, or an array holding one of those. An array of
  several inputs is refused: each input is a request of its own here (its own scheduling,
  record and error record), so the fix is one line per input, each with its custom_id;
- `encoding_format`: "float" (default) or "base64" (the floats as little-endian float32
  bytes, base64, as OpenAI and vLLM write them): how the output is written, nothing else;
- `dimensions`: a Matryoshka model's shorter embedding; vLLM refuses it, naming the sizes,
  when the model has none (an error record `engine_refused` under --on-error skip);
- `model`, `user` as the other endpoints take them.

What it asks goes into `record.sampling["embed"]` (plain data, as every request's fields: it
travels to Ray replicas and into the resume digests); the engine makes PoolingParams of it.
Pure.
"""

from __future__ import annotations

from typing import Any

from neuron_batch.inputs.prompt_records import (
    FieldError,
    PromptRecord,
    check_int,
    check_prompt_text,
    check_token_ids,
    describe_value,
)

EMBEDDINGS_URL = "/v1/embeddings"
#: The body fields read here.
EMBEDDINGS_FIELDS = ("input", "encoding_format", "dimensions", "model", "user")
ENCODING_FORMATS = ("float", "base64")
#: The key of `PromptRecord.sampling` (and of the engine's spec) that makes a request an
#: embedding: its value the pooling parameters it asks for ({} or {"dimensions": d}).
EMBED = "embed"


def read_embeddings_body(body: dict, record: PromptRecord) -> None:
    """Fill `record` (its prompt and the `embed` spec) from an embeddings body whose keys are
    known (check_known ran). FieldError names the first bad field."""
    value: Any = body.get("input")
    if isinstance(value, list) and value and isinstance(value[0], (str, list)):
        if len(value) > 1:
            raise FieldError("body.input", f"{len(value)} inputs in one line: each input runs "
                             "as a request of its own here, so give one line per input, each "
                             "with its own custom_id")
        value = value[0]
    if isinstance(value, list):
        record.prompt_token_ids = check_token_ids(value, "body.input")
    else:
        record.prompt = check_prompt_text(value, "body.input")
    record.prompt_field = "body.input"
    encoding = body.get("encoding_format", "float")
    if encoding not in ENCODING_FORMATS:
        raise FieldError("body.encoding_format",
                         f"expected \"float\" or \"base64\", got {describe_value(encoding)}")
    embed: dict[str, Any] = {}
    if body.get("dimensions") is not None:
        embed["dimensions"] = check_int(body["dimensions"], "body.dimensions", minimum=1)
    record.sampling = {**(record.sampling or {}), EMBED: embed}
    record.sampling_fields = {**(record.sampling_fields or {}), EMBED: "url"}


def is_embedding(record: PromptRecord) -> bool:
    return EMBED in (record.sampling or {})


def encoding_of(record: PromptRecord) -> str:
    """How the record's embedding is written ("float" or "base64")."""
    return (record.openai or {}).get("encoding_format") or "float"
