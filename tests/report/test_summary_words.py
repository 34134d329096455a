"""Nothing changes silently, and the words say what happened (issue 33, items 3 and 5): the
summary counts pending requests and says why they are pending, names the skipped lines' file,
says how many max_tokens were cut and to what, hints at many empty outputs, names the run
folder last, shows the estimated compile beside the cost, says "compiled" only on Neuron; the
Prometheus help names the clock; --quiet prints one line when a run did not finish.

The summary and Prometheus parts are pure (report dicts); the run parts use the simulated
device (seconds) and one CPU run of the tiny random-weight model (--device auto)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuron_batch.inputs.prompt_records import InputProblem
from neuron_batch.inputs.skipped import SKIPPED, skipped_row, write_skipped
from neuron_batch.report.notes import outcome_line
from neuron_batch.report.prometheus import prometheus_text
from neuron_batch.report.summary import format_summary

SIM = ["--device", "sim", "--instance", "inf2.8xlarge", "--architecture", "llama-3.1-8b"]


def report_of(**requests) -> dict:
    figures = {"total": 10, "completed": 10, "failed": 0, "skipped": 0, "pending": 0,
               "max_tokens_clamped": 0, "max_tokens_clamped_to": None, "empty_outputs": 0}
    return {"config": {"device": "sim", "runtime": "nxdi", "max_model_len": 2048,
                       "compiled_graphs": 10},
            "requests": figures | requests, "output_dir": "/srv/run"}


def flat(text: str) -> str:
    return " ".join(text.split())


# -- the summary's words ------------------------------------------------------------------------

def test_an_interrupted_run_counts_its_pending_requests_and_says_why():
    report = report_of(completed=6, pending=18, total=24)
    report["attempts"] = [{"attempt": 1, "ended": "interrupted", "signal": "SIGINT"}]
    text = format_summary(report)
    requests = next(line for line in text.splitlines() if line.startswith("Requests"))
    assert requests.split()[-2:] == ["18", "pending"]
    assert ("Stopped by SIGINT: 6 of 24 requests done, 18 pending; rerun with --resume to "
            "finish them.") in flat(text)
    report["attempts"] = [{"attempt": 1, "ended": "deadline", "max_runtime_s": 1.0}]
    assert "Stopped at --max-runtime (1 s): 6 of 24" in flat(format_summary(report))
    # a finished run says neither
    done = format_summary(report_of())
    assert "pending" not in done and "Stopped" not in done


def test_skipped_lines_are_named_with_their_file():
    text = format_summary(report_of(skipped=2, total=12))
    assert f"2 skipped ({SKIPPED})" in text
    assert f"2 input line(s) skipped (--on-error skip), each with its file, line, field and " \
           f"reason in {SKIPPED}" in flat(text)
    assert SKIPPED not in format_summary(report_of())


def test_clamped_max_tokens_say_how_many_and_to_what():
    text = flat(format_summary(report_of(max_tokens_clamped=3,
                                         max_tokens_clamped_to={"min": 1000, "max": 2040})))
    assert ("3 request(s) asked for more max_tokens than fit beside their prompt in "
            "max_model_len 2,048: cut to 1,000-2,040 tokens") in text
    one = flat(format_summary(report_of(max_tokens_clamped=1,
                                        max_tokens_clamped_to={"min": 2045, "max": 2045})))
    assert "cut to 2,045 tokens" in one
    assert "max_tokens than fit" not in format_summary(report_of())


def test_many_empty_outputs_get_a_hint_and_a_few_do_not():
    # the built-in model's plain-text run: 12 of the 24 built-in prompts come back empty
    for empty in (23, 12, 6):
        text = flat(format_summary(report_of(completed=24, total=24, empty_outputs=empty)))
        assert f"{empty} of 24 outputs are empty" in text and "`messages` records" in text
    # as chat messages 1 of 24: a question answered by its end token is no sign of a mismatch
    for empty in (1, 5):
        assert "outputs are empty" not in format_summary(report_of(completed=24,
                                                                   empty_outputs=empty))


def test_the_summary_ends_with_the_run_folder():
    lines = format_summary(report_of()).rstrip("\n").splitlines()
    assert lines[-1] == "Run folder  /srv/run"


def test_graphs_are_compiled_only_on_neuron_and_the_cpu_runs_no_neuron_runtime():
    graphs = "(5 prefill buckets + 4 decode buckets x 1 context lengths)"
    config = {"runtime": "vllm-neuron", "compiled_graphs": 9,
              "prefill_buckets": [128, 256, 512, 1024, 2048], "decode_buckets": [1, 2, 4, 8]}
    cpu = format_summary({"config": {**config, "device": "cpu"}})
    assert f"9 to compile on Neuron {graphs}" in cpu and "compiled" not in cpu
    assert "runtime=shapes of vllm-neuron" in cpu
    neuron = format_summary({"config": {**config, "device": "neuron"}})
    assert f"9 compiled {graphs}" in neuron and "runtime=vllm-neuron" in neuron


def test_the_cost_shows_the_estimated_compile_beside_it():
    report = report_of()
    report["config"]["sim"] = {"compile": {"estimated_compile_s": 1800.0}}
    report["cost"] = {"instance": "inf2.8xlarge", "num_instances": 2, "pricing": "on-demand",
                      "price_per_hour_usd": 2.0, "usd": 0.33,
                      "usd_per_million_output_tokens": 1.5}
    lines = format_summary(report).splitlines()
    cost = next(i for i, line in enumerate(lines) if line.startswith("Cost"))
    # half an hour on two instances at $2/h
    assert lines[cost].startswith("Cost        $0.33 run (+ $2.00 compile estimated, 30.0 min)")
    assert "2 x inf2.8xlarge at $2.0000/h" in " ".join(lines[cost:cost + 2])
    assert all(len(line) <= 100 for line in lines)
    graphs = next(line for line in lines if line.startswith("Graphs"))
    assert "to compile on Neuron" in graphs
    # without an estimate (a Neuron host): the cost alone
    del report["config"]["sim"]
    plain = next(line for line in format_summary(report).splitlines() if line.startswith("Cost"))
    assert plain.startswith("Cost        $0.33   2 x inf2.8xlarge") and "compile" not in plain


def test_prometheus_help_names_the_clock():
    def helps(device):
        report = report_of()
        report["config"]["device"] = device
        report["throughput"] = {"elapsed_s": 4.0, "output_tokens_per_s": 1.0}
        return {line.split()[2]: line for line in prometheus_text(report, timestamp=0)
                .splitlines() if line.startswith("# HELP")}

    sim, cpu = helps("sim"), helps("cpu")
    assert "simulated seconds" in sim["neuron_batch_elapsed_seconds"]
    assert "per simulated second" in sim["neuron_batch_throughput_output_tokens_per_second"]
    assert "wall seconds" in cpu["neuron_batch_elapsed_seconds"]
    assert "simulated" not in cpu["neuron_batch_throughput_output_tokens_per_second"]


def test_the_quiet_line_is_one_line_with_why_and_how_to_finish():
    report = report_of(completed=3, pending=7, skipped=1)
    report["attempts"] = [{"ended": "deadline", "max_runtime_s": 30}]
    line = outcome_line(report)
    assert "\n" not in line and line.startswith("neuron-batch: Stopped at --max-runtime (30 s)")
    assert "--resume" in line and SKIPPED in line and line.endswith("Run folder: /srv/run")


# -- skipped.jsonl ------------------------------------------------------------------------------

def test_skipped_rows_split_the_source_into_file_and_line(tmp_path):
    assert skipped_row(InputProblem("/in/a.jsonl:12", "prompt", "expected a string",
                                    custom_id="r-12")) == {
        "file": "/in/a.jsonl", "line": 12, "custom_id": "r-12", "field": "prompt",
        "reason": "expected a string"}
    assert skipped_row(InputProblem("t.csv:row 4", None, "bad"))["line"] == "row 4"
    path = write_skipped(tmp_path, [InputProblem("a:1", "x", "r1"), InputProblem("a:3", None,
                                                                                  "r2")])
    assert [json.loads(line)["line"] for line in path.read_text().splitlines()] == [1, 3]
    # rewritten at each attempt: with nothing skipped now, no stale list is left
    assert write_skipped(tmp_path, []) is None and not path.exists()


def test_empty_outputs_are_counted_from_the_outputs_file(tmp_path):
    from neuron_batch.job.folder import RunFolder
    from neuron_batch.report.model import Report
    from neuron_batch.run.folder_report import _tokens_from_outputs

    rows = [{"id": "a", "output": "", "num_prompt_tokens": 3, "num_output_tokens": 1},
            {"id": "b", "output": " \n", "num_prompt_tokens": 3, "num_output_tokens": 1},
            {"id": "c", "output": "Paris", "num_prompt_tokens": 3, "num_output_tokens": 2},
            {"id": "d", "output": None, "num_prompt_tokens": 3, "num_output_tokens": 2},
            {"custom_id": "e", "response": {"body": {
                "choices": [{"message": {"content": ""}}],
                "usage": {"prompt_tokens": 2, "completion_tokens": 1}}}}]
    (tmp_path / "outputs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = Report.from_dict({"requests": {}, "throughput": {"elapsed_s": 1.0}})
    _tokens_from_outputs(report, RunFolder(tmp_path))
    # blank text counts; no text (the simulated device writes none) does not
    assert report.requests.empty_outputs == 3


# -- runs ---------------------------------------------------------------------------------------

def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def cli(args, **env):
    return subprocess.run([sys.executable, "-m", "neuron_batch.cli", *args], capture_output=True,
                          timeout=600, text=True, env={**os.environ, **env})


def test_skipped_lines_are_kept_and_quiet_prints_one_line(tmp_path):
    pytest.importorskip("vllm")
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "a", "prompt_len": 30, "max_tokens": 4}, '{"prompt": 5}',
        {"id": "b", "prompt_len": 2000, "max_tokens": 500}])
    out = tmp_path / "run"
    args = ["run", path, *SIM, "--max-model-len", "2048", "--on-error", "skip", "-o", str(out)]
    quiet = cli([*args, "-q"])
    assert quiet.returncode == 3, quiet.stderr
    assert quiet.stdout == "" and len(quiet.stderr.splitlines()) == 1
    assert SKIPPED in quiet.stderr and str(out) in quiet.stderr
    kept = [json.loads(line) for line in (out / SKIPPED).read_text().splitlines()]
    assert kept == [{"file": path, "line": 2, "custom_id": None, "field": "prompt",
                     "reason": "expected a string, got 5 (integer)"}]
    report = json.loads((out / "report.json").read_text())
    assert report["requests"]["max_tokens_clamped"] == 1
    assert report["requests"]["max_tokens_clamped_to"] == {"min": 48, "max": 48}
    # the summary, again from the folder, says both
    again = flat(cli(["report", str(out)]).stdout)
    assert f"1 skipped ({SKIPPED})" in again and "cut to 48 tokens" in again
    # (the run folder last, but for the verdict on what would have run faster)
    assert again.split(" Verdict ")[0].endswith(f"Run folder {out}")


def test_max_runtime_under_quiet_prints_why_and_how_to_resume(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    from click.testing import CliRunner

    from neuron_batch.cli import main
    from neuron_batch.job import generate

    path = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt_len": 100,
                                              "max_tokens": 400} for i in range(40)])
    out = tmp_path / "run"
    clock = iter(range(10**9))    # a second per read: the deadline passes after 5 steps
    monkeypatch.setattr(generate, "runtime_clock", lambda: float(next(clock)))
    result = CliRunner().invoke(main, ["run", path, *SIM, "-o", str(out), "-q",
                                       "--max-runtime", "5"], catch_exceptions=False)
    assert result.exit_code == 4
    assert result.stdout == ""
    line, = result.stderr.splitlines()
    assert line.startswith("neuron-batch: Stopped at --max-runtime (5 s): ")
    assert "pending; rerun with --resume to finish them" in line and str(out) in line


def test_sigint_leaves_a_summary_that_counts_the_pending(tmp_path):
    pytest.importorskip("vllm")
    path = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt_len": 200,
                                              "max_tokens": 1500} for i in range(400)])
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "neuron_batch.cli", "run", path, *SIM,
                             "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    outputs = out / "outputs.jsonl"
    deadline = time.monotonic() + 300
    while not (outputs.exists() and outputs.read_text().count("\n") >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 4
    done = len(outputs.read_text().splitlines())
    text = flat(stdout)
    assert f"Stopped by SIGINT: {done} of 400 requests done, {400 - done} pending" in text
    assert f"{400 - done} pending" in next(line for line in stdout.splitlines()
                                           if line.startswith("Requests"))


def test_auto_on_the_cpu_says_cpu_everywhere(tiny_model, tmp_path):
    pytest.importorskip("vllm")
    path = write_jsonl(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt_len": 20,
                                              "max_tokens": 3} for i in range(3)])
    out = tmp_path / "run"
    result = cli(["run", path, "--model", tiny_model, "--device", "auto", "--max-model-len",
                  "512", "--max-num-batched-tokens", "256", "-o", str(out)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"running 3 of 3 requests on cpu (--device auto) (output: {out})" in result.stderr
    assert "device 'auto'" not in result.stderr
    assert "device=cpu" in result.stdout and "runtime=shapes of vllm-neuron" in result.stdout
    assert " compiled " not in result.stdout and "to compile on Neuron" in result.stdout
