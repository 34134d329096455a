"""What a request asks for besides its prompt, read once from a JSON line's top level or an
OpenAI batch body, checked before anything runs, and kept as plain data.

Every field vLLM's `SamplingParams` takes for offline generation is honoured: `n`,
`temperature`, `top_p`, `top_k`, `min_p`, `seed`, the three penalties, `logit_bias`,
`logprobs` (chat: `logprobs: true` and `top_logprobs: k`; completions and JSON lines: an
integer k), `stop`, `stop_token_ids`, `include_stop_str_in_output`, `min_tokens`,
`ignore_eos`, `max_tokens` / `max_completion_tokens`, and structured outputs (structured.py).
A field this module does not know is refused, naming it (a typo is the likelier cause than a
field to ignore), unless `--ignore-field NAME` drops it; nothing is dropped silently.

`temperature`, `max_tokens` and `stop` stay on the record itself (everything sizes a run by
them); the rest go into `PromptRecord.sampling`, a dict under SamplingParams' own names, only
the fields given. `sampling_spec` merges it with the run's defaults into the one dict
engine/sampling_params.py turns into `SamplingParams`. Pure Python.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from neuron_batch.errors import did_you_mean
from neuron_batch.inputs.embeddings_body import is_embedding
from neuron_batch.inputs.prompt_records import (
    FieldError,
    PromptRecord,
    check_int,
    check_number,
    check_stop,
    describe_value,
)
from neuron_batch.inputs.structured import STRUCTURED_FIELDS, read_structured

#: vLLM's default `max_logprobs` (ModelConfig): a request may ask for at most this many top
#: alternatives per token (OpenAI's chat API allows 20 too).
MAX_LOGPROBS = 20
#: The range of a seed torch's generator takes (manual_seed: -2**63 .. 2**64 - 1).
SEED_RANGE = (-(2 ** 63), 2 ** 64 - 1)

#: The fields that go into `PromptRecord.sampling`, by SamplingParams' names.
SAMPLING_KEYS = ("n", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs",
                 "stop_token_ids", "include_stop_str_in_output", "min_tokens", "ignore_eos",
                 "structured")
#: Request fields read here, and what they are (the words of an unknown field's message).
REQUEST_FIELDS = ("max_tokens", "max_completion_tokens", "temperature", "stop", "n", "top_p",
                  "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
                  "repetition_penalty", "logit_bias", "logprobs", "top_logprobs",
                  "stop_token_ids", "include_stop_str_in_output", "min_tokens", "ignore_eos",
                  *STRUCTURED_FIELDS)


#: What a line runs with where it gives no temperature, by its format (--temperature, where
#: given, for every format): other inputs decode greedily, as this tool always documented;
#: an OpenAI batch line gets what OpenAI's API gives (temperature and top_p 1), or where the
#: model's generation_config.json sets sampling fields, those, as vLLM's server does.
PLAIN_TEMPERATURE = 0.0
OPENAI_DEFAULTS = {"temperature": 1.0, "top_p": 1.0}
#: The generation_config.json fields vLLM takes as a request's defaults, by SamplingParams'
#: names (vLLM's ModelConfig.get_diff_sampling_param; max_new_tokens is not taken here: an
#: OpenAI line without max_tokens runs up to the context).
GENERATION_CONFIG_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                          "presence_penalty", "frequency_penalty")


def default_temperature(record: PromptRecord, run_temperature: float | None) -> float:
    """The temperature `record` runs with: its own, else --temperature, else its format's."""
    if record.temperature is not None:
        return record.temperature
    if run_temperature is not None:
        return run_temperature
    # (an OpenAI line is given the model's own default once it is known: apply_openai_defaults)
    return OPENAI_DEFAULTS["temperature"] if record.openai is not None else PLAIN_TEMPERATURE


def openai_defaults(model_path: str | None) -> tuple[dict[str, float], str]:
    """(what an OpenAI line runs with where its body says nothing, where that comes from)."""
    generation: dict[str, Any] = {}
    if model_path is not None:
        try:
            generation = json.loads((Path(model_path) / "generation_config.json").read_text())
        except (OSError, ValueError):
            generation = {}
    own = {key: generation[key] for key in GENERATION_CONFIG_KEYS
           if isinstance(generation.get(key), (int, float))
           and not isinstance(generation.get(key), bool)}
    if own:
        return {**OPENAI_DEFAULTS, **own}, "the model's generation_config.json"
    return dict(OPENAI_DEFAULTS), "OpenAI's"


