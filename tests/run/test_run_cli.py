"""`neuron-batch run` end to end on the CPU: real loaders, vLLM's real engine with the Neuron
scheduler, real output files. A tiny random-weight llama (config.json only) keeps it fast;
one test uses the built-in SmolLM2 model for the text formats."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")

from neuron_batch.cli import main  # noqa: E402
from neuron_batch.job.folder import RunFolder  # noqa: E402

ENGINE = ["--max-num-seqs", "4", "--max-num-batched-tokens", "256", "--max-model-len", "1024",
          "--device", "cpu"]




def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def token_prompts(n, max_tokens=5):
    rows = []
    for i in range(n):
        if i % 2:
            rows.append({"id": f"q{i}", "prompt_len": 20 + 37 * i % 400, "max_tokens": max_tokens})
        else:
            rows.append({"id": f"q{i}", "prompt_token_ids": [3 + (i + j) % 500 for j in range(
                10 + 53 * i % 300)], "max_tokens": max_tokens})
    return rows


def invoke(args):
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    return result


def read_outputs(folder):
    return [json.loads(line) for line in (Path(folder) / "outputs.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def cpu_run(tiny_model, tmp_path_factory):
    """One run of 10 token prompts on the CPU, with a metrics textfile: (folder, textfile)."""
    tmp_path = tmp_path_factory.mktemp("cpu-run")
    prompts = write_jsonl(tmp_path / "p.jsonl", token_prompts(10))
    out = tmp_path / "run"
    textfile = tmp_path / "metrics.prom"
    result = invoke(["run", prompts, "--model", tiny_model, *ENGINE, "-o", str(out),
                     "--metrics-textfile", str(textfile)])
    assert result.exit_code == 0, result.output
    return out, textfile


def test_run_writes_every_output_once(cpu_run):
    out, _ = cpu_run
    rows = read_outputs(out)
    assert sorted(r["id"] for r in rows) == sorted(f"q{i}" for i in range(10))
    assert all(r["num_output_tokens"] == 5 for r in rows)


def test_the_report_agrees_with_the_outputs(cpu_run):
    out, _ = cpu_run
    rows = read_outputs(out)
    report = json.loads((out / "report.json").read_text())
    # the report agrees with the outputs and the records
    assert report["requests"] == {"total": 10, "completed": 10, "failed": 0, "skipped": 0,
                                  "pending": 0, "max_tokens_clamped": 0,
                                  "max_tokens_clamped_to": None, "empty_outputs": 0}
    assert report["tokens"]["output"] == sum(r["num_output_tokens"] for r in rows)
    assert report["tokens"]["input"] == sum(r["num_prompt_tokens"] for r in rows)


def test_the_report_is_consistent_with_its_records(cpu_run):
    out, _ = cpu_run
    report = json.loads((out / "report.json").read_text())
    prefill, decode = report["padding"]["prefill"], report["padding"]["decode"]
    assert prefill["padded_tokens"] >= prefill["actual_tokens"] == report["tokens"]["input"]
    assert decode["padded_seqs"] >= decode["actual_seqs"]
    state_seconds = sum(s["seconds"] for s in report["states"].values())
    assert state_seconds == pytest.approx(report["throughput"]["elapsed_s"], rel=1e-9)
    assert set(report["admission_blocked"]) == {"at_capacity", "prefill_in_running",
                                                "prefill_batch_full", "kv_saturated"}
    for key in ("elapsed_time", "num_requests", "total_num_tokens", "requests_per_second",
                "tokens_per_second"):
        assert key in report
    assert report["config"]["device"] == "cpu"


def test_the_caching_decision_the_bound_and_the_report_use_one_block_size(cpu_run):
    """The CPU summary said "no KV block of 32 tokens" (the decision's own default) while
    report.json said block_size 128 (vLLM's CPU engine): the engine is now given the one block
    size (engine.run_block_size) that the decision, the order and the bound read."""
    out, _ = cpu_run
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["block_size"] == 128
    assert report["prefix_caching"]["figures"]["block_size"] == 128
    assert "KV block of 128 tokens" in report["prefix_caching"]["reason"]
    summary = invoke(["report", str(out)]).output
    assert "32 tokens" not in summary


def test_the_run_writes_its_metrics_textfile(cpu_run):
    _, textfile = cpu_run
    text = textfile.read_text()
    assert "neuron_batch_throughput_output_tokens_per_second" in text
    [exit_line] = [line for line in text.splitlines()
                   if line.startswith("neuron_batch_last_run_exit_code{")]
    assert exit_line.endswith(" 0")     # every request done


def test_report_prints_the_same_summary_again(cpu_run):
    out, _ = cpu_run
    # `report DIR` prints the same summary again
    again = invoke(["report", str(out)])
    assert again.exit_code == 0 and "Prefill padding" in again.output


def test_the_report_reads_back_typed_as_it_was_written(cpu_run):
    from neuron_batch.report.model import SCHEMA_VERSION, Report

    out, _ = cpu_run
    text = (out / "report.json").read_text()
    data = json.loads(text)
    assert list(data)[0] == "schema_version" and data["schema_version"] == SCHEMA_VERSION
    # key for key, in order
    assert json.dumps(Report.from_dict(data).to_dict()) == json.dumps(data)


def test_report_reads_an_older_folder(cpu_run, tmp_path):
    """A folder an older version wrote (no schema_version, no prefix-cache, cost or attempts
    sections) still prints its summary."""
    out, _ = cpu_run
    data = json.loads((out / "report.json").read_text())
    for key in ("schema_version", "prefix_cache", "prefix_caching", "attempts", "kv", "cost",
                "latency"):
        data.pop(key, None)
    old = tmp_path / "old"
    old.mkdir()
    (old / "report.json").write_text(json.dumps(data))
    again = invoke(["report", str(old)])
    assert again.exit_code == 0, again.output
    assert "10 completed of 10" in again.output and str(old) in again.output


def test_bad_input_stops_before_the_model_loads(tiny_model, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt_len": 30}\n{"prompt_len": \n{"prompt": ""}\n')
    out = tmp_path / "run"
    result = invoke(["run", str(path), "--model", tiny_model, *ENGINE, "-o", str(out)])
    assert result.exit_code == 2
    assert f"{path}:2" in result.output and f"{path}:3" in result.output
    # stopped while reading the input: no run folder, so no engine was ever started
    assert not out.exists()


def test_prompt_longer_than_max_model_len_is_named(tiny_model, tmp_path):
    path = write_jsonl(tmp_path / "long.jsonl", [{"prompt_len": 30}, {"prompt_len": 5000}])
    result = invoke(["run", path, "--model", tiny_model, *ENGINE, "-o", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert f"{path}:2: field 'prompt_len': the prompt has 5,000 tokens" in result.output


def test_on_error_skip_runs_the_rest_and_exits_partial(tiny_model, tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"id": "a", "prompt_len": 30, "max_tokens": 3}\nnot json\n'
                    '{"id": "b", "prompt_len": 40, "max_tokens": 3}\n')
    out = tmp_path / "run"
    result = invoke(["run", str(path), "--model", tiny_model, *ENGINE, "-o", str(out),
                     "--on-error", "skip"])
    assert result.exit_code == 3, result.output
    assert sorted(r["id"] for r in read_outputs(out)) == ["a", "b"]
    report = json.loads((out / "report.json").read_text())
    assert report["requests"]["skipped"] == 1 and report["requests"]["total"] == 3


def test_invalid_buckets_are_a_usage_error(tiny_model, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", token_prompts(2))
    result = invoke(["run", path, "--model", tiny_model, *ENGINE, "--prefill-buckets",
                     "512,128"])
    assert result.exit_code == 2
    assert "--prefill-buckets must be in ascending order" in result.output


def test_a_locked_folder_is_refused_at_once(tiny_model, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", token_prompts(2))
    out = tmp_path / "run"
    holder = RunFolder(out)
    holder.lock()
    try:
        result = invoke(["run", path, "--model", tiny_model, *ENGINE, "-o", str(out)])
    finally:
        holder.unlock()
    assert result.exit_code == 5
    assert "in use by another neuron-batch run" in result.output


#: `neuron-batch run`, saying on stderr as it exits which heavy libraries it had imported.
IMPORTS_AT_EXIT = ("import atexit, sys\n"
                   "atexit.register(lambda: print('imported:', [m for m in ('vllm', 'torch', "
                   "'transformers') if m in sys.modules], file=sys.stderr))\n"
                   "from neuron_batch.cli import main\n"
                   "main(sys.argv[1:], prog_name='neuron-batch')\n")


def test_a_folder_in_use_is_refused_before_anything_heavy_loads(tmp_path):
    """The refusal took 4-6 s (the inputs tokenized, the model's tokenizer loaded, then the
    lock): it comes now before vLLM, torch or transformers is imported."""
    out = tmp_path / "run"
    holder = RunFolder(out)
    holder.lock()
    try:
        done = subprocess.run([sys.executable, "-c", IMPORTS_AT_EXIT, "run", "--device", "cpu",
                               "-o", str(out)], capture_output=True, text=True, timeout=300)
    finally:
        holder.unlock()
    assert done.returncode == 5, done.stderr
    assert "in use by another neuron-batch run" in done.stderr
    assert "imported: []" in done.stderr


def test_a_second_run_on_the_same_output_needs_resume(tiny_model, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", token_prompts(3))
    out = tmp_path / "run"
    assert invoke(["run", path, "--model", tiny_model, *ENGINE, "-o", str(out)]).exit_code == 0
    again = invoke(["run", path, "--model", tiny_model, *ENGINE, "-o", str(out)])
    assert again.exit_code == 2 and "--resume" in again.output
    done = invoke(["run", path, "--model", tiny_model, *ENGINE, "-o", str(out), "--resume"])
    assert done.exit_code == 0 and len(read_outputs(out)) == 3


class StepClock:
    """A clock that advances a fixed amount each time it is read: --max-runtime then trips after
    a fixed number of engine steps, however fast or loaded the machine is."""

    def __init__(self, seconds_per_read: float):
        self.now, self.step = 0.0, seconds_per_read

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_max_runtime_stops_cleanly_and_resume_finishes(tiny_model, tmp_path, monkeypatch):
    from neuron_batch.job import generate

    path = write_jsonl(tmp_path / "p.jsonl", token_prompts(40, max_tokens=40))
    out = tmp_path / "run"
    # 0.5 s of runtime at 0.005 s per step: the deadline comes after 100 engine steps, when some
    # of the 40 x 40-token requests have finished and most have not (they need > 400 steps).
    monkeypatch.setattr(generate, "runtime_clock", StepClock(0.005))
    first = invoke(["run", path, "--model", tiny_model, *ENGINE, "-o", str(out),
                    "--max-runtime", "0.5"])
    assert first.exit_code == 4, first.output
    kept = read_outputs(out)
    assert 0 < len(kept) < 40
    monkeypatch.setattr(generate, "runtime_clock", time.monotonic)
    second = invoke(["run", path, "--model", tiny_model, *ENGINE, "-o", str(out), "--resume"])
    assert second.exit_code == 0, second.output
    rows = read_outputs(out)
    assert sorted(r["id"] for r in rows) == sorted(f"q{i}" for i in range(40))
    report = json.loads((out / "report.json").read_text())
    assert report["requests"]["completed"] == 40
    assert [a["ended"] for a in report["attempts"]] == ["deadline", "completed"]


def _start_run(args, env=None):
    return subprocess.Popen([sys.executable, "-m", "neuron_batch.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})


def _wait_for_lines(path, count, proc, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= count:
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stdout.read().decode()[-2000:]}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("no outputs appeared")


def test_a_stop_before_any_step_is_recorded_exits_4_and_resumes(tiny_model, tmp_path,
                                                                monkeypatch):
    """--max-runtime can end a run before any engine recorded a step (Ray's replicas still
    loading): no report to build, nothing lost; exit 4, one line under --quiet, --resume runs
    every request."""
    import neuron_batch.run.runner as runner

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(3)))
    out = tmp_path / "run"
    args = ["run", str(prompts), "--model", tiny_model, "--device", "sim", "--max-tokens", "4",
            "-o", str(out)]
    real = runner._generate_all
    monkeypatch.setattr(runner, "_generate_all", lambda *a: {"ended": "deadline"})
    stopped = CliRunner().invoke(main, [*args, "-q"])
    assert stopped.exit_code == 4, stopped.output
    assert "--max-runtime reached before any request ran" in stopped.output
    assert not (out / "report.json").exists()
    monkeypatch.setattr(runner, "_generate_all", real)
    resumed = CliRunner().invoke(main, [*args, "-q", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert len((out / "outputs.jsonl").read_text().splitlines()) == 3


@pytest.mark.parametrize("how", ["kill9", "sigterm"])
def test_a_killed_run_resumes_without_loss_or_duplicates(tiny_model, tmp_path, how):
    path = write_jsonl(tmp_path / "p.jsonl", token_prompts(60, max_tokens=60))
    out = tmp_path / "run"
    proc = _start_run(["run", path, "--model", tiny_model, *ENGINE, "-o", str(out), "-q"])
    _wait_for_lines(out / "outputs.jsonl", 5, proc)
    if how == "kill9":
        proc.kill()
        proc.wait()
    else:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=600) == 4
    partial = read_outputs(out)
    assert 5 <= len(partial) < 60
    resumed = invoke(["run", path, "--model", tiny_model, *ENGINE, "-o", str(out), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    ids = [r["id"] for r in read_outputs(out)]
    assert len(ids) == len(set(ids)) == 60
    report = json.loads((out / "report.json").read_text())
    assert report["requests"]["completed"] == 60
    assert report["tokens"]["output"] == 60 * 60 == sum(r["num_output_tokens"]
                                                        for r in read_outputs(out))
    # the attempt killed -9 wrote no line of its own: the resume wrote it, with its outputs
    first = report["attempts"][0]
    assert first["ended"] == ("killed" if how == "kill9" else "interrupted")
    assert first["requests_finished"] == len(partial)


def test_every_input_format_through_the_builtin_model(tmp_path):
    """Text, CSV, Parquet, OpenAI batch (chat) and a saved data set in one run, with the
    built-in SmolLM2 model (real tokenizer, chat template, text out) and a TOML job file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import datasets

    (tmp_path / "a.txt").write_text("The capital of France is\n\nOne, two, three,\n")
    (tmp_path / "b.csv").write_text('id,prompt\nc1,"Hello, my name is"\n')
    pq.write_table(pa.table({"id": ["p1"], "prompt": ["The sky is"]}), tmp_path / "c.parquet")
    write_jsonl(tmp_path / "d.jsonl", [{"custom_id": "o1", "method": "POST",
                                        "url": "/v1/chat/completions",
                                        "body": {"model": "x", "max_tokens": 3, "messages": [
                                            {"role": "user", "content": "Say hi"}]}}])
    datasets.Dataset.from_dict({"id": ["h1"], "prompt": ["Once upon a time"]}).save_to_disk(
        str(tmp_path / "e"))
    job = tmp_path / "job.toml"
    job.write_text('max-tokens = 3\nmax-num-seqs = 4\ndevice = "cpu"\nmax-model-len = 512\n'
                   'max-num-batched-tokens = 512\n')
    out = tmp_path / "run"
    result = invoke(["run", *(str(tmp_path / n) for n in ("a.txt", "b.csv", "c.parquet",
                                                          "d.jsonl", "e")),
                     "--config", str(job), "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = read_outputs(out)
    assert len(rows) == 6
    openai = [r for r in rows if "custom_id" in r]
    assert [r["custom_id"] for r in openai] == ["o1"]
    body = openai[0]["response"]["body"]
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] <= 3
    plain = {r["id"]: r for r in rows if "custom_id" not in r}
    assert set(plain) == {"0", "1", "c1", "p1", "h1"}
    assert all(isinstance(r["output"], str) and r["num_output_tokens"] <= 3
               for r in plain.values())
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["max_num_seqs"] == 4 and report["config"]["max_tokens"] == 3


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_quiet_run_prints_nothing_and_logs_the_engine(tiny_model, tmp_path, device):
    """Under --quiet a successful run writes not one byte to stdout or stderr (cron mails every
    line): vLLM's logs, the kernels' C++ warnings and loading bars go to engine.log."""
    path = write_jsonl(tmp_path / "p.jsonl", token_prompts(6))
    out = tmp_path / "run"
    extra = ["--instance", "inf2.xlarge", "--architecture", "tinyllama-1.1b"] \
        if device == "sim" else []
    engine = [*ENGINE[:-1], device, *extra]
    proc = subprocess.run([sys.executable, "-m", "neuron_batch.cli", "run", path, "--model",
                           tiny_model, *engine, "-o", str(out), "-q"],
                          capture_output=True, timeout=600,
                          env={**os.environ, "VLLM_LOGGING_LEVEL": "INFO"})
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout == b"" and proc.stderr == b""
    assert len(read_outputs(out)) == 6
    assert "INFO" in (out / "engine.log").read_text()


def test_kv_reserve_from_a_job_file_reaches_the_scheduler_and_the_report(tmp_path):
    """`kv-reserve` in a TOML job file (or --kv-reserve) picks the KV admission rule; the report
    records it with the KV figures, and under max-model-len the summary says what request
    would do when kv_saturated holds the run back."""
    path = write_jsonl(tmp_path / "p.jsonl", [{"id": f"r{i}", "prompt_len": 200 + 10 * i,
                                              "max_tokens": 40} for i in range(30)])
    job = tmp_path / "job.toml"
    # (the rules are the Beta plugin's, whose paged cache they govern: runtime vllm-neuron,
    # on trn2, the hardware AWS ships it for)
    job.write_text('kv-reserve = "max-model-len"\ndevice = "sim"\nmax-num-seqs = 32\n'
                   'runtime = "vllm-neuron"\nmax-model-len = 8192\n'
                   '[sim]\narchitecture = "llama-3-8b"\ninstance = "trn2.3xlarge"\n')
    sim = ["--max-num-batched-tokens", "2048"]
    reports = {}
    for rule, extra in (("max_model_len", []), ("request", ["--kv-reserve", "request"])):
        out = tmp_path / rule
        result = invoke(["run", path, "--config", str(job), *sim, *extra, "-o", str(out)])
        assert result.exit_code == 0, result.output
        reports[rule] = report = json.loads((out / "report.json").read_text())
        assert report["config"]["kv_reserve"] == rule and report["preemptions"] == 0
        assert set(report["kv"]) == {"num_blocks", "peak_reserved_blocks", "peak_used_blocks",
                                     "mean_used_fraction"}
        assert report["kv"]["peak_used_blocks"] <= report["kv"]["peak_reserved_blocks"]
        flat = " ".join(result.output.split())
        assert ("--kv-reserve request reserves each request's own prompt" in flat) == (
            rule == "max_model_len")
    # the KV cache (30% of a trn2 chip's 96 GiB) holds 28 requests at max_model_len 8192:
    # request runs all 30 at once
    assert reports["max_model_len"]["admission_blocked"]["kv_saturated"] > 0
    assert reports["request"]["admission_blocked"]["kv_saturated"] == 0
    assert reports["request"]["throughput"]["output_tokens_per_s"] > \
        reports["max_model_len"]["throughput"]["output_tokens_per_s"]


def test_kv_reserve_is_checked_before_anything_runs(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", token_prompts(2))
    bad = invoke(["run", path, "--device", "sim", "--kv-reserve", "sometimes"])
    assert bad.exit_code == 2 and "--kv-reserve must be one of request, max-model-len" in \
        bad.output
    two = invoke(["run", path, "--device", "sim", "--kv-reserve", "request,max-model-len"])
    assert two.exit_code == 2 and "neuron-batch bench --kv-reserve" in two.output
    # inf2 runs nxdi, whose static cache the rule cannot govern: said before anything runs
    static = invoke(["run", path, "--device", "sim", "--kv-reserve", "max-model-len"])
    assert static.exit_code == 2 and "does not apply under the nxdi runtime" in static.output


def test_report_of_a_run_folder_without_a_report_says_what_happened(tmp_path):
    """Issue 49: `report` on a run that failed before its report asked whether the folder was
    a run folder; it says the run failed, why, and how to finish it."""
    import json

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").write_text("{}")
    (folder / "attempts.json").write_text(json.dumps(
        [{"attempt": 1, "ended": "failed", "error": "engine core died"}]))
    result = CliRunner().invoke(main, ["report", str(folder)])
    assert result.exit_code != 0
    assert "is a run folder without a report" in result.output
    assert "1 failed before writing one: engine core died" in result.output
    assert "--resume" in result.output and "is it a neuron-batch run folder" not in result.output
    elsewhere = CliRunner().invoke(main, ["report", str(tmp_path)])
    assert "a neuron-batch run folder?" in elsewhere.output


_SPLIT_RUN = """
import json, sys
from neuron_batch.job import check_parts, generate
check_parts.MIN_LINES, check_parts.PART_LINES = 0, 100    # (a small job's check split)
prefetch = generate.prefetch_vllm
def spied():
    prefetch()
    with open(sys.argv[1], "w") as seen:
        json.dump({"imported": "vllm.entrypoints.llm" in sys.modules,
                   "said": "".join(generate._prefetched)}, seen)
generate.prefetch_vllm = spied
from neuron_batch.cli import main
main(sys.argv[2:])
"""


def test_a_split_checks_processes_run_while_this_one_imports_vllm_and_quiet_stays_silent(
        tmp_path):
    """Where the check is split across processes, this one imports vLLM meanwhile
    (job/generate.py `prefetch_vllm`); under --quiet nothing reaches the terminal still, and
    what vLLM said as it was imported heads the run's engine.log."""
    path = write_jsonl(tmp_path / "p.jsonl", token_prompts(400, max_tokens=2))
    out, seen = tmp_path / "run", tmp_path / "seen"
    proc = subprocess.run(
        [sys.executable, "-c", _SPLIT_RUN, str(seen), "run", path, "--device", "sim",
         "--instance", "inf2.xlarge", "--architecture", "tinyllama-1.1b", "-o", str(out), "-q"],
        capture_output=True, timeout=600,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "INFO", "NEURON_BATCH_CHECK_PROCESSES": "2",
             "NEURON_BATCH_PREFETCH_VLLM": "1"})     # (whatever the cores: runner.py)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stdout == b"" and proc.stderr == b""
    prefetched = json.loads(seen.read_text())
    assert prefetched["imported"]           # (during the check, before the folder was made)
    assert len(read_outputs(out)) == 400
    assert prefetched["said"] and (out / "engine.log").read_text().startswith(
        prefetched["said"])


def test_vllm_is_imported_during_the_check_by_default_only_with_cores_to_spare(monkeypatch):
    """runner.py `_engine_prefetch`: on the CPU or the simulated device, from PREFETCH_CORES
    cores (with fewer the import only slows the check's processes), or as
    NEURON_BATCH_PREFETCH_VLLM says; never for Ray's replicas or a Neuron host."""
    from neuron_batch.job import check_parts
    from neuron_batch.run import runner
    from neuron_batch.settings import RunSettings

    def prefetch(device, cores, wanted=None, **more):
        monkeypatch.setattr(check_parts, "cores", lambda: cores)
        if wanted is None:
            monkeypatch.delenv("NEURON_BATCH_PREFETCH_VLLM", raising=False)
        else:
            monkeypatch.setenv("NEURON_BATCH_PREFETCH_VLLM", wanted)
        return runner._engine_prefetch(RunSettings.of(("x",), device=device, **more))

    assert prefetch("sim", runner.PREFETCH_CORES) is not None
    assert prefetch("cpu", 16) is not None
    assert prefetch("sim", runner.PREFETCH_CORES - 1) is None
    assert prefetch("sim", 2, "1") is not None
    assert prefetch("sim", 16, "0") is None
    assert prefetch("neuron", 16, "1") is None
    assert prefetch("sim", 16, replicas=2) is None
