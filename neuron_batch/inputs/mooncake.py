"""Mooncake request traces: one JSON object a line with `input_length`, `output_length`,
`hash_ids` and an optional `timestamp` (milliseconds from the start).

Each hash id names one 512-token block of the prompt; requests whose lists share ids share
those blocks, which is how the trace records prefix reuse (kvcache-ai/Mooncake, FAST25-release
traces; datasets/README.md). The prompt is the blocks in order, the last one cut to what is
left of `input_length`. inputs/prepare.py turns each id into the same tokens in every request
(`SyntheticTokens.blocks`), so vLLM's prefix cache finds exactly the sharing the trace holds.
"""

from __future__ import annotations

from neuron_batch.inputs.prompt_records import (
    FieldError,
    PromptRecord,
    check_id,
    check_int,
    check_number,
    describe_value,
)

#: Tokens a Mooncake hash id stands for.
MOONCAKE_BLOCK = 512
#: Hash ids must fit in 63 bits: SyntheticTokens writes each id into its block's first tokens.
MAX_HASH_ID = (1 << 63) - 1
_FIELDS = ("input_length", "output_length", "hash_ids")


def is_mooncake(obj: dict) -> bool:
    """Whether a JSON object is a Mooncake trace line (it has `hash_ids`, or the two lengths
    and none of the prompt fields of our own format)."""
    if "hash_ids" in obj:
        return True
    return ("input_length" in obj and "output_length" in obj
            and not any(name in obj for name in ("prompt", "messages", "prompt_token_ids",
                                                 "prompt_len")))


def record_from_mooncake(obj: dict, source: str) -> tuple[PromptRecord, str]:
    """One trace line -> (record, "id"): `prompt_len` = input_length, `max_tokens` =
    output_length, `arrival_s` = timestamp / 1000, `hash_ids` as given."""
    for name in _FIELDS:
        if obj.get(name) is None:
            raise FieldError(name, f"missing; a Mooncake trace line has {', '.join(_FIELDS)}")
    input_length = check_int(obj["input_length"], "input_length", minimum=1)
    output_length = check_int(obj["output_length"], "output_length", minimum=1)
    hash_ids = obj["hash_ids"]
    if not isinstance(hash_ids, list):
        raise FieldError("hash_ids", f"expected an array of block ids, got "
                                     f"{describe_value(hash_ids)}")
    for position, block_id in enumerate(hash_ids):
        if (isinstance(block_id, bool) or not isinstance(block_id, int)
                or not 0 <= block_id <= MAX_HASH_ID):
            raise FieldError(f"hash_ids[{position}]", f"expected a block id (an integer from 0 "
                                                      f"to 2^63 - 1), got "
                                                      f"{describe_value(block_id)}")
    needed = -(-input_length // MOONCAKE_BLOCK)
    if len(hash_ids) != needed:
        raise FieldError("hash_ids", f"{len(hash_ids)} block id(s) for input_length "
                                     f"{input_length:,}, which takes {needed} block(s) of "
                                     f"{MOONCAKE_BLOCK} tokens")
    record = PromptRecord(index=-1, id="", source=source, prompt_len=input_length,
                          max_tokens=output_length, hash_ids=hash_ids,
                          prompt_field="input_length")
    if (value := obj.get("timestamp")) is not None:
        record.arrival_s = check_number(value, "timestamp", minimum=0.0) / 1000.0
    if (value := obj.get("id")) is not None:
        record.id = check_id(value, "id")
    return record, "id"
