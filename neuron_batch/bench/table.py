"""The ranked terminal table of a bucket sweep. Pure Python.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from neuron_batch.bench.ranking import (
    COST_COMPILE_S,
    COST_USD,
    COST_USD_WITH_COMPILE,
    DEFAULT_NAME,
    rank_key,
)
from neuron_batch.bench.words import abbreviate_buckets, as_number

#: Widest the terminal table may get.
MAX_WIDTH = 140
MAX_NAME_WIDTH = 28

# -- terminal table ---------------------------------------------------------------------------

# (group header, column header, alignment) per column; one group header spans its columns.
_COLUMNS = (
    ("", "#", ">"), ("", "name", "<"), ("buckets", "prefill", "<"), ("buckets", "decode", "<"),
    ("compile", "graphs", ">"), ("compile", "est.", ">"), ("out", "tok/s", ">"),
    ("vs", "{base}", ">"), ("tok/s", "/graph", ">"), ("cost USD", "run", ">"),
    ("cost USD", "+comp", ">"),
    ("waste%", "pf", ">"), ("waste%", "dec", ">"),
    ("time%", "pf", ">"), ("time%", "dec", ">"), ("time%", "idle", ">"),
    ("admission block", "reason", "<"), ("admission block", "count", ">"),
    ("TTFT s", "p50", ">"), ("TTFT s", "p99", ">"),
    ("TPOT ms", "p50", ">"), ("TPOT ms", "p99", ">"),
)


def format_table(rows: Sequence[dict[str, Any]], recommendation: Mapping[str, Any] | None = None,
                 *, failed: Sequence[Mapping[str, Any]] = ()) -> str:
    """An aligned table of the ranked rows (at most ~140 columns), then the recommendation's
    sentences. `failed`: failed sweep entries, listed after the table with their errors."""
    rows = sorted(rows, key=lambda row: (row.get("rank") or 0, rank_key(row)))
    lines = [f"neuron-batch bucket sweep: {len(rows)} configuration"
             f"{'s' if len(rows) != 1 else ''} finished"
             + (f", {len(failed)} failed" if failed else "")]
    if rows:
        lines += _table(rows)
        lines.append("  pf = prefill, dec = decode; waste% = padding share of the padded work; "
                     "time% = share of the run per scheduler state;")
        lines.append("  admission block = the most frequent reason admission refused the queue "
                     "head; est. = estimated start-up (tracing, compiling, loading)")
        if any(row.get(COST_USD) is not None for row in rows):
            lines.append("  cost USD: the run at the instance's hourly price; +comp: with the "
                         "estimated start-up too")
    for entry in failed:
        error = " ".join(str(entry.get("error") or "no error message").split())
        lines.append(_clip(f"  FAILED {entry.get('name')}: {error}"))
    if recommendation:
        lines.append("")
        lines.append("Recommendation")
        for sentence in recommendation.get("reasons", []):
            lines += _wrap(f"- {sentence}", MAX_WIDTH, indent="  ")
    return "\n".join(lines) + "\n"


def _table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The table's lines. Names are shown whole (a clipped name is ambiguous: sweeps name
    configurations like P=o2,D=def,S=32), so a sweep of long names gives a wider table."""
    name_width = max(8, min(MAX_NAME_WIDTH, max(len(row["name"]) for row in rows)))
    return _table_lines(rows, name_width)


def _table_lines(rows: Sequence[dict[str, Any]], name_width: int) -> list[str]:
    base = next((row for row in rows if row["name"] == DEFAULT_NAME), None)
    reference = base if base is not None else rows[0]
    headers = [(group, sub.format(base="default" if base is not None else "best"), align)
               for group, sub, align in _COLUMNS]
    body = [_cells(row, reference, name_width) for row in rows]
    drop = set()
    if all(row.get(COST_COMPILE_S) is None for row in rows):   # no estimate: no column
        drop.add("est.")
        headers = [("", "graphs", ">") if h[1] == "graphs" else h for h in headers]
    if all(row.get(COST_USD) is None for row in rows):         # no price: no cost columns
        drop.add("run")
    if all(row.get(COST_USD_WITH_COMPILE) is None for row in rows):
        drop.add("+comp")
    if "+comp" in drop and "run" not in drop:   # one cost column: no group header
        headers = [("", "USD", ">") if h[1] == "run" else h for h in headers]
    keep = [i for i, (_, sub, _) in enumerate(_COLUMNS) if sub not in drop]
    headers = [headers[i] for i in keep]
    body = [[cells[i] for i in keep] for cells in body]
    spans = _spans(headers)
    widths = [len(h[1]) for h in headers]
    for cells in body:
        widths = [max(width, len(cell)) for width, cell in zip(widths, cells)]
    for start, end in spans:
        if end - start == 1:
            widths[start] = max(widths[start], len(headers[start][0]))
    # A group header wider than its columns widens the group's last column.
    for start, end in spans:
        group = headers[start][0]
        inner = sum(widths[start:end]) + (end - start - 1)
        if end - start > 1 and len(group) > inner:
            widths[end - 1] += len(group) - inner

    def render(cells: Sequence[str]) -> str:
        parts = []
        for start, end in spans:    # two spaces between groups, one inside a group
            parts.append(" ".join(
                cells[i].ljust(widths[i]) if headers[i][2] == "<" else cells[i].rjust(widths[i])
                for i in range(start, end)))
        return ("  " + "  ".join(parts)).rstrip()

    top = []
    for start, end in spans:
        inner = sum(widths[start:end]) + (end - start - 1)
        group = headers[start][0]
        if end - start > 1:
            top.append(group.center(inner))
        else:
            top.append(group.rjust(inner) if headers[start][2] == ">" else group.ljust(inner))
    lines = [("  " + "  ".join(top)).rstrip(), render([h[1] for h in headers])]
    lines += [render(cells) for cells in body]
    return lines


