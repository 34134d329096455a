"""Golden report: `neuron-batch run` of a small slice of the real trace on the simulated device
gives the report stored in tests/run/golden/, field for field, apart from paths and wall-clock
timestamps. The simulated device is deterministic, so any difference is a change of behaviour:
a refactor must leave this file alone; a deliberate change regenerates it with
`NEURON_BATCH_REGENERATE_GOLDEN=1 pytest tests/run/test_golden_report.py` and says why in its
commit.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")

from neuron_batch.cli import main  # noqa: E402
from neuron_batch.report.model import SCHEMA_VERSION  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "datasets" / "azure-llm-inference-conv-2023.csv"
GOLDEN = Path(__file__).parent / "golden" / "sim_report.json"

#: Keys whose values depend on where or when the run happened, not on what it did.
#: (the verdict's command names the input's path, as `inputs` does)
VOLATILE = {"output_dir", "inputs", "started", "wall_time_s", "pid", "created", "generated_at",
            "command"}


def normalise(value):
    if isinstance(value, dict):
        return {k: normalise(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    if isinstance(value, float):
        return round(value, 9)
    return value


def run_slice(tmp_path: Path, extra: list[str] | None = None) -> dict:
    rows = list(csv.reader(TRACE.open()))
    sliced = tmp_path / "slice.csv"
    with sliced.open("w", newline="") as handle:
        csv.writer(handle).writerows(rows[:151])   # header + 150 requests
    out = tmp_path / "run"
    result = CliRunner().invoke(main, [
        "run", str(sliced), "--device", "sim", "--instance", "inf2.8xlarge",
        "--architecture", "llama-3.1-8b", "--max-model-len", "8192",
        "--max-num-batched-tokens", "2048", "--max-num-seqs", "12", "-q", "-o", str(out),
        *(extra or [])], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads((out / "report.json").read_text())


@pytest.mark.skipif(not TRACE.exists(), reason="the trace copy in datasets/ is missing")
def test_sim_report_matches_golden(tmp_path, monkeypatch):
    # (the recorder as a real run has it: keeping only what is in flight, tests/conftest.py)
    monkeypatch.delenv("NEURON_BATCH_RECORDS_IN_MEMORY", raising=False)
    raw = run_slice(tmp_path)
    # The layout's version belongs to the format, not to what the run did: checked here, kept
    # out of the golden figures so a version bump alone does not regenerate them.
    assert raw.pop("schema_version") == SCHEMA_VERSION
    report = normalise(raw)
    if os.environ.get("NEURON_BATCH_REGENERATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert report == golden
