"""The report as Prometheus text (node_exporter's textfile collector), and the atomic write
that publishes it without a scrape ever seeing half a file. Pure Python."""

from __future__ import annotations

import contextlib
import math
import os
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from neuron_batch.report.summary import LATENCIES, PERCENTILES

# -- Prometheus ------------------------------------------------------------------------------

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: Label names the metrics carry themselves; caller labels may not reuse them.
METRIC_LABELS = frozenset({"status", "kind", "phase", "bucket", "state", "reason", "quantile",
                           "replica"})


def prometheus_text(report: dict[str, Any], *, job: str = "neuron_batch",
                    labels: dict[str, str] | None = None,
                    timestamp: float | None = None) -> str:
    """The report's headline figures in Prometheus text format (version 0.0.4).

    `job` prefixes every metric name (characters Prometheus does not allow become "_").
    `labels` are added to every sample (e.g. {"model": ..., "run": ...}); they must not reuse
    the label names the metrics themselves carry. `timestamp` (seconds since the epoch) is
    written as `<job>_last_run_timestamp_seconds`; by default, the current time.
    Counts over the run are `counter`s (a new run resets them); the rest are gauges.
    """
    prefix = _metric_prefix(job)
    families = _families(report, time.time() if timestamp is None else timestamp)
    common = dict(labels or {})
    for name in common:
        if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise ValueError(f"invalid Prometheus label name {name!r}")
        if name in METRIC_LABELS:  # a sample may not carry the same label twice
            raise ValueError(f"label {name!r} is used by the metrics themselves; rename it")

    lines = []
    for name, kind, help_text, samples in families:
        if not samples:  # e.g. no latency figures for a run with no completed request
            continue
        full_name = f"{prefix}_{name}"
        lines.append(f"# HELP {full_name} {_escape_help(help_text)}")
        lines.append(f"# TYPE {full_name} {kind}")
        for sample_labels, value in samples:
            label_text = ",".join(f'{key}="{_escape_label_value(str(val))}"'
                                  for key, val in {**common, **sample_labels}.items())
            braces = f"{{{label_text}}}" if label_text else ""
            lines.append(f"{full_name}{braces} {_format_value(value)}")
    return "\n".join(lines) + "\n"