def _spans(headers: Sequence[tuple[str, str, str]]) -> list[tuple[int, int]]:
    """(start, end) of each group header: consecutive columns with the same non-empty group."""
    spans, start = [], 0
    while start < len(headers):
        end = start + 1
        group = headers[start][0]
        while group and end < len(headers) and headers[end][0] == group:
            end += 1
        spans.append((start, end))
        start = end
    return spans


def _cells(row: dict[str, Any], reference: dict[str, Any], name_width: int) -> list[str]:
    shares = row.get("state_shares") or {}
    blocked = {reason: count for reason, count in (row.get("admission_blocked") or {}).items()
               if count}
    reason = max(blocked, key=lambda r: (blocked[r], r)) if blocked else None
    if row is reference:
        versus = "-"
    else:
        ref = as_number(reference["output_tokens_per_s"])
        versus = (f"{(as_number(row['output_tokens_per_s']) - ref) / ref * 100:+.1f}%"
                  if ref else "-")
    return [
        str(row.get("rank") or ""),
        _clip_to(row["name"], name_width),
        abbreviate_buckets(row.get("prefill_buckets"), 16),
        abbreviate_buckets(row.get("decode_buckets"), 12),
        str(row["compiled_graphs"]),
        _short_compile(row.get(COST_COMPILE_S)),
        f"{as_number(row['output_tokens_per_s']):,.0f}",
        versus,
        _fixed(row.get("throughput_per_graph"), 0),
        _usd(row.get(COST_USD)),
        _usd(row.get(COST_USD_WITH_COMPILE)),
        _percent_cell(row.get("prefill_waste")),
        _percent_cell(row.get("decode_waste")),
        _percent_cell(shares.get("ACTIVE_PREFILL")),
        _percent_cell(shares.get("ACTIVE_DECODE")),
        _percent_cell(shares.get("IDLE")),
        reason or "none",
        f"{blocked[reason]:,}" if reason else "0",
        _sig(row.get("ttft_p50_s")),
        _sig(row.get("ttft_p99_s")),
        _sig(None if row.get("tpot_p50_s") is None else row["tpot_p50_s"] * 1000),
        _sig(None if row.get("tpot_p99_s") is None else row["tpot_p99_s"] * 1000),
    ]


def _usd(value: Any) -> str:
    """Dollars with cents below 1,000, whole dollars above."""
    if value is None:
        return "-"
    value = float(value)
    return f"{value:,.2f}" if value < 1000 else f"{value:,.0f}"


def _short_compile(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 100 * 60:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _fixed(value: Any, digits: int) -> str:
    return "-" if value is None else f"{float(value):,.{digits}f}"


def _sig(value: Any) -> str:
    """About three significant figures: 2.72, 11.2, 345."""
    if value is None:
        return "-"
    value = float(value)
    if abs(value) < 10:
        return f"{value:.2f}"
    return f"{value:.1f}" if abs(value) < 100 else f"{value:,.0f}"


def _percent_cell(fraction: Any) -> str:
    return "-" if fraction is None else f"{float(fraction) * 100:.0f}"


def _clip_to(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "~"


def _clip(line: str) -> str:
    return line if len(line) <= MAX_WIDTH else line[:MAX_WIDTH - 3] + "..."


def _wrap(text: str, width: int, indent: str) -> list[str]:
    lines, current = [], ""
    for word in text.split(" "):
        candidate = f"{current} {word}" if current else word
        if current and len(candidate) > width:
            lines.append(current)
            current = indent + word
        else:
            current = candidate
    if current:
        lines.append(current)
    return lines