def apply_openai_defaults(records: Iterable[PromptRecord], defaults: dict[str, float], *,
                          run_temperature: float | None, honours: Callable[[str], bool]
                          ) -> int:
    """Give each OpenAI batch record the fields its body left out, from `defaults`
    (`openai_defaults`); --temperature (`run_temperature`), where given, wins over the
    default temperature. A field the run's path does not honour is left out (a default is
    not a request). Returns how many records took a default."""
    took = 0
    for record in records:
        if record.openai is None or is_embedding(record):   # (an embedding samples nothing)
            continue
        before = (record.temperature, dict(record.sampling or {}))
        if record.temperature is None and run_temperature is None:
            record.temperature = float(defaults["temperature"])
        sampling = dict(record.sampling or {})
        for key, value in defaults.items():
            if key == "temperature" or key in sampling or not honours(key):
                continue
            if key == "top_p" and value == 1.0:
                continue        # (vLLM's own default: nothing to say)
            sampling[key] = value
        record.sampling = sampling or None
        took += (record.temperature, dict(record.sampling or {})) != before
    return took


def defaults_words(defaults: dict[str, float], source: str) -> str:
    """The defaults an OpenAI line took, for the run's log and its report."""
    fields = ", ".join(f"{key} {value:g}" for key, value in defaults.items())
    return f"{fields} ({source} defaults)"


def read_request_fields(obj: dict, record: PromptRecord, *, prefix: str = "",
                        style: str = "jsonl") -> None:
    """Fill `record`'s max_tokens, temperature, stop and sampling from `obj` (a JSON line, or
    an OpenAI body with `prefix` "body."); `style` "chat", "completions" or "jsonl" says how
    `logprobs` is written. FieldError names the first bad field."""
    get = obj.get
    for name in ("max_completion_tokens", "max_tokens"):  # chat's newer name wins over the old
        if get(name) is not None:
            record.max_tokens = check_int(get(name), prefix + name, minimum=1)
            break
    if get("temperature") is not None:
        record.temperature = check_number(get("temperature"), prefix + "temperature",
                                          minimum=0.0)
    if get("stop") is not None:
        record.stop = check_stop(get("stop"), prefix + "stop")
    sampling: dict[str, Any] = {}
    if get("n") is not None:
        sampling["n"] = check_int(get("n"), prefix + "n", minimum=1)
    if get("top_p") is not None:
        sampling["top_p"] = _in_range(get("top_p"), prefix + "top_p", 0.0, 1.0, open_low=True)
    if get("top_k") is not None:
        top_k = _integer(get("top_k"), prefix + "top_k", -1, None,
                         "an integer >= 1 (0 or -1: every token)")
        if top_k > 0:
            sampling["top_k"] = top_k
    if get("min_p") is not None:
        sampling["min_p"] = _in_range(get("min_p"), prefix + "min_p", 0.0, 1.0)
    if get("seed") is not None:
        sampling["seed"] = _integer(get("seed"), prefix + "seed", *SEED_RANGE, "an integer")
    for name in ("presence_penalty", "frequency_penalty"):
        if get(name) is not None:
            sampling[name] = _in_range(get(name), prefix + name, -2.0, 2.0)
    if get("repetition_penalty") is not None:
        sampling["repetition_penalty"] = _in_range(get("repetition_penalty"),
                                                   prefix + "repetition_penalty", 0.0, None,
                                                   open_low=True)
    if get("logit_bias") is not None:
        sampling["logit_bias"] = _logit_bias(get("logit_bias"), prefix + "logit_bias")
    logprobs = _logprobs(obj, prefix, style)
    if logprobs is not None:
        sampling["logprobs"] = logprobs
    if get("stop_token_ids") is not None:
        sampling["stop_token_ids"] = _token_ids(get("stop_token_ids"), prefix + "stop_token_ids")
    if get("min_tokens") is not None:
        sampling["min_tokens"] = check_int(get("min_tokens"), prefix + "min_tokens", minimum=0)
        if record.max_tokens is not None and sampling["min_tokens"] > record.max_tokens:
            raise FieldError(prefix + "min_tokens", f"{sampling['min_tokens']} is more than "
                                                    f"max_tokens ({record.max_tokens})")
    for name in ("ignore_eos", "include_stop_str_in_output"):
        if get(name) is not None:
            if not isinstance(get(name), bool):
                raise FieldError(prefix + name,
                                 f"expected true or false, got {describe_value(get(name))}")
            sampling[name] = get(name)
    structured = read_structured(obj, prefix)
    if structured is not None:
        sampling["structured"] = structured
    record.sampling = sampling or None
    if sampling:    # each key's field as the input spells it, for messages about it
        record.sampling_fields = {key: prefix + key for key in sampling}
        if structured is not None:
            record.sampling_fields["structured"] = prefix + next(
                name for name in STRUCTURED_FIELDS if get(name) is not None)


def check_known(obj: dict, known: Collection[str], prefix: str, ignored: Collection[str],
                what: str) -> None:
    """FieldError for the first key of `obj` this tool does not read and `--ignore-field` does
    not drop (`ignored` holds names as given: "logprobs" or "body.logprobs")."""
    for key in obj:
        if key in known or key in ignored or prefix + key in ignored:
            continue
        hint = did_you_mean(key, sorted(known))
        raise FieldError(prefix + key, f"not a field {what} takes"
                                       f"{hint + ' N' if hint else '; n'}othing is dropped "
                                       f"unasked: fix it, or pass --ignore-field "
                                       f"{prefix + key} to run without it")


