"""report/model.py and schema.py: the typed report reads every report.json there is and writes
it back as it was, key for key and in order; an older one (no schema_version, sections missing,
words this version does not know) still reads, formats and exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neuron_batch.report.model import (
    SCHEMA_VERSION,
    STOPPED,
    Attempt,
    Cost,
    Ended,
    PaddingPhase,
    Report,
    Tokens,
    as_report,
)
from neuron_batch.report.notes import outcome_line
from neuron_batch.report.prometheus import prometheus_text
from neuron_batch.report.schema import ABSENT, present
from neuron_batch.report.summary import format_summary

GOLDEN = Path(__file__).resolve().parents[1] / "run" / "golden" / "sim_report.json"

#: A report as an early version wrote it: no schema_version, no prefix_cache, kv, latency,
#: attempts or cost; an admission reason and a key this version does not know.
OLD = {
    "elapsed_time": 2.0, "num_requests": 3, "total_num_tokens": 60,
    "requests_per_second": 1.5, "tokens_per_second": 30.0,
    "config": {"model": "m", "device": "cpu", "max_num_seqs": 4, "max_model_len": 64,
               "prefill_buckets": [16, 32], "decode_buckets": [4], "some_old_setting": 1},
    "requests": {"total": 4, "completed": 3, "failed": 0, "skipped": 1},
    "throughput": {"elapsed_s": 2.0, "requests_per_s": 1.5, "input_tokens_per_s": 20.0,
                   "output_tokens_per_s": 10.0, "total_tokens_per_s": 30.0},
    "tokens": {"input": 40, "output": 20, "total": 60},
    "padding": {"prefill": {"actual_tokens": 40, "padded_tokens": 64, "waste_fraction": 0.375,
                            "by_bucket": {"16": {"chunks": 1, "actual_tokens": 10,
                                                 "padded_tokens": 16},
                                          "32": {"chunks": 0, "actual_tokens": 0,
                                                 "padded_tokens": 0}}},
                "decode": {"actual_seqs": 12, "padded_seqs": 16, "waste_fraction": 0.25,
                           "by_bucket": {"4": {"steps": 4, "actual_seqs": 12,
                                               "padded_seqs": 16}}}},
    "states": {"IDLE": {"steps": 0, "seconds": 0.5}, "ACTIVE_DECODE": {"steps": 4,
                                                                        "seconds": 1.5}},
    "admission_blocked": {"at_capacity": 2, "a_reason_from_elsewhere": 1},
    "steps": {"total": 5, "prefill": 1, "decode": 4, "empty": 0},
    "a_section_from_elsewhere": {"x": [1, 2]},
}


def dumped(value) -> str:
    """JSON text, keys in their order: equal only when the order is too."""
    return json.dumps(value)


def test_the_golden_report_round_trips_key_for_key_in_order():
    data = json.loads(GOLDEN.read_text())
    report = Report.from_dict(data)
    assert dumped(report.to_dict()) == dumped(data)
    # typed all the way down where readers need it
    assert report.padding.prefill.by_bucket["128"].chunks == data["padding"]["prefill"][
        "by_bucket"]["128"]["chunks"]
    assert report.latency.ttft_s.p99 == data["latency"]["ttft_s"]["p99"]
    assert report.attempts[0].ended is Ended.COMPLETED
    assert report.cost.usd == data["cost"]["usd"]


def test_an_older_report_reads_and_writes_back_as_it_was():
    report = Report.from_dict(OLD)
    assert dumped(report.to_dict()) == dumped(OLD)
    assert report.version == 0 and report.schema_version is ABSENT
    assert report.prefix_cache is ABSENT and not report.cost and report.attempts is ABSENT
    assert report.section("kv").num_blocks is ABSENT      # an empty section, not a KeyError
    assert report.config.extra == {"some_old_setting": 1}
    assert report.admission_blocked.counts() == {"at_capacity": 2, "a_reason_from_elsewhere": 1}
    assert report.extra == {"a_section_from_elsewhere": {"x": [1, 2]}}


def test_an_older_report_still_formats_and_exports():
    text = format_summary(Report.from_dict(OLD))
    assert text == format_summary(OLD)      # a dict is typed on the way in
    assert "3 completed of 4" in text and "a_reason_from_elsewhere" in text
    metrics = prometheus_text(OLD, timestamp=0.0)
    assert 'neuron_batch_requests_total{status="completed"} 3' in metrics
    assert "prefix_cache" not in metrics and "kv_peak_blocks" not in metrics
    assert "1 input line(s) skipped" in outcome_line(OLD)


def test_a_new_report_starts_with_its_version_and_appends_in_declared_order():
    report = Report.new({"elapsed_time": 1.0, "requests": {"total": 1}})
    report.output_dir = "/r"
    report.cost = Cost(usd=0.5)
    report.tokens = Tokens(input=1, output=2, total=3)
    report.requests.pending = 0
    out = report.to_dict()
    assert list(out) == ["schema_version", "elapsed_time", "requests", "tokens", "cost",
                         "output_dir"]
    assert out["schema_version"] == SCHEMA_VERSION == report.version
    assert out["requests"] == {"total": 1, "pending": 0}
    assert out["cost"] == {"usd": 0.5} and out["tokens"] == {"input": 1, "output": 2, "total": 3}


def test_null_is_a_value_absent_is_not():
    data = {"prefix_caching": None, "requests": {"max_tokens_clamped_to": None}}
    report = Report.from_dict(data)
    assert report.prefix_caching is None and present(report.prefix_caching)
    assert report.verdict is ABSENT and not present(report.verdict)
    assert report.to_dict() == data


def test_ended_is_an_enum_that_keeps_words_it_does_not_know():
    stopped = Attempt.from_dict({"attempt": 2, "ended": "deadline", "max_runtime_s": 60})
    assert stopped.ended is Ended.DEADLINE and stopped.ended in STOPPED
    assert "interrupted" in STOPPED      # (a str enum: the words compare as they are)
    newer = Attempt.from_dict({"attempt": 3, "ended": "paused by a newer version"})
    assert newer.ended == "paused by a newer version"
    assert newer.to_dict() == {"attempt": 3, "ended": "paused by a newer version"}
    assert json.loads(json.dumps(stopped.to_dict()))["ended"] == "deadline"


def test_padding_rows_read_by_their_phase_keys():
    phase = PaddingPhase.from_dict(OLD["padding"]["decode"])
    assert phase.totals("decode") == (12, 16)
    assert phase.rows()["4"].figures(*PaddingPhase.KINDS["decode"]) == (4, 12, 16)
    assert Report.from_dict({}).section("padding").phase("attention").rows() == {}


def test_as_report_takes_either_form():
    report = Report.from_dict(OLD)
    assert as_report(report) is report
    assert as_report(OLD) == report


def test_a_report_of_a_newer_schema_is_named_with_the_versions_read(tmp_path):
    """`neuron-batch report DIR` on a folder a newer release wrote: named, with the versions
    this one reads, rather than rendered from fields it may misread."""
    from neuron_batch.errors import RunError
    from neuron_batch.report.model import SCHEMA_VERSION
    from neuron_batch.run.folder_report import rerender

    (tmp_path / "report.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(RunError) as error:
        rerender(tmp_path)
    assert f"schema_version {SCHEMA_VERSION + 1} is newer" in str(error.value)
    assert f"(0 to {SCHEMA_VERSION})" in str(error.value)
