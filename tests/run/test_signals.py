"""SIGTERM and SIGINT in every phase of a run end the same way (job/stop.py, docs/cron.md):
exit 4 (0 when every request had completed), one line saying what was done and how to
resume, and the attempt in attempts.json; a second signal stops at once. Real processes, the
CPU engine and the simulated device; each is held at the phase's start by the test hook
(NEURON_BATCH_TEST_PAUSE) so that the signal lands in that phase, not wherever a sleep ends.
One small workload throughout: a request that ends after 2 tokens while the others need 40,
so that "running" is reached with requests still in flight."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuron_batch.job.stop import (
    PAUSE_ENV,
    PAUSE_FILE_ENV,
    READING,
    REPORTING,
    RUNNING,
    STARTING,
    Interrupted,
    RunSignals,
    hold_early_signals,
    release_early_signals,
)

ROWS = [{"id": f"r{i}", "prompt_len": 40 + 8 * i, "max_tokens": 2 if i == 0 else 40}
        for i in range(6)]
SIM = ["--device", "sim", "--instance", "inf2.8xlarge", "--architecture", "llama-3.1-8b",
       "--max-model-len", "1024", "--max-num-seqs", "4"]
CPU = ["--max-num-seqs", "4", "--max-num-batched-tokens", "256", "--max-model-len", "1024",
       "--device", "cpu", "--ignore-eos"]


def device_args(device, tiny_model):
    return SIM if device == "sim" else ["--model", tiny_model, *CPU]


def workload(tmp_path) -> str:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return str(path)


def signalled_run(tmp_path, args, phase, signums, extra=()):
    """Run `neuron-batch run`, held at `phase` until it has received `signums` (one after
    the other); returns (exit code, stdout, stderr, the run folder)."""
    out, marker = tmp_path / "run", tmp_path / "paused"
    env = {**os.environ, PAUSE_ENV: f"{phase},{len(signums)}", PAUSE_FILE_ENV: str(marker)}
    proc = subprocess.Popen([sys.executable, "-m", "neuron_batch.cli", "run", workload(tmp_path),
                             *args, "-o", str(out), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 600
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"never reached {phase!r}: {proc.communicate()}")
        time.sleep(0.05)
    for signum in signums:
        proc.send_signal(signum)
        if len(signums) > 1:       # the next one after the process has taken this one
            time.sleep(0.5)
    stdout, stderr = proc.communicate(timeout=600)
    return proc.returncode, stdout, stderr, out


def attempts(out: Path) -> list[dict]:
    return json.loads((out / "attempts.json").read_text())


# -- the handler itself, in this process ----------------------------------------------------

@pytest.fixture(autouse=True)
def _handlers_as_a_fresh_process_has_them():
    """These tests start from the handlers a fresh interpreter has: an earlier test in this
    process (a library it ran) can leave SIGINT ignored, and the run's handler puts back
    whatever it found."""
    found = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for signum, handler in found.items():
        signal.signal(signum, handler)


def test_a_phase_that_does_not_wait_stops_at_once_and_a_waiting_one_at_its_end():
    with RunSignals() as signals:
        with pytest.raises(Interrupted) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        assert (stopped.value.signal, stopped.value.phase) == ("SIGTERM", READING)
    with RunSignals() as signals:
        signals.enter(RUNNING, defer=True)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert (signals.reason, signals.signal) == ("interrupted", "SIGINT")
        with pytest.raises(Interrupted) as stopped:     # the next phase that does not wait
            signals.enter(STARTING)
        assert stopped.value.phase == STARTING and not stopped.value.insisted
    with RunSignals() as signals:
        signals.enter(REPORTING, defer=True)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        with pytest.raises(Interrupted) as stopped:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        assert stopped.value.insisted and stopped.value.signal == "SIGINT"
    # the handlers before the run are back
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_handler_taken_meanwhile_is_taken_back_at_the_next_phase():
    """Ray's driver takes SIGTERM in ray.init, after the run's handler is in: the engine loop's
    phase takes it back (a SIGTERM on --replicas aborted the driver, exit -6), and the run's
    end puts back the handler from before the run, not Ray's."""
    before = signal.getsignal(signal.SIGTERM)
    with RunSignals() as signals:
        signal.signal(signal.SIGTERM, lambda *_: os.abort())
        signals.enter(RUNNING, defer=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert signals.reason == "interrupted"
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_signal_held_before_the_run_handler_stops_the_run_at_its_first_phase():
    """The command line holds a signal while it imports (hold_early_signals); the run's handler
    takes it as one that came while the inputs were read; the handlers found come back."""
    before = signal.getsignal(signal.SIGTERM)
    hold_early_signals()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)            # held: nothing raised, the process goes on
    except BaseException:
        release_early_signals(deliver=False)
        raise
    with RunSignals() as signals:
        assert signal.getsignal(signal.SIGTERM) == signals._handle
        with pytest.raises(Interrupted) as stopped:
            signals.enter(READING)
        assert (stopped.value.signal, stopped.value.phase) == ("SIGTERM", READING)
    assert signal.getsignal(signal.SIGTERM) == before
    # a command other than run gets a held signal back as it came (SIGINT: KeyboardInterrupt)
    hold_early_signals()
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)
    with pytest.raises(KeyboardInterrupt):
        release_early_signals()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


