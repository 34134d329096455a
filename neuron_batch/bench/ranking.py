"""Rank the configurations of a bucket sweep, and find the throughput / compile-cost Pareto front.

Input: the sweep entries, each a dict
`{"name", "params", "status": "done" | "failed", "error", "report"}` where `report` is the run's
report.json (or None when the run failed), read here as a `Report`. On the simulated device
`report.config.sim` is the simulated target's description; its
`compile.estimated_compile_s` is the compile cost when every configuration has it. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from neuron_batch.bench.number_words import COST_COMPILE_S, as_number
from neuron_batch.report.cost import compile_and_usd
from neuron_batch.report.model import (
    KvFigures,
    Report,
    ReportConfig,
    as_report,
)
from neuron_batch.report.schema import or_none, present
from neuron_batch.scheduler.records import BLOCK_REASONS

#: Scheduler states, in report order.
STATES = ("IDLE", "ACTIVE_PREFILL", "ACTIVE_DECODE")
#: The configuration every other one is compared with, when the sweep has it.
DEFAULT_NAME = "default"
#: Compile-cost keys `pareto_front` can use (and COST_COMPILE_S, from words).
COST_GRAPHS = "compiled_graphs"

# -- ranking ----------------------------------------------------------------------------------

#: What `rank` can order by: output throughput, or what the run costs.
RANK_BY = ("throughput", "cost")
#: Row keys of a configuration's cost: the run's (report["cost"]["usd"]), and the run plus its
#: estimated compile time at the same price.
COST_USD, COST_USD_WITH_COMPILE = "usd", "usd_with_compile"


def rank(entries: Iterable[Mapping[str, Any]], by: str = "throughput") -> list[dict[str, Any]]:
    """One row per finished configuration, best first.

    by="throughput": output tokens/s (descending), then fewer compiled graphs, then name.
    by="cost": cheapest first, on run + compile cost when every row has it, else on the run's
    cost; rows without a cost last; ties as for throughput. Entries whose status is not
    "done", or that have no report, are left out (`write_csv` still lists them).
    """
    if by not in RANK_BY:
        raise ValueError(f"rank by one of {', '.join(RANK_BY)}, got {by!r}")
    rows = [_row(entry) for entry in entries
            if entry.get("status") == "done" and entry.get("report")]
    if by == "cost":
        key = cost_key_of(rows)
        rows.sort(key=lambda row: (as_number(row.get(key), math.inf), *rank_key(row)))
    else:
        rows.sort(key=rank_key)
    for index, row in enumerate(rows, start=1):
        row["rank"] = index
    return rows


def rank_key(row: Mapping[str, Any]) -> tuple:
    return (-as_number(row.get("output_tokens_per_s")),
            as_number(row.get("compiled_graphs"), math.inf), str(row.get("name")))


def cost_key_of(rows: Sequence[Mapping[str, Any]]) -> str:
    """The cost to rank on: run + compile when every row has it, else the run's alone."""
    if rows and all(row.get(COST_USD_WITH_COMPILE) is not None for row in rows):
        return COST_USD_WITH_COMPILE
    return COST_USD


def _row(entry: Mapping[str, Any]) -> dict[str, Any]:
    report = as_report(entry["report"])     # (sweep.json holds the report's JSON)
    params = dict(entry.get("params") or {})
    # (report.section gives the empty section where an older report lacks one, typed per name)
    config = report.section("config")
    throughput = report.section("throughput")
    padding = report.section("padding")
    latency = report.section("latency")

    prefill = configured_buckets(or_none(config.prefill_buckets), params.get("prefill_buckets"))
    decode = configured_buckets(or_none(config.decode_buckets), params.get("decode_buckets"))
    graphs = or_none(config.compiled_graphs)
    if graphs is None:
        graphs = len(prefill) + len(decode)
    output_tps = float(throughput.output_tokens_per_s or 0.0)

    seconds, shares = _state_time(report, float(throughput.elapsed_s or 0.0))
    blocked = {reason: 0 for reason in BLOCK_REASONS}
    refusals = report.section("admission_blocked").counts()
    blocked.update({reason: int(count or 0) for reason, count in refusals.items()})

    def quantile(kind: str, name: str) -> float | None:
        figures = getattr(latency, kind)
        return or_none(getattr(figures, name)) if figures else None

    compile_s, with_compile = compile_and_usd(report)
    cost = report.section("cost")

    def setting(name: str) -> Any:     # the report's, else the swept setting
        value = getattr(config, name)
        return value if present(value) else params.get(name)

    return {
        "rank": None,
        "name": str(entry.get("name")),
        "params": params,
        "runtime": config.runtime or params.get("runtime"),
        "prefill_buckets": prefill,
        "decode_buckets": decode,
        "attention_buckets": list(config.attention_buckets or []),
        "max_num_seqs": setting("max_num_seqs"),
        "max_num_batched_tokens": setting("max_num_batched_tokens"),
        "compiled_graphs": int(graphs),
        "estimated_compile_s": compile_s,
        # the start-up counted only a load: the graphs were compiled before (None: unknown)
        "compiled_before": ((config.sim or {}).get("compile") or {}).get("compiled"),
        "output_tokens_per_s": output_tps,
        "total_tokens_per_s": float(throughput.total_tokens_per_s or 0.0),
        "elapsed_s": or_none(throughput.elapsed_s),
        "steps": or_none(report.section("steps").total),
        "prefill_waste": or_none(padding.phase("prefill").waste_fraction),
        "decode_waste": or_none(padding.phase("decode").waste_fraction),
        # decode KV attended but not held (nxdi: idle slots and the token-generation bucket;
        # vllm-neuron: max_model_len or the context-length bucket per padded request)
        "attention_waste": or_none(padding.phase("attention").waste_fraction),
        "state_seconds": seconds,
        "state_shares": shares,
        "admission_blocked": blocked,
        "ttft_p50_s": quantile("ttft_s", "p50"),
        "ttft_p99_s": quantile("ttft_s", "p99"),
        "tpot_p50_s": quantile("tpot_s", "p50"),
        "tpot_p99_s": quantile("tpot_s", "p99"),
        "throughput_per_graph": output_tps / graphs if graphs else None,
        COST_USD: or_none(cost.usd),
        COST_USD_WITH_COMPILE: with_compile,
        "usd_per_million_output_tokens": or_none(cost.usd_per_million_output_tokens),
        # KV admission: the rule, and what it reserved and the requests held (fractions of
        # the usable blocks); None in reports from before these figures existed.
        "kv_reserve": config.kv_reserve or params.get("kv_reserve"),
        "preemptions": or_none(report.preemptions),
        **_kv_fractions(report.section("kv")),
        **_prefix_fields(entry, config),
    }


