"""`plan`'s recommendation in words: what to rent and why, what it was weighed against (the
other kind of layout, the start-up it rests on, hosts left out, prefix caching)."""

from __future__ import annotations

from typing import Any

from neuron_batch.bench.deadline import format_hours
from neuron_batch.plan.grid import CANNOT_COMPILE
from neuron_batch.runtimes.runtime import runtime_of


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 0.001 * max(abs(a), abs(b))


def late_words(hours: float) -> str:
    """How late, in words (under a minute: "<1 min")."""
    return "<1 min" if hours < 1 / 60 else format_hours(hours)


def _split_words(best: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """How the recommendation compares with the other kind (rows are ranked): a split is only
    recommended when it beats every single layout simulated."""
    other = next((r for r in rows if bool(r.get("split")) != bool(best.get("split"))), None)
    if other is None:
        return []
    figures = (f"{format_hours(other['hours'])} for ${other['usd']:,.2f} "
               f"(${other['usd_per_million_output_tokens']:,.2f}/M)")
    if best.get("split"):
        return [f"The best single layout, {other['name']}, takes {figures}: splitting by "
                f"length is worth its second layout here."]
    return [f"The best split by length, {other['name']}, takes {figures}: not worth its "
            f"second layout here."]


def _compile_flip_words(best: dict[str, Any], rows: list[dict[str, Any]], deadline_h: float,
                        compiled: bool) -> list[str]:
    """Whether the recommendation rests on the start-up: the option that would win with no
    start-up counted at all (rows are ranked with it), among those simulated."""
    if compiled or not best["meets_deadline"]:
        return []

    def run_only(row: dict[str, Any]) -> tuple[float, float]:
        hours = row["hours"] - row["compile_hours"]
        return row["usd"] * hours / row["hours"] if row["hours"] > 0 else row["usd"], hours

    meeting = [r for r in rows if run_only(r)[1] <= deadline_h]
    other = min(meeting, key=lambda r: (run_only(r)[0], r["rank"]), default=best)
    if other is best:
        return []
    return [f"That rests on the start-up: with the graphs compiled before (--compiled, "
            f"later runs) {other['name']} would be cheaper, ${run_only(other)[0]:,.2f} against "
            f"${run_only(best)[0]:,.2f} of run alone."]


def left_out_line(excluded: list[str]) -> str:
    """The log's line of what the grid left out: each name once (an instance without a price
    or a host that cannot compile is left out at every max_model_len candidate), with what of
    it (a TP group at a max_model_len, its max_num_seqs from one value up), and one reason."""
    names = list(dict.fromkeys(reason.split(":", 1)[0] for reason in excluded))
    return (f"  left out ({len(names)}; reasons in plan.json): {', '.join(names)}; e.g. "
            f"{excluded[0]}")


def _left_out_words(meta: dict[str, Any]) -> list[str]:
    """The instances not weighed because their host cannot compile the model: with graphs
    compiled elsewhere (--compiled, the nights after the first) they would be, and may win."""
    names = list(dict.fromkeys(reason.split(":", 1)[0] for reason in meta.get("excluded") or []
                               if CANNOT_COMPILE in reason))
    if not names or meta.get("compiled"):
        return []
    return [f"Not weighed: {', '.join(names)}, whose host memory cannot compile "
            f"{meta['architecture']} (aws-neuron-sdk issue 1222); with the graphs compiled on "
            f"a larger host (--compiled, as on the nights after the first) "
            f"{'it is' if len(names) == 1 else 'they are'} weighed too."]


def prefix_words(best: dict[str, Any], rows: list[dict[str, Any]],
                 bound: dict[str, Any] | None) -> list[str]:
    """Whether the recommendation runs with prefix caching, and why (rows are ranked)."""
    if bound is None:
        return []
    if not bound.get("bound_tokens"):
        return [f"Prefix caching off (--no-prefix-caching): the prompts share no KV block, so "
                f"the cache would serve none of their {bound.get('prompt_tokens', 0):,} tokens "
                f"and only add graphs{' and decode time' if runtime_of(best).prefix_grid else ''}."]
    share = bound["bound_tokens"] / bound["prompt_tokens"] if bound.get("prompt_tokens") else 0
    other = next((r for r in rows if r.get("prefix_caching") != best.get("prefix_caching")),
                 None)
    versus = ("" if other is None else
              f" The best option {'without' if best.get('prefix_caching') else 'with'} it, "
              f"{other['name']}, takes {format_hours(other['hours'])} for ${other['usd']:,.2f}.")
    if best.get("prefix_caching"):
        hits = best.get("hit_fraction")
        return [f"Prefix caching on, in {best.get('order')} order (--order {best.get('order')}): "
                f"the cache served {'-' if hits is None else f'{hits:.0%}'} of a replica's "
                f"prompt tokens (an unbounded one could serve {share:.0%} of the job's)."
                + versus]
    return [f"Prefix caching off (--no-prefix-caching): up to {share:.0%} of the prompt tokens "
            f"are shared, but caching on does not pay here." + versus]


def recommendation_words(data: dict[str, Any]) -> list[str]:
    meta, rows = data["meta"], data["options"]
    deadline = meta["deadline"]
    if not rows:
        return ["No option could be simulated: nothing to recommend."]
    best = rows[0]
    runtime = runtime_of(best)
    buckets = "buckets " + runtime.bucket_words(best["prefill_buckets"], best["decode_buckets"],
                                                best.get("attention_buckets"))
    what = (f"{best['num_instances']} x {best['instance']}, {best['replicas']} replica"
            f"{'s' if best['replicas'] != 1 else ''} of TP {best['tensor_parallel_size']} on "
            f"each ({runtime.name}), max_model_len {best.get('max_model_len')}, "
            f"max_num_seqs {best['max_num_seqs']}, {buckets}")
    if best.get("split"):
        short = best["split"]
        what += (f"; split by length at {short['split_at']:,} tokens: the requests of prompt + "
                 f"max_tokens <= {short['split_at']:,} ({short['requests']:,} of the "
                 f"{short['share_requests']:,} of a replica's share) first, in a layout of "
                 f"max_model_len {short['split_at']:,} with {short['max_num_seqs']} slots "
                 f"(`run --split-at`; its buckets fitted to them, "
                 f"{format_hours(short['compile_hours'])} more start-up)")
    cost = (f"${best['usd']:,.2f} (${best['usd_per_million_output_tokens']:,.2f} per million "
            f"output tokens, {best['pricing']} at ${best['price_per_hour_usd']:,.4f}/h)")
    compile_ = (f" of which {format_hours(best['compile_hours'])} starting up"
                + (" (loading graphs compiled before)" if meta.get("compiled") else
                   " (compiling fresh)") if best["compile_hours"] else "")
    if best["meets_deadline"]:
        out = [f"Recommendation: {what}. It finishes in {format_hours(best['hours'])}"
               f"{compile_}, {format_hours(best['hours_to_spare'])} before the deadline, for "
               f"{cost}: the cheapest option that meets the deadline."]
        same = [r["name"] for r in rows[1:] if _close(r["hours"], best["hours"])
                and _close(r["usd"], best["usd"])]
        if same:
            out.append(f"Equally good (same time and cost): {', '.join(same)}.")
        cheaper = [r for r in rows if not r["meets_deadline"] and r["usd"] < best["usd"]]
        if cheaper:
            late = min(cheaper, key=lambda r: r["usd"])
            out.append(f"Cheaper but late: {late['name']} takes {format_hours(late['hours'])} "
                       f"({late_words(-late['hours_to_spare'])} late) for ${late['usd']:,.2f}.")
        fastest = min(rows, key=lambda r: (r["hours"], r["usd"]))
        if fastest is not best and fastest["hours"] < best["hours"] * 0.999:
            out.append(f"The fastest, {fastest['name']}, takes {format_hours(fastest['hours'])} "
                       f"for ${fastest['usd']:,.2f}.")
    else:
        out = [f"No option meets the {deadline['text']} deadline. The fastest is {what}: "
               f"{format_hours(best['hours'])}{compile_}, "
               f"{late_words(-best['hours_to_spare'])} late, for {cost}."]
        if best["compile_hours"] and best["hours"] - best["compile_hours"] <= deadline["hours"]:
            out.append("With the graphs compiled in advance (--compiled) it would make it.")
        else:
            out.append("More instances (--max-num-instances) or a later deadline would help.")
    out += _split_words(best, rows)
    out += _compile_flip_words(best, rows, deadline["hours"], bool(meta.get("compiled")))
    out += _left_out_words(meta)
    out += prefix_words(best, rows, meta.get("prefix_cache"))
    out += ["", f"One replica, on its share of {best['share_requests']:,} requests (measured "
                f"{best['replica_output_tokens_per_s']:,.1f} output tok/s; the simulated device "
                f"reproduces it):", f"  {best['command']}",
            "The whole layout, for a run that spreads replicas over instances:",
            f"  {best['layout_command']}"]
    return out
