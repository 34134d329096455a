"""Structured outputs as a request asks for them: OpenAI's `response_format` and vLLM's own
forms (`structured_outputs`, the older `guided_*` fields), read into one plain form and checked
before anything runs.

The one form is a dict with exactly one key, as vLLM's `StructuredOutputsParams` (older
releases `GuidedDecodingParams`) takes it: {"json": schema}, {"json_object": True},
{"regex": str}, {"choice": [str, ...]} or {"grammar": str}. engine/sampling_params.py turns it into
the installed vLLM's class (scheduler/compat.py). Pure: a JSON schema is checked with
`jsonschema` when it is installed (vLLM depends on it), imported only when a schema is given.
"""

from __future__ import annotations

import json
import re
from typing import Any

from neuron_batch.inputs.prompt_records import FieldError, describe_value

#: vLLM's structured-output kinds (its StructuredOutputsParams fields), in the one form.
KINDS = ("json", "json_object", "regex", "choice", "grammar")
#: vLLM's older request fields (`--guided-decoding` era, and still in its OpenAI server's
#: extra body), each one of KINDS.
GUIDED_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                 "guided_grammar": "grammar"}
#: Every field of a request that asks for structured output.
STRUCTURED_FIELDS = ("response_format", "structured_outputs", *GUIDED_FIELDS)


def read_structured(obj: dict, prefix: str) -> dict | None:
    """The one structured-output form `obj` asks for (None: none), from whichever of
    STRUCTURED_FIELDS it gives; two of them conflict."""
    given = [name for name in STRUCTURED_FIELDS if obj.get(name) is not None]
    if not given:
        return None
    if len(given) > 1:
        raise FieldError(prefix + given[1], f"conflicts with '{prefix}{given[0]}': a request "
                                            "takes one structured-output form")
    name = given[0]
    value = obj[name]
    if name == "response_format":
        return _response_format(value, prefix + name)
    if name == "structured_outputs":
        return _structured_outputs(value, prefix + name)
    return {GUIDED_FIELDS[name]: check_kind(GUIDED_FIELDS[name], value, prefix + name)}


def _response_format(value: Any, where: str) -> dict | None:
    """OpenAI's `response_format`: {"type": "text"} (no constraint), {"type": "json_object"},
    or {"type": "json_schema", "json_schema": {"name", "schema", "strict"?}}."""
    if not isinstance(value, dict):
        raise FieldError(where, f"expected an object with a type, got {describe_value(value)}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind != "json_schema":
        raise FieldError(f"{where}.type", 'expected "text", "json_object" or "json_schema", '
                                          f"got {describe_value(kind)}")
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise FieldError(f"{where}.json_schema", "missing: a json_schema response format needs "
                                                 '{"name": ..., "schema": {...}}')
    if spec.get("schema") is None:
        raise FieldError(f"{where}.json_schema.schema", "missing: the JSON schema the output "
                                                        "must follow")
    return {"json": check_schema(spec["schema"], f"{where}.json_schema.schema")}


def _structured_outputs(value: Any, where: str) -> dict:
    """vLLM's own form: an object with one of KINDS."""
    if not isinstance(value, dict):
        raise FieldError(where, f"expected an object with one of {', '.join(KINDS)}, "
                                f"got {describe_value(value)}")
    given = [key for key, item in value.items() if item is not None]
    unknown = [key for key in given if key not in KINDS]
    if unknown:
        raise FieldError(f"{where}.{unknown[0]}", f"unknown structured-output form; expected "
                                                  f"one of {', '.join(KINDS)}")
    if len(given) != 1:
        raise FieldError(where, f"expected exactly one of {', '.join(KINDS)}, got "
                                f"{', '.join(given) or 'none'}")
    kind = given[0]
    return {kind: check_kind(kind, value[kind], f"{where}.{kind}")}


def check_kind(kind: str, value: Any, where: str) -> Any:
    """One structured-output value checked for its kind; a JSON schema given as a string is
    parsed."""
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as error:
                raise FieldError(where, f"not a JSON schema: {error}") from None
        return check_schema(value, where)
    if kind == "json_object":
        if value is not True:
            raise FieldError(where, f"expected true, got {describe_value(value)}")
        return True
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(
                isinstance(item, str) and item for item in value):
            raise FieldError(where, f"expected a non-empty array of non-empty strings, got "
                                    f"{describe_value(value)}")
        return value
    if not isinstance(value, str) or not value.strip():
        raise FieldError(where, f"expected a non-empty string, got {describe_value(value)}")
    if kind == "regex":
        try:
            re.compile(value)
        except re.error as error:
            raise FieldError(where, f"not a regular expression: {error}") from None
    return value


def check_schema(schema: Any, where: str) -> dict:
    """A JSON schema the backend can compile: an object (or true), valid as JSON Schema."""
    if schema is True:
        return {}
    if not isinstance(schema, dict):
        raise FieldError(where, f"expected a JSON schema (an object), got "
                                f"{describe_value(schema)}")
    try:
        import jsonschema
    except ImportError:     # (vLLM depends on it; without it, only the shape is checked)
        return schema
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        path = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.path)
        raise FieldError(where + path, f"not a valid JSON schema: {error.message}") from None
    return schema
