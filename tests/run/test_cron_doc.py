"""docs/cron.md's job file works as printed: its TOML block and the command that tries it on
the simulated device are read out of the page (never copied into the test, so a changed page
is what gets tested) and run, silent on success as cron needs, with the file's settings in the
report."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

CRON_DOC = Path(__file__).resolve().parents[2] / "docs" / "cron.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", CRON_DOC.read_text(encoding="utf-8"),
                      re.M | re.S)


def test_the_job_file_in_the_cron_page_runs_as_printed(tmp_path):
    pytest.importorskip("vllm")
    job, = [block for block in blocks("toml") if "inputs =" in block]
    name = re.match(r"# (\S+\.toml)\n", job).group(1)
    (tmp_path / name).write_text(job)
    inputs = re.search(r"^inputs = \[\"([^\"]+)\"\]", job, re.M).group(1)
    (tmp_path / inputs).write_text("".join(
        json.dumps({"id": f"p{i}", "prompt": f"Question {i}: what is {i} + {i}?",
                    "max_tokens": 16}) + "\n" for i in range(4)))
    line, = [line for block in blocks("bash") for line in block.splitlines()
             if f"--config {name}" in line and "--device sim" in line]
    args = shlex.split(line)
    assert args[0] == "neuron-batch"
    done = subprocess.run([sys.executable, "-m", "neuron_batch.cli", *args[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    out = tmp_path / args[args.index("--output") + 1]
    config = json.loads((out / "report.json").read_text())["config"]
    settings = json.loads((out / "run.json").read_text())["settings"]
    for key in ("max-num-seqs", "max-model-len", "max-tokens", "on-error",
                "tensor-parallel-size"):
        value = re.search(rf"^{key} = (\S+)", job, re.M).group(1).strip('"')
        field = key.replace("-", "_")
        found = config.get(field, settings.get(field, (settings.get("sim") or {}).get(field)))
        assert str(found) == value, (key, found)
    assert json.loads((out / "report.json").read_text())["requests"]["completed"] == 4
