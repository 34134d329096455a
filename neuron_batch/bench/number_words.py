"""Numbers and bucket sets as words, for the verdict, the table and the plots. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from neuron_batch.runtimes.runtime import runtime_of

#: The row key of a configuration's estimated compile time (a compile-cost key of `ranking`).
COST_COMPILE_S = "estimated_compile_s"

def as_number(value: Any, missing: float = 0.0) -> float:
    if value is None:
        return missing
    value = float(value)
    return missing if math.isnan(value) else value


# -- words and numbers ------------------------------------------------------------------------

def fmt_tps(value: Any) -> str:
    """Tokens per second as written in sentences: 1,234 (one decimal below 100)."""
    if value is None:
        return "-"
    value = float(value)
    return f"{value:,.1f}" if abs(value) < 100 else f"{value:,.0f}"


def fmt_pct(fraction: Any) -> str:
    """A share as written in sentences: 12% (one decimal below 10%)."""
    if fraction is None:
        return "-"
    percent = float(fraction) * 100
    return f"{percent:.1f}%" if abs(round(percent, 1)) < 10 else f"{percent:.0f}%"


def fmt_share_of(amount: float, whole: Any) -> str:
    whole = as_number(whole)
    return fmt_pct(amount / whole) if whole else "-"


def fmt_relative(value: Any, reference: Any) -> str:
    """"8% above" / "3% below" / "level with"."""
    value, reference = as_number(value), as_number(reference)
    if not reference:
        return "not comparable with"
    change = (value - reference) / reference
    if change == 0:
        return "level with"
    return f"{fmt_pct(abs(change))} {'above' if change > 0 else 'below'}"


def fmt_seconds(seconds: Any) -> str:
    """A duration in sentences: 4.2 s, 95 s, 12 min, 2.5 h."""
    if seconds is None:
        return "-"
    seconds = float(seconds)
    if abs(seconds) < 10:
        return f"{seconds:.1f} s"
    if abs(seconds) < 600:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:,.0f} min" if abs(seconds) < 3 * 3600 else f"{seconds / 3600:.1f} h"


def compile_minutes(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:,.0f} min"


def compile_words(row: dict) -> str:
    seconds = row.get(COST_COMPILE_S)
    return "" if seconds is None else f" (est. start-up {compile_minutes(seconds)})"


def compile_pair(row: dict, other: dict, inline: bool = False) -> str:
    a, b = row.get(COST_COMPILE_S), other.get(COST_COMPILE_S)
    if a is None or b is None:
        return ""
    text = f"est. start-up {compile_minutes(a)} vs {compile_minutes(b)}"
    return f"; {text}" if inline else f" ({text})"


def bucket_words(row: dict) -> str:
    """The configuration's buckets in its runtime's own words (runtime.Runtime.bucket_words)."""
    return runtime_of(row).bucket_words(
        row.get("prefill_buckets"), row.get("decode_buckets"), row.get("attention_buckets"))


def join_buckets(buckets: Sequence[int] | None) -> str:
    return ",".join(str(b) for b in buckets or []) or "-"


def abbreviate_buckets(buckets: Sequence[int] | None, width: int = 16) -> str:
    """The bucket list as "128,256,512", or "128..8192 (7)" when that would exceed `width`."""
    text = join_buckets(buckets)
    if len(text) <= width or not buckets:
        return text
    return f"{buckets[0]}..{buckets[-1]} ({len(buckets)})"
