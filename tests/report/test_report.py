"""report.py: the terminal summary, the Prometheus text, and the atomic file write."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from dataclasses import asdict

import pytest

from neuron_batch.report.metrics import summarize
from neuron_batch.report.prometheus import prometheus_text, write_text_atomic
from neuron_batch.report.summary import format_summary
from neuron_batch.scheduler.records import (
    BLOCK_REASONS,
    Records,
    RequestRecord,
    RunConfig,
    StepRecord,
)

CONFIG = RunConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64, block_size=4,
                   num_kv_blocks=64, max_kv_concurrent=4, prefill_buckets=[4, 8, 16],
                   decode_buckets=[2, 3], scheduler_cls="NeuronScheduler")


def step(index, state, kind, t_start, t_end, tokens, padded, seqs, seqs_padded, bucket):
    return StepRecord(index, state, kind, ["r"] * seqs, tokens, padded, seqs, seqs_padded, bucket,
                      0, None, 0, seqs, 0.0, t_start, t_end)


def small_report(**extra_config) -> dict:
    """Two requests over 4 s: prefill 8 of bucket 8 and 3 of bucket 4, then two decodes of
    one sequence in batch bucket 2. Buckets 16 (prefill) and 3 (decode) go unused."""
    steps = [step(0, "ACTIVE_PREFILL", "prefill", 0.0, 1.0, 8, 8, 1, 1, 8),
             step(1, "ACTIVE_PREFILL", "prefill", 1.0, 2.0, 3, 4, 1, 1, 4),
             step(2, "ACTIVE_DECODE", "decode", 2.0, 3.0, 1, 1, 1, 2, 2),
             step(3, "ACTIVE_DECODE", "decode", 3.0, 3.5, 1, 1, 1, 2, 2)]
    requests = [RequestRecord("a", 8, 0.0, 0.0, 1.0, 3.0, 2),
                RequestRecord("b", 3, 0.0, 1.0, 2.0, 3.5, 3)]
    blocked = dict.fromkeys(BLOCK_REASONS, 0) | {"kv_saturated": 4}
    return summarize(Records(CONFIG, steps, requests, blocked), elapsed_s=4.0,
                     extra_config=extra_config or {"model": "tiny-llama", "device": "inf2"})


# -- terminal summary --------------------------------------------------------------------------

def test_summary_has_every_section_and_fits_the_terminal():
    text = format_summary(small_report())
    for title in ("Requests", "Throughput", "Tokens", "Steps", "Graphs", "Latency (ms)",
                  "Prefill padding", "Decode padding", "Time per state", "Admission blocked"):
        assert title in text
    assert all(len(line) <= 100 for line in text.splitlines())
    assert "\x1b" not in text
    assert "model=tiny-llama" in text and "device=inf2" in text
    # the records' runtime is the seed design's (vllm-neuron): batch buckets x context lengths
    assert "5 compiled (3 prefill buckets + 2 decode buckets x 1 context lengths)" in text


@pytest.fixture(scope="module")
def summary_lines():
    return format_summary(small_report()).splitlines()


def starting(lines, *words):
    """The one summary line that starts with `words`, split."""
    matches = [line for line in lines if line.split()[:len(words)] == list(words)]
    assert len(matches) == 1, (words, matches)
    return matches[0].split()


def test_summary_requests_and_elapsed(summary_lines):
    def line_starting(*words):
        return starting(summary_lines, *words)

    assert line_starting("Requests") == ["Requests", "2", "completed", "of", "2", "0", "failed",
                                         "0", "skipped"]
    assert "4.00" in line_starting("Throughput")  # elapsed seconds


def test_summary_padding_per_bucket(summary_lines):
    lines = summary_lines

    def line_starting(*words):
        return starting(lines, *words)

    # Prefill: 11 of 12 tokens real; per bucket chunks, actual, padded, waste, note.
    assert line_starting("4") == ["4", "1", "3", "4", "25.0%"]
    assert line_starting("8") == ["8", "1", "8", "8", "0.0%"]
    assert line_starting("16") == ["16", "0", "0", "0", "-", "unused"]
    assert line_starting("2") == ["2", "2", "2", "4", "50.0%"]
    assert [line.split()[0] for line in lines if line.endswith("unused")] == ["16", "3"]
    assert "Prefill padding: 11 of 12 tokens real, 8.3% waste" in lines


def test_summary_latency_states_and_blocked_steps(summary_lines):
    def line_starting(*words):
        return starting(summary_lines, *words)

    # TTFT 1.0 and 2.0 s -> mean 1500 ms, p90 1900 ms.
    assert line_starting("TTFT") == ["TTFT", "1,500.0", "1,500.0", "1,900.0", "1,990.0"]
    # 0.5 s idle after the last step (everything finished at 3.5), of 4.0 s.
    assert line_starting("IDLE") == ["IDLE", "0.50", "12.5%", "0"]
    assert line_starting("ACTIVE_DECODE") == ["ACTIVE_DECODE", "1.50", "37.5%", "2"]
    assert line_starting("kv_saturated") == ["kv_saturated", "4"]


def test_summary_of_json_round_trip_is_the_same():
    report = small_report()
    assert format_summary(json.loads(json.dumps(report))) == format_summary(report)


def test_summary_of_an_empty_run_shows_dashes():
    text = format_summary(summarize(Records(None, [], [], {})))
    ttft = next(line for line in text.splitlines() if line.strip().startswith("TTFT"))
    assert ttft.split() == ["TTFT", "-", "-", "-", "-"]
    assert "0 of 0 tokens real, - waste" in text


def test_long_config_values_are_clipped_at_a_terminal_and_kept_whole_when_piped():
    report = small_report(model="org/" + "x" * 300)
    text = format_summary(report, width=100)
    assert all(len(line) <= 100 for line in text.splitlines())
    piped = format_summary(report)
    assert "x" * 300 in piped and "..." not in piped


def test_no_row_is_cut_when_its_figures_are_wide():
    """The throughput row of a fast run passes 100 columns (`2,065.3 total t...` was cut):
    it goes on under its first item, whole, at a terminal and piped."""
    report = small_report()
    report["throughput"] = {"elapsed_s": 123456.78, "requests_per_s": 12345.67,
                            "input_tokens_per_s": 1234567.8, "output_tokens_per_s": 1234567.8,
                            "total_tokens_per_s": 2469135.6}
    for width in (None, 100):
        text = format_summary(report, width=width)
        assert "..." not in text and "2,469,135.6 total tok/s" in text
        assert all(len(line) <= 100 for line in text.splitlines())


def test_the_width_is_a_terminals_only(tmp_path):
    from neuron_batch.report.summary import terminal_width

    with open(tmp_path / "piped", "w") as piped:
        assert terminal_width(piped) is None

    class Terminal:
        def isatty(self):
            return True

    assert terminal_width(Terminal()) >= 100


# -- Prometheus --------------------------------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{((?:{_LABEL})(?:,{_LABEL})*)?\}})? (\S+)$")
_HELP = re.compile(rf"^# HELP ({_NAME}) (.*)$")
_TYPE = re.compile(rf"^# TYPE ({_NAME}) (counter|gauge|summary|histogram|untyped)$")
_ONE_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')


def _unescape(value):
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), value)


def parse_prometheus(text):
    """Check every line against the exposition format; return {(name, labels): value}."""
    assert text.endswith("\n")
    samples, types, current = {}, {}, None
    for line in text.splitlines():
        if help_match := _HELP.match(line):
            current = help_match.group(1)
            continue
        if type_match := _TYPE.match(line):
            name = type_match.group(1)
            assert name == current and name not in types, f"TYPE out of place: {line}"
            types[name] = type_match.group(2)
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a valid sample line: {line!r}"
        name, label_text, value = match.groups()
        assert name == current, f"sample outside its family: {line}"
        labels = tuple((k, _unescape(v)) for k, v in _ONE_LABEL.findall(label_text or ""))
        assert len({k for k, _ in labels}) == len(labels), f"duplicate label: {line}"
        key = (name, labels)
        assert key not in samples, f"duplicate sample: {line}"
        samples[key] = float(value)
    return samples, types


@pytest.fixture(scope="module")
def prometheus():
    """(samples, types) of the small report's textfile."""
    return parse_prometheus(prometheus_text(small_report(), timestamp=1_700_000_000.5))


