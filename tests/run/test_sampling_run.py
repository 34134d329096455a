"""`neuron-batch run --device sim` under nxdi: a job whose requests sample with different
temperatures (which NxDI's on-device sampler mixes up) samples on the host, decided from the
job's requests before the engine is built (engine_kwargs -> the simulated device), and the
report says what that cost; a job with one temperature gets no sampling section at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")

from neuron_batch.cli import main  # noqa: E402


def run(tmp_path: Path, temperatures) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "in.jsonl"
    path.write_text("".join(
        json.dumps({"id": f"r{i}", "prompt_token_ids": [1000 + (7 * i + j) % 20000
                                                        for j in range(40 + 9 * i)],
                    "max_tokens": 8, "temperature": t}) + "\n"
        for i, t in enumerate(temperatures)))
    out = tmp_path / "run"
    result = CliRunner().invoke(main, [
        "run", str(path), "--device", "sim", "--instance", "inf2.8xlarge",
        "--architecture", "llama-3.1-8b", "--max-model-len", "2048", "--max-num-seqs", "4",
        "-q", "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.output == ""              # quiet: nothing printed on success
    return json.loads((out / "report.json").read_text())


def test_mixed_temperatures_are_charged_host_sampling_and_one_temperature_is_not(tmp_path):
    same = run(tmp_path / "same", [0.7] * 6)
    mixed = run(tmp_path / "mixed", [0.0, 0.7] * 3)
    assert "sampling" not in same
    section = mixed["sampling"]
    assert section["sampling_s"] > 0 and 0 < section["share_of_step_time"] < 1
    assert section["constrained_requests"] == section["logprob_requests"] == 0
    assert mixed["elapsed_time"] == pytest.approx(same["elapsed_time"] + section["sampling_s"],
                                                  rel=1e-6)
