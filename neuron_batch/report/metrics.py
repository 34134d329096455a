"""Turn scheduler records into the run report: throughput, padding waste, time per state.

Pure Python (no vLLM; numpy for the requests' columns). Two ways in, one report dict:
`summarize_run()` from records read back (report/run_records.py: the steps' running aggregates
and the requests as columns, no pass over the steps: what a run's report is built from), and
`summarize()` from records in memory, a full pass over every step (tests, small tools; the
reference the aggregates are tested against). `summary.py` formats the dict for the terminal,
`prometheus.py` for Prometheus.

The time accounting (`states`) tiles the interval [start, start + elapsed] with step spans, so
the seconds per state always add up to the elapsed time, whatever gaps or overlaps the clock
shows (async scheduling plans step N+1 before step N's output returns).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from typing import Any

from neuron_batch.report.prefix_cache import (
    grid_padding,
    grid_table,
    has_prefix_buckets,
    prefix_cache_figures,
    prefix_cache_section,
)
from neuron_batch.report.quantiles import PERCENTILES
from neuron_batch.report.run_records import RunRecords
from neuron_batch.report.sampling import sampling_figures, sampling_section
from neuron_batch.runtimes.runtime import runtime_of
from neuron_batch.scheduler.aggregates import Aggregates, system_empty_checker
from neuron_batch.scheduler.records import (
    BLOCK_REASONS,
    DECODE,
    EMPTY,
    PREFILL,
    Records,
    RequestRecord,
    SchedulerState,
    StepRecord,
)

#: Percentiles reported for every latency, as (report key, fraction).
LATENCY_PERCENTILES = PERCENTILES

_IDLE = SchedulerState.IDLE.value


def summarize(records: Records, *, elapsed_s: float | None = None, start: float | None = None,
              extra_config: dict[str, Any] | None = None, total: int | None = None,
              failed: int | None = None, skipped: int | None = None) -> dict[str, Any]:
    """The report dictionary of a run: JSON-ready, read by `summary.py`, users and dashboards.

    `elapsed_s`: the run's wall time if the caller measured it; otherwise it is the time from
    `start` (default: the earliest request arrival) to the latest step end or finish time.
    `total`, `failed`, `skipped`: request counts only the caller knows (inputs it skipped,
    requests that errored); `total` defaults to the number of completed requests.
    """
    steps = records.steps
    completed = [r for r in records.requests if r.finished is not None]
    start, elapsed = _time_window(steps, records.requests, elapsed_s, start)

    input_tokens = sum(r.num_prompt_tokens for r in completed)
    output_tokens = sum(r.num_output_tokens for r in completed)
    num_completed = len(completed)

    config = asdict(records.config) if records.config is not None else {}
    config.update(extra_config or {})
    prefill_buckets = list(config.get("prefill_buckets") or [])
    decode_buckets = list(config.get("decode_buckets") or [])
    attention_buckets = list(config.get("attention_buckets") or [])
    config["compiled_graphs"] = runtime_of(config).num_graphs(
        len(prefill_buckets), len(decode_buckets), len(attention_buckets),
        len(config.get("prefix_buckets") or []))

    padding = padding_summary(steps, prefill_buckets, decode_buckets, attention_buckets)
    if has_prefix_buckets(steps):       # nxdi with prefix caching: by (prefill, prefix) cell
        padding["prefill"] = grid_padding(steps)
    report = {
        **_headline(elapsed, num_completed, input_tokens, output_tokens, config, total=total,
                    failed=failed, skipped=skipped),
        "padding": padding,
        "prefix_cache": prefix_cache_section(steps, completed,
                                             bool(config.get("enable_prefix_caching"))),
        "states": time_per_state(steps, records.requests, start, start + elapsed),
        "admission_blocked": _blocked(records.blocked_counts),
        # vLLM preemptions seen in the scheduler's outputs: Neuron cannot preempt, so the KV
        # admission rule must keep this at 0.
        "preemptions": sum(s.num_preempted for s in steps),
        "kv": kv_summary(steps, records.config.num_kv_blocks if records.config else None),
        "latency": latency_summary(completed),
        "steps": _step_counts(steps),
    }
    sampling = sampling_section(steps, records.requests, runtime_of(config).sampling)
    if sampling is not None:    # (only where a request asked or the device charged)
        report["sampling"] = sampling
    return report


def summarize_run(run: RunRecords, *, elapsed_s: float | None = None,
                  extra_config: dict[str, Any] | None = None, total: int | None = None,
                  failed: int | None = None, skipped: int | None = None) -> dict[str, Any]:
    """The report dictionary of records read back (report/run_records.py): the same figures
    as `summarize`, from the steps' running aggregates and the requests' columns, without a
    pass over the steps. `run.requests` are the requests that count (the caller filters);
    `elapsed_s` None: the aggregates' window."""
    agg = run.aggregates
    requests = run.request_figures()
    elapsed = agg.elapsed if elapsed_s is None else float(elapsed_s)
    input_tokens, output_tokens = requests.prompt_tokens, requests.output_tokens
    num_completed = requests.completed

    config = asdict(run.config) if run.config is not None else {}
    config.update(extra_config or {})
    prefill_buckets = list(config.get("prefill_buckets") or [])
    decode_buckets = list(config.get("decode_buckets") or [])
    attention_buckets = list(config.get("attention_buckets") or [])
    config["compiled_graphs"] = runtime_of(config).num_graphs(
        len(prefill_buckets), len(decode_buckets), len(attention_buckets),
        len(config.get("prefix_buckets") or []))

    padding = padding_tables(agg, prefill_buckets, decode_buckets, attention_buckets)
    if agg.grid_used:       # nxdi with prefix caching: by (prefill, prefix) cell
        padding["prefill"] = grid_table(agg.grid)
    num_blocks = run.config.num_kv_blocks if run.config is not None else None
    usable = num_blocks - 1 if num_blocks else 0
    report = {
        **_headline(elapsed, num_completed, input_tokens, output_tokens, config, total=total,
                    failed=failed, skipped=skipped),
        "padding": padding,
        "prefix_cache": prefix_cache_figures(
            input_tokens, requests.cached_tokens,
            agg.recomputed_tokens, bool(config.get("enable_prefix_caching"))),
        "states": agg.states(),
        "admission_blocked": _blocked(run.blocked),
        "preemptions": agg.preemptions,
        "kv": {"num_blocks": num_blocks, "peak_reserved_blocks": agg.kv_peak_reserved,
               "peak_used_blocks": round(agg.kv_peak_usage * usable),
               "mean_used_fraction": agg.kv_mean()},
        "latency": requests.latency(),
        "steps": {"total": agg.num_steps,
                  **{kind: agg.kinds.get(kind, 0) for kind in (PREFILL, DECODE, EMPTY)}},
    }
    sampling = sampling_figures(agg.sampling_s, agg.step_s, requests.constrained,
                                requests.logprobs, requests.samples, runtime_of(config).sampling)
    if sampling is not None:
        report["sampling"] = sampling
    return report


