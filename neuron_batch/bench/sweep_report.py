"""The verdict of `neuron-batch bench --sweep-buckets`: rank the swept configurations, find the
throughput / compile-cost Pareto front, say in plain English which to use and why, and write the
sweep's table, CSV and JSON.

Input: the sweep entries, each a dict
`{"name", "params", "status": "done" | "failed", "error", "report"}` where `report` is the run
report `metrics.summarize()` produced (or None when the run failed). On the simulated device
`report["config"]["sim"]` is `describe_sim()`'s output; its `compile.estimated_compile_s` is used
as the compile cost when every configuration has it.

Pure Python (no matplotlib: the figures are `plots.py`'s job), so it works on any host.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from neuron_batch.scheduler.records import BLOCK_REASONS

#: Scheduler states, in report order.
STATES = ("IDLE", "ACTIVE_PREFILL", "ACTIVE_DECODE")
#: The configuration every other one is compared with, when the sweep has it.
DEFAULT_NAME = "default"
#: Compile-cost keys `pareto_front` can use.
COST_GRAPHS, COST_COMPILE_S = "compiled_graphs", "estimated_compile_s"
#: Admission blocked in fewer than this share of the steps counts as rarely blocked.
RARE_BLOCK_SHARE = 0.05
#: Widest the terminal table may get.
MAX_WIDTH = 140
MAX_NAME_WIDTH = 28

_STATE_WORDS = {"IDLE": "idle", "ACTIVE_PREFILL": "prefill", "ACTIVE_DECODE": "decode"}


# -- ranking ----------------------------------------------------------------------------------

def rank(entries: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per finished configuration, fastest first.

    Order: output tokens/s (descending), then fewer compiled graphs, then name. Entries whose
    status is not "done", or that have no report, are left out (`write_csv` still lists them).
    """
    rows = [_row(entry) for entry in entries
            if entry.get("status") == "done" and entry.get("report")]
    rows.sort(key=_rank_key)
    for index, row in enumerate(rows, start=1):
        row["rank"] = index
    return rows


def _rank_key(row: Mapping[str, Any]) -> tuple:
    return (-_num(row.get("output_tokens_per_s")), _num(row.get("compiled_graphs"), math.inf),
            str(row.get("name")))


def _row(entry: Mapping[str, Any]) -> dict[str, Any]:
    report = entry["report"]
    params = dict(entry.get("params") or {})
    config = report.get("config") or {}
    throughput = report.get("throughput") or {}
    padding = report.get("padding") or {}
    latency = report.get("latency") or {}

    prefill = _buckets(config.get("prefill_buckets"), params.get("prefill_buckets"))
    decode = _buckets(config.get("decode_buckets"), params.get("decode_buckets"))
    graphs = config.get("compiled_graphs")
    if graphs is None:
        graphs = len(prefill) + len(decode)
    output_tps = float(throughput.get("output_tokens_per_s") or 0.0)

    states = report.get("states") or {}
    seconds = {state: float((states.get(state) or {}).get("seconds") or 0.0) for state in STATES}
    for state, figures in states.items():   # a state this module does not know stays visible
        seconds.setdefault(state, float((figures or {}).get("seconds") or 0.0))
    total = sum(seconds.values())
    if total <= 0:
        total = float(throughput.get("elapsed_s") or 0.0)
    shares = {state: (value / total if total > 0 else None) for state, value in seconds.items()}

    blocked = {reason: 0 for reason in BLOCK_REASONS}
    blocked.update({reason: int(count or 0)
                    for reason, count in (report.get("admission_blocked") or {}).items()})

    def quantile(kind: str, name: str) -> float | None:
        return (latency.get(kind) or {}).get(name)

    return {
        "rank": None,
        "name": str(entry.get("name")),
        "params": params,
        "prefill_buckets": prefill,
        "decode_buckets": decode,
        "max_num_seqs": config.get("max_num_seqs", params.get("max_num_seqs")),
        "max_num_batched_tokens": config.get("max_num_batched_tokens",
                                             params.get("max_num_batched_tokens")),
        "compiled_graphs": int(graphs),
        "estimated_compile_s": _estimated_compile_s(config),
        "output_tokens_per_s": output_tps,
        "total_tokens_per_s": float(throughput.get("total_tokens_per_s") or 0.0),
        "elapsed_s": throughput.get("elapsed_s"),
        "steps": (report.get("steps") or {}).get("total"),
        "prefill_waste": (padding.get("prefill") or {}).get("waste_fraction"),
        "decode_waste": (padding.get("decode") or {}).get("waste_fraction"),
        "state_seconds": seconds,
        "state_shares": shares,
        "admission_blocked": blocked,
        "ttft_p50_s": quantile("ttft_s", "p50"),
        "ttft_p99_s": quantile("ttft_s", "p99"),
        "tpot_p50_s": quantile("tpot_s", "p50"),
        "tpot_p99_s": quantile("tpot_s", "p99"),
        "throughput_per_graph": output_tps / graphs if graphs else None,
    }


