"""Where every request of a run ends, in the shape its input's users parse: a response line in
outputs.jsonl, or an error record in errors.jsonl; and batch.json's counts of both
(job/batch_object.py). The one place a run writes them (`RunOutputs`).

- OpenAI batch input: OpenAI's batch output line (as `vllm run-batch` writes it): `id`,
  `custom_id`, `response` {`status_code`, `request_id`, `body`: a chat.completion or
  text_completion with `choices[n]`, each with its `finish_reason` and `logprobs`, and
  `usage`}, `error`. The body's `model` is the model that ran, by its served name
  (--served-model-name, else the model's directory or catalogue name), not the name the
  request gave. Chat logprobs as the chat API has them (`content[]` of `token`, `logprob`,
  `bytes`, `top_logprobs[]`); completions logprobs in that API's legacy shape (`tokens`,
  `token_logprobs`, `top_logprobs`, `text_offset`). An embeddings line's body is the
  embeddings API's `list` of one `embedding` (floats, or base64 where asked) and its `usage`.
- Anything else: a JSON object with the request's id, index, prompt, `output`,
  `finish_reason` and token counts; with n > 1 or logprobs also `choices[n]` (each its
  `output`, `finish_reason`, token count and `logprobs` in the chat shape) and `usage`.

An error record (OpenAI's error file layout; `vllm run-batch` puts the same `error` in its
one output file instead): a line refused before anything ran (its fields, a prompt over
max_model_len: the problems `--on-error skip` skipped), a request vLLM refused when it was
added, or one the engine finished with an error. OpenAI's shape: `id`, `custom_id`,
`response` {`status_code` 400 or 500, `request_id`, `body` {`error`}}, `error` {`code`,
`message`, `param`, `file`, `line`}; other inputs: `id` and `error`. Every input line ends in
exactly one record once an attempt has run to its end.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from array import array
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from neuron_batch.engine.models import BUILTIN_SERVED_NAME
from neuron_batch.inputs.embeddings_body import EMBEDDINGS_URL, encoding_of
from neuron_batch.inputs.prepare import PreparedRequest
from neuron_batch.inputs.prompt_records import InputProblem, PromptRecord
from neuron_batch.inputs.skipped import source_position
from neuron_batch.job.batch_object import BatchFile
from neuron_batch.job.folder import guard_disk_full
from neuron_batch.job.outputs_tally import OutputsTally

if TYPE_CHECKING:
    from neuron_batch.job.job import Job

ERRORS = "errors.jsonl"

#: Error codes (`error.code`) and the HTTP status each answers with.
INVALID_REQUEST = "invalid_request"             # a field refused, a line that is not a request
UNSUPPORTED_FIELD = "unsupported_field"         # a field this run's path cannot honour
CONTEXT_LENGTH = "context_length_exceeded"      # a prompt over max_model_len
ENGINE_REFUSED = "engine_refused"               # vLLM's own checks refused it when added
ENGINE_ERROR = "engine_error"                   # the engine finished it with an error
STATUS = {INVALID_REQUEST: 400, UNSUPPORTED_FIELD: 400, CONTEXT_LENGTH: 400,
          ENGINE_REFUSED: 400, ENGINE_ERROR: 500}


def served_name(job: Job) -> str:
    """The model name a run's responses say: --served-model-name, else the model's directory
    or hub name (the built-in one's own name, without the words that say it is built in)."""
    model = job.workload.model
    if job.settings.served_model_name:
        return job.settings.served_model_name
    return BUILTIN_SERVED_NAME if model.source == "builtin" else model.name


def output_row(request: PreparedRequest, done, model_name: str, simulated: bool) -> dict:
    record = request.record
    if record.openai is not None:
        return openai_row(request, done, model_name)
    row: dict[str, Any] = {"id": record.id, "index": record.index}
    if record.prompt is not None:
        row["prompt"] = record.prompt
    elif record.messages is not None:
        row["messages"] = record.messages
    row["num_prompt_tokens"] = request.prompt_len
    row["output"] = done.text
    if done.text is None and not simulated:
        row["output_token_ids"] = done.token_ids
    row["num_output_tokens"] = len(done.token_ids)
    row["finish_reason"] = done.finish_reason
    if done.choices is not None:
        row["choices"] = []
        for choice in done.choices:
            item = {"index": choice["index"], "output": choice["text"]}
            if choice["text"] is None and not simulated:
                item["output_token_ids"] = choice["token_ids"]
            item.update(num_output_tokens=len(choice["token_ids"]),
                        finish_reason=choice["finish_reason"])
            if "logprobs" in choice:
                item["logprobs"] = chat_logprobs(choice["logprobs"])["content"]
            row["choices"].append(item)
        row["usage"] = usage(request, done)
    return row


def usage(request: PreparedRequest, done) -> dict[str, Any]:
    """OpenAI's usage: the prompt once, the completion tokens of every choice, and how many of
    the prompt's tokens vLLM's prefix cache held."""
    prompt = request.prompt_len
    completion = sum(len(c["token_ids"]) for c in done.choices) if done.choices else len(
        done.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached_tokens(done)}}