# (a request column: an array, or a list where the records were kept in memory)
def _headline(elapsed: float, num_completed: int, input_tokens: int, output_tokens: int,
              config: dict[str, Any], *, total: int | None, failed: int | None,
              skipped: int | None) -> dict[str, Any]:
    """The report's first sections, from counts either summary makes: the fields `vllm bench
    throughput --output-json` writes (so its dashboards read us), then requests, throughput and
    tokens."""
    total_tokens = input_tokens + output_tokens
    return {
        "elapsed_time": elapsed,
        "num_requests": num_completed,
        "total_num_tokens": total_tokens,
        "requests_per_second": _rate(num_completed, elapsed),
        "tokens_per_second": _rate(total_tokens, elapsed),
        "config": config,
        "requests": {
            "total": num_completed if total is None else total,
            "completed": num_completed,
            "failed": 0 if failed is None else failed,
            "skipped": 0 if skipped is None else skipped,
        },
        "throughput": {
            "elapsed_s": elapsed,
            "requests_per_s": _rate(num_completed, elapsed),
            "input_tokens_per_s": _rate(input_tokens, elapsed),
            "output_tokens_per_s": _rate(output_tokens, elapsed),
            "total_tokens_per_s": _rate(total_tokens, elapsed),
        },
        "tokens": {"input": input_tokens, "output": output_tokens, "total": total_tokens},
    }