def _buckets(configured: Any, param: Any) -> list[int]:
    """The compiled bucket sizes: the report's list, else the swept setting ("128,256,...")."""
    value = configured if configured else param
    if value is None:
        return []
    if isinstance(value, str):
        return [int(part) for part in value.replace(" ", ",").split(",") if part.strip()]
    return [int(part) for part in value]


def _estimated_compile_s(config: Mapping[str, Any]) -> float | None:
    sim = config.get("sim")
    if isinstance(sim, Mapping):
        for key in ("compile", "compile_footprint"):
            footprint = sim.get(key)
            if isinstance(footprint, Mapping) and footprint.get(COST_COMPILE_S) is not None:
                return float(footprint[COST_COMPILE_S])
        if sim.get(COST_COMPILE_S) is not None:
            return float(sim[COST_COMPILE_S])
    value = config.get(COST_COMPILE_S)
    return None if value is None else float(value)


def _num(value: Any, missing: float = 0.0) -> float:
    if value is None:
        return missing
    value = float(value)
    return missing if math.isnan(value) else value


# -- Pareto front -----------------------------------------------------------------------------

class ParetoFront(list):
    """The rows of the Pareto front (a plain list of the same row dicts), cheapest first.

    `cost_key` says which cost the front was taken on: "estimated_compile_s" when every row
    had an estimate, else "compiled_graphs". `cost_label` is the same in words.
    """

    def __init__(self, rows: Iterable[dict[str, Any]] = (), cost_key: str = COST_GRAPHS):
        super().__init__(rows)
        self.cost_key = cost_key

    @property
    def cost_label(self) -> str:
        return "estimated compile time" if self.cost_key == COST_COMPILE_S else "compiled graphs"


def cost_key_for(rows: Sequence[Mapping[str, Any]]) -> str:
    """The compile cost to compare rows on: estimated compile seconds if every row has it."""
    if rows and all(row.get(COST_COMPILE_S) is not None for row in rows):
        return COST_COMPILE_S
    return COST_GRAPHS


def pareto_front(rows: Sequence[dict[str, Any]]) -> ParetoFront:
    """Configurations no other beats on both output throughput (higher is better) and compile
    cost (lower is better): none has at least the throughput at no more cost, one of them
    strictly. Rows equal on both are all kept. Cheapest first (`ParetoFront.cost_key` names
    the cost)."""
    key = cost_key_for(rows)
    by_cost: dict[float, list[dict[str, Any]]] = {}
    for row in rows:
        by_cost.setdefault(float(row[key]), []).append(row)
    front = []
    best_cheaper = -math.inf    # the best throughput of any strictly cheaper row
    for cost in sorted(by_cost):
        group = by_cost[cost]
        best_here = max(_num(row["output_tokens_per_s"]) for row in group)
        if best_here > best_cheaper:
            front += sorted((row for row in group
                             if _num(row["output_tokens_per_s"]) == best_here),
                            key=lambda row: str(row["name"]))
        best_cheaper = max(best_cheaper, best_here)
    return ParetoFront(front, key)


def dominates(a: Mapping[str, Any], b: Mapping[str, Any], cost_key: str) -> bool:
    """True if `a` is at least as fast and as cheap as `b`, and strictly one of the two."""
    ta, tb = _num(a["output_tokens_per_s"]), _num(b["output_tokens_per_s"])
    ca, cb = float(a[cost_key]), float(b[cost_key])
    return ta >= tb and ca <= cb and (ta > tb or ca < cb)


# -- recommendation ---------------------------------------------------------------------------

