"""The sweep's verdict on prefix caching and the submission order: whether to enable the cache
for this job on this layout, and why, in the runs' own figures (bench/cache_effect.py: hits from the
records, prefill and decode time as the device charged it, the decode-time block-KV gather),
and which order pays best. Pure Python.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from neuron_batch.bench.number_words import as_number, fmt_pct, fmt_relative, fmt_seconds, fmt_tps

#: Throughputs closer than this are level: the cache (its graphs, its gather) is not worth it.
LEVEL_SHARE = 0.005


def prefix_verdict(ordered: Sequence[dict[str, Any]],
                   bound: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Whether to run with prefix caching, and in which order, from rows fastest first and the
    job's bound ({"prompt_tokens", "bound_tokens"}, bench/cache_effect.py `job_bound`; None:
    unknown). None unless the rows hold caching on and off, or several orders.

    Returns {"enable" (True / False; None when caching was not swept), "pick" (the row to
    run: the fastest under the chosen caching), "order" (its order), "ratio" (best on / best
    off output tok/s), "hit_fraction", "bound_fraction" (hits / bound_tokens),
    "prefill_saved_s", "gather_s", "graphs_on", "graphs_off", "text"}."""
    on = [row for row in ordered if row.get("prefix_caching") is True]
    off = [row for row in ordered if row.get("prefix_caching") is False]
    orders = {row.get("order") for row in ordered if row.get("order")}
    if not (on and off) and len(orders) < 2:
        return None
    bound_tokens = (bound or {}).get("bound_tokens")
    prompt_tokens = (bound or {}).get("prompt_tokens")
    out: dict[str, Any] = {"enable": None, "pick": ordered[0]["name"],
                           "order": ordered[0].get("order"), "ratio": None,
                           "hit_fraction": None, "bound_fraction": None,
                           "prefill_saved_s": None, "gather_s": None, "graphs_on": None,
                           "graphs_off": None}
    parts = []
    if on and off:
        best_on, best_off = on[0], off[0]
        tps_on = as_number(best_on["output_tokens_per_s"])
        tps_off = as_number(best_off["output_tokens_per_s"])
        ratio = tps_on / tps_off if tps_off else None
        hits = best_on.get("hit_tokens")
        shared_nothing = bound_tokens == 0
        enable = (not shared_nothing and ratio is not None and ratio > 1 + LEVEL_SHARE)
        pick = best_on if enable else best_off
        out.update(enable=enable, pick=pick["name"], order=pick.get("order"), ratio=ratio,
                   hit_fraction=best_on.get("hit_fraction"),
                   bound_fraction=(hits / bound_tokens if bound_tokens and hits is not None
                                   else None),
                   prefill_saved_s=_minus(best_off.get("prefill_s"), best_on.get("prefill_s")),
                   gather_s=best_on.get("gather_s"),
                   graphs_on=best_on["compiled_graphs"], graphs_off=best_off["compiled_graphs"])
        pair = (f"{best_on['name']} at {fmt_tps(tps_on)} output tok/s with it, "
                f"{best_off['name']} at {fmt_tps(tps_off)} without")
        why = "; ".join(_figures(best_on, best_off, out, prompt_tokens, bound_tokens))
        if shared_nothing:
            parts.append(f"prefix caching: leave it off, the job shares no prefix block (an "
                         f"unbounded cache would serve 0 of its {_tokens(prompt_tokens)} "
                         f"prompt tokens), so the cache only costs: caching on is "
                         f"{fmt_relative(tps_on, tps_off)} off ({pair}); {why}")
        elif enable:
            parts.append(f"prefix caching: enable it, {ratio:.2f}x ({pair}): {why}")
        else:
            parts.append(f"prefix caching: leave it off, caching on is "
                         f"{fmt_relative(tps_on, tps_off)} off ({pair}), not worth its graphs"
                         f"{' and gather' if as_number(best_on.get('gather_s')) else ''}: "
                         f"{why}")
    chosen = [row for row in ordered
              if out["enable"] is None or row.get("prefix_caching") is out["enable"]]
    order_text = _order_sentence(chosen)
    if order_text:
        parts.append(order_text)
    if out["enable"] is not None or len(orders) > 1:
        flags = ("" if out["enable"] is None else
                 "--prefix-caching" if out["enable"] else "--no-prefix-caching")
        order = out["order"] or "input"
        if len(orders) > 1 or order != "input":
            flags = " ".join(f for f in (flags, f"--order {order}") if f)
        parts.append(f"run {out['pick']} ({flags})")
    out["text"] = "; ".join(parts)
    return out


