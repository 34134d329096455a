"""`run --split-at N` on the simulated device: two layouts one after the other, one folder, every
request once, a report with each part; bad cuts refused before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")

from neuron_batch.cli import main  # noqa: E402
from neuron_batch.runtimes.buckets import nxdi_default_buckets  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
# (prompt, max_tokens): most fit in 1024 tokens, three need the long layout.
WORKLOAD = [(100 + 37 * i, 20 + i % 7) for i in range(24)] + [(2500, 40), (3000, 16),
                                                                  (1500, 30)]
# (--compiled: inf2.xlarge's 16 GiB host cannot compile an 8B model, issue 29; its graphs come
# from a larger host, and each layout's start-up is its load)
BASE = ["--device", "sim", "--instance", "inf2.xlarge", "--architecture", "llama-3.1-8b",
        "--max-model-len", "4096", "--max-num-seqs", "3", "--compiled", "-q"]


def trace(tmp_path: Path) -> str:
    path = tmp_path / "trace.csv"
    path.write_text("ContextTokens,GeneratedTokens\n"
                    + "".join(f"{p},{m}\n" for p, m in WORKLOAD))
    return str(path)


def run(args):
    return CliRunner().invoke(main, ["run", *args], catch_exceptions=False)


def test_a_split_run_runs_each_request_once_in_the_layout_it_fits(tmp_path):
    data = trace(tmp_path)
    out = tmp_path / "split"
    result = run([data, *BASE, "--split-at", "1024", "-o", str(out)])
    assert result.exit_code == 0, result.output
    outputs = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    assert sorted(o["index"] for o in outputs) == list(range(len(WORKLOAD)))
    assert all(o["num_output_tokens"] == WORKLOAD[o["index"]][1] for o in outputs)
    report = json.loads((out / "report.json").read_text())
    short, long = report["split"]["parts"]
    assert (short["part"], short["max_model_len"], short["requests"]) == ("short", 1024, 24)
    assert (long["part"], long["max_model_len"], long["requests"]) == ("long", 4096, 3)
    # the short layout gets every static slot of 1024 that loads beside the weights; the
    # long one the --max-num-seqs given (3 of 4096 fit on one inf2 chip)
    assert short["max_num_seqs"] > 3 and long["max_num_seqs"] == 3
    # each layout's lists fitted to its own requests, as many as NxDI's default (no more
    # graphs), ending at the layout's max_model_len; prompts 1..1000 -> not powers of two
    assert len(short["buckets"]["context_encoding_buckets"]) == len(nxdi_default_buckets(1024))
    assert short["buckets"]["context_encoding_buckets"] != nxdi_default_buckets(1024)
    assert short["buckets"]["token_generation_buckets"][-1] == 1024
    assert long["buckets"]["context_encoding_buckets"][-1] == 4096
    assert report["split"]["estimated_compile_s"] == pytest.approx(
        short["estimated_compile_s"] + long["estimated_compile_s"])
    # each part's records are its own attempt: their steps add up to the whole report's
    assert [a["part"]["part"] for a in report["attempts"]] == ["short", "long"]
    assert report["requests"]["completed"] == len(WORKLOAD)
    assert report["throughput"]["elapsed_s"] == pytest.approx(
        short["elapsed_s"] + long["elapsed_s"], rel=1e-6)

    # against one layout sized for the longest request: the split finishes sooner
    single = tmp_path / "single"
    assert run([data, *BASE, "-o", str(single)]).exit_code == 0
    one = json.loads((single / "report.json").read_text())
    assert report["throughput"]["output_tokens_per_s"] > \
        one["throughput"]["output_tokens_per_s"]
    summary = CliRunner().invoke(main, ["report", str(out)])
    assert "Split at 1,024 tokens" in summary.output
    assert "short: context_encoding_buckets " in summary.output


def test_the_user_s_bucket_lists_stay_the_long_layout_s(tmp_path):
    out = tmp_path / "given"
    result = run([trace(tmp_path), *BASE, "--split-at", "1024", "--context-encoding-buckets",
                  "2048,4096", "-o", str(out)])
    assert result.exit_code == 0, result.output
    short, long = json.loads((out / "report.json").read_text())["split"]["parts"]
    assert long["buckets"]["context_encoding_buckets"] == [2048, 4096]
    assert short["buckets"]["context_encoding_buckets"][-1] == 1024


def test_split_at_auto_picks_a_cut_says_so_and_runs_it(tmp_path):
    """--split-at auto: the cut the step-time estimate finishes soonest with compile, logged,
    recorded in run.json (so --resume keeps it) and run as if given."""
    out = tmp_path / "auto"
    args = [trace(tmp_path), *[a for a in BASE if a != "-q"], "--split-at", "auto",
            "-o", str(out)]
    result = run(args)
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if "--split-at auto" in line]
    assert len(said) == 1, result.output
    cut = json.loads((out / "run.json").read_text())["settings"]["split_at"]
    report = json.loads((out / "report.json").read_text())
    if cut is None:
        assert "no split" in said[0] and "split" not in report
    else:
        assert said[0].startswith(f"--split-at auto: {cut:,} (")
        assert report["split"]["split_at"] == cut
        assert sum(p["requests"] for p in report["split"]["parts"]) == len(WORKLOAD)
    assert report["requests"]["completed"] == len(WORKLOAD)
    bad = run([trace(tmp_path), *BASE, "--split-at", "most", "-o", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "neither a number of tokens nor auto" in bad.output


def test_bad_cuts_are_refused_with_the_numbers_before_anything_runs(tmp_path):
    data = trace(tmp_path)
    above = run([data, *BASE, "--split-at", "4096", "-o", str(tmp_path / "a")])
    assert above.exit_code == 2 and "must be below --max-model-len 4,096" in above.output
    below = run([data, *BASE, "--split-at", "50", "-o", str(tmp_path / "b")])
    assert below.exit_code != 0
    assert "below the shortest request" in below.output and "120" in below.output
    assert not (tmp_path / "b" / "outputs.jsonl").exists()


def test_a_killed_split_run_resumes_without_loss_or_duplicates(tmp_path):
    """kill -9 while the short part runs; --resume splits what is left and finishes."""
    data = trace(tmp_path)
    out = tmp_path / "killed"
    args = [sys.executable, "-m", "neuron_batch.cli", "run", data, *BASE, "--split-at", "1024",
            "-o", str(out)]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    outputs = out / "outputs.jsonl"
    import time
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if outputs.exists() and len(outputs.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    resumed = run([data, *BASE, "--split-at", "1024", "--resume", "-o", str(out)])
    assert resumed.exit_code == 0, resumed.output
    rows = [json.loads(line) for line in outputs.read_text().splitlines()]
    assert sorted(r["index"] for r in rows) == list(range(len(WORKLOAD)))
    report = json.loads((out / "report.json").read_text())
    assert report["requests"]["completed"] == len(WORKLOAD)
    assert {p["part"] for p in report["split"]["parts"]} <= {"short", "long"}


def test_bench_compares_splits_with_the_best_single_layout(tmp_path):
    data = trace(tmp_path)
    out = tmp_path / "bench"
    result = CliRunner().invoke(main, ["bench", data, *BASE, "--split-at", "1024,2048",
                                       "--order", "length", "--jobs", "1", "-o", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "split.json").read_text())
    rows = {r["name"]: r for r in saved["configurations"]}
    assert set(rows) == {"single", "single fitted", "split 1024", "split 2048"}
    assert all(r["order"] == "length" for r in rows.values())
    singles = [rows["single"], rows["single fitted"]]
    best = max(singles, key=lambda r: r["output_tokens_per_s"])
    assert saved["best_single"] == best["name"]
    split = rows[saved["best_split"]]
    assert saved["ratio"] == pytest.approx(split["output_tokens_per_s"]
                                           / best["output_tokens_per_s"])
    # a split compiles both layouts; its parts are in the row
    assert split["estimated_compile_s"] > best["estimated_compile_s"]
    assert [p["part"] for p in split["parts"]] == ["short", "long"]
    assert rows["split 1024"]["parts"][0]["max_model_len"] == 1024
    again = CliRunner().invoke(main, ["report", str(out)])
    assert "x best single" in again.output and "split 1024" in again.output
    bad = CliRunner().invoke(main, ["bench", data, *BASE, "--split-at", "4096",
                                    "-o", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "must be below --max-model-len" in bad.output
