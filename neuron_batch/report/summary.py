"""Present a run report (the dict `metrics.summarize()` returns, or the same read back from JSON).

`format_summary()`: a plain-text summary for the terminal, laid out in 100 columns, no colours
(it often ends up in CI logs and ticket comments); a row that would pass them goes on under
its first item, and only at a terminal is a line still too long (a long model path) cut, at
the terminal's width (`terminal_width`): piped, every line is kept whole. The Prometheus
form is `prometheus.py`'s.

Pure Python; the functions only read the report, so an older report missing a section still
formats (the section is shown empty).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from neuron_batch.inputs.skipped import SKIPPED
from neuron_batch.report.cost import compile_and_usd
from neuron_batch.report.decision_words import caching_lines, verdict_lines
from neuron_batch.report.notes import notes
from neuron_batch.report.prefix_cache import summary_words as prefix_cache_words
from neuron_batch.runtime import runtime_of
from neuron_batch.runtime_hints import graph_words

MAX_WIDTH = 100

_STATES = ("IDLE", "ACTIVE_PREFILL", "ACTIVE_DECODE")
#: (label, report key) of each latency, and (column, quantile) of each percentile.
LATENCIES = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s"))
PERCENTILES = (("p50", "0.5"), ("p90", "0.9"), ("p99", "0.99"))
_CONFIG_KEYS = ("model", "device", "runtime", "scheduler_cls", "max_num_seqs",
                "max_num_batched_tokens", "max_model_len", "block_size", "num_kv_blocks",
                "max_kv_concurrent", "kv_reserve", "order")
#: Devices that compile nothing: the CPU (and a GPU) follow the shapes a Neuron runtime would
#: compile, and the simulated device estimates what compiling them would take.
NOTHING_COMPILED = ("cpu", "cuda", "sim")
#: kv_saturated refusing the queue head in at least this share of steps, and more often than
#: any other reason, counts as the KV rule limiting the run.
KV_BOUND_SHARE = 0.10


# -- terminal summary ------------------------------------------------------------------------

def format_summary(report: dict[str, Any], width: int | None = None) -> str:
    """A compact, aligned summary of a run report, one section per concern; lines longer than
    `width` (a terminal's, `terminal_width`; None: none) cut."""
    config = report.get("config", {})
    requests = report.get("requests", {})
    throughput = report.get("throughput", {})
    tokens = report.get("tokens", {})
    steps = report.get("steps", {})
    padding = report.get("padding", {})

    lines = ["neuron-batch run summary"]
    shown = dict(config)
    if "kv_reserve" in shown and runtime_of(config).static_kv:
        shown["kv_reserve"] = "n/a (static KV cache)"    # the rule never binds under nxdi
    if config.get("device") in ("cpu", "cuda") and "runtime" in shown:
        # no Neuron runtime ran here: the scheduler padded to the shapes it compiles
        shown["runtime"] = f"shapes of {shown['runtime']}"
    lines += _wrap_pairs([(key, shown[key]) for key in _CONFIG_KEYS if key in shown])
    lines.append("")
    skipped = requests.get("skipped")
    lines += _rows("Requests", [
        f"{_int(requests.get('completed'))} completed of {_int(requests.get('total'))}",
        f"{_int(requests.get('failed'))} failed",
        f"{_int(skipped)} skipped" + (f" ({SKIPPED})" if skipped else ""),
        *([f"{_int(requests['pending'])} pending"] if requests.get("pending") else [])])
    lines += _rows("Throughput", [
        f"{_float(throughput.get('elapsed_s'), 2)} s elapsed",
        f"{_float(throughput.get('requests_per_s'), 2)} req/s",
        f"{_float(throughput.get('input_tokens_per_s'), 1)} in tok/s",
        f"{_float(throughput.get('output_tokens_per_s'), 1)} out tok/s",
        f"{_float(throughput.get('total_tokens_per_s'), 1)} total tok/s"])
    lines += _rows("Tokens", [f"{_int(tokens.get('input'))} input",
                              f"{_int(tokens.get('output'))} output",
                              f"{_int(tokens.get('total'))} total"])
    prefix_words = prefix_cache_words(report.get("prefix_cache"))
    if prefix_words:
        lines += textwrap.wrap(prefix_words, MAX_WIDTH, initial_indent=f"{'Prefixes':<12}",
                               subsequent_indent=" " * 12, break_on_hyphens=False)
    lines += caching_lines(report, MAX_WIDTH)
    if report.get("cost"):
        lines += _cost_rows(report)
    elif report.get("cost_missing"):
        lines.append(_row("Cost", [report["cost_missing"]]))
    profile = (config.get("sim") or {}).get("profile") or {}
    if profile.get("calibrated") is False:
        lines.append(_row("Profile", [f"uncalibrated ({profile.get('name')}: derived from "
                                      f"hardware ratios, no published figures to fit)"]))
    lines.append(_row("Steps", [f"{_int(steps.get('total'))} total",
                                f"{_int(steps.get('prefill'))} prefill",
                                f"{_int(steps.get('decode'))} decode",
                                f"{_int(steps.get('empty'))} empty",
                                f"{_int(report.get('preemptions'))} preempted"]))
    # The configured lists are what was compiled; by_bucket may add buckets seen but not configured.
    prefill_buckets = config.get("prefill_buckets", padding.get("prefill", {}).get("by_bucket", {}))
    decode_buckets = config.get("decode_buckets", padding.get("decode", {}).get("by_bucket", {}))
    attention_buckets = config.get("attention_buckets") or []
    runtime = runtime_of(config)
    lines.append(_kv_row(report))
    graphs = graph_words(runtime, len(prefill_buckets), len(decode_buckets),
                         len(attention_buckets), len(config.get("prefix_buckets") or []))
    startup = _startup_words(report)
    # (the start-up row breaks the estimate down: the graphs row then leaves it out)
    lines += _rows("Graphs", _graphs_words(config, graphs,
                                           None if startup else compile_and_usd(report)[0]))
    if startup:
        lines += _rows("Start-up", startup)
    said = notes(report)
    if said:
        lines += ["", *(line for sentence in said for line in textwrap.wrap(sentence, MAX_WIDTH))]

    lines += ["", *_latency_section(report.get("latency", {}))]
    lines += ["", *_padding_section(padding.get("prefill", {}), phase="Prefill",
                                    unit="tokens", noun="tokens", count_key="chunks",
                                    actual_key="actual_tokens", padded_key="padded_tokens")]
    lines += ["", *_padding_section(padding.get("decode", {}), phase="Decode",
                                    unit="sequence slots", noun="seqs", count_key="steps",
                                    actual_key="actual_seqs", padded_key="padded_seqs")]
    if padding.get("attention"):
        # What decode attended: NxDI's token-generation buckets over every slot, or the Beta
        # plugin's max_model_len / context-length bucket per padded request.
        lines += ["", *_padding_section(padding["attention"], phase="Decode attention",
                                        unit="KV tokens attended", noun="KV",
                                        count_key="steps", actual_key="kv_held_tokens",
                                        padded_key="kv_attended_tokens")]
    if report.get("split"):
        lines += ["", *_split_section(report["split"])]
    states = report.get("states", {})
    if report.get("replicas"):
        # Replica-seconds: shares of the replicas' summed time, not of the run's elapsed time.
        state_total = sum(row.get("seconds", 0.0) for row in states.values())
        lines += ["", *_state_section(states, state_total, "Time per state (all replicas)")]
    else:
        lines += ["", *_state_section(states, throughput.get("elapsed_s"))]
    lines += ["", *_blocked_section(report.get("admission_blocked", {}))]
    lines += _kv_hint(report)
    if report.get("replicas"):
        lines += ["", *_replicas_section(report["replicas"])]
    if report.get("output_dir"):
        lines += ["", _row("Run folder", [str(report["output_dir"])])]
    verdict = verdict_lines(report, MAX_WIDTH)     # (last: what to run next time)
    if verdict:
        lines += ["", *verdict]
    # Long model paths are the only thing that could still overflow: at a terminal cut rather
    # than wrap tables; piped (a log, a file) nothing is cut.
    return "\n".join(_clip(line, width) for line in lines) + "\n"


def terminal_width(stream) -> int | None:
    """The width `format_summary` cuts at for `stream`: the terminal's (at least the 100
    columns the summary is laid out in), or None when it is not a terminal."""
    import shutil

    if not (hasattr(stream, "isatty") and stream.isatty()):
        return None
    return max(shutil.get_terminal_size().columns, MAX_WIDTH)


def _cost_rows(report: dict[str, Any]) -> list[str]:
    """What the run cost, on which instances, at which price; beside it the estimated compile
    (simulated runs), which the run's cost leaves out."""
    cost = report["cost"]
    count = cost.get("num_instances") or 1
    where = f"{count} x {cost.get('instance')}" if count != 1 else str(cost.get("instance"))
    per_m = cost.get("usd_per_million_output_tokens")
    amount = f"${_float(cost.get('usd'), 2)}"
    compile_s, with_compile = compile_and_usd(report)
    if with_compile is not None:
        amount += (f" run (+ ${_float(with_compile - cost['usd'], 2)} compile estimated, "
                   f"{_float(compile_s / 60, 1)} min)")
    return _rows("Cost", [
        amount,
        f"{where} at ${_float(cost.get('price_per_hour_usd'), 4)}/h ({cost.get('pricing')})",
        f"${_float(per_m, 3)} per M output tok" if per_m is not None else "no output tokens"])


def _graphs_words(config: dict[str, Any], graphs: str, compile_s: float | None) -> list[str]:
    """Compiled on Neuron; elsewhere what Neuron would compile for this layout (nothing was)."""
    count = _int(config.get("compiled_graphs"))
    if config.get("device") not in NOTHING_COMPILED:
        return [f"{count} compiled ({graphs})"]
    estimate = [f"about {_float(compile_s / 60, 1)} min (estimated)"] if compile_s else []
    return [f"{count} to compile on Neuron ({graphs})", *estimate]


def _startup_words(report: dict[str, Any]) -> list[str]:
    """The engine's start-up, as row items: estimated on the simulated device (compiled fresh,
    or loaded only), measured on a Neuron host (and whether the graphs came from the cache)."""
    measured = next((a["startup"] for a in reversed(report.get("attempts") or [])
                     if (a.get("startup") or {}).get("measured_s") is not None), None)
    if measured is not None:
        reused = ["the artifacts folder held them"] if measured.get("artifacts_reused") else []
        return [f"{measured['measured_s']:,.0f} s measured",
                f"{measured.get('cached_graphs', 0)} graph(s) from the compile cache, "
                f"{measured.get('compiled_graphs', 0)} compiled", *reused]
    compile_ = ((report.get("config") or {}).get("sim") or {}).get("compile") or {}
    parts = compile_.get("startup")
    if not parts:
        return []
    if parts.get("total_s") is None:
        return textwrap.wrap(f"no estimate: {compile_.get('host_warning')}", MAX_WIDTH - 12)
    if parts.get("compiled"):
        return [f"about {parts['total_s']:,.0f} s estimated", "the graphs compiled before, "
                "loaded only", "not in the elapsed time"]
    return [f"about {parts['total_s'] / 60:,.1f} min estimated, compiled fresh",
            f"trace {parts['trace_s']:,.0f} s, compile "
            f"{parts['priority_s'] + parts['parallel_s']:,.0f} s ({parts['workers']} at once), "
            f"load {parts['load_s']:,.0f} s", "not in the elapsed time"]


def _split_section(split: dict[str, Any]) -> list[str]:
    """The layouts of a --split-at run, one row a part, with the compile time of both."""
    rows = [[part.get("part", ""), _int(part.get("max_model_len")),
             _int(part.get("max_num_seqs")), _int(part.get("requests")),
             _float(part.get("elapsed_s"), 1), _float(part.get("output_tokens_per_s"), 1)]
            for part in split.get("parts", [])]
    compile_s = split.get("estimated_compile_s")
    replicas = max((len(part.get("replicas") or []) for part in split.get("parts", [])),
                   default=0)
    placement = split.get("placement") or {}
    if placement.get("mode") == "side-by-side":
        where = (f"side by side, short on {placement.get('short_replicas')} replica(s), long "
                 f"on {placement.get('long_replicas')}")
        compiling = "starting each instance's layouts"
    else:
        where = "one after the other" + (f", each across {replicas} replicas"
                                         if replicas > 1 else "")
        compiling = "starting both"
    title = (f"Split at {_int(split.get('split_at'))} tokens: two layouts, {where}"
             + (f" ({compiling}: about {compile_s / 60:,.0f} min, not in the elapsed time)"
                if compile_s else ""))
    lists = [f"  {part.get('part', '')}: " + "; ".join(
                 f"{key} {','.join(map(str, values))}" for key, values in part["buckets"].items())
             for part in split.get("parts", []) if part.get("buckets")]
    return [title, *_table(["part", "max_model_len", "max_num_seqs", "requests", "seconds",
                            "out tok/s"], rows), *lists]


def _latency_section(latency: dict[str, Any]) -> list[str]:
    rows = []
    for title, key in LATENCIES:
        figures = latency.get(key) or {}
        rows.append([title] + [_ms(figures.get(name)) for name in ("mean", "p50", "p90", "p99")])
    return ["Latency (ms)", *_table(["", "mean", "p50", "p90", "p99"], rows)]


def _padding_section(phase_report: dict[str, Any], *, phase: str, unit: str, noun: str,
                     count_key: str, actual_key: str, padded_key: str) -> list[str]:
    actual, padded = phase_report.get(actual_key, 0), phase_report.get(padded_key, 0)
    title = (f"{phase} padding: {_int(actual)} of {_int(padded)} {unit} real, "
             f"{_percent(phase_report.get('waste_fraction') if padded else None)} waste"
             + (f" (bucket: {phase_report['by']})" if phase_report.get("by") else ""))
    rows = []
    for bucket, row in phase_report.get("by_bucket", {}).items():
        count, row_actual, row_padded = (row.get(count_key, 0), row.get(actual_key, 0),
                                         row.get(padded_key, 0))
        waste = (row_padded - row_actual) / row_padded if row_padded else None
        rows.append([bucket, _int(count), _int(row_actual), _int(row_padded), _percent(waste),
                     "" if count else "unused"])
    headers = ["bucket", count_key, f"actual {noun}", f"padded {noun}", "waste", ""]
    return [title, *_table(headers, rows, first_left=False)]


def _state_section(states: dict[str, Any], elapsed: float | None,
                   title: str = "Time per state") -> list[str]:
    rows = []
    names = [s for s in _STATES if s in states] + [s for s in states if s not in _STATES]
    for name in names:
        seconds = states[name].get("seconds", 0.0)
        share = seconds / elapsed if elapsed else None
        rows.append([name, _float(seconds, 2), _percent(share), _int(states[name].get("steps"))])
    return [title, *_table(["", "seconds", "share", "steps"], rows)]


def _replicas_section(replicas: list[dict[str, Any]]) -> list[str]:
    restarts = any(row.get("restarts") for row in replicas)
    rows = []
    for row in replicas:
        device = str(row.get("device") or "-").removeprefix("sim ")
        cells = [str(row.get("replica")), str(row.get("node") or "-")[:8], device[:25],
                 _int(row.get("requests")), _int(row.get("output_tokens")),
                 _float(row.get("elapsed_s"), 2), _float(row.get("output_tokens_per_s"), 1),
                 _percent(row.get("busy_fraction"))]
        rows.append(cells + ([_int(row.get("restarts"))] if restarts else []))
    headers = ["#", "node", "device", "requests", "out tokens", "seconds", "out tok/s", "busy"]
    headers += ["restarts"] if restarts else []
    return [f"Replicas ({len(replicas)}; busy = share of the time its engine was full)",
            *_table(headers, rows)]


def _kv_row(report: dict[str, Any]) -> str:
    kv = report.get("kv") or {}
    num_blocks = kv.get("num_blocks")
    usable = num_blocks - 1 if num_blocks else None

    def share(blocks: Any) -> str:
        return f" ({_percent(blocks / usable)})" if usable and blocks is not None else ""

    return _row("KV blocks", [
        _int(num_blocks),
        f"peak reserved {_int(kv.get('peak_reserved_blocks'))}"
        f"{share(kv.get('peak_reserved_blocks'))}",
        f"peak used {_int(kv.get('peak_used_blocks'))}{share(kv.get('peak_used_blocks'))}",
        f"mean used {_percent(kv.get('mean_used_fraction'))}"])


def _kv_hint(report: dict[str, Any]) -> list[str]:
    """Under kv_reserve=max_model_len, when kv_saturated is what holds the run back, say that
    reserving each request's own need would lift it."""
    if (report.get("config") or {}).get("kv_reserve") != "max_model_len":
        return []
    blocked = report.get("admission_blocked") or {}
    saturated = blocked.get("kv_saturated", 0)
    num_steps = (report.get("steps") or {}).get("total") or 0
    if not num_steps or saturated < KV_BOUND_SHARE * num_steps or saturated < max(
            blocked.values(), default=0):
        return []
    kv = report.get("kv") or {}
    used = kv.get("mean_used_fraction")
    text = (f"The KV rule limits this run: kv_saturated refused admission in "
            f"{saturated / num_steps:.0%} of steps while the requests used {_percent(used)} of "
            f"the KV cache on average: every request is "
            f"reserved max_model_len. --kv-reserve request reserves each request's own prompt + "
            f"max_tokens and would lift it (still no preemption).")
    return ["", *textwrap.wrap(text, MAX_WIDTH)]


def _blocked_section(blocked: dict[str, int]) -> list[str]:
    rows = [[reason, _int(count)] for reason, count in blocked.items()]
    return ["Admission blocked (refusals of the queue head)",
            *_table(["reason", "count"], rows)]


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
           first_left: bool = True) -> list[str]:
    """Indented columns: the first left-aligned (a name) unless told otherwise, the rest right;
    an empty last header marks a free-text note column, left-aligned."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    note_column = len(headers) - 1 if headers and headers[-1] == "" else None

    def render(cells: Sequence[str]) -> str:
        parts = []
        for index, (cell, width) in enumerate(zip(cells, widths)):
            if index == note_column:
                parts.append(str(cell))
            elif index == 0 and first_left:
                parts.append(str(cell).ljust(width))
            else:
                parts.append(str(cell).rjust(width))
        return ("  " + "   ".join(parts)).rstrip()

    return [render(headers), *(render(row) for row in rows)]


def _row(title: str, items: Sequence[str]) -> str:
    return f"{title:<12}" + "   ".join(items)


def _rows(title: str, items: Sequence[str]) -> list[str]:
    """`_row`, continued on lines of its own (under the first item) where it would pass
    MAX_WIDTH; an item longer than a line goes on at its spaces."""
    lines = [_row(title, items[:1])]
    for item in items[1:]:
        if len(lines[-1]) + 3 + len(item) > MAX_WIDTH:
            lines.append(" " * 12 + item)
        else:
            lines[-1] += "   " + item
    return [part for line in lines for part in
            textwrap.wrap(line, MAX_WIDTH, subsequent_indent=" " * 12, break_long_words=False,
                          break_on_hyphens=False) or [line]]


def _wrap_pairs(pairs: Sequence[tuple[str, Any]]) -> list[str]:
    lines, current = [], ""
    for key, value in pairs:
        item = f"{key}={value}"
        if current and len(current) + 3 + len(item) > MAX_WIDTH:
            lines.append(current)
            current = ""
        current = f"{current}   {item}" if current else item
    if current:
        lines.append(current)
    return lines


def _clip(line: str, width: int | None) -> str:
    return line if width is None or len(line) <= width else line[:width - 3] + "..."


def _int(value: Any) -> str:
    return "-" if value is None else f"{int(value):,}"


def _float(value: Any, digits: int) -> str:
    return "-" if value is None else f"{float(value):,.{digits}f}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.1f}"


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction * 100:.1f}%"