def cached_tokens(done) -> int:
    return getattr(done, "num_cached_tokens", None) or 0


def _choices(done) -> list[dict[str, Any]]:
    if done.choices is not None:
        return done.choices
    return [{"index": 0, "token_ids": done.token_ids, "text": done.text,
             "finish_reason": done.finish_reason,
             "tool_calls": getattr(done, "tool_calls", None)}]


def _message(choice: dict[str, Any]) -> dict[str, Any]:
    """A chat choice's message: its text, and the tool calls read from it (content null where
    the calls are all there is, as OpenAI gives it)."""
    calls = choice.get("tool_calls")
    if not calls:
        return {"role": "assistant", "content": choice["text"] or ""}
    return {"role": "assistant", "content": choice["text"] or None, "tool_calls": calls}


def openai_row(request: PreparedRequest, done, model_name: str) -> dict:
    """A line of the OpenAI batch output format, as `vllm run-batch` writes it."""
    record = request.record
    assert record.openai is not None    # (output_row: only for an OpenAI batch line)
    if record.openai.get("url") == "/v1/responses":
        return _batch_line(record, responses_body(request, done, model_name))
    if record.openai.get("url") == EMBEDDINGS_URL:
        return _batch_line(record, embeddings_body(request, done, model_name))
    chat = record.openai.get("url", "").endswith("/chat/completions")
    choices = []
    for choice in _choices(done):
        text = choice["text"] or ""
        logprobs = choice.get("logprobs")
        if chat:
            item = {"index": choice["index"], "message": _message(choice),
                    "logprobs": chat_logprobs(logprobs) if logprobs is not None else None,
                    "finish_reason": choice["finish_reason"]}
        else:
            item = {"index": choice["index"], "text": text,
                    "logprobs": (completion_logprobs(logprobs) if logprobs is not None
                                 else None),
                    "finish_reason": choice["finish_reason"]}
        choices.append(item)
    body = {"id": f"cmpl-{record.id}", "object": "chat.completion" if chat else
            "text_completion", "created": int(time.time()),
            "model": model_name, "choices": choices, "usage": usage(request, done)}
    return _batch_line(record, body)


def _batch_line(record: PromptRecord, body: dict) -> dict:
    return {"id": f"batch_req_{record.index}", "custom_id": record.id,
            "response": {"status_code": 200, "request_id": record.id, "body": body},
            "error": None}


def responses_body(request: PreparedRequest, done, model_name: str) -> dict:
    """The Responses API's response object: one assistant message of output_text; status
    incomplete (reason max_output_tokens) where the output hit its length."""
    record = request.record
    text = done.text or ""
    counts = usage(request, done)
    cut = done.finish_reason == "length"
    sampling = record.sampling or {}
    return {"id": f"resp_{record.id}", "object": "response", "created_at": int(time.time()),
            "status": "incomplete" if cut else "completed", "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "instructions": None, "max_output_tokens": record.max_tokens, "model": model_name,
            "output": [{"type": "message", "id": f"msg_{record.id}",
                        "status": "incomplete" if cut else "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": text,
                                     "annotations": []}]}],
            "parallel_tool_calls": False, "temperature": record.temperature,
            "tool_choice": "none", "tools": [], "top_p": sampling.get("top_p", 1.0),
            "usage": {"input_tokens": counts["prompt_tokens"],
                      "input_tokens_details": {**counts["prompt_tokens_details"],
                                               "cache_write_tokens": 0},
                      "output_tokens": counts["completion_tokens"],
                      "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": counts["total_tokens"]}}