def _families(report: dict[str, Any], timestamp: float) -> list[tuple[str, str, str, list]]:
    """(name, type, help, [(labels, value)]) per metric family; None values are left out."""
    requests = report.get("requests", {})
    throughput = report.get("throughput", {})
    padding = report.get("padding", {})
    latency = report.get("latency", {})
    kv = report.get("kv") or {}
    replicas = report.get("replicas") or []
    prefix = report.get("prefix_cache") or {}
    # Every time of a simulated run is the virtual clock's, not the time the run took.
    simulated = (report.get("config") or {}).get("device") == "sim"
    seconds = "simulated seconds" if simulated else "wall seconds"
    per_second = "per simulated second" if simulated else "per second"

    def samples(label: str, values: dict[str, Any]) -> list:
        return [({label: key}, value) for key, value in values.items() if value is not None]

    def single(value: Any) -> list:
        return [] if value is None else [({}, value)]

    bucket_steps = []
    for phase, count_key in (("prefill", "chunks"), ("decode", "steps")):
        for bucket, row in padding.get(phase, {}).get("by_bucket", {}).items():
            bucket_steps.append(({"phase": phase, "bucket": bucket}, row.get(count_key, 0)))
    latency_quantiles, latency_means = [], []
    for _, key in LATENCIES:
        kind = key.removesuffix("_s")
        figures = latency.get(key) or {}
        for name, quantile in PERCENTILES:
            if figures.get(name) is not None:
                latency_quantiles.append(({"kind": kind, "quantile": quantile}, figures[name]))
        if figures.get("mean") is not None:
            latency_means.append(({"kind": kind}, figures["mean"]))

    return [
        ("requests_total", "counter", "Requests of the last run by outcome.",
         samples("status", {k: requests.get(k) for k in ("completed", "failed", "skipped")})),
        ("elapsed_seconds", "gauge", f"Elapsed time of the last run, in {seconds}.",
         single(throughput.get("elapsed_s"))),
        ("throughput_requests_per_second", "gauge", f"Completed requests {per_second}.",
         single(throughput.get("requests_per_s"))),
        ("throughput_input_tokens_per_second", "gauge", f"Prompt tokens {per_second}.",
         single(throughput.get("input_tokens_per_s"))),
        ("throughput_output_tokens_per_second", "gauge", f"Generated tokens {per_second}.",
         single(throughput.get("output_tokens_per_s"))),
        ("throughput_total_tokens_per_second", "gauge",
         f"Prompt plus generated tokens {per_second}.",
         single(throughput.get("total_tokens_per_s"))),
        ("tokens_total", "counter", "Tokens of completed requests by kind.",
         samples("kind", {k: report.get("tokens", {}).get(k) for k in ("input", "output")})),
        ("steps_total", "counter", "Scheduler steps by kind.",
         samples("kind", {k: report.get("steps", {}).get(k)
                          for k in ("prefill", "decode", "empty")})),
        ("padding_waste_ratio", "gauge", "Share of padded work that was padding, by phase.",
         samples("phase", {phase: padding.get(phase, {}).get("waste_fraction")
                           for phase in ("prefill", "decode")})),
        ("bucket_steps_total", "counter",
         "Steps per compiled bucket (prefill chunks, decode batches); 0 means an unused graph.",
         bucket_steps),
        ("state_seconds", "gauge", f"Time the scheduler spent in each state, in {seconds}.",
         samples("state", {name: figures.get("seconds")
                           for name, figures in report.get("states", {}).items()})),
        ("admission_blocked_total", "counter", "Admission refusals of the queue head, by reason.",
         samples("reason", report.get("admission_blocked", {}))),
        ("latency_seconds", "gauge",
         f"Request latency quantiles (ttft, tpot, e2e), in {seconds}.",
         latency_quantiles),
        ("latency_mean_seconds", "gauge", f"Mean request latency (ttft, tpot, e2e), in {seconds}.",
         latency_means),
        ("compiled_graphs", "gauge",
         "Graphs the run's layout compiles on Neuron (prefill + decode buckets).",
         single(report.get("config", {}).get("compiled_graphs"))),
        ("preemptions_total", "counter",
         "Requests vLLM preempted (Neuron cannot preempt: should stay 0).",
         single(report.get("preemptions"))),
        ("kv_peak_blocks", "gauge",
         "Most KV blocks reserved by the admission rule / really held by requests at once.",
         samples("kind", {"reserved": kv.get("peak_reserved_blocks"),
                          "used": kv.get("peak_used_blocks")})),
        ("kv_mean_used_ratio", "gauge", "Mean share of the usable KV blocks held by requests.",
         single(kv.get("mean_used_fraction"))),
        ("prefix_cache_enabled", "gauge", "1 when the last run had prefix caching on.",
         single(None if "enabled" not in prefix else int(bool(prefix["enabled"])))),
        ("prefix_cache_tokens", "gauge",
         "Prompt tokens of the last run, served by the prefix cache (hit), computed by the device "
         "(computed) and at most servable by an unbounded cache (bound).",
         samples("kind", {kind: prefix.get(f"{kind}_tokens")
                          for kind in ("prompt", "hit", "computed", "bound")})),
        ("prefix_cache_hit_ratio", "gauge", "Share of prompt tokens served by the prefix cache.",
         single(prefix.get("hit_fraction"))),
        ("prefix_cache_bound_ratio", "gauge",
         "Share of prompt tokens an unbounded prefix cache could serve.",
         single(prefix.get("bound_fraction"))),
        ("last_run_timestamp_seconds", "gauge", "When the last run's report was written.",
         single(timestamp)),
        ("replica_output_tokens_per_second", "gauge",
         f"Generated tokens {per_second} of each replica (--replicas runs).",
         [({"replica": str(r.get("replica"))}, r["output_tokens_per_s"])
          for r in replicas if r.get("output_tokens_per_s") is not None]),
        ("replica_busy_ratio", "gauge",
         "Share of each replica's time with its engine full (--replicas runs).",
         [({"replica": str(r.get("replica"))}, r["busy_fraction"])
          for r in replicas if r.get("busy_fraction") is not None]),
    ]


def _metric_prefix(job: str) -> str:
    prefix = re.sub(r"[^a-zA-Z0-9_:]", "_", job)
    if not prefix or not _METRIC_NAME.fullmatch(prefix):
        prefix = "_" + prefix
    return prefix


def _escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


# -- files -----------------------------------------------------------------------------------

def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` to `path` so readers see the old file or the new one, never a part.

    The temp file lives in the same folder (os.replace is atomic only within a filesystem) and
    is named `.<name>.*.tmp`, which the textfile collector (it reads `*.prom`) ignores. It keeps
    the old file's permissions, or gets 0644: mkstemp's 0600 would hide it from a collector
    running as another user.
    """
    path = Path(path)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o644
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_name, mode)
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    return path
