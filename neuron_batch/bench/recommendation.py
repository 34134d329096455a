"""The verdict of a bucket sweep in plain English: which configuration to use, which gives the
most per compiled graph, what the Pareto front trades, and what limits the winner. Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from neuron_batch.bench.number_words import (
    as_number,
    bucket_words,
    compile_pair,
    compile_words,
    fmt_pct,
    fmt_relative,
    fmt_share_of,
    fmt_tps,
)
from neuron_batch.bench.prefix_verdict import prefix_verdict
from neuron_batch.bench.ranking import (
    COST_USD,
    COST_USD_WITH_COMPILE,
    DEFAULT_NAME,
    cost_key_of,
    dominates,
    pareto_front,
    rank_key,
)

#: Admission blocked in fewer than this share of the steps counts as rarely blocked.
RARE_BLOCK_SHARE = 0.05

_STATE_WORDS = {"IDLE": "idle", "ACTIVE_PREFILL": "prefill", "ACTIVE_DECODE": "decode"}

# -- recommendation ---------------------------------------------------------------------------

def recommend(rows: Sequence[dict[str, Any]],
              prefix_bound: dict[str, Any] | None = None) -> dict[str, Any]:
    """Which configuration to use, and why, in numbers and plain English.

    Returns {"fastest", "best_per_graph", "cheapest" (None without prices), "pareto" (names,
    cheapest compile first), "pareto_cost"
    (the cost key of the front), "baseline" ("default" when the sweep has it, else None),
    "limits" (what holds the fastest back: dominant state and admission block), "reasons"
    (sentences)}, and "kv_reserve" (which KV admission rule wins, see `kv_reserve_verdict`)
    when the sweep ran both, and "prefix" (whether to enable prefix caching and in which
    order, see prefix_verdict.py; `prefix_bound` is the job's bound) when it swept them.
    """
    ordered = sorted(rows, key=rank_key)
    front = pareto_front(ordered)
    result: dict[str, Any] = {"fastest": None, "best_per_graph": None, "cheapest": None,
                              "pareto": [row["name"] for row in front],
                              "pareto_cost": front.cost_key, "baseline": None,
                              "limits": None, "reasons": []}
    if not ordered:
        result["reasons"].append("no configuration finished: nothing to recommend")
        return result
    fastest = ordered[0]
    baseline = next((row for row in ordered if row["name"] == DEFAULT_NAME), None)
    per_graph = min(ordered, key=lambda row: (-as_number(row.get("throughput_per_graph")),
                                              -as_number(row["output_tokens_per_s"]),
                                              row["compiled_graphs"], row["name"]))
    result.update(fastest=fastest["name"], best_per_graph=per_graph["name"],
                  baseline=baseline["name"] if baseline else None)
    reasons = result["reasons"]

    reasons.append(_fastest_sentence(fastest, baseline, ordered))
    limits = _limits(fastest)
    result["limits"] = limits
    reasons.append(f"what limits {fastest['name']}: {limits['text']}")
    kv_rule = kv_reserve_verdict(ordered)
    if kv_rule is not None:
        result["kv_reserve"] = kv_rule
        reasons.append(kv_rule["text"])
    prefix = prefix_verdict(ordered, prefix_bound)
    if prefix is not None:
        result["prefix"] = prefix
        reasons.append(prefix["text"])
    reasons.append(_per_graph_sentence(per_graph, fastest))
    cheapest, text = _cheapest(ordered, fastest)
    if cheapest is not None:
        result["cheapest"] = cheapest["name"]
        reasons.append(text)

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
                f"{fmt_relative(pick['output_tokens_per_s'], baseline['output_tokens_per_s'])} "
                f"({fmt_tps(pick['output_tokens_per_s'])} vs "
                f"{fmt_tps(baseline['output_tokens_per_s'])} tok/s) with "
                f"{pick['compiled_graphs']} graphs against {baseline['compiled_graphs']}"
                + compile_pair(pick, baseline))
    return result


def _cheapest(ordered: list[dict], fastest: dict) -> tuple[dict | None, str]:
    """Which configuration costs least (run + compile where estimated), and the sentence;
    (None, "") when no row is priced."""
    key = cost_key_of(ordered)
    priced = [row for row in ordered if row.get(key) is not None]
    if not priced:
        return None, ""
    cheapest = min(priced, key=lambda row: (float(row[key]), rank_key(row)))
    what = "run"
    if key == COST_USD_WITH_COMPILE:
        loaded = [row.get("compiled_before") for row in priced]
        what = ("run + estimated start-up, the graphs loaded: compiled before"
                if all(loaded) else "run + estimated start-up, compiled fresh"
                if not any(loaded) else "run + estimated start-up, compiled fresh where not "
                "compiled before")
    text = (f"cheapest ({what}): {cheapest['name']} at ${float(cheapest[key]):,.2f}")
    if cheapest is not fastest and fastest.get(key) is not None:
        text += f" against ${float(fastest[key]):,.2f} for the fastest"
    if key == COST_USD_WITH_COMPILE:
        run_only = [row for row in priced if row.get(COST_USD) is not None]
        by_run = min(run_only, key=lambda row: (float(row[COST_USD]), rank_key(row)),
                     default=cheapest)
        if by_run is not cheapest:
            text += (f"; it rests on the start-up: counting the run alone (the graphs compiled "
                     f"before, on later runs), {by_run['name']} is cheapest at "
                     f"${float(by_run[COST_USD]):,.2f}")
    return cheapest, text


def _fastest_sentence(fastest: dict, baseline: dict | None, ordered: list[dict]) -> str:
    text = (f"fastest: {fastest['name']} ({bucket_words(fastest)}) at "
            f"{fmt_tps(fastest['output_tokens_per_s'])} output tok/s with "
            f"{fastest['compiled_graphs']} compiled graphs{compile_words(fastest)}")
    if baseline is not None and baseline is not fastest:
        gain = fmt_relative(fastest["output_tokens_per_s"], baseline["output_tokens_per_s"])
        text += (f", {gain} the default ({fmt_tps(baseline['output_tokens_per_s'])} tok/s, "
                 f"{baseline['compiled_graphs']} graphs)")
        text += (f"; its prefill padding waste is {fmt_pct(fastest['prefill_waste'])} against "
                 f"{fmt_pct(baseline['prefill_waste'])} for the default (decode "
                 f"{fmt_pct(fastest['decode_waste'])} against {fmt_pct(baseline['decode_waste'])}")
        if fastest.get("attention_waste") is not None:
            # what the attention buckets save: KV attended but not held
            text += (f"; decode KV attended but not held {fmt_pct(fastest['attention_waste'])}"
                     f" against {fmt_pct(baseline.get('attention_waste'))}")
        return text + ")"
    if baseline is fastest:
        text += "; no configuration beat the default"
    if len(ordered) > 1:
        second = ordered[1]
        text += (f"; the runner-up {second['name']} is "
                 f"{fmt_relative(second['output_tokens_per_s'], fastest['output_tokens_per_s'])} "
                 f"({fmt_tps(second['output_tokens_per_s'])} tok/s)")
    text += (f"; padding waste {fmt_pct(fastest['prefill_waste'])} prefill, "
             f"{fmt_pct(fastest['decode_waste'])} decode")
    return text


#: Throughputs closer than this are level: neither KV admission rule wins.
LEVEL_SHARE = 0.005


def kv_reserve_verdict(ordered: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Which KV admission rule wins, comparing the best configuration of each (rows fastest
    first), and why: how often kv_saturated held the queue back and how much of the KV cache
    the requests really used. None unless the rows hold both rules."""
    best: dict[str, dict[str, Any]] = {}
    for row in ordered:
        if row.get("kv_reserve"):
            best.setdefault(row["kv_reserve"], row)
    request, seed = best.get("request"), best.get("max_model_len")
    if request is None or seed is None:
        return None
    tps_request = as_number(request["output_tokens_per_s"])
    tps_seed = as_number(seed["output_tokens_per_s"])
    ratio = tps_request / tps_seed if tps_seed else None
    if ratio is None or abs(ratio - 1) < LEVEL_SHARE:
        winner = None
    else:
        winner = "request" if ratio > 1 else "max_model_len"
    pair = (f"{request['name']} at {fmt_tps(tps_request)} output tok/s against "
            f"{seed['name']} at {fmt_tps(tps_seed)}")
    seed_use = (f"under max_model_len kv_saturated refused admission in "
                f"{_block_share(seed, 'kv_saturated')} of steps while the requests held "
                f"{fmt_pct(seed.get('kv_mean_used_fraction'))} of the KV cache on average")
    if winner == "request":
        text = (f"KV admission: request wins, {ratio:.2f}x ({pair}): {seed_use}; reserving "
                f"each request's own prompt + max_tokens let them use "
                f"{fmt_pct(request.get('kv_mean_used_fraction'))} on average (peak "
                f"{fmt_pct(request.get('kv_peak_used_fraction'))})"
                f"{_preemption_words(request, seed)}")
    elif winner is None:
        text = (f"KV admission: the rules are level ({pair}): {seed_use}, so the KV cache was "
                f"not what limited it; {_limits(request)['text']}")
    else:
        text = (f"KV admission: max_model_len wins, {fmt_relative(tps_seed, tps_request)} "
                f"request ({pair}): running more requests at once cost more than it gained; "
                f"{_limits(request)['text']}")
    return {"winner": winner, "ratio": ratio, "request": request["name"],
            "max_model_len": seed["name"], "text": text}


def _block_share(row: dict[str, Any], reason: str) -> str:
    steps = row.get("steps") or 0
    count = (row.get("admission_blocked") or {}).get(reason, 0)
    return fmt_pct(count / steps) if steps else "-"


def _preemption_words(*rows: dict[str, Any]) -> str:
    counts = [row.get("preemptions") for row in rows]
    if any(count is None for count in counts):
        return ""
    total = sum(count or 0 for count in counts)
    return ", with no preemption under either rule" if total == 0 else (
        f"; vLLM preempted {total:,} requests, which Neuron cannot do")


def _per_graph_sentence(row: dict, fastest: dict) -> str:
    text = (f"best throughput per compiled graph: {row['name']} ({bucket_words(row)}) at "
            f"{fmt_tps(row['throughput_per_graph'])} tok/s per graph with "
            f"{row['compiled_graphs']} graphs{compile_words(row)}")
    if row is fastest:
        return text + "; the fastest configuration is also the most graph-efficient"
    return (text + f", {fmt_tps(row['output_tokens_per_s'])} output tok/s "
            f"({fmt_relative(row['output_tokens_per_s'], fastest['output_tokens_per_s'])} "
            f"the fastest)")


def _trade_sentence(row: dict, fastest: dict) -> str:
    loss = as_number(fastest["output_tokens_per_s"]) - as_number(row["output_tokens_per_s"])
    saved = fastest["compiled_graphs"] - row["compiled_graphs"]
    if loss > 0:
        give = (f"gives up {fmt_share_of(loss, fastest['output_tokens_per_s'])} throughput "
                f"({fmt_tps(row['output_tokens_per_s'])} vs "
                f"{fmt_tps(fastest['output_tokens_per_s'])} tok/s)")
    else:
        give = f"matches the fastest's throughput ({fmt_tps(row['output_tokens_per_s'])} tok/s)"
    if saved > 0:
        gets = f"{saved} fewer graph{'s' if saved != 1 else ''}"
    elif saved < 0:
        gets = f"{-saved} more graph{'s' if saved != -1 else ''}"
    else:
        gets = "the same number of graphs"
    text = f"{row['name']} {give} for {gets} ({row['compiled_graphs']} instead of " \
           f"{fastest['compiled_graphs']}{compile_pair(row, fastest, inline=True)})"
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
            parts.append(f"the engine is idle {fmt_pct(known[state])} of the time")
        else:
            parts.append(f"{word} dominates ({fmt_pct(known[state])} of time)")
    if reason is None or rare:
        parts.append("admission was never blocked" if reason is None else
                     f"admission was rarely blocked (most often {reason}, {blocked[reason]:,} "
                     f"times in {steps:,} steps)")
        if state == "IDLE":
            verdict = "requests arrive slower than it serves them: the workload limits it"
        elif state == "ACTIVE_PREFILL":
            verdict = ("prefill compute limits it: prefill buckets that fit the prompts "
                       f"(prefill waste {fmt_pct(row.get('prefill_waste'))}) matter most")
        elif state == "ACTIVE_DECODE":
            verdict = ("decode compute limits it: the decode buckets and batch size "
                       f"(decode waste {fmt_pct(row.get('decode_waste'))}) matter most")
        else:
            verdict = "nothing in the records points to a limit"
    else:
        parts.append(f"{reason} blocked admission {blocked[reason]:,} times"
                     + (f" (in {fmt_pct(blocked[reason] / steps)} of {steps:,} steps)"
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
