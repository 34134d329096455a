"""The step model against AWS's one published prefix-caching table (trn2, NxDI): the ratio of
TTFT without/with prefix caching per workload, and CALIBRATION.md states exactly the errors
the model gives (scripts/calibration_report.py --prefix writes that table)."""

from __future__ import annotations

from pathlib import Path

from neuron_batch.device.published_prefix import PUBLISHED, apc_check, apc_model

CALIBRATION = Path(__file__).resolve().parents[2] / "neuron_batch/device/CALIBRATION.md"


def test_the_model_reproduces_the_high_hit_gain_and_the_zero_hit_cost():
    rows = {r["workload"]: r for r in apc_check(apc_model())}
    high = rows[PUBLISHED[0].workload]
    assert high["cached_tokens"] > 0.9 * high["prompt_tokens"] - 32
    assert abs(high["ratio_error"]) < 0.10
    zero = rows[PUBLISHED[3].workload]
    assert zero["cached_tokens"] == 0 and zero["model_ratio"] <= 1.0   # the grid's minimum


def test_calibration_md_states_the_errors_the_model_gives():
    text = CALIBRATION.read_text(encoding="utf-8")
    assert "No published figure measures" in text
    for row in apc_check(apc_model()):
        line = (f"({row['prompt_tokens']:,}, {row['cached_tokens']:,}) | "
                f"{row['published_ms'][0]} -> {row['published_ms'][1]} "
                f"({row['published_ratio']:.2f}x) | {row['model_ms'][0]} -> "
                f"{row['model_ms'][1]} ({row['model_ratio']:.2f}x) | "
                f"{row['ratio_error']:+.1%} |")
        assert line in text, line
