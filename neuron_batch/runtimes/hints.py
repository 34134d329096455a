"""A Neuron runtime's lists in words: what to give instead of bucket lists of another
runtime (the hint `Runtime.foreign_message` returns), and the lists as tables name them.

Pure Python; it reads the `Runtime` objects it is given (runtimes/runtime.py passes them in, so
this module imports nothing of it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from neuron_batch.runtimes.buckets import (
    DECODE_CONTEXT_MULTIPLE,
    effective_max_prefill_tokens,
    fitting_buckets,
)

#: A Runtime's bucket-option attributes: a list of one runtime maps to the other's of a role.
ROLES = ("prefill", "decode", "attention")


def foreign_message(runtime: Any, other: Any, given: Mapping[str, Sequence[int]], *,
                    max_model_len: int, max_num_batched_tokens: int,
                    family: str | None = None) -> str:
    """Why bucket lists of `other` (by config key) are refused by `runtime`, and what to give
    instead: `runtime`'s list of the same role (prefill; decode attention) made valid from the
    values given, and `--runtime <other>` only where `other` runs on the instance `family`
    (None: unknown), so the hint never names a runtime that is then refused (the Beta plugin
    on inf2)."""
    theirs = {o.key: (role, o) for role in ROLES if (o := getattr(other, role)) is not None}
    named, instead = [], []
    for key, values in given.items():
        role, option = theirs.get(key, (None, None))
        named.append(option.flag if option else key)
        own = getattr(runtime, role) if role else None
        fitted = _fitted(runtime, role, values, max_model_len=max_model_len,
                         max_num_batched_tokens=max_num_batched_tokens)
        if option and own is None:
            why = dict(runtime.fixed_words).get(role, "it compiles no such list")
            instead.append(f"drop {option.flag} ({runtime.name} {why})")
        elif option and own is not None and fitted:
            instead.append(f"use {own.flag} {','.join(map(str, fitted))} ({own.what})")
        elif option and own is not None:
            instead.append(f"drop {option.flag} ({own.flag} is opt-in and none of these "
                           f"values is below max_model_len {max_model_len})")
    text = (f"{', '.join(named)} belong(s) to the {other.name} runtime "
            f"({other.summary}); this run uses {runtime.name} ({runtime.summary}). Instead: "
            f"{'; '.join(instead)}")
    if family is None or family in other.runs_on:
        return text + f"; or keep them with --runtime {other.name}"
    return text + (f"; {other.name} itself does not run on {family} (AWS ships it for "
                   f"{'/'.join(other.runs_on)} only)")


def _fitted(runtime: Any, role: str | None, values: Sequence[int], *, max_model_len: int,
            max_num_batched_tokens: int) -> list[int]:
    """`values` made a valid list of `runtime`'s `role` option (empty: none is)."""
    if role == "prefill" and not runtime.static_kv:
        return fitting_buckets(values, effective_max_prefill_tokens(
            max_num_batched_tokens, max_model_len))
    if role == "attention" and not runtime.static_kv:   # opt-in multiples of 128 below it
        rounded = {-(-v // DECODE_CONTEXT_MULTIPLE) * DECODE_CONTEXT_MULTIPLE
                   for v in values if v > 0}
        return sorted(v for v in rounded if v < max_model_len)
    if role in ("prefill", "attention"):
        fitted = fitting_buckets(values, max_model_len)
        own = getattr(runtime, role)
        # a one-value option (optimum-neuron's max context length): the longest that fits
        return fitted[-1:] if own is not None and own.single else fitted
    return []


def bucket_words(runtime: Any, prefill: Sequence[int] | None, decode: Sequence[int] | None,
                 attention: Sequence[int] | None) -> str:
    """The three lists in `runtime`'s own words, for tables and verdicts."""
    def join(buckets):
        return ",".join(str(b) for b in buckets or []) or "default"

    if runtime.attention is None:        # an export's two graphs
        return f"max context length {join(prefill)}"
    if runtime.static_kv:
        return f"context encoding {join(prefill)} / token generation {join(attention)}"
    text = f"prefill {join(prefill)} / decode {join(decode)}"
    return text + (f" / decode context {join(attention)}" if attention else "")


def graph_words(runtime: Any, num_prefill: int, num_decode: int, num_attention: int,
                num_prefix: int = 0) -> str:
    """The graphs `runtime.num_graphs` counts, in words that add up to it (the summary's
    Graphs row): under NxDI's prefix-caching grid a context-encoding graph per (prefill,
    prefix) cell."""
    if not runtime.static_kv:
        return (f"{num_prefill} prefill buckets + {num_decode} decode buckets x "
                f"{num_attention + 1} context lengths")
    if num_prefix > 1:
        return (f"{num_prefill * num_prefix} context-encoding ({num_prefill} prefill x "
                f"{num_prefix} prefix buckets, NxDI's grid) + {num_attention} "
                f"token-generation buckets")
    return f"{num_prefill} context-encoding + {num_attention} token-generation buckets"