def test_prometheus_text_parses_with_counter_and_gauge_types(prometheus):
    samples, types = prometheus
    assert samples[("neuron_batch_requests_total", (("status", "completed"),))] == 2
    assert types["neuron_batch_requests_total"] == "counter"
    assert types["neuron_batch_padding_waste_ratio"] == "gauge"


def test_prometheus_time_throughput_padding_and_states(prometheus):
    samples, _ = prometheus
    assert samples[("neuron_batch_elapsed_seconds", ())] == 4.0
    # 5 tokens generated in 4 s.
    assert samples[("neuron_batch_throughput_output_tokens_per_second", ())] == 1.25
    assert samples[("neuron_batch_padding_waste_ratio", (("phase", "prefill"),))] == \
        pytest.approx(1 / 12)
    assert samples[("neuron_batch_padding_waste_ratio", (("phase", "decode"),))] == 0.5
    assert samples[("neuron_batch_state_seconds", (("state", "ACTIVE_DECODE"),))] == 1.5
    assert samples[("neuron_batch_state_seconds", (("state", "IDLE"),))] == 0.5


def test_prometheus_blocked_latency_buckets_graphs_and_timestamp(prometheus):
    samples, _ = prometheus
    for reason in BLOCK_REASONS:
        key = ("neuron_batch_admission_blocked_total", (("reason", reason),))
        assert samples[key] == (4 if reason == "kv_saturated" else 0)
    assert samples[("neuron_batch_latency_seconds", (("kind", "ttft"), ("quantile", "0.9")))] == \
        pytest.approx(1.9)
    assert samples[("neuron_batch_bucket_steps_total",
                    (("phase", "prefill"), ("bucket", "16")))] == 0
    assert samples[("neuron_batch_compiled_graphs", ())] == 5
    assert samples[("neuron_batch_last_run_timestamp_seconds", ())] == 1_700_000_000.5