def padding_tables(agg: Aggregates, prefill_buckets: Sequence[int],
                   decode_buckets: Sequence[int], attention_buckets: Sequence[int] = ()
                   ) -> dict[str, Any]:
    """`padding_summary` from the aggregates' tables (every configured bucket a row)."""
    tables = []
    for configured, counted in ((prefill_buckets, agg.prefill), (decode_buckets, agg.decode),
                                (attention_buckets, agg.attention)):
        table = {b: [0, 0, 0] for b in configured}
        for bucket, row in counted.items():
            mine = table.setdefault(bucket, [0, 0, 0])
            for i in range(3):
                mine[i] += row[i]
        tables.append(table)
    prefill, decode, attention = tables
    summary = {
        "prefill": _padding_phase(prefill, "chunks", "actual_tokens", "padded_tokens"),
        "decode": _padding_phase(decode, "steps", "actual_seqs", "padded_seqs"),
    }
    if any(row[0] for row in attention.values()):
        summary["attention"] = _padding_phase(attention, "steps", "kv_held_tokens",
                                              "kv_attended_tokens")
    return summary


# -- time window -----------------------------------------------------------------------------

def _time_window(steps: Sequence[StepRecord], requests: Sequence[RequestRecord],
                 elapsed_s: float | None, start: float | None) -> tuple[float, float]:
    """(start, elapsed) of the run as the report counts it."""
    if start is None:
        arrivals = [r.arrival for r in requests]
        if arrivals:
            start = min(arrivals)
        elif steps:
            start = min(s.t_start for s in steps)
        else:
            start = 0.0
    if elapsed_s is not None:
        if elapsed_s < 0:
            raise ValueError(f"elapsed_s must not be negative, got {elapsed_s}")
        return float(start), float(elapsed_s)
    # A step that never came back (t_end None) still ran from its t_start.
    step_ends = [s.t_start if s.t_end is None else s.t_end for s in steps]
    finishes = [r.finished for r in requests if r.finished is not None]
    end = max(start, max(step_ends, default=start), max(finishes, default=start))
    return float(start), float(end - start)


def _rate(amount: float, seconds: float) -> float:
    return amount / seconds if seconds > 0 else 0.0


# -- padding ---------------------------------------------------------------------------------