def recommend(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Which configuration to use, and why, in numbers and plain English.

    Returns {"fastest", "best_per_graph", "pareto" (names, cheapest first), "pareto_cost"
    (the cost key of the front), "baseline" ("default" when the sweep has it, else None),
    "limits" (what holds the fastest back: dominant state and admission block), "reasons"
    (sentences)}.
    """
    ordered = sorted(rows, key=_rank_key)
    front = pareto_front(ordered)
    result: dict[str, Any] = {"fastest": None, "best_per_graph": None,
                              "pareto": [row["name"] for row in front],
                              "pareto_cost": front.cost_key, "baseline": None,
                              "limits": None, "reasons": []}
    if not ordered:
        result["reasons"].append("no configuration finished: nothing to recommend")
        return result
    fastest = ordered[0]
    baseline = next((row for row in ordered if row["name"] == DEFAULT_NAME), None)
    per_graph = min(ordered, key=lambda row: (-_num(row.get("throughput_per_graph")),
                                              -_num(row["output_tokens_per_s"]),
                                              row["compiled_graphs"], row["name"]))
    result.update(fastest=fastest["name"], best_per_graph=per_graph["name"],
                  baseline=baseline["name"] if baseline else None)
    reasons = result["reasons"]

    reasons.append(_fastest_sentence(fastest, baseline, ordered))
    limits = _limits(fastest)
    result["limits"] = limits
    reasons.append(f"what limits {fastest['name']}: {limits['text']}")
    reasons.append(_per_graph_sentence(per_graph, fastest))

    cost_words = front.cost_label
    if len(front) == 1:
        reasons.append(f"Pareto front (throughput vs {cost_words}): only {front[0]['name']}: "
                       f"no other configuration is cheaper without being slower")
    else:
        reasons.append(f"Pareto front (throughput vs {cost_words}), cheapest first: "
                       + ", ".join(row["name"] for row in front))
    for row in front:
        if row is not fastest:
            reasons.append(_trade_sentence(row, fastest))
    if baseline is not None and all(row is not baseline for row in front):
        better = [row for row in front if dominates(row, baseline, front.cost_key)]
        if better:
            pick = min(better, key=lambda row: (float(row[front.cost_key]), row["name"]))
            reasons.append(
                f"the default is dominated: {pick['name']} is "
                f"{_relative(pick['output_tokens_per_s'], baseline['output_tokens_per_s'])} "
                f"({_tps(pick['output_tokens_per_s'])} vs "
                f"{_tps(baseline['output_tokens_per_s'])} tok/s) with "
                f"{pick['compiled_graphs']} graphs against {baseline['compiled_graphs']}"
                + _compile_pair(pick, baseline))
    return result


def _fastest_sentence(fastest: dict, baseline: dict | None, ordered: list[dict]) -> str:
    text = (f"fastest: {fastest['name']} ({_bucket_words(fastest)}) at "
            f"{_tps(fastest['output_tokens_per_s'])} output tok/s with "
            f"{fastest['compiled_graphs']} compiled graphs{_compile_words(fastest)}")
    if baseline is not None and baseline is not fastest:
        gain = _relative(fastest["output_tokens_per_s"], baseline["output_tokens_per_s"])
        text += (f", {gain} the default ({_tps(baseline['output_tokens_per_s'])} tok/s, "
                 f"{baseline['compiled_graphs']} graphs)")
        text += (f"; its prefill padding waste is {_pct(fastest['prefill_waste'])} against "
                 f"{_pct(baseline['prefill_waste'])} for the default (decode "
                 f"{_pct(fastest['decode_waste'])} against {_pct(baseline['decode_waste'])})")
        return text
    if baseline is fastest:
        text += "; no configuration beat the default"
    if len(ordered) > 1:
        second = ordered[1]
        text += (f"; the runner-up {second['name']} is "
                 f"{_relative(second['output_tokens_per_s'], fastest['output_tokens_per_s'])} "
                 f"({_tps(second['output_tokens_per_s'])} tok/s)")
    text += (f"; padding waste {_pct(fastest['prefill_waste'])} prefill, "
             f"{_pct(fastest['decode_waste'])} decode")
    return text


def _per_graph_sentence(row: dict, fastest: dict) -> str:
    text = (f"best throughput per compiled graph: {row['name']} ({_bucket_words(row)}) at "
            f"{_tps(row['throughput_per_graph'])} tok/s per graph with "
            f"{row['compiled_graphs']} graphs{_compile_words(row)}")
    if row is fastest:
        return text + "; the fastest configuration is also the most graph-efficient"
    return (text + f", {_tps(row['output_tokens_per_s'])} output tok/s "
            f"({_relative(row['output_tokens_per_s'], fastest['output_tokens_per_s'])} "
            f"the fastest)")


def _trade_sentence(row: dict, fastest: dict) -> str:
    loss = _num(fastest["output_tokens_per_s"]) - _num(row["output_tokens_per_s"])
    saved = fastest["compiled_graphs"] - row["compiled_graphs"]
    if loss > 0:
        give = (f"gives up {_share_of(loss, fastest['output_tokens_per_s'])} throughput "
                f"({_tps(row['output_tokens_per_s'])} vs "
                f"{_tps(fastest['output_tokens_per_s'])} tok/s)")
    else:
        give = f"matches the fastest's throughput ({_tps(row['output_tokens_per_s'])} tok/s)"
    if saved > 0:
        gets = f"{saved} fewer graph{'s' if saved != 1 else ''}"
    elif saved < 0:
        gets = f"{-saved} more graph{'s' if saved != -1 else ''}"
    else:
        gets = "the same number of graphs"
    text = f"{row['name']} {give} for {gets} ({row['compiled_graphs']} instead of " \
           f"{fastest['compiled_graphs']}{_compile_pair(row, fastest, inline=True)})"
    return text


def _limits(row: dict) -> dict[str, Any]:
    """What holds a configuration back: where its time goes and why admission waited."""
    shares = row.get("state_shares") or {}
    known = {state: share for state, share in shares.items() if share is not None}
    state = max(known, key=lambda s: (known[s], s)) if known else None
    blocked = {reason: count for reason, count in (row.get("admission_blocked") or {}).items()
               if count}
    reason = max(blocked, key=lambda r: (blocked[r], r)) if blocked else None

    steps = row.get("steps") or 0
    # A block is counted at most once per scheduler step: blocks in under 5% of the steps
    # mean the queue hardly ever waited, whatever the reason.
    rare = reason is not None and steps and blocked[reason] < RARE_BLOCK_SHARE * steps

    parts = []
    if state is not None:
        word = _STATE_WORDS.get(state, state)
        if state == "IDLE":
            parts.append(f"the engine is idle {_pct(known[state])} of the time")
        else:
            parts.append(f"{word} dominates ({_pct(known[state])} of time)")
    if reason is None or rare:
        parts.append("admission was never blocked" if reason is None else
                     f"admission was rarely blocked (most often {reason}, {blocked[reason]:,} "
                     f"times in {steps:,} steps)")
        if state == "IDLE":
            verdict = "requests arrive slower than it serves them: the workload limits it"
        elif state == "ACTIVE_PREFILL":
            verdict = ("prefill compute limits it: prefill buckets that fit the prompts "
                       f"(prefill waste {_pct(row.get('prefill_waste'))}) matter most")
        elif state == "ACTIVE_DECODE":
            verdict = ("decode compute limits it: the decode buckets and batch size "
                       f"(decode waste {_pct(row.get('decode_waste'))}) matter most")
        else:
            verdict = "nothing in the records points to a limit"
    else:
        parts.append(f"{reason} blocked admission {blocked[reason]:,} times"
                     + (f" (in {_pct(blocked[reason] / steps)} of {steps:,} steps)"
                        if steps else ""))
        verdict = _REASON_VERDICT.get(reason, f"{reason} limits it").format(
            max_num_seqs=row.get("max_num_seqs") if row.get("max_num_seqs") is not None
            else "?")
    return {"state": state, "share": known.get(state) if state else None,
            "block_reason": reason, "block_count": blocked.get(reason, 0) if reason else 0,
            "text": "; ".join(parts) + ": " + verdict}


_REASON_VERDICT = {
    "kv_saturated": "the KV cache, not the buckets, limits it",
    "at_capacity": ("max_num_seqs ({max_num_seqs}), not the buckets, limits it: every decode "
                    "slot was busy"),
    "prefill_in_running": ("one prefill at a time limits it: the queue waited for running "
                           "prefills, so prefill speed (buckets that fit the prompts, fewer "
                           "chunks) matters"),
    "prefill_batch_full": "the per-step prefill limit (max_prefills_per_batch) limits it",
}


# -- words and numbers ------------------------------------------------------------------------

def _tps(value: Any) -> str:
    """Tokens per second as written in sentences: 1,234 (one decimal below 100)."""
    if value is None:
        return "-"
    value = float(value)
    return f"{value:,.1f}" if abs(value) < 100 else f"{value:,.0f}"


def _pct(fraction: Any) -> str:
    """A share as written in sentences: 12% (one decimal below 10%)."""
    if fraction is None:
        return "-"
    percent = float(fraction) * 100
    return f"{percent:.1f}%" if abs(round(percent, 1)) < 10 else f"{percent:.0f}%"


def _share_of(amount: float, whole: Any) -> str:
    whole = _num(whole)
    return _pct(amount / whole) if whole else "-"


def _relative(value: Any, reference: Any) -> str:
    """"8% above" / "3% below" / "level with"."""
    value, reference = _num(value), _num(reference)
    if not reference:
        return "not comparable with"
    change = (value - reference) / reference
    if change == 0:
        return "level with"
    return f"{_pct(abs(change))} {'above' if change > 0 else 'below'}"


def _compile_minutes(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:,.0f} min"


def _compile_words(row: dict) -> str:
    seconds = row.get(COST_COMPILE_S)
    return "" if seconds is None else f" (est. compile {_compile_minutes(seconds)})"


def _compile_pair(row: dict, other: dict, inline: bool = False) -> str:
    a, b = row.get(COST_COMPILE_S), other.get(COST_COMPILE_S)
    if a is None or b is None:
        return ""
    text = f"est. compile {_compile_minutes(a)} vs {_compile_minutes(b)}"
    return f"; {text}" if inline else f" ({text})"


def _bucket_words(row: dict) -> str:
    return (f"prefill {_join(row.get('prefill_buckets'))} / "
            f"decode {_join(row.get('decode_buckets'))}")


def _join(buckets: Sequence[int] | None) -> str:
    return ",".join(str(b) for b in buckets or []) or "-"


def abbreviate_buckets(buckets: Sequence[int] | None, width: int = 16) -> str:
    """The bucket list as "128,256,512", or "128..8192 (7)" when that would exceed `width`."""
    text = _join(buckets)
    if len(text) <= width or not buckets:
        return text
    return f"{buckets[0]}..{buckets[-1]} ({len(buckets)})"


# -- terminal table ---------------------------------------------------------------------------

# (group header, column header, alignment) per column; one group header spans its columns.
_COLUMNS = (
    ("", "#", ">"), ("", "name", "<"), ("buckets", "prefill", "<"), ("buckets", "decode", "<"),
    ("compile", "graphs", ">"), ("compile", "est.", ">"), ("out", "tok/s", ">"),
    ("vs", "{base}", ">"), ("tok/s", "/graph", ">"),
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
    rows = sorted(rows, key=_rank_key)
    lines = [f"neuron-batch bucket sweep: {len(rows)} configuration"
             f"{'s' if len(rows) != 1 else ''} finished"
             + (f", {len(failed)} failed" if failed else "")]
    if rows:
        lines += _table(rows)
        lines.append("  pf = prefill, dec = decode; waste% = padding share of the padded work; "
                     "time% = share of the run per scheduler state;")
        lines.append("  admission block = the most frequent reason admission refused the queue "
                     "head; est. = estimated compile time")
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
    if all(row.get(COST_COMPILE_S) is None for row in rows):   # no estimate: no column
        drop = [i for i, (group, sub, _) in enumerate(_COLUMNS) if sub == "est."][0]
        headers = [("", "graphs", ">") if h[1] == "graphs" else h
                   for i, h in enumerate(headers) if i != drop]
        body = [cells[:drop] + cells[drop + 1:] for cells in body]
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
        ref = _num(reference["output_tokens_per_s"])
        versus = (f"{(_num(row['output_tokens_per_s']) - ref) / ref * 100:+.1f}%"
                  if ref else "-")
    return [
        str(row.get("rank") or ""),
        _clip_to(row["name"], name_width),
        abbreviate_buckets(row.get("prefill_buckets"), 16),
        abbreviate_buckets(row.get("decode_buckets"), 12),
        str(row["compiled_graphs"]),
        _short_compile(row.get(COST_COMPILE_S)),
        f"{_num(row['output_tokens_per_s']):,.0f}",
        versus,
        _fixed(row.get("throughput_per_graph"), 0),
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


# -- files ------------------------------------------------------------------------------------

def param_names(entries: Iterable[Mapping[str, Any]]) -> list[str]:
    """Swept setting names, in order of first appearance."""
    names: dict[str, None] = {}
    for entry in entries:
        for name in entry.get("params") or {}:
            names.setdefault(str(name), None)
    return list(names)


def csv_rows(entries: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, rows) of the sweep CSV: one row per configuration, done or failed."""
    entries = list(entries)
    ranked = {row["name"]: row for row in rank(entries)}
    params = param_names(entries)
    reasons = list(BLOCK_REASONS)
    for row in ranked.values():
        reasons += [r for r in row["admission_blocked"] if r not in reasons]
    columns = (["name", "rank"] + [f"param_{name}" for name in params]
               + ["output_tokens_per_s", "total_tokens_per_s", "throughput_per_graph",
                  "elapsed_s", "prefill_waste", "decode_waste"]
               + [f"seconds_{state}" for state in STATES]
               + [f"share_{state}" for state in STATES]
               + [f"blocked_{reason}" for reason in reasons]
               + ["ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
                  "prefill_buckets", "decode_buckets", "compiled_graphs", COST_COMPILE_S,
                  "status", "error"])
    out = []
    for entry in entries:
        entry_params = entry.get("params") or {}
        record: dict[str, Any] = dict.fromkeys(columns, "")
        record["name"] = entry.get("name")
        record["status"] = entry.get("status")
        record["error"] = entry.get("error") or ""
        for name in params:
            record[f"param_{name}"] = _csv_value(entry_params.get(name))
        row = ranked.get(str(entry.get("name"))) if entry.get("status") == "done" else None
        if row is not None:
            record.update({key: _csv_value(row.get(key)) for key in (
                "rank", "output_tokens_per_s", "total_tokens_per_s", "throughput_per_graph",
                "elapsed_s", "prefill_waste", "decode_waste", "ttft_p50_s", "ttft_p99_s",
                "tpot_p50_s", "tpot_p99_s", "prefill_buckets", "decode_buckets",
                "compiled_graphs", COST_COMPILE_S)})
            for state in STATES:
                record[f"seconds_{state}"] = _csv_value(row["state_seconds"].get(state))
                record[f"share_{state}"] = _csv_value(row["state_shares"].get(state))
            for reason in reasons:
                record[f"blocked_{reason}"] = row["admission_blocked"].get(reason, 0)
        else:   # what the settings alone say: the graphs it would have compiled
            try:
                prefill = _buckets(None, entry_params.get("prefill_buckets"))
                decode = _buckets(None, entry_params.get("decode_buckets"))
            except (TypeError, ValueError):
                prefill = decode = []
            if prefill or decode:
                record["prefill_buckets"] = _csv_value(prefill)
                record["decode_buckets"] = _csv_value(decode)
                record["compiled_graphs"] = len(prefill) + len(decode)
        out.append(record)
    return columns, out


def write_csv(entries: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """The sweep as CSV: one row per configuration (failed ones too), `param_<name>` columns
    for the swept settings, then the flattened metrics, status and error."""
    columns, records = csv_rows(entries)
    path = Path(path)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(records)
    return path


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, Mapping):
        return ";".join(f"{k}={v}" for k, v in value.items())
    return value


def sweep_json(entries: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]],
               recommendation: Mapping[str, Any], meta: Mapping[str, Any] | None) -> dict:
    """The sweep as one JSON-ready dict: {"meta", "configurations" (the entries, each with its
    full report), "ranking" (the rows), "recommendation"}."""
    return {"meta": _jsonable(dict(meta or {})),
            "configurations": _jsonable(list(entries)),
            "ranking": _jsonable(list(rows)),
            "recommendation": _jsonable(dict(recommendation))}


def _jsonable(value: Any) -> Any:
    """A copy json.dumps accepts: Paths and other objects as text, tuples and sets as lists,
    keys as text, NaN and infinities as None (strict JSON has none)."""
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return [_jsonable(item) for item in sorted(value, key=str)]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)