#: `neuron-batch run` as its script starts it, from just before the CLI package imports (what
#: prints "up" is already imported there, so "up" comes a few microseconds before the hold).
EARLY_CHILD = ("import sys; sys.argv = ['neuron-batch', *sys.argv[1:]]; "
               "import neuron_batch.job.stop; print('up', flush=True); "
               "from neuron_batch.cli import main; main()")


@pytest.mark.parametrize("delay", [0.03, 0.1, 0.2, 0.3, 0.5])
def test_a_sigterm_in_the_first_moments_of_run_exits_4(tmp_path, delay):
    """Before the run's handler is in (click and the commands importing, the options parsed:
    the first ~0.3 s), a SIGTERM killed the process (exit 143); now it ends like one while
    the inputs are read: exit 4, its line and the attempt."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", EARLY_CHILD, "run", workload(tmp_path), *SIM,
                             "-o", str(out), "-q"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 4, (proc.returncode, stderr)
    # (the inputs are read from about 0.3 s on a quiet machine; later, the engine starts)
    phase = attempts(out)[0]["phase"]
    assert phase in (READING, STARTING), phase
    assert stderr.startswith("neuron-batch: Stopped by SIGTERM while "
                             + ("reading the inputs" if phase == READING
                                else "starting the engine")), stderr


# -- before the engine runs: stopped there and then ------------------------------------------

@pytest.mark.parametrize("device", ["cpu", "sim"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("phase", [READING, STARTING])
def test_a_signal_before_the_engine_runs_exits_4_with_the_attempt(tmp_path, tiny_model, device,
                                                                  signum, phase):
    if phase == STARTING:
        pytest.importorskip("vllm")
    code, stdout, stderr, out = signalled_run(tmp_path, device_args(device, tiny_model), phase,
                                              [signum], ["-q"])
    name = signal.Signals(signum).name
    assert code == 4, stderr
    assert stdout == ""
    line, = stderr.splitlines()      # -q: only the line (no "Aborted!", no traceback)
    assert line.startswith(f"neuron-batch: Stopped by {name} while {phase}: ")
    assert "rerun with --resume" in line and line.endswith(f"Run folder: {out}")
    if phase == STARTING:
        assert "0 of 6 requests done, 6 pending" in line
    attempt, = attempts(out)
    assert attempt["ended"] == "interrupted" and attempt["attempt"] == 1
    assert (attempt["signal"], attempt["phase"], attempt["requests_finished"]) == (name, phase, 0)


def test_a_signal_while_reading_leaves_another_jobs_folder_alone(tmp_path):
    """Before the folder is checked against this job, a run there is not written to."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("{}")
    code, _, stderr, _ = signalled_run(tmp_path, SIM, READING, [signal.SIGTERM])
    assert code == 4 and "Stopped by SIGTERM while reading the inputs" in stderr
    assert not (out / "attempts.json").exists()


