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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from neuron_batch.report.model import Distribution, PaddingPhase, Report, as_report
from neuron_batch.report.schema import Section, or_none, present
from neuron_batch.report.summary import LATENCIES, PERCENTILES

# -- Prometheus ------------------------------------------------------------------------------

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: Label names the metrics carry themselves; caller labels may not reuse them.
METRIC_LABELS = frozenset({"status", "kind", "phase", "bucket", "state", "reason", "quantile",
                           "replica"})


def prometheus_text(report: Report | Mapping[str, Any], *, job: str = "neuron_batch",
                    labels: dict[str, str] | None = None,
                    timestamp: float | None = None, exit_code: int | None = None) -> str:
    """The report's headline figures in Prometheus text format (version 0.0.4).

    `job` prefixes every metric name (characters Prometheus does not allow become "_").
    `labels` are added to every sample (e.g. {"model": ..., "run": ...}); they must not reuse
    the label names the metrics themselves carry. `timestamp` (seconds since the epoch) is
    written as `<job>_last_run_timestamp_seconds`; by default, the current time. `exit_code`
    (the run's, where it is known: `run --metrics-textfile`) is `<job>_last_run_exit_code`, so
    an alert can tell a partial or stopped night (3, 4) from a whole one (0).
    Counts over the run are `counter`s (a new run resets them); the rest are gauges.
    """
    prefix = _metric_prefix(job)
    families = _families(as_report(report), time.time() if timestamp is None else timestamp,
                         exit_code)
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


#: A family's samples: (labels, value), the value a report's JSON number.
_Samples = list[tuple[dict[str, Any], Any]]


def _families(report: Report, timestamp: float, exit_code: int | None = None
              ) -> list[_Family]:
    """(name, type, help, [(labels, value)]) per metric family, in the file's order; None
    (and absent) values are left out."""
    # Every time of a simulated run is the virtual clock's, not the time the run took.
    simulated = report.section("config").device == "sim"
    clock = ("simulated seconds", "per simulated second") if simulated else (
        "wall seconds", "per second")
    return [*_throughput_families(report, *clock), *_scheduler_families(report, clock[0]),
            *_prefix_families(report), *_run_families(report, timestamp, exit_code, clock[1])]


#: A metric family: (name, type, help, samples).
_Family = tuple[str, str, str, _Samples]


def _samples(label: str, values: dict[str, Any]) -> _Samples:
    return [({label: key}, value) for key, value in values.items()
            if or_none(value) is not None]


def _single(value: Any) -> _Samples:
    return [] if or_none(value) is None else [({}, value)]


def _figures_of(section: Section, keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: getattr(section, key) for key in keys}


def _throughput_families(report: Report, seconds: str, per_second: str) -> list[_Family]:
    """What the run did: requests by outcome, its time, its rates, its tokens."""
    throughput = report.section("throughput")
    return [
        ("requests_total", "counter", "Requests of the last run by outcome.",
         _samples("status", _figures_of(report.section("requests"),
                                        ("completed", "failed", "skipped", "pending")))),
        ("elapsed_seconds", "gauge", f"Elapsed time of the last run, in {seconds}.",
         _single(throughput.elapsed_s)),
        ("throughput_requests_per_second", "gauge", f"Completed requests {per_second}.",
         _single(throughput.requests_per_s)),
        ("throughput_input_tokens_per_second", "gauge", f"Prompt tokens {per_second}.",
         _single(throughput.input_tokens_per_s)),
        ("throughput_output_tokens_per_second", "gauge", f"Generated tokens {per_second}.",
         _single(throughput.output_tokens_per_s)),
        ("throughput_total_tokens_per_second", "gauge",
         f"Prompt plus generated tokens {per_second}.",
         _single(throughput.total_tokens_per_s)),
        ("tokens_total", "counter", "Tokens of completed requests by kind.",
         _samples("kind", _figures_of(report.section("tokens"), ("input", "output")))),
    ]


