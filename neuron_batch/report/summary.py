"""Present a run report (a `Report`, or its JSON read back: typed on the way in).

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
from collections.abc import Mapping
from typing import Any

from neuron_batch.inputs.skipped import SKIPPED
from neuron_batch.report.cost import compile_and_usd
from neuron_batch.report.decision_words import caching_lines, verdict_lines
from neuron_batch.report.model import (
    Distribution,
    Latency,
    PaddingPhase,
    Report,
    ReportConfig,
    Startup,
    StateTime,
    as_report,
)
from neuron_batch.report.notes import notes
from neuron_batch.report.prefix_cache import summary_words as prefix_cache_words
from neuron_batch.report.schema import or_none, present
from neuron_batch.report.text_layout import (
    MAX_WIDTH,
    clip,
    float_text,
    int_text,
    ms_text,
    percent_text,
    text_table,
    title_row,
    title_rows,
    wrap_pairs,
)
from neuron_batch.runtimes.hints import graph_words
from neuron_batch.runtimes.runtime import runtime_of

_STATES = ("IDLE", "ACTIVE_PREFILL", "ACTIVE_DECODE")
#: (label, report key) of each latency, and (column, quantile) of each percentile.
LATENCIES = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s"))
PERCENTILES = (("p50", "0.5"), ("p90", "0.9"), ("p99", "0.99"))
_CONFIG_KEYS = ("model", "device", "runtime", "scheduler_cls", "max_num_seqs",
                "max_num_batched_tokens", "max_model_len", "block_size", "num_kv_blocks",
                "max_kv_concurrent", "kv_reserve", "order", "defaults")
#: Devices that compile nothing: the CPU (and a GPU) follow the shapes a Neuron runtime would
#: compile, and the simulated device estimates what compiling them would take.
NOTHING_COMPILED = ("cpu", "cuda", "sim")
#: kv_saturated refusing the queue head in at least this share of steps, and more often than
#: any other reason, counts as the KV rule limiting the run.
KV_BOUND_SHARE = 0.10


# -- terminal summary ------------------------------------------------------------------------

def format_summary(report: Report | Mapping[str, Any], width: int | None = None) -> str:
    """A compact, aligned summary of a run report, one section per concern; lines longer than
    `width` (a terminal's, `terminal_width`; None: none) cut."""
    report = as_report(report)
    runtime = runtime_of(report.section("config").to_dict())
    lines = ["neuron-batch run summary", *_config_rows(report, runtime), "",
             *_totals_rows(report), *_shape_rows(report, runtime), *_table_sections(report)]
    if report.output_dir:
        lines += ["", title_row("Run folder", [str(report.output_dir)])]
    verdict = verdict_lines(report, MAX_WIDTH)     # (last: what to run next time)
    if verdict:
        lines += ["", *verdict]
    # Long model paths are the only thing that could still overflow: at a terminal cut rather
    # than wrap tables; piped (a log, a file) nothing is cut.
    return "\n".join(clip(line, width) for line in lines) + "\n"


def _config_rows(report: Report, runtime: Any) -> list[str]:
    """The settings the run ran with, as key: value pairs."""
    config = report.section("config")
    shown = config.to_dict()
    if "kv_reserve" in shown and runtime.static_kv:
        shown["kv_reserve"] = "n/a (static KV cache)"    # the rule never binds under nxdi
    if config.device in ("cpu", "cuda") and "runtime" in shown:
        # no Neuron runtime ran here: the scheduler padded to the shapes it compiles
        shown["runtime"] = f"shapes of {shown['runtime']}"
    return wrap_pairs([(key, shown[key]) for key in _CONFIG_KEYS if key in shown])


def _totals_rows(report: Report) -> list[str]:
    """Requests, throughput, tokens, the prefix cache, cost and the profile's calibration."""
    requests = report.section("requests")
    throughput = report.section("throughput")
    tokens = report.section("tokens")
    skipped = or_none(requests.skipped)
    lines = title_rows("Requests", [
        f"{int_text(or_none(requests.completed))} completed of "
        f"{int_text(or_none(requests.total))}",
        f"{int_text(or_none(requests.failed))} failed",
        f"{int_text(skipped)} skipped" + (f" ({SKIPPED})" if skipped else ""),
        *([f"{int_text(requests.pending)} pending"] if requests.pending else [])])
    lines += title_rows("Throughput", [
        f"{float_text(or_none(throughput.elapsed_s), 2)} s elapsed",
        f"{float_text(or_none(throughput.requests_per_s), 2)} req/s",
        f"{float_text(or_none(throughput.input_tokens_per_s), 1)} in tok/s",
        f"{float_text(or_none(throughput.output_tokens_per_s), 1)} out tok/s",
        f"{float_text(or_none(throughput.total_tokens_per_s), 1)} total tok/s"])
    lines += title_rows("Tokens", [f"{int_text(or_none(tokens.input))} input",
                                   f"{int_text(or_none(tokens.output))} output",
                                   f"{int_text(or_none(tokens.total))} total"])
    prefix_words = prefix_cache_words(report.prefix_cache or None)
    if prefix_words:
        lines += textwrap.wrap(prefix_words, MAX_WIDTH, initial_indent=f"{'Prefixes':<12}",
                               subsequent_indent=" " * 12, break_on_hyphens=False)
    lines += caching_lines(report, MAX_WIDTH)
    if report.cost:
        lines += _cost_rows(report)
    elif report.cost_missing:
        lines.append(title_row("Cost", [report.cost_missing]))
    profile = (report.section("config").sim or {}).get("profile") or {}
    if profile.get("calibrated") is False:
        lines.append(title_row("Profile", [f"uncalibrated ({profile.get('name')}: derived from "
                                      f"hardware ratios, no published figures to fit)"]))
    return lines


def _shape_rows(report: Report, runtime: Any) -> list[str]:
    """Steps, KV, the compiled graphs and the start-up, and the report's notes."""
    config = report.section("config")
    steps = report.section("steps")
    padding = report.section("padding")
    lines = [title_row("Steps", [f"{int_text(or_none(steps.total))} total",
                                 f"{int_text(or_none(steps.prefill))} prefill",
                                 f"{int_text(or_none(steps.decode))} decode",
                                 f"{int_text(or_none(steps.empty))} empty",
                                 f"{int_text(or_none(report.preemptions))} preempted"])]
    # The configured lists are what was compiled; by_bucket may add buckets seen but not configured.
    prefill_buckets = (config.prefill_buckets if present(config.prefill_buckets)
                       else padding.phase("prefill").rows())
    decode_buckets = (config.decode_buckets if present(config.decode_buckets)
                      else padding.phase("decode").rows())
    attention_buckets = config.attention_buckets or []
    lines.append(_kv_row(report))
    graphs = graph_words(runtime, len(prefill_buckets), len(decode_buckets),
                         len(attention_buckets), len(config.prefix_buckets or []))
    startup = _startup_words(report)
    # (the start-up row breaks the estimate down: the graphs row then leaves it out)
    lines += title_rows("Graphs", _graphs_words(config, graphs,
                                           None if startup else compile_and_usd(report)[0]))
    if startup:
        lines += title_rows("Start-up", startup)
    said = notes(report)
    if said:
        lines += ["", *(line for sentence in said for line in textwrap.wrap(sentence, MAX_WIDTH))]
    return lines


def _table_sections(report: Report) -> list[str]:
    """Latency, padding per phase, the split, time per state, admission refusals, replicas."""
    padding = report.section("padding")
    lines = ["", *_latency_section(report.section("latency"))]
    lines += ["", *_padding_section(padding.phase("prefill"), phase="Prefill",
                                    unit="tokens", noun="tokens", kind="prefill")]
    lines += ["", *_padding_section(padding.phase("decode"), phase="Decode",
                                    unit="sequence slots", noun="seqs", kind="decode")]
    if padding.attention:
        # What decode attended: NxDI's token-generation buckets over every slot, or the Beta
        # plugin's max_model_len / context-length bucket per padded request.
        lines += ["", *_padding_section(padding.attention, phase="Decode attention",
                                        unit="KV tokens attended", noun="KV", kind="attention")]
    if report.split:
        lines += ["", *_split_section(report.split)]
    states = report.states or {}
    if report.replicas:
        # Replica-seconds: shares of the replicas' summed time, not of the run's elapsed time.
        state_total = sum(or_none(row.seconds) or 0.0 for row in states.values())
        lines += ["", *_state_section(states, state_total, "Time per state (all replicas)")]
    else:
        elapsed = or_none(report.section("throughput").elapsed_s)
        lines += ["", *_state_section(states, elapsed)]
    lines += ["", *_blocked_section(report.section("admission_blocked").counts())]
    lines += _kv_hint(report)
    if report.replicas:
        lines += ["", *_replicas_section(report.replicas)]
    return lines


def terminal_width(stream: object) -> int | None:
    """The width `format_summary` cuts at for `stream`: the terminal's (at least the 100
    columns the summary is laid out in), or None when it is not a terminal."""
    import shutil

    if not (hasattr(stream, "isatty") and stream.isatty()):
        return None
    return max(shutil.get_terminal_size().columns, MAX_WIDTH)


def _cost_rows(report: Report) -> list[str]:
    """What the run cost, on which instances, at which price; beside it the estimated compile
    (simulated runs), which the run's cost leaves out."""
    cost = report.cost
    count = cost.num_instances or 1
    instance = or_none(cost.instance)
    where = f"{count} x {instance}" if count != 1 else str(instance)
    per_m = or_none(cost.usd_per_million_output_tokens)
    amount = f"${float_text(or_none(cost.usd), 2)}"
    compile_s, with_compile = compile_and_usd(report)
    if with_compile is not None:
        assert compile_s is not None    # (compile_and_usd prices a compile only where it knows it)
        amount += (f" run (+ ${float_text(with_compile - cost.usd, 2)} compile estimated, "
                   f"{float_text(compile_s / 60, 1)} min)")
    return title_rows("Cost", [
        amount,
        f"{where} at ${float_text(or_none(cost.price_per_hour_usd), 4)}/h "
        f"({or_none(cost.pricing)})",
        f"${float_text(per_m, 3)} per M output tok" if per_m is not None else "no output tokens"])


def _graphs_words(config: ReportConfig, graphs: str, compile_s: float | None) -> list[str]:
    """Compiled on Neuron; elsewhere what Neuron would compile for this layout (nothing was)."""
    count = int_text(or_none(config.compiled_graphs))
    if config.device not in NOTHING_COMPILED:
        return [f"{count} compiled ({graphs})"]
    estimate = [f"about {float_text(compile_s / 60, 1)} min (estimated)"] if compile_s else []
    return [f"{count} to compile on Neuron ({graphs})", *estimate]


def _startup_words(report: Report) -> list[str]:
    """The engine's start-up, as row items: estimated on the simulated device (compiled fresh,
    or loaded only), measured on a Neuron host (and whether the graphs came from the cache)."""
    measured = next((a.startup for a in reversed(report.attempts or [])
                     if isinstance(a.startup, Startup) and present(a.startup.measured_s)
                     and a.startup.measured_s is not None), None)
    if measured is not None:
        reused = ["the artifacts folder held them"] if measured.artifacts_reused else []
        return [f"{measured.measured_s:,.0f} s measured",
                f"{measured.cached_graphs or 0} graph(s) from the compile cache, "
                f"{measured.compiled_graphs or 0} compiled", *reused]
    compile_ = (report.section("config").sim or {}).get("compile") or {}
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
    rows = [[part.get("part", ""), int_text(part.get("max_model_len")),
             int_text(part.get("max_num_seqs")), int_text(part.get("requests")),
             float_text(part.get("elapsed_s"), 1), float_text(part.get("output_tokens_per_s"), 1)]
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
    title = (f"Split at {int_text(split.get('split_at'))} tokens: two layouts, {where}"
             + (f" ({compiling}: about {compile_s / 60:,.0f} min, not in the elapsed time)"
                if compile_s else ""))
    lists = [f"  {part.get('part', '')}: " + "; ".join(
                 f"{key} {','.join(map(str, values))}" for key, values in part["buckets"].items())
             for part in split.get("parts", []) if part.get("buckets")]
    return [title, *text_table(["part", "max_model_len", "max_num_seqs", "requests", "seconds",
                            "out tok/s"], rows), *lists]


def _latency_section(latency: Latency) -> list[str]:
    rows = []
    for title, key in LATENCIES:
        figures = getattr(latency, key) or Distribution()
        rows.append([title] + [ms_text(or_none(getattr(figures, name)))
                               for name in ("mean", "p50", "p90", "p99")])
    return ["Latency (ms)", *text_table(["", "mean", "p50", "p90", "p99"], rows)]


def _padding_section(table: PaddingPhase, *, phase: str, unit: str, noun: str,
                     kind: str) -> list[str]:
    count_key, actual_key, padded_key = PaddingPhase.KINDS[kind]
    actual, padded = table.totals(kind)
    title = (f"{phase} padding: {int_text(actual)} of {int_text(padded)} {unit} real, "
             f"{percent_text(or_none(table.waste_fraction) if padded else None)} waste"
             + (f" (bucket: {table.by})" if table.by else ""))
    rows = []
    for bucket, row in table.rows().items():
        count, row_actual, row_padded = row.figures(count_key, actual_key, padded_key)
        waste = (row_padded - row_actual) / row_padded if row_padded else None
        rows.append([bucket, int_text(count), int_text(row_actual), int_text(row_padded),
                     percent_text(waste), "" if count else "unused"])
    headers = ["bucket", count_key, f"actual {noun}", f"padded {noun}", "waste", ""]
    return [title, *text_table(headers, rows, first_left=False)]


def _state_section(states: dict[str, StateTime], elapsed: float | None,
                   title: str = "Time per state") -> list[str]:
    rows = []
    names = [s for s in _STATES if s in states] + [s for s in states if s not in _STATES]
    for name in names:
        seconds = or_none(states[name].seconds) or 0.0
        share = seconds / elapsed if elapsed else None
        rows.append([name, float_text(seconds, 2), percent_text(share),
                     int_text(or_none(states[name].steps))])
    return [title, *text_table(["", "seconds", "share", "steps"], rows)]


def _replicas_section(replicas: list[dict[str, Any]]) -> list[str]:
    restarts = any(row.get("restarts") for row in replicas)
    rows = []
    for row in replicas:
        device = str(row.get("device") or "-").removeprefix("sim ")
        cells = [str(row.get("replica")), str(row.get("node") or "-")[:8], device[:25],
                 int_text(row.get("requests")), int_text(row.get("output_tokens")),
                 float_text(row.get("elapsed_s"), 2), float_text(row.get("output_tokens_per_s"), 1),
                 percent_text(row.get("busy_fraction"))]
        rows.append(cells + ([int_text(row.get("restarts"))] if restarts else []))
    headers = ["#", "node", "device", "requests", "out tokens", "seconds", "out tok/s", "busy"]
    headers += ["restarts"] if restarts else []
    return [f"Replicas ({len(replicas)}; busy = share of the time its engine was full)",
            *text_table(headers, rows)]


def _kv_row(report: Report) -> str:
    kv = report.section("kv")
    num_blocks = or_none(kv.num_blocks)
    usable = num_blocks - 1 if num_blocks else None
    reserved, used = or_none(kv.peak_reserved_blocks), or_none(kv.peak_used_blocks)

    def share(blocks: Any) -> str:
        return f" ({percent_text(blocks / usable)})" if usable and blocks is not None else ""

    return title_row("KV blocks", [
        int_text(num_blocks),
        f"peak reserved {int_text(reserved)}{share(reserved)}",
        f"peak used {int_text(used)}{share(used)}",
        f"mean used {percent_text(or_none(kv.mean_used_fraction))}"])


def _kv_hint(report: Report) -> list[str]:
    """Under kv_reserve=max_model_len, when kv_saturated is what holds the run back, say that
    reserving each request's own need would lift it."""
    if report.section("config").kv_reserve != "max_model_len":
        return []
    blocked = report.section("admission_blocked").counts()
    saturated = blocked.get("kv_saturated", 0)
    num_steps = report.section("steps").total or 0
    if not num_steps or saturated < KV_BOUND_SHARE * num_steps or saturated < max(
            blocked.values(), default=0):
        return []
    used = or_none(report.section("kv").mean_used_fraction)
    text = (f"The KV rule limits this run: kv_saturated refused admission in "
            f"{saturated / num_steps:.0%} of steps while the requests used {percent_text(used)} of "
            f"the KV cache on average: every request is "
            f"reserved max_model_len. --kv-reserve request reserves each request's own prompt + "
            f"max_tokens and would lift it (still no preemption).")
    return ["", *textwrap.wrap(text, MAX_WIDTH)]


def _blocked_section(blocked: dict[str, int]) -> list[str]:
    rows = [[reason, int_text(count)] for reason, count in blocked.items()]
    return ["Admission blocked (refusals of the queue head)",
            *text_table(["reason", "count"], rows)]