def _state_time(report: Report, elapsed: float
                ) -> tuple[dict[str, float], dict[str, float | None]]:
    """Seconds in each scheduler state, and each one's share of their sum (of the elapsed
    time where the states hold none); a state this module does not know stays visible."""
    states = report.states or {}
    seconds = {state: float(states[state].seconds or 0.0) if state in states else 0.0
               for state in STATES}
    for state, figures in states.items():
        seconds.setdefault(state, float((figures.seconds if figures else 0.0) or 0.0))
    total = sum(seconds.values()) or elapsed
    return seconds, {state: (value / total if total > 0 else None)
                     for state, value in seconds.items()}


def _prefix_fields(entry: Mapping[str, Any], config: ReportConfig) -> dict[str, Any]:
    """Prefix caching and order of a configuration, and what the cache did (bench/cache_effect.py,
    from the run's records; None in sweeps from before these figures existed)."""
    figures = entry.get("prefix") or {}
    params = entry.get("params") or {}
    caching = or_none(config.enable_prefix_caching)
    if caching is None and params.get("prefix_caching") is not None:
        caching = params["prefix_caching"] == "on"
    out = {"prefix_caching": caching, "order": config.order or params.get("order"),
           "prefix_buckets": list(config.prefix_buckets or [])}
    for key in ("prompt_tokens", "hit_tokens", "hit_fraction", "recomputed_tokens",
                "prefill_s", "decode_s", "gather_s"):
        out[key] = figures.get(key)
    return out


def _kv_fractions(kv: KvFigures) -> dict[str, float | None]:
    num_blocks = or_none(kv.num_blocks)
    usable = num_blocks - 1 if num_blocks and num_blocks > 1 else None

    def share(value: Any) -> float | None:
        value = or_none(value)
        return value / usable if usable and value is not None else None

    return {"kv_peak_reserved_fraction": share(kv.peak_reserved_blocks),
            "kv_peak_used_fraction": share(kv.peak_used_blocks),
            "kv_mean_used_fraction": or_none(kv.mean_used_fraction)}


def configured_buckets(configured: Any, param: Any) -> list[int]:
    """The compiled bucket sizes: the report's list, else the swept setting ("128,256,...")."""
    value = configured if configured else param
    if value is None:
        return []
    if isinstance(value, str):
        return [int(part) for part in value.replace(" ", ",").split(",") if part.strip()]
    return [int(part) for part in value]


# -- Pareto front -----------------------------------------------------------------------------

class ParetoFront(list):
    """The rows of the Pareto front (a plain list of the same row dicts), cheapest first.

    `cost_key` says which cost the front was taken on: "estimated_compile_s" when every row
    had an estimate, else "compiled_graphs". `cost_label` is the same in words.
    """

    def __init__(self, rows: Iterable[Mapping[str, Any]] = (), cost_key: str = COST_GRAPHS):
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


def pareto_front(rows: Sequence[Mapping[str, Any]]) -> ParetoFront:
    """Configurations no other beats on both output throughput (higher is better) and compile
    cost (lower is better): none has at least the throughput at no more cost, one of them
    strictly. Rows equal on both are all kept. Cheapest first (`ParetoFront.cost_key` names
    the cost)."""
    key = cost_key_for(rows)
    by_cost: dict[float, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_cost.setdefault(float(row[key]), []).append(row)
    front = []
    best_cheaper = -math.inf    # the best throughput of any strictly cheaper row
    for cost in sorted(by_cost):
        group = by_cost[cost]
        best_here = max(as_number(row["output_tokens_per_s"]) for row in group)
        if best_here > best_cheaper:
            front += sorted((row for row in group
                             if as_number(row["output_tokens_per_s"]) == best_here),
                            key=lambda row: str(row["name"]))
        best_cheaper = max(best_cheaper, best_here)
    return ParetoFront(front, key)


def dominates(a: Mapping[str, Any], b: Mapping[str, Any], cost_key: str) -> bool:
    """True if `a` is at least as fast and as cheap as `b`, and strictly one of the two."""
    ta, tb = as_number(a["output_tokens_per_s"]), as_number(b["output_tokens_per_s"])
    ca, cb = float(a[cost_key]), float(b[cost_key])
    return ta >= tb and ca <= cb and (ta > tb or ca < cb)