def drop_ignored(obj: dict, prefix: str, ignored: Collection[str]) -> dict:
    """`obj` without the fields `--ignore-field` names (as "name" or "prefix.name")."""
    if not ignored:
        return obj
    return {key: value for key, value in obj.items()
            if key not in ignored and prefix + key not in ignored}


def _integer(value: Any, where: str, low: int, high: int | None, what: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(where, f"expected {what}, got {describe_value(value)}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise FieldError(where, f"must be {bound}, got {value}")
    return value


def _in_range(value: Any, where: str, low: float, high: float | None, *,
              open_low: bool = False) -> float:
    number = check_number(value, where, minimum=float("-inf"))
    if number < low or (open_low and number == low) or (high is not None and number > high):
        low_text = f"> {low:g}" if open_low else f">= {low:g}"
        raise FieldError(where, f"must be {low_text}" + (f" and <= {high:g}" if high is not None
                                                         else "") + f", got {number:g}")
    return number


def _logit_bias(value: Any, where: str) -> dict[str, float]:
    """{"token id": bias in [-100, 100]} (JSON keys are strings; OpenAI's range)."""
    if not isinstance(value, dict):
        raise FieldError(where, f"expected an object of token id -> bias, got "
                                f"{describe_value(value)}")
    out = {}
    for key, bias in value.items():
        if not str(key).isdigit():
            raise FieldError(f"{where}.{key}", "expected a token id (a non-negative integer) "
                                               "as the key")
        out[str(int(key))] = _in_range(bias, f"{where}.{key}", -100.0, 100.0)
    return out


def _token_ids(value: Any, where: str) -> list[int]:
    if not isinstance(value, list):
        raise FieldError(where, f"expected an array of token ids, got {describe_value(value)}")
    for position, token_id in enumerate(value):
        if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
            raise FieldError(f"{where}[{position}]", f"expected a token id (integer >= 0), "
                                                     f"got {describe_value(token_id)}")
    return value


def _logprobs(obj: dict, prefix: str, style: str) -> int | None:
    """How many top alternatives a request asks for beside each token's own logprob (0: only
    its own), None: no logprobs. Chat: `logprobs: true` with `top_logprobs: k`; completions:
    `logprobs: k`; JSON lines take either."""
    logprobs, top = obj.get("logprobs"), obj.get("top_logprobs")
    where = prefix + "logprobs"
    if style == "completions" and top is not None:
        raise FieldError(prefix + "top_logprobs", "a chat field; the completions API asks "
                                                  "for k alternatives with logprobs: k")
    if isinstance(logprobs, bool) or (logprobs is None and style == "chat"):
        if style == "completions":
            raise FieldError(where, f"expected an integer from 0 to {MAX_LOGPROBS} (how many "
                                    f"alternatives per token), got {describe_value(logprobs)}")
        if top is not None and not logprobs:
            raise FieldError(prefix + "top_logprobs", "needs logprobs: true")
        if not logprobs:
            return None
        if top is None:
            return 0
        return _integer(top, prefix + "top_logprobs", 0, MAX_LOGPROBS,
                        f"an integer from 0 to {MAX_LOGPROBS}")
    if logprobs is None:
        if top is not None:
            raise FieldError(prefix + "top_logprobs", "needs logprobs: true")
        return None
    if style == "chat":
        raise FieldError(where, "expected true or false; top_logprobs says how many "
                                f"alternatives, got {describe_value(logprobs)}")
    if top is not None:
        raise FieldError(prefix + "top_logprobs", "give logprobs: true with top_logprobs, or "
                                                  "logprobs: k alone")
    return _integer(logprobs, where, 0, MAX_LOGPROBS, f"an integer from 0 to {MAX_LOGPROBS}")


def sampling_spec(record: PromptRecord, *, max_tokens: int, temperature: float, seed: int,
                  ignore_eos: bool) -> dict[str, Any]:
    """Everything the engine's SamplingParams gets for `record`, as plain data (JSON-able: it
    travels to Ray actors and into a run folder's request digests): the record's own fields,
    else the run's defaults (`temperature`; `seed`, the run's seed for this request, used only
    where it samples; `ignore_eos`, the run's or the simulated device's)."""
    sampling = dict(record.sampling or ())
    temp = float(temperature if record.temperature is None else record.temperature)
    # A seed only where the request samples (greedy decoding has one answer, whatever the
    # seed): the request's own, else the run's for it.
    sampling["seed"] = sampling.get("seed", seed) if temp > 0 else None
    if ignore_eos:
        sampling["ignore_eos"] = True
    return {"max_tokens": max_tokens, "temperature": temp, "stop": record.stop, **sampling}