def test_prometheus_labels_are_escaped_and_added_everywhere():
    awkward = 'say "hi"\\now\nbye'
    text = prometheus_text(small_report(), labels={"model": awkward, "run": "r1"}, timestamp=0)
    samples, _ = parse_prometheus(text)
    assert all(dict(labels).get("model") == awkward and dict(labels)["run"] == "r1"
               for _, labels in samples)
    assert len(text.splitlines()) == len(text.split("\n")) - 1  # no raw newline in a value


def test_prometheus_refuses_bad_or_clashing_label_names():
    with pytest.raises(ValueError):
        prometheus_text(small_report(), labels={"bad-name": "x"})
    with pytest.raises(ValueError):
        prometheus_text(small_report(), labels={"__reserved": "x"})
    with pytest.raises(ValueError):
        prometheus_text(small_report(), labels={"phase": "x"})  # the metrics use it


def test_prometheus_job_prefix_and_missing_latencies():
    text = prometheus_text(summarize(Records(None, [], [], {})), job="my-batch", timestamp=0)
    samples, _ = parse_prometheus(text)
    assert all(name.startswith("my_batch_") for name, _ in samples)
    assert not any("latency" in name for name, _ in samples)  # no completed request: no figures


def test_prometheus_timestamp_defaults_to_now():
    before = time.time()
    samples, _ = parse_prometheus(prometheus_text(small_report()))
    stamp = samples[("neuron_batch_last_run_timestamp_seconds", ())]
    assert before <= stamp <= time.time()


# -- atomic write ------------------------------------------------------------------------------

def test_write_text_atomic_creates_and_replaces(tmp_path):
    target = tmp_path / "neuron_batch.prom"
    assert write_text_atomic(target, "first\n") == target
    assert target.read_text() == "first\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644  # readable by a collector user
    target.chmod(0o640)
    write_text_atomic(str(target), "second\n")
    assert target.read_text() == "second\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # keeps the operator's choice
    assert os.listdir(tmp_path) == ["neuron_batch.prom"]  # no temp file left behind


def test_write_text_atomic_failure_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "neuron_batch.prom"
    target.write_text("old\n")

    def failing_replace(source, destination):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        write_text_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["neuron_batch.prom"]


# -- KV cache and the kv_reserve hint ----------------------------------------------------------