def _figures(best_on: dict, best_off: dict, out: Mapping[str, Any], prompt_tokens: Any,
             bound_tokens: Any) -> list[str]:
    """The cache's figures in words: hits (and of the bound), prefill saved, gather paid,
    graphs added."""
    words = []
    hits = best_on.get("hit_tokens")
    if hits is not None:
        text = (f"it served {fmt_pct(best_on.get('hit_fraction'))} of the prompt tokens from "
                f"the cache ({_tokens(hits)} of {_tokens(best_on.get('prompt_tokens'))})")
        if bound_tokens:
            text += (f", {fmt_pct(out['bound_fraction'])} of what an unbounded cache could "
                     f"({_tokens(bound_tokens)}, {fmt_pct(bound_tokens / prompt_tokens)} of "
                     f"the prompt tokens)" if prompt_tokens else "")
        words.append(text)
    saved = out.get("prefill_saved_s")
    if saved is not None:
        words.append(f"prefill {fmt_seconds(best_on.get('prefill_s'))} against "
                     f"{fmt_seconds(best_off.get('prefill_s'))} ("
                     + (f"{fmt_seconds(saved)} saved" if saved >= 0
                        else f"{fmt_seconds(-saved)} more") + ")")
    gather = best_on.get("gather_s")
    if gather is not None:
        words.append(f"decode gather of block KV {fmt_seconds(gather)} paid"
                     + (f" ({fmt_pct(gather / best_on['decode_s'])} of decode)"
                        if gather and best_on.get("decode_s") else ""))
    words.append(f"{best_on['compiled_graphs']} compiled graphs against "
                 f"{best_off['compiled_graphs']} ({_graph_words(best_on)} against "
                 f"{_graph_words(best_off)})")
    return words


def _graph_words(row: dict) -> str:
    """A configuration's graphs by kind: nxdi's (prefill x prefix) grid and token generation,
    else the prefill and decode lists."""
    prefill = len(row.get("prefill_buckets") or [])
    prefix = len(row.get("prefix_buckets") or [])
    attention = len(row.get("attention_buckets") or [])
    if prefix:
        return f"a {prefill} x {prefix} prefill grid + {attention} token generation"
    if row.get("runtime") == "nxdi":
        return f"{prefill} context encoding + {attention} token generation"
    return f"{prefill} prefill + {len(row.get('decode_buckets') or [])} decode"


def _order_sentence(rows: Sequence[dict[str, Any]]) -> str:
    """Which order pays best among `rows` (fastest first): each order's best configuration."""
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.get("order"):
            best.setdefault(row["order"], row)
    if len(best) < 2:
        return ""
    first, *others = best.items()

    def described(order: str, row: dict) -> str:
        hits = row.get("hit_fraction")
        return (f"{order} ({row['name']}, {fmt_tps(row['output_tokens_per_s'])} tok/s"
                + (f", hits {fmt_pct(hits)}" if row.get("prefix_caching") and hits is not None
                   else "") + ")")

    lead = first[1]["output_tokens_per_s"]
    return (f"order: {described(*first)} pays best, against "
            + ", ".join(f"{described(order, row)} "
                        f"{fmt_relative(row['output_tokens_per_s'], lead)} it"
                        for order, row in others))


def _minus(a: Any, b: Any) -> float | None:
    return None if a is None or b is None else float(a) - float(b)


def _tokens(count: Any) -> str:
    return "-" if count is None else f"{int(count):,}"