def _scheduler_families(report: Report, seconds: str) -> list[_Family]:
    """How the Neuron scheduler spent it: steps, padding, states, refusals, latency, KV."""
    padding, kv = report.section("padding"), report.section("kv")
    latency_quantiles, latency_means = _latency_samples(report.section("latency"))
    return [
        ("steps_total", "counter", "Scheduler steps by kind.",
         _samples("kind", _figures_of(report.section("steps"), ("prefill", "decode", "empty")))),
        ("padding_waste_ratio", "gauge", "Share of padded work that was padding, by phase.",
         _samples("phase", {phase: padding.phase(phase).waste_fraction
                            for phase in ("prefill", "decode")})),
        ("bucket_steps_total", "counter",
         "Steps per compiled bucket (prefill chunks, decode batches); 0 means an unused graph.",
         _bucket_steps(padding)),
        ("state_seconds", "gauge", f"Time the scheduler spent in each state, in {seconds}.",
         _samples("state", {name: figures.seconds
                            for name, figures in (report.states or {}).items()})),
        ("admission_blocked_total", "counter", "Admission refusals of the queue head, by reason.",
         _samples("reason", report.section("admission_blocked").counts())),
        ("latency_seconds", "gauge",
         f"Request latency quantiles (ttft, tpot, e2e), in {seconds}.",
         latency_quantiles),
        ("latency_mean_seconds", "gauge", f"Mean request latency (ttft, tpot, e2e), in {seconds}.",
         latency_means),
        ("compiled_graphs", "gauge",
         "Graphs the run's layout compiles on Neuron (prefill + decode buckets).",
         _single(report.section("config").compiled_graphs)),
        ("preemptions_total", "counter",
         "Requests vLLM preempted (Neuron cannot preempt: should stay 0).",
         _single(report.preemptions)),
        ("kv_peak_blocks", "gauge",
         "Most KV blocks reserved by the admission rule / really held by requests at once.",
         _samples("kind", {"reserved": kv.peak_reserved_blocks, "used": kv.peak_used_blocks})),
        ("kv_mean_used_ratio", "gauge", "Mean share of the usable KV blocks held by requests.",
         _single(kv.mean_used_fraction)),
    ]


def _prefix_families(report: Report) -> list[_Family]:
    """Prefix caching: whether it was on, what it served, what it could have served."""
    prefix = report.section("prefix_cache")
    enabled = prefix.enabled
    return [
        ("prefix_cache_enabled", "gauge", "1 when the last run had prefix caching on.",
         _single(int(bool(enabled)) if present(enabled) else None)),
        ("prefix_cache_tokens", "gauge",
         "Prompt tokens of the last run, served by the prefix cache (hit), computed by the device "
         "(computed) and at most servable by an unbounded cache (bound).",
         _samples("kind", {kind: getattr(prefix, f"{kind}_tokens")
                           for kind in ("prompt", "hit", "computed", "bound")})),
        ("prefix_cache_hit_ratio", "gauge", "Share of prompt tokens served by the prefix cache.",
         _single(prefix.hit_fraction)),
        ("prefix_cache_bound_ratio", "gauge",
         "Share of prompt tokens an unbounded prefix cache could serve.",
         _single(prefix.bound_fraction)),
    ]


def _run_families(report: Report, timestamp: float, exit_code: int | None,
                  per_second: str) -> list[_Family]:
    """When the run ended and how, and each replica's share of it."""
    replicas = report.replicas or []
    return [
        ("last_run_timestamp_seconds", "gauge", "When the last run's report was written.",
         _single(timestamp)),
        ("last_run_exit_code", "gauge",
         "The last run's exit code: 0 every request done, 3 some skipped or failed, 4 stopped "
         "(--max-runtime, a signal) with requests pending.",
         _single(exit_code)),
        ("replica_output_tokens_per_second", "gauge",
         f"Generated tokens {per_second} of each replica (--replicas runs).",
         [({"replica": str(r.get("replica"))}, r["output_tokens_per_s"])
          for r in replicas if r.get("output_tokens_per_s") is not None]),
        ("replica_busy_ratio", "gauge",
         "Share of each replica's time with its engine full (--replicas runs).",
         [({"replica": str(r.get("replica"))}, r["busy_fraction"])
          for r in replicas if r.get("busy_fraction") is not None]),
    ]


def _bucket_steps(padding: Any) -> _Samples:
    """Steps per compiled bucket, by phase (0: a graph the run never used)."""
    out: _Samples = []
    for phase in ("prefill", "decode"):
        count_key = PaddingPhase.KINDS[phase][0]
        for bucket, row in padding.phase(phase).rows().items():
            out.append(({"phase": phase, "bucket": bucket},
                        or_none(getattr(row, count_key)) or 0))
    return out


def _latency_samples(latency: Any) -> tuple[_Samples, _Samples]:
    """(the latency quantiles, the latency means) by kind (ttft, tpot, e2e)."""
    quantiles: _Samples = []
    means: _Samples = []
    for _, key in LATENCIES:
        kind = key.removesuffix("_s")
        figures = getattr(latency, key) or Distribution()
        for name, quantile in PERCENTILES:
            if or_none(getattr(figures, name)) is not None:
                quantiles.append(({"kind": kind, "quantile": quantile}, getattr(figures, name)))
        if or_none(figures.mean) is not None:
            means.append(({"kind": kind}, figures.mean))
    return quantiles, means


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