def embeddings_body(request: PreparedRequest, done, model_name: str) -> dict:
    """The embeddings API's response: a list of one embedding (a line embeds one input:
    inputs/embeddings_body.py), as floats or, where the line asked for base64, its float32
    little-endian bytes in base64 (as OpenAI and vLLM write them); usage counts the prompt."""
    vector = done.embedding or []
    if encoding_of(request.record) == "base64":
        data = array("f", vector)
        if sys.byteorder != "little":
            data.byteswap()
        embedding: list[float] | str = base64.b64encode(data.tobytes()).decode("ascii")
    else:
        embedding = vector
    prompt = request.prompt_len
    return {"id": f"embd-{request.record.id}", "object": "list", "created": int(time.time()),
            "data": [{"object": "embedding", "index": 0, "embedding": embedding}],
            "model": model_name, "usage": {"prompt_tokens": prompt, "total_tokens": prompt}}


def _token_text(token: str | None, token_id: int) -> str:
    # Without a tokenizer (the simulated device) a token is named by its id, as vLLM's
    # --return-tokens-as-token-ids does.
    return token if token is not None else f"token_id:{token_id}"


def chat_logprobs(logprobs: list[dict[str, Any]]) -> dict[str, list]:
    """The chat API's logprobs object from engine/sampling_params.py's plain ones."""
    def entry(token: str | None, token_id: int, logprob: float) -> dict[str, Any]:
        text = _token_text(token, token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**entry(item["token"], item["id"], item["logprob"]),
                         "top_logprobs": [entry(tok, tid, lp) for tid, tok, lp in item["top"]]}
                        for item in logprobs]}


def completion_logprobs(logprobs: list[dict[str, Any]]) -> dict[str, list]:
    """The completions API's legacy logprobs: tokens, token_logprobs, top_logprobs (a
    {token: logprob} per position) and text_offset (each token's start in the text)."""
    tokens = [_token_text(item["token"], item["id"]) for item in logprobs]
    offsets, offset = [], 0
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": [item["logprob"] for item in logprobs],
            "top_logprobs": [{_token_text(tok, tid): lp for tid, tok, lp in item["top"]}
                             for item in logprobs],
            "text_offset": offsets}


# ---------------------------------------------------------------------------------------------
# Error records


def error_row(*, custom_id: str | None, key: str, code: str, message: str,
              param: str | None, file: str | None, line: int | str | None,
              openai: bool) -> dict[str, Any]:
    """One error record: OpenAI's error-file line (`openai`), else `id` and `error`."""
    error = {"code": code, "message": message, "param": param, "file": file, "line": line}
    if not openai:
        return {"id": custom_id, "error": error}
    status = STATUS.get(code, 400)
    body = {"error": {"message": message,
                      "type": "invalid_request_error" if status < 500 else "server_error",
                      "param": param, "code": code}}
    return {"id": f"batch_req_{key}", "custom_id": custom_id,
            "response": {"status_code": status, "request_id": custom_id, "body": body},
            "error": error}


def problem_error_row(problem: InputProblem, openai: bool) -> dict[str, Any]:
    """The error record of a line refused before anything ran."""
    file, line = source_position(problem)
    code = CONTEXT_LENGTH if problem.too_long else problem.code or INVALID_REQUEST
    return error_row(custom_id=problem.custom_id, key=f"line_{problem.read_order}", code=code,
                     message=str(problem), param=problem.field, file=file, line=line,
                     openai=openai)