def kv_report(kv_reserve: str, blocked: dict[str, int]) -> dict:
    """Four steps over a 64-block cache (63 usable): reservations up to 48, 21 blocks held."""
    steps = []
    for i, (usage, reserved) in enumerate([(0.0, 16), (1 / 3, 48), (1 / 3, 48), (0.0, 0)]):
        record = step(i, "ACTIVE_DECODE", "decode", float(i), i + 1.0, 1, 1, 1, 2, 2)
        record.kv_usage, record.kv_reserved_blocks = usage, reserved
        steps.append(record)
    records = Records(RunConfig(**{**asdict(CONFIG), "kv_reserve": kv_reserve}), steps,
                      [RequestRecord("a", 8, 0.0, 0.0, 1.0, 4.0, 4)],
                      dict.fromkeys(BLOCK_REASONS, 0) | blocked)
    return summarize(records)


def test_summary_shows_kv_use_and_preemptions():
    report = kv_report("request", {"kv_saturated": 3})
    assert report["kv"] == {"num_blocks": 64, "peak_reserved_blocks": 48, "peak_used_blocks": 21,
                            "mean_used_fraction": pytest.approx(1 / 6)}
    assert report["preemptions"] == 0
    lines = format_summary(report).splitlines()
    row = next(line for line in lines if line.startswith("KV blocks"))
    assert row.split() == ["KV", "blocks", "64", "peak", "reserved", "48", "(76.2%)",
                           "peak", "used", "21", "(33.3%)", "mean", "used", "16.7%"]
    assert next(line for line in lines if line.startswith("Steps")).endswith("0 preempted")
    assert "kv_reserve=request" in format_summary(report)
    # under `request` there is nothing to suggest
    assert "--kv-reserve request" not in format_summary(report)


def test_summary_says_request_would_lift_a_dominant_kv_saturated():
    text = format_summary(kv_report("max_model_len", {"kv_saturated": 3, "at_capacity": 1}))
    flat = " ".join(text.split())
    assert "kv_saturated refused admission in 75% of steps" in flat
    assert "--kv-reserve request reserves each request's own prompt + max_tokens" in flat
    assert all(len(line) <= 100 for line in text.splitlines())
    # not when another reason refuses more often
    text = format_summary(kv_report("max_model_len", {"kv_saturated": 3, "at_capacity": 4}))
    assert "--kv-reserve request" not in text


def test_prometheus_has_preemptions_and_kv_figures():
    text = prometheus_text(kv_report("request", {}), timestamp=0)
    assert "neuron_batch_preemptions_total 0" in text
    assert 'neuron_batch_kv_peak_blocks{kind="reserved"} 48' in text
    assert 'neuron_batch_kv_peak_blocks{kind="used"} 21' in text


def test_the_graphs_row_adds_up_under_the_prefix_caching_grid():
    """nxdi with prefix caching: a context-encoding graph per (prefill, prefix) cell, so
    '36 to compile' reads 30 context-encoding (5 x 6, the grid) + 6 token-generation."""
    report = small_report(model="m", device="sim", runtime="nxdi",
                          prefill_buckets=[128, 256, 512, 1024, 2048],
                          attention_buckets=[128, 256, 512, 1024, 2048, 4096],
                          prefix_buckets=[0, 128, 512, 1024, 2048, 4096])
    assert report["config"]["compiled_graphs"] == 36
    text = " ".join(format_summary(report).split())
    assert ("Graphs 36 to compile on Neuron (30 context-encoding (5 prefill x 6 prefix "
            "buckets, NxDI's grid) + 6 token-generation buckets)") in text


def test_prometheus_says_how_many_requests_wait_and_how_the_run_exited():
    """A stopped night is told from a whole one by the textfile alone: its pending requests and
    its exit code (4), as cron's alert reads them."""
    report = small_report()
    report["requests"] = {**report["requests"], "pending": 7}
    samples, types = parse_prometheus(prometheus_text(report, timestamp=0, exit_code=4))
    assert samples[("neuron_batch_requests_total", (("status", "pending"),))] == 7
    assert samples[("neuron_batch_last_run_exit_code", ())] == 4
    assert types["neuron_batch_last_run_exit_code"] == "gauge"
    # where the exit is not known (a report re-rendered later) no exit-code sample is written
    without, _ = parse_prometheus(prometheus_text(report, timestamp=0))
    assert ("neuron_batch_last_run_exit_code", ()) not in without
