"""The ranked terminal table of a bucket sweep, at most `MAX_WIDTH` columns. Pure Python.

The bucket columns are the runtime's own lists (runtime.Runtime.dimensions: under nxdi the
context-encoding and token-generation sets, under vllm-neuron prefill, decode batch and decode
context-length sets), each beside the padding waste it changes (nxdi's token-generation sets:
the KV every slot attends but does not hold). Columns that do not fit are left out, latency
first, and the table says so: sweep.csv has them all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_batch.bench.number_words import abbreviate_buckets, as_number
from neuron_batch.bench.ranking import (
    COST_COMPILE_S,
    COST_USD,
    COST_USD_WITH_COMPILE,
    DEFAULT_NAME,
    rank_key,
)
from neuron_batch.runtimes.runtime import runtime_of

#: Widest any line of the table (and of what follows it) may get.
MAX_WIDTH = 100
#: Widths a bucket list is abbreviated to: as wide as fits, then tighter when the table is
#: still too wide without its optional columns.
SET_WIDTHS = (16, 13, 0)
#: The `drop` rank of the cost columns: those above it go before the lists are abbreviated
#: tighter, the waste columns (below it) last.
COST_DROP = 4


@dataclass(frozen=True)
class Column:
    group: str                      # header spanning consecutive columns of the same group
    header: str
    align: str                      # "<" or ">"
    cell: Callable[[dict[str, Any]], str]
    drop: int = 0                   # 0: always shown; else left out to fit, highest first
    note: str = ""                  # what it is, for the line naming what was left out


def format_table(rows: Sequence[dict[str, Any]], recommendation: Mapping[str, Any] | None = None,
                 *, failed: Sequence[Mapping[str, Any]] = (),
                 notes: Sequence[str] = ()) -> str:
    """The ranked rows as an aligned table, then what its columns mean, the failed entries
    with their errors, `notes` (e.g. what the sweep left out), and the recommendation."""
    rows = sorted(rows, key=lambda row: (row.get("rank") or 0, rank_key(row)))
    lines = [f"neuron-batch bucket sweep: {len(rows)} configuration"
             f"{'s' if len(rows) != 1 else ''} finished"
             + (f", {len(failed)} failed" if failed else "")]
    if rows:
        table, legend = _table(rows)
        lines += table
        for sentence in legend:
            lines += wrap(sentence, MAX_WIDTH, indent="    ", first="  ")
    for entry in failed:
        error = " ".join(str(entry.get("error") or "no error message").split())
        lines.append(_clip(f"  FAILED {entry.get('name')}: {error}"))
    for note in notes:
        lines += wrap(note, MAX_WIDTH, indent="    ", first="  ")
    if recommendation:
        lines.append("")
        lines.append("Recommendation")
        for sentence in recommendation.get("reasons", []):
            lines += wrap(f"- {sentence}", MAX_WIDTH, indent="  ")
    return "\n".join(lines) + "\n"


# -- columns ----------------------------------------------------------------------------------

def _columns(rows: Sequence[dict[str, Any]], set_width: int) -> list[Column]:
    runtime = runtime_of(rows[0])
    base = next((row for row in rows if row["name"] == DEFAULT_NAME), None)
    reference = base if base is not None else rows[0]
    columns = [Column("", "#", ">", lambda row: str(row.get("rank") or "")),
               Column("", "name", "<", lambda row: row["name"])]
    for index, (dimension, option) in enumerate(runtime.dimensions):
        if not any(row.get(f"{dimension}_buckets") for row in rows):
            continue            # (vllm-neuron's opt-in context lengths, never swept)
        group = option.label if set_width else option.short     # (the tightest: "ctx")
        columns.append(Column(group, "set", "<", _set_cell(dimension, set_width)))
        # The attention waste (what nxdi's token-generation sets change) is left out last.
        drop = 1 if option.padding == "attention" else 3 - index
        columns.append(Column(group, "waste", ">", _waste_cell(option.padding), drop=drop,
                              note=f"{option.short} waste"))
    priced = any(row.get(COST_USD_WITH_COMPILE) is not None for row in rows)
    if len({(row.get("prefix_caching"), row.get("order")) for row in rows}) > 1:
        # prefix caching or the order swept: the share of prompt tokens the cache served
        columns.append(Column("cache", "hit%", ">", _hit_cell, drop=2, note="cache hit%"))
    columns += [
        Column("compile", "graphs", ">", lambda row: str(row["compiled_graphs"])),
        Column("compile", "est.", ">", lambda row: _short_compile(row.get(COST_COMPILE_S)),
               drop=9, note="est. compile"),
        Column("out", "tok/s", ">", lambda row: f"{as_number(row['output_tokens_per_s']):,.0f}"),
        Column("vs", "default" if base is not None else "best", ">",
               lambda row: _versus(row, reference)),
        Column("tok/s", "/graph", ">", lambda row: _fixed(row.get("throughput_per_graph"), 0),
               drop=12, note="tok/s per graph"),
        Column("USD", "run", ">", lambda row: _usd(row.get(COST_USD)),
               drop=10 if priced else COST_DROP, note="run USD"),
        Column("USD", "+comp", ">", lambda row: _usd(row.get(COST_USD_WITH_COMPILE)),
               drop=COST_DROP, note="USD with compile"),
        Column("time%", "pf", ">", _share_cell("ACTIVE_PREFILL"), drop=13, note="time%"),
        Column("time%", "dec", ">", _share_cell("ACTIVE_DECODE"), drop=11, note="time%"),
        Column("time%", "idle", ">", _share_cell("IDLE"), drop=14, note="time%"),
        Column("admission block", "reason", "<", lambda row: _block(row)[0], drop=15,
               note="admission blocks"),
        Column("admission block", "count", ">", lambda row: _block(row)[1], drop=16,
               note="admission blocks"),
        Column("TTFT s", "p50", ">", lambda row: _sig(row.get("ttft_p50_s")), drop=17,
               note="TTFT"),
        Column("TTFT s", "p99", ">", lambda row: _sig(row.get("ttft_p99_s")), drop=18,
               note="TTFT"),
        Column("TPOT ms", "p50", ">", lambda row: _ms(row.get("tpot_p50_s")), drop=19,
               note="TPOT"),
        Column("TPOT ms", "p99", ">", lambda row: _ms(row.get("tpot_p99_s")), drop=20,
               note="TPOT"),
    ]
    # A figure no row has is no column (no compile estimate, no price).
    return [c for c in columns if not c.drop or any(c.cell(row) != "-" for row in rows)]


def _set_cell(dimension: str, width: int) -> Callable[[dict[str, Any]], str]:
    def cell(row: dict[str, Any]) -> str:
        buckets = row.get(f"{dimension}_buckets") or []
        if width == 0 and buckets:     # the tightest: the largest bucket and the count
            return f"..{buckets[-1]} ({len(buckets)})" if len(buckets) > 1 else str(buckets[0])
        return abbreviate_buckets(buckets, width)
    return cell


def _hit_cell(row: dict[str, Any]) -> str:
    if row.get("prefix_caching") is False:
        return "off"
    return _percent_cell(row.get("hit_fraction"))


def _waste_cell(padding: str) -> Callable[[dict[str, Any]], str]:
    return lambda row: _percent_cell(row.get(f"{padding}_waste"), "%")


def _share_cell(state: str) -> Callable[[dict[str, Any]], str]:
    return lambda row: _percent_cell((row.get("state_shares") or {}).get(state))


def _table(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(lines, legend sentences) of the widest table within `MAX_WIDTH`: optional columns are
    left out highest `drop` first down to the cost and waste columns, then the bucket lists
    are abbreviated tighter, then the cost and the waste go but the attention waste's (what
    nxdi's token-generation sets change), then the lists are cut to their largest bucket and
    count, and last that waste goes too."""
    ranks = sorted({c.drop for c in _columns(rows, SET_WIDTHS[0]) if c.drop}, reverse=True)
    states = [(SET_WIDTHS[0], keep) for keep in [*ranks, COST_DROP] if keep >= COST_DROP]
    states += [(SET_WIDTHS[1], keep) for keep in range(COST_DROP, 0, -1)]
    states += [(SET_WIDTHS[2], 1), (SET_WIDTHS[2], 0)]
    for set_width, keep in states:
        every = _columns(rows, set_width)
        columns = [c for c in every if c.drop <= keep]
        lines = _render(columns, rows)
        if max(map(len, lines)) <= MAX_WIDTH:
            break
    return lines, _legend(rows, columns, sorted((c for c in every if c.drop > keep),
                                                key=lambda c: -c.drop))