def request_error_row(record: PromptRecord, code: str, message: str) -> dict[str, Any]:
    """The error record of a request vLLM refused or failed."""
    file, _, where = record.source.rpartition(":")
    line = int(where) if where.isdigit() else (where or None)
    return error_row(custom_id=record.id, key=str(record.index), code=code,
                     message=message, param=None, file=file or None,
                     line=line, openai=record.openai is not None)


# ---------------------------------------------------------------------------------------------
# The run's writer


class RunOutputs:
    """Writes where each request of an attempt ends: its response (outputs.jsonl, through the
    run folder, flushed at once), or its error record (errors.jsonl); and batch.json's counts.

    errors.jsonl is rewritten when an attempt starts with the lines refused before anything
    ran (a --resume runs the requests an engine failed again), then appended to; it is removed
    while it would be empty (OpenAI's `error_file_id` is null then)."""

    def __init__(self, job: Job, batch: BatchFile):
        self.folder = job.folder
        self.model_name = served_name(job)
        self.simulated = job.simulated
        self.batch = batch
        self.errors_path = job.folder.path / ERRORS
        self._errors: IO[str] | None = None

    @classmethod
    def begin(cls, job: Job, done: OutputsTally,
              problems: Sequence[InputProblem]) -> RunOutputs:
        """An attempt's writer: the error records of `problems` written, batch.json current
        with the outputs already written (`done`: a --resume's, their sums)."""
        requests = job.workload.prepared.requests     # (a streamed job: read, not held)
        openai = job.workload.input_kind == "openai-batch"
        rows = [problem_error_row(problem, openai) for problem in problems]
        path = job.folder.path / ERRORS
        if rows:
            tmp = path.with_name(f".{path.name}.tmp")
            guard_disk_full(tmp, lambda: tmp.write_text(
                "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows),
                encoding="utf-8"))
            tmp.replace(path)
        else:
            path.unlink(missing_ok=True)
        settings = job.settings
        batch = BatchFile(job.folder.path, path, total=len(requests) + len(problems),
                          inputs=settings.inputs or ("(built-in prompts)",),
                          endpoint=job.workload.facts(settings).endpoint,
                          model=served_name(job),
                          max_runtime_s=settings.max_runtime)
        batch.start(done, failed=len(rows))
        return cls(job, batch)

    def response(self, request: PreparedRequest, done) -> None:
        """A finished request's response line (run folder: outputs.jsonl)."""
        row = output_row(request, done, self.model_name, self.simulated)
        self.folder.append_output(row, request.record.index)
        completion = (sum(len(c["token_ids"]) for c in done.choices) if done.choices
                      else len(done.token_ids))
        self.batch.completed(request.prompt_len, completion, cached_tokens(done))

    def refused(self, request: PreparedRequest, error: Exception) -> str:
        """vLLM refused `request` when it was added: its error record; returns the words."""
        message = f"vLLM refused the request: {error}"
        self.error(request.record, ENGINE_REFUSED, message)
        return f"{request.record.source}: {message}"

    def failed(self, request: PreparedRequest, done) -> str:
        """The engine finished `request` with an error (e.g. too big for the KV cache): its
        error record; returns the words."""
        message = str(done.stop_reason or f"request {done.request_id} failed in the engine")
        self.error(request.record, ENGINE_ERROR, message)
        return message

    def error(self, record: PromptRecord, code: str, message: str) -> None:
        """A request's error record (vLLM refused or failed it)."""
        row = request_error_row(record, code, message)
        if self._errors is None:
            self._errors = open(self.errors_path, "a", encoding="utf-8")

        def write() -> None:
            assert self._errors is not None
            self._errors.write(json.dumps(row, ensure_ascii=False) + "\n")
            self._errors.flush()
        guard_disk_full(self.errors_path, write)
        self.batch.failed()

    def end(self, ended: str) -> None:
        """The attempt ended (attempts.json's word for how): the files closed, batch.json
        says so."""
        self.close()
        self.batch.end(ended)

    def close(self) -> None:
        if self._errors is not None:
            self._errors.close()
            self._errors = None