def padding_summary(steps: Iterable[StepRecord], prefill_buckets: Sequence[int],
                    decode_buckets: Sequence[int],
                    attention_buckets: Sequence[int] = ()) -> dict[str, Any]:
    """Tokens (prefill) and sequences (decode) scheduled versus padded to, per bucket, and
    (`attention`) the KV decode steps held versus the KV their compiled shape attends (padded
    slots x attended length), per attended length: under nxdi the idle slots and the
    attention-length waste per token-generation bucket, under vllm-neuron the decode context
    read versus held.

    Every configured bucket gets a row, used or not: an unused bucket is a compiled graph that
    costs compile time and device memory for nothing, and AWS's advice is to drop it.
    """
    # bucket -> [count, actual, padded]; dicts keep configured buckets even when unused.
    prefill: dict[int, list[int]] = {b: [0, 0, 0] for b in prefill_buckets}
    decode: dict[int, list[int]] = {b: [0, 0, 0] for b in decode_buckets}
    attention: dict[int, list[int]] = {b: [0, 0, 0] for b in attention_buckets}
    for step in steps:
        kind = step.kind
        if kind == PREFILL:
            actual, padded, table = step.num_tokens, step.num_tokens_padded, prefill
        elif kind == DECODE:
            actual, padded, table = step.num_seqs, step.num_seqs_padded, decode
            if step.attended_len is not None:
                row = attention.get(step.attended_len)
                if row is None:
                    row = attention[step.attended_len] = [0, 0, 0]
                row[0] += 1
                row[1] += step.context_tokens + step.num_seqs   # held once the step writes
                row[2] += step.num_seqs_padded * step.attended_len
        else:
            continue
        # A record without a bucket (older scheduler) is filed under the size it padded to.
        bucket = step.bucket if step.bucket is not None else padded
        row = table.get(bucket)
        if row is None:
            row = table[bucket] = [0, 0, 0]
        row[0] += 1
        row[1] += actual
        row[2] += padded
    summary = {
        "prefill": _padding_phase(prefill, "chunks", "actual_tokens", "padded_tokens"),
        "decode": _padding_phase(decode, "steps", "actual_seqs", "padded_seqs"),
    }
    if any(row[0] for row in attention.values()):
        summary["attention"] = _padding_phase(attention, "steps", "kv_held_tokens",
                                              "kv_attended_tokens")
    return summary


def _padding_phase(table: dict[int, list[int]], count_key: str, actual_key: str,
                   padded_key: str) -> dict[str, Any]:
    actual = sum(row[1] for row in table.values())
    padded = sum(row[2] for row in table.values())
    return {
        actual_key: actual,
        padded_key: padded,
        "waste_fraction": waste_fraction(actual, padded),
        # String keys because the report is JSON; ordered by bucket size for reading.
        "by_bucket": {str(bucket): {count_key: row[0], actual_key: row[1], padded_key: row[2]}
                      for bucket, row in sorted(table.items())},
    }


def waste_fraction(actual: float, padded: float) -> float:
    """Share of the padded work that was padding."""
    return (padded - actual) / padded if padded else 0.0


# -- KV cache --------------------------------------------------------------------------------

def kv_summary(steps: Sequence[StepRecord], num_blocks: int | None) -> dict[str, Any]:
    """How much of the KV cache the admission rule reserved and the requests really held.

    Fractions are of the usable blocks (vLLM's null block left out, as in its usage figure).
    `peak_used_blocks` counts blocks held by requests: blocks freed into the prefix cache are
    free. `mean_used_fraction` weights each step by its duration (a step whose end was never
    recorded, or a run whose steps all take no time, counts each step once).
    """
    usable = num_blocks - 1 if num_blocks else 0
    usages = [s.kv_usage for s in steps]
    weights = [0.0 if s.t_end is None else max(s.t_end - s.t_start, 0.0) for s in steps]
    total_weight = math.fsum(weights)
    if total_weight > 0:
        mean = math.fsum(u * w for u, w in zip(usages, weights)) / total_weight
    else:
        mean = math.fsum(usages) / len(usages) if usages else 0.0
    return {
        "num_blocks": num_blocks,
        "peak_reserved_blocks": max((s.kv_reserved_blocks for s in steps), default=0),
        "peak_used_blocks": round(max(usages, default=0.0) * usable),
        "mean_used_fraction": mean,
    }


# -- time per state --------------------------------------------------------------------------