def _legend(rows: Sequence[dict[str, Any]], columns: Sequence[Column],
            left_out: Sequence[Column]) -> list[str]:
    runtime = runtime_of(rows[0])
    shown = {(c.group, c.header) for c in columns}
    parts = [f"{option.label}: {option.what} ({option.flag}); waste = {option.waste}"
             for dimension, option in runtime.dimensions
             if {(option.label, "set"), (option.short, "set")} & shown]
    if runtime.decode is None:      # no decode list: the batch is always every slot
        seqs = sorted({int(row["max_num_seqs"]) for row in rows if row.get("max_num_seqs")})
        parts.append("every decode step runs all max_num_seqs slots ("
                     + ", ".join(map(str, seqs)) + ")")
    if ("cache", "hit%") in shown:
        parts.append("PC = prefix caching, O = order (in, len, pfx); cache hit% = prompt "
                     "tokens served from the prefix cache")
    if ("compile", "est.") in shown:
        parts.append("est. = estimated start-up (tracing, compiling, loading)")
    if any(c.group == "USD" for c in columns):
        parts.append("cost USD: run = the run at the instance's hourly price; +comp: with the "
                     "estimated start-up too")
    if any(c.group == "time%" for c in columns):
        parts.append("time% = share of the run per scheduler state")
    if any(c.group == "admission block" for c in columns):
        parts.append("admission block = the most frequent reason admission refused the queue "
                     "head")
    sentences = ["; ".join(parts)]
    notes = list(dict.fromkeys(c.note for c in left_out))
    if notes:
        sentences.append(f"left out to fit {MAX_WIDTH} columns (in sweep.csv): "
                         + ", ".join(notes))
    return sentences


