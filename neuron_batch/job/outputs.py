"""A finished request -> its line of outputs.jsonl, in the shape its input's users parse.

- OpenAI batch input: OpenAI's batch output line (as `vllm run-batch` writes it): `id`,
  `custom_id`, `response` {`status_code`, `request_id`, `body`: a chat.completion or
  text_completion with `choices[n]`, each with its `finish_reason` and `logprobs`, and
  `usage`}, `error`. Chat logprobs as the chat API has them (`content[]` of `token`,
  `logprob`, `bytes`, `top_logprobs[]`); completions logprobs in that API's legacy shape
  (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`).
- Anything else: a JSON object with the request's id, index, prompt, `output`,
  `finish_reason` and token counts; with n > 1 or logprobs also `choices[n]` (each its
  `output`, `finish_reason`, token count and `logprobs` in the chat shape) and `usage`.
"""

from __future__ import annotations

import time
from typing import Any

from neuron_batch.inputs.prepare import PreparedRequest


def output_row(request: PreparedRequest, done, model_name: str, simulated: bool) -> dict:
    record = request.record
    if record.openai is not None:
        return openai_row(request, done, model_name)
    row: dict[str, Any] = {"id": record.id, "index": record.index}
    if record.prompt is not None:
        row["prompt"] = record.prompt
    elif record.messages is not None:
        row["messages"] = record.messages
    row["num_prompt_tokens"] = len(request.prompt_token_ids)
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


def usage(request: PreparedRequest, done) -> dict[str, int]:
    """OpenAI's usage: the prompt once, the completion tokens of every choice."""
    prompt = len(request.prompt_token_ids)
    completion = sum(len(c["token_ids"]) for c in done.choices) if done.choices else len(
        done.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _choices(done) -> list[dict[str, Any]]:
    if done.choices is not None:
        return done.choices
    return [{"index": 0, "token_ids": done.token_ids, "text": done.text,
             "finish_reason": done.finish_reason}]


def openai_row(request: PreparedRequest, done, model_name: str) -> dict:
    """A line of the OpenAI batch output format, as `vllm run-batch` writes it."""
    record = request.record
    chat = record.openai.get("url", "").endswith("/chat/completions")
    choices = []
    for choice in _choices(done):
        text = choice["text"] or ""
        logprobs = choice.get("logprobs")
        if chat:
            item = {"index": choice["index"],
                    "message": {"role": "assistant", "content": text},
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
            "model": record.openai.get("model") or model_name, "choices": choices,
            "usage": usage(request, done)}
    return {"id": f"batch_req_{record.index}", "custom_id": record.id,
            "response": {"status_code": 200, "request_id": record.id, "body": body},
            "error": None}


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