# -- while requests run and while the report is written: the phase finishes first ------------

@pytest.mark.parametrize(("device", "signum"), [("cpu", signal.SIGINT), ("sim", signal.SIGTERM)])
def test_a_signal_while_running_keeps_what_finished_and_resume_finishes(tmp_path, tiny_model,
                                                                        device, signum):
    """(SIGTERM on the CPU and SIGINT on sim while running: test_run_cli.py and
    report/test_summary_words.py.)"""
    pytest.importorskip("vllm")
    args = device_args(device, tiny_model)
    code, stdout, stderr, out = signalled_run(tmp_path, args, RUNNING, [signum], ["-q"])
    name = signal.Signals(signum).name
    assert code == 4, stderr
    assert stdout == ""
    line, = stderr.splitlines()
    assert line.startswith(f"neuron-batch: Stopped by {name}: 1 of 6 requests done, 5 pending; "
                           f"rerun with --resume")
    attempt, = attempts(out)
    assert (attempt["ended"], attempt["signal"], attempt["requests_finished"]) == (
        "interrupted", name, 1)
    # batch.json, OpenAI's Batch object, says so too (issue 47)
    batch = json.loads((out / "batch.json").read_text())
    assert batch["status"] == "cancelled" and batch["cancelled_at"] is not None
    assert batch["request_counts"] == {"total": 6, "completed": 1, "failed": 0}
    if device == "sim":
        resumed = subprocess.run([sys.executable, "-m", "neuron_batch.cli", "run",
                                  workload(tmp_path), *args, "-o", str(out), "--resume", "-q"],
                                 capture_output=True, text=True, timeout=600)
        assert (resumed.returncode, resumed.stdout, resumed.stderr) == (0, "", "")
        ids = [json.loads(row)["id"] for row in (out / "outputs.jsonl").read_text().splitlines()]
        assert sorted(ids) == [row["id"] for row in ROWS]
        assert [a["ended"] for a in attempts(out)] == ["interrupted", "completed"]
        resumed_batch = json.loads((out / "batch.json").read_text())
        assert (resumed_batch["id"], resumed_batch["created_at"]) == (batch["id"],
                                                                      batch["created_at"])
        assert resumed_batch["status"] == "completed"
        assert resumed_batch["request_counts"] == {"total": 6, "completed": 6, "failed": 0}


@pytest.mark.parametrize(("device", "signum"), [("cpu", signal.SIGTERM), ("sim", signal.SIGINT)])
def test_a_signal_while_the_report_is_written_after_the_last_request_exits_0(
        tmp_path, tiny_model, device, signum):
    pytest.importorskip("vllm")
    code, stdout, stderr, out = signalled_run(tmp_path, device_args(device, tiny_model),
                                              REPORTING, [signum], ["-q"])
    assert (code, stdout, stderr) == (0, "", "")      # quiet: silent on success
    report = json.loads((out / "report.json").read_text())
    assert report["requests"]["completed"] == 6
    assert [a["ended"] for a in attempts(out)] == ["completed"]


def test_a_second_signal_stops_at_once(tmp_path):
    pytest.importorskip("vllm")
    code, stdout, stderr, out = signalled_run(tmp_path, SIM, RUNNING,
                                              [signal.SIGTERM, signal.SIGINT])
    assert code == 4, stderr
    assert stderr.splitlines()[-1].startswith(
        "neuron-batch: Stopped at once by a second signal after SIGTERM while running: 1 of 6 "
        "requests done, 5 pending; rerun with --resume to finish them.")
    assert "Traceback" not in stderr and not (out / "report.json").exists()
    attempt, = attempts(out)
    assert (attempt["attempt"], attempt["ended"], attempt["insisted"],
            attempt["requests_finished"]) == (1, "interrupted", True, 1)