def time_per_state(steps: Sequence[StepRecord], requests: Sequence[RequestRecord],
                   start: float, end: float) -> dict[str, dict[str, float | int]]:
    """Steps and seconds per scheduler state over [start, end].

    Each step owns the time from its t_start to the next step's t_start (the last one: to
    `end`), all clipped into [start, end] so the spans tile the window exactly. The part of a
    span after the step's output came back is IDLE if no request was in the system then (the
    engine was waiting for work, not working); otherwise it stays with the step's state (host
    overhead between steps of a busy engine). Time before the first step is IDLE.
    """
    table: dict[str, dict[str, float | int]] = {
        state.value: {"steps": 0, "seconds": 0.0} for state in SchedulerState}
    if not steps:
        table[_IDLE]["seconds"] = max(end - start, 0.0)
        return table
    system_empty_at = _system_empty_checker(requests)
    # Columns first: comprehensions are much faster than attribute reads in the loop below,
    # which has to stay fast for 100k+ steps.
    states = [s.state for s in steps]
    starts = [s.t_start for s in steps]
    ends = [s.t_end for s in steps]
    next_starts: list[float | None] = starts[1:] + [None]   # (the last step has no next)
    seconds = dict.fromkeys(table, 0.0)
    seconds.update(dict.fromkeys(states, 0.0))  # a state this module does not know stays visible

    cursor = min(max(starts[0], start), end)
    seconds[_IDLE] += cursor - start
    for state, t_start, done, next_start in zip(states, starts, ends, next_starts):
        # Clip and never step back, so the spans telescope to end - start.
        if next_start is None:
            span_end = end
        else:
            span_end = (next_start if cursor <= next_start <= end
                        else min(max(next_start, cursor), end))
        if done is None:  # output never came back: assume it ran until the next step began
            done = next_start if next_start is not None else t_start
        work_end = done if cursor <= done <= span_end else min(max(done, cursor), span_end)
        seconds[state] += work_end - cursor
        if span_end > work_end:
            seconds[_IDLE if system_empty_at(done) else state] += span_end - work_end
        cursor = span_end

    counts = Counter(states)
    for state, total in seconds.items():
        table[state] = {"steps": counts.get(state, 0), "seconds": total}
    return table


def _system_empty_checker(requests: Sequence[RequestRecord]) -> Callable[[float], bool]:
    return system_empty_checker([r.arrival for r in requests], [r.finished for r in requests])


# -- latency ---------------------------------------------------------------------------------

def latency_summary(completed: Sequence[RequestRecord]) -> dict[str, dict[str, float | None]]:
    """TTFT, time per output token and end-to-end latency of completed requests, in seconds."""
    ttft, tpot, e2e = [], [], []
    for r in completed:
        assert r.finished is not None   # (summarize passes the finished ones only)
        e2e.append(r.finished - r.arrival)
        if r.first_token is not None:
            ttft.append(r.first_token - r.arrival)
            # TPOT excludes the first token, whose time is TTFT; one-token requests have none.
            if r.num_output_tokens >= 2:
                tpot.append((r.finished - r.first_token) / (r.num_output_tokens - 1))
    return {"ttft_s": distribution(ttft), "tpot_s": distribution(tpot), "e2e_s": distribution(e2e)}


def distribution(values: Iterable[float]) -> dict[str, float | None]:
    """Mean and percentiles; None values when there is nothing to describe."""
    ordered = sorted(values)
    if not ordered:
        return {"mean": None, **{key: None for key, _ in LATENCY_PERCENTILES}}
    # fsum is exactly rounded, so the mean does not depend on record order (live vs file).
    result: dict[str, float | None] = {"mean": math.fsum(ordered) / len(ordered)}
    for key, fraction in LATENCY_PERCENTILES:
        result[key] = percentile(ordered, fraction)
    return result


def percentile(ordered: Sequence[float], fraction: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method) of sorted values."""
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    position = fraction * (len(ordered) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    weight = position - lower
    return ordered[lower] + (ordered[upper] - ordered[lower]) * weight


# -- counts ----------------------------------------------------------------------------------

def _blocked(counts: dict[str, int]) -> dict[str, int]:
    """Every known reason (zeros included, so dashboards see a steady set), then any others."""
    result = {reason: int(counts.get(reason, 0)) for reason in BLOCK_REASONS}
    for reason, count in counts.items():
        result.setdefault(reason, int(count))
    return result


def _step_counts(steps: Sequence[StepRecord]) -> dict[str, int]:
    kinds = Counter(s.kind for s in steps)
    return {"total": len(steps), **{kind: kinds.get(kind, 0) for kind in (PREFILL, DECODE, EMPTY)}}