def _render(columns: Sequence[Column], rows: Sequence[dict[str, Any]]) -> list[str]:
    body = [[c.cell(row) for c in columns] for row in rows]
    spans = _spans(columns)
    widths = [len(c.header) for c in columns]
    for cells in body:
        widths = [max(width, len(cell)) for width, cell in zip(widths, cells)]
    # A group header wider than its columns widens the group's last column.
    for start, end in spans:
        inner = sum(widths[start:end]) + (end - start - 1)
        if len(columns[start].group) > inner:
            widths[end - 1] += len(columns[start].group) - inner

    def render(cells: Sequence[str]) -> str:
        parts = []
        for start, end in spans:    # two spaces between groups, one inside a group
            parts.append(" ".join(
                cells[i].ljust(widths[i]) if columns[i].align == "<"
                else cells[i].rjust(widths[i]) for i in range(start, end)))
        return ("  " + "  ".join(parts)).rstrip()

    top = []
    for start, end in spans:
        inner = sum(widths[start:end]) + (end - start - 1)
        group = columns[start].group
        if end - start > 1:
            top.append(group.center(inner))
        else:
            top.append(group.rjust(inner) if columns[start].align == ">" else group.ljust(inner))
    return [("  " + "  ".join(top)).rstrip(), render([c.header for c in columns]),
            *(render(cells) for cells in body)]


def _spans(columns: Sequence[Column]) -> list[tuple[int, int]]:
    """(start, end) of each group header: consecutive columns with the same non-empty group."""
    spans, start = [], 0
    while start < len(columns):
        end = start + 1
        group = columns[start].group
        while group and end < len(columns) and columns[end].group == group:
            end += 1
        spans.append((start, end))
        start = end
    return spans


# -- cells ------------------------------------------------------------------------------------

def _versus(row: dict[str, Any], reference: dict[str, Any]) -> str:
    if row is reference:
        return "-"
    ref = as_number(reference["output_tokens_per_s"])
    return (f"{(as_number(row['output_tokens_per_s']) - ref) / ref * 100:+.1f}%"
            if ref else "-")


def _block(row: dict[str, Any]) -> tuple[str, str]:
    """(the most frequent admission block reason, its count), or ("none", "0")."""
    blocked = {reason: count for reason, count in (row.get("admission_blocked") or {}).items()
               if count}
    if not blocked:
        return "none", "0"
    reason = max(blocked, key=lambda r: (blocked[r], r))
    return reason, f"{blocked[reason]:,}"


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


def _ms(seconds: Any) -> str:
    return _sig(None if seconds is None else float(seconds) * 1000)


def _sig(value: Any) -> str:
    """About three significant figures: 2.72, 11.2, 345."""
    if value is None:
        return "-"
    value = float(value)
    if abs(value) < 10:
        return f"{value:.2f}"
    return f"{value:.1f}" if abs(value) < 100 else f"{value:,.0f}"


def _percent_cell(fraction: Any, unit: str = "") -> str:
    return "-" if fraction is None else f"{float(fraction) * 100:.0f}{unit}"


def _clip(line: str) -> str:
    return line if len(line) <= MAX_WIDTH else line[:MAX_WIDTH - 3] + "..."


def wrap(text: str, width: int, indent: str, first: str = "") -> list[str]:
    """`text` in lines of at most `width` (a longer word stays whole), the first starting
    with `first`, the others with `indent`."""
    lines, current = [], ""
    for word in text.split(" "):
        candidate = f"{current} {word}" if current else first + word
        if current and len(candidate) > width:
            lines.append(current)
            current = indent + word
        else:
            current = candidate
    if current:
        lines.append(current)
    return lines
