"""`neuron-batch run --replicas N` on a real Ray cluster on this machine: two nodes of one CPU
each, made with Ray's own `ray.cluster_utils.Cluster` (every node a real raylet). Runs on the
simulated device and on the CPU with the built-in model; kill -9 of a replica's process and of the
driver; `--replicas 1` through Ray against the plain path; a node lost for good.

Slow (each run starts Ray workers that import vLLM): the cluster is shared by the module and
the inputs are small. The README's suite runs two (the CPU's real engines on the two nodes,
one replica against the plain path); the fault and layout tests and the simulated device on
two nodes, marked `ray_faults`, ran 2x slower beside the suite's other worker and were a third
of its work: CI runs them in a step of their own (.ci/run), as can anyone, with
`-m ray_faults`.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")
pytest.importorskip("ray.data")
pytestmark = pytest.mark.ray

from neuron_batch.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "datasets" / "azure-llm-inference-conv-2023.csv"
SIM = ["--device", "sim", "--instance", "inf2.48xlarge", "--tensor-parallel-size", "4",
       "--architecture", "llama-3.1-8b", "--max-model-len", "8192",
       "--max-num-batched-tokens", "2048", "--max-num-seqs", "16"]
ENV = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="nbray", dir="/tmp")   # short: Ray's socket paths
    # The nodes' workers import this tree; Ray's files go to this cluster's own temp dir.
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "RAY_TMPDIR")}
    os.environ.update(PYTHONPATH=ENV["PYTHONPATH"], RAY_TMPDIR=temp)
    made = None
    try:
        made = Cluster(initialize_head=True,
                       head_node_args={"num_cpus": 1, "include_dashboard": False})
        made.add_node(num_cpus=1)
        made.wait_for_nodes()
        yield made
    finally:
        if made is not None:
            made.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def node_ids(cluster):
    return {node.node_id for node in cluster.list_all_nodes()}


def trace_slice(path: Path, n: int) -> str:
    rows = list(csv.reader(TRACE.open()))
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows(rows[:n + 1])
    return str(path)


def invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def outputs(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "outputs.jsonl").read_text().splitlines()]


def report_of(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


def assert_totals_match_replicas(report: dict) -> None:
    replicas = report["replicas"]
    assert sum(r["requests"] for r in replicas) == report["requests"]["completed"]
    assert sum(r["output_tokens"] for r in replicas) == report["tokens"]["output"]


def start_driver(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "neuron_batch.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, **ENV})


def wait_until(check, proc: subprocess.Popen, what: str, timeout: float = 400):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: "
                                 f"{proc.stdout.read().decode()[-3000:]}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"timed out waiting for {what}")


def resume_and_check_each_once(args: list[str], out: Path, total: int) -> dict:
    """`--resume` the run of `args` into `out`: it finishes, every request is in outputs.jsonl
    once and the report's totals match it; returns the report."""
    resumed = invoke([*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    ids = [row["id"] for row in outputs(out)]
    assert len(ids) == len(set(ids)) == total
    report = report_of(out)
    assert report["requests"]["completed"] == total
    assert report["tokens"]["output"] == sum(r["num_output_tokens"] for r in outputs(out))
    return report


def assert_resumed_placement(report: dict, stopped: set[int], placement: str) -> None:
    """The attempts a --resume ran (those not in `stopped`): under side-by-side, both parts
    side by side again where both were left; else each part left in turn across both
    replicas."""
    resumed = [a for a in report["attempts"] if "part" in a and a["attempt"] not in stopped]
    assert resumed
    if placement == "side-by-side" and len(resumed) == 2:
        assert [a["side_by_side"] for a in resumed] == [resumed[0]["attempt"]] * 2
    else:
        assert all(a["placement"]["mode"] == "in-turn" for a in resumed)
        assert all(a["placement"]["short_replicas"] == 2 for a in resumed)


def count_lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def replica_pid(folder: Path, replica: int) -> int | None:
    path = folder / f"records-1-r{replica}.jsonl"
    if not path.exists() or not path.read_text():
        return None
    return json.loads(path.read_text().splitlines()[0])["pid"]


# -- the two-node cluster ------------------------------------------------------------------------
@pytest.mark.ray_faults
def test_sim_replicas_on_two_nodes(cluster, node_ids, tmp_path, monkeypatch):
    """A trace on two simulated replicas, one on each node: every request once, the report's
    totals the replicas', batch.json written as they finish. The driver makes batches as the
    replicas drain (replicas/feed.py): the requests it holds (sent to the replicas, not yet
    written back) never pass two rounds of what every replica runs at once, a third of this
    job. (One run for both: each run starts two Ray workers that import vLLM.)"""
    from neuron_batch.replicas import feed

    held, caps = [], []
    real_send = feed.BatchFeed._send

    def send(self, number, batch):
        sent = real_send(self, number, batch)
        held.append(len(self.in_flight))
        caps.append(self._cap * self._size)
        return sent

    monkeypatch.setattr(feed.BatchFeed, "_send", send)
    out = tmp_path / "run"
    result = invoke(["run", trace_slice(tmp_path / "t.csv", 3000), *SIM, "--ray",
                     cluster.address, "--replicas", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    ids = [row["id"] for row in outputs(out)]
    assert len(ids) == len(set(ids)) == 3000
    assert len(held) == len(caps) > 100
    assert max(held) <= caps[0] < 3000 / 2
    report = report_of(out)
    assert report["requests"]["completed"] == 3000 and report["requests"]["pending"] == 0
    replicas = report["replicas"]
    assert {r["node"] for r in replicas} == node_ids          # both nodes used
    assert all(r["requests"] > 0 for r in replicas)
    assert_totals_match_replicas(report)
    assert report["throughput"]["elapsed_s"] == max(r["elapsed_s"] for r in replicas)
    assert report["config"]["replicas"] == 2
    assert [r["device"] for r in replicas] == ["sim inf2.48xlarge#0 cores 0-3",
                                               "sim inf2.48xlarge#0 cores 4-7"]
    assert "Replicas (2" in result.output                     # the terminal table
    batch = json.loads((out / "batch.json").read_text())      # written as the replicas finish
    assert batch["request_counts"] == {"total": 3000, "completed": 3000, "failed": 0}
    assert batch["usage"]["output_tokens"] == report["tokens"]["output"]


def test_every_batch_line_ends_in_one_record_on_cpu_replicas(cluster, node_ids, tmp_path):
    """An OpenAI batch file on two CPU replicas of the built-in model, one on each node, under
    --on-error skip: a line vLLM refuses when a replica adds it (a logit_bias id outside the
    vocabulary) is that line's error record, as on one engine, and the replica goes on;
    outputs.jsonl and errors.jsonl joined by custom_id hold every line once, batch.json counts
    them, and the report's totals are the replicas'. (One CPU run for both: two CPU engines
    in Ray workers take a minute or two to start here.)"""
    def line(custom_id: str, **body) -> dict:
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                         "max_tokens": 3, **body}}

    rows = [*[line(f"ok-{i}") for i in range(5)], line("bias", logit_bias={"99999999": 5}),
            {"custom_id": "moderation", "method": "POST", "url": "/v1/moderations",
             "body": {"input": "hi"}}]
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "run"
    result = invoke(["run", str(path), "--device", "cpu", "--max-model-len", "256",
                     "--ray", cluster.address, "--replicas", "2", "--on-error", "skip", "-q",
                     "-o", str(out)])
    assert result.exit_code == 3, result.output          # partial: two lines failed
    errors = [json.loads(x) for x in (out / "errors.jsonl").read_text().splitlines()]
    ended = {row["custom_id"]: "ok" for row in outputs(out)}
    assert len(ended) == len(outputs(out)) == 5
    codes = {row["custom_id"]: row["error"]["code"] for row in errors}
    assert len(codes) == len(errors) and not set(codes) & set(ended)
    assert all(isinstance(row["response"]["body"]["choices"][0]["message"]["content"], str)
               for row in outputs(out))              # real text from SmolLM2
    assert ended | codes == {**{f"ok-{i}": "ok" for i in range(5)},
                             "bias": "engine_refused", "moderation": "invalid_request"}
    assert "vLLM refused the request" in errors[[r["custom_id"] for r in errors].index(
        "bias")]["error"]["message"]
    batch = json.loads((out / "batch.json").read_text())
    assert batch["request_counts"] == {"total": 7, "completed": 5, "failed": 2}
    report = report_of(out)
    assert {r["node"] for r in report["replicas"]} == node_ids
    assert_totals_match_replicas(report)
    assert report["latency"]["e2e_s"]["mean"] is not None
    assert report["config"]["device"] == "cpu"


@pytest.mark.ray_faults
def test_a_killed_replica_is_restarted_and_nothing_is_lost(cluster, tmp_path):
    out = tmp_path / "run"
    proc = start_driver(["run", trace_slice(tmp_path / "t.csv", 800), *SIM,
                         "--ray", cluster.address, "--replicas", "2", "-q", "-o", str(out)])
    pid = wait_until(lambda: replica_pid(out, 0), proc, "replica 0 reported its pid")
    wait_until(lambda: count_lines(out / "outputs.jsonl") >= 60, proc, "some outputs")
    os.kill(pid, signal.SIGKILL)
    assert proc.wait(timeout=600) == 0, proc.stdout.read().decode()[-3000:]
    ids = [row["id"] for row in outputs(out)]
    assert len(ids) == len(set(ids)) == 800
    report = report_of(out)
    assert report["requests"]["completed"] == 800
    assert_totals_match_replicas(report)
    assert report["replicas"][0]["restarts"] >= 1
    assert (out / "records-1-r0-restart1.jsonl").exists()
    assert pid in report["attempts"][0]["replicas"][0]["pids"]


def test_one_replica_through_ray_counts_as_the_plain_path(cluster, tmp_path):
    trace = trace_slice(tmp_path / "t.csv", 120)
    plain, ray = tmp_path / "plain", tmp_path / "ray"
    assert invoke(["run", trace, *SIM, "-q", "-o", str(plain)]).exit_code == 0
    result = invoke(["run", trace, *SIM, "--ray", cluster.address, "-q", "-o", str(ray)])
    assert result.exit_code == 0, result.output
    a, b = report_of(plain), report_of(ray)
    assert "replicas" not in a and len(b["replicas"]) == 1
    assert a["requests"] == b["requests"]
    assert a["tokens"] == b["tokens"]
    # what the workload fixes: prefill chunks per bucket, decode tokens; batching may differ
    assert a["padding"]["prefill"] == b["padding"]["prefill"]
    assert a["padding"]["decode"]["actual_seqs"] == b["padding"]["decode"]["actual_seqs"]
    assert a["steps"]["prefill"] == b["steps"]["prefill"]
    assert set(a["admission_blocked"]) == set(b["admission_blocked"])
    assert b["replicas"][0]["requests"] == a["requests"]["completed"]


@pytest.mark.ray_faults
@pytest.mark.parametrize("split", [[], ["--split-at", "2048", "--split-placement",
                                          "side-by-side"]], ids=["one-pool", "side-by-side"])
def test_sigterm_stops_the_replicas_and_resume_finishes(cluster, tmp_path, split):
    """SIGTERM as for one engine: exit 4 with the reason, outputs kept, --resume finishes; side
    by side too, even when one part's pool had finished before the other was stopped. One
    pool: its first --resume is given a --max-runtime shorter than the replicas take to load
    their engines (each imports vLLM in a new Ray worker), so that stop comes while Ray Data
    still waits for its first result, and still ends cleanly with exit 4, nothing written
    twice, the next --resume finishing the job."""
    out = tmp_path / "run"
    trace = trace_slice(tmp_path / "t.csv", 600)
    args = ["run", trace, *SIM, "--ray", cluster.address, "--replicas", "2", *split,
            "-o", str(out)]
    proc = start_driver(args)
    wait_until(lambda: count_lines(out / "outputs.jsonl") >= 60, proc, "some outputs")
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=300)
    said = proc.stdout.read().decode()
    assert code == 4, said[-3000:]
    assert "rerun with --resume" in said
    kept = len(outputs(out))
    assert 60 <= kept < 600
    stopped = {a["attempt"] for a in report_of(out)["attempts"]}
    if not split:
        proc = start_driver([*args, "--resume", "--max-runtime", "1"])
        assert proc.wait(timeout=300) == 4
        assert "--max-runtime reached" in proc.stdout.read().decode()
        assert kept <= len(outputs(out)) < 600
    resumed = invoke([*args, "--resume", "-q"])
    assert resumed.exit_code == 0, resumed.output
    ids = [row["id"] for row in outputs(out)]
    assert len(ids) == len(set(ids)) == 600
    if split:
        assert_resumed_placement(report_of(out), stopped, "side-by-side")


@pytest.mark.ray_faults
def test_a_split_run_runs_each_part_across_both_replicas(cluster, node_ids, tmp_path):
    """--split-at with --replicas: the short part on both replicas, then the long one; each
    request once, the run's elapsed time the sum of the parts' (each its slowest replica's)."""
    out = tmp_path / "run"
    # the slice's prompt + max_tokens run from 95 to 4,176: 185 fit in 2,048, 15 do not
    result = invoke(["run", trace_slice(tmp_path / "t.csv", 200), *SIM, "--ray", cluster.address,
                     "--replicas", "2", "--split-at", "2048", "-o", str(out)])
    assert result.exit_code == 0, result.output
    ids = [row["id"] for row in outputs(out)]
    assert len(ids) == len(set(ids)) == 200
    report = report_of(out)
    assert report["requests"]["completed"] == 200 and report["requests"]["pending"] == 0
    short, long = report["split"]["parts"]
    assert (short["part"], short["max_model_len"]) == ("short", 2048)
    assert (long["part"], long["max_model_len"]) == ("long", 8192)
    assert short["requests"] + long["requests"] == 200 and long["requests"] > 0
    # a replica serves about half the short part: no more slots than that
    assert short["max_num_seqs"] <= -(-short["requests"] // 2)
    for part, attempt in zip((short, long), report["attempts"]):
        assert attempt["part"]["part"] == part["part"]
        assert {r["node"] for r in attempt["replicas"]} == node_ids     # both nodes
        assert [r["replica"] for r in part["replicas"]] == [0, 1]
        assert sum(r["requests"] for r in part["replicas"]) == part["requests"]
        assert part["elapsed_s"] == max(r["elapsed_s"] for r in part["replicas"])
    assert all(r["requests"] > 0 for r in short["replicas"])
    assert report["throughput"]["elapsed_s"] == pytest.approx(
        short["elapsed_s"] + long["elapsed_s"], rel=1e-9)
    assert short["output_tokens"] + long["output_tokens"] == report["tokens"]["output"]
    assert_totals_match_replicas(report)
    assert (out / "records-1-r1.jsonl").exists() and (out / "records-2-r1.jsonl").exists()
    assert "each across 2 replicas" in result.output


@pytest.mark.ray_faults
def test_split_parts_side_by_side_run_at_once_each_on_its_own_replica(cluster, node_ids,
                                                                     tmp_path):
    """--split-placement side-by-side: the short part on one replica while the long one runs on
    the other; each request once, the run's elapsed time the longer part's, each replica its
    own number and records, the estimate the choice was made with near what the parts took."""
    out = tmp_path / "run"
    result = invoke(["run", trace_slice(tmp_path / "t.csv", 200), *SIM, "--ray", cluster.address,
                     "--replicas", "2", "--split-at", "2048", "--split-placement",
                     "side-by-side", "-o", str(out)])
    assert result.exit_code == 0, result.output
    ids = [row["id"] for row in outputs(out)]
    assert len(ids) == len(set(ids)) == 200
    report = report_of(out)
    split = report["split"]
    assert split["placement"]["mode"] == "side-by-side"
    assert (split["placement"]["short_replicas"], split["placement"]["long_replicas"]) == (1, 1)
    short, long = split["parts"]
    assert [r["replica"] for r in short["replicas"]] == [0]
    assert [r["replica"] for r in long["replicas"]] == [1]
    assert short["requests"] + long["requests"] == 200
    # the two pools were at once on the two nodes (one CPU each: one replica per node)
    first, second = report["attempts"]
    assert first["side_by_side"] == second["side_by_side"] == 1
    assert {first["replicas"][0]["node"], second["replicas"][0]["node"]} == node_ids
    assert report["throughput"]["elapsed_s"] == pytest.approx(
        max(short["elapsed_s"], long["elapsed_s"]), rel=1e-9)
    # both layouts on one instance: compiled one after the other there
    assert split["estimated_compile_s"] == pytest.approx(
        short["estimated_compile_s"] + long["estimated_compile_s"], rel=1e-3)
    estimated = split["placement"]["estimated_parts_s"]
    for part, guess in zip((short, long), estimated):
        assert 0.5 * part["elapsed_s"] <= guess <= 1.2 * part["elapsed_s"], (part, guess)
    assert_totals_match_replicas(report)
    assert (out / "records-1-r0.jsonl").exists() and (out / "records-2-r1.jsonl").exists()
    assert "side by side, short on 1 replica(s), long on 1" in result.output


@pytest.mark.ray_faults
def test_a_killed_split_run_on_replicas_resumes_each_request_once(cluster, tmp_path):
    """kill -9 of the driver of a split run in turn: --resume runs what is left, each request
    once, and the killed attempt is recorded as killed. (Side by side is stopped and resumed by
    the SIGTERM test above; a kill -9 of it here too cost a minute of the suite's longest file,
    and a kill -9 of a run of one pool two runs more: its resume is the SIGTERM test's.)"""
    out = tmp_path / "run"
    trace = trace_slice(tmp_path / "t.csv", 600)
    args = ["run", trace, *SIM, "--ray", cluster.address, "--replicas", "2", "--split-at",
            "2048", "--split-placement", "in-turn", "-q", "-o", str(out)]
    proc = start_driver(args)
    wait_until(lambda: count_lines(out / "outputs.jsonl") >= 60, proc, "some outputs")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 60 <= len(outputs(out)) < 600
    report = resume_and_check_each_once(args, out, 600)
    ended = [a["ended"] for a in report["attempts"]]
    assert ended[0] == "killed" and ended[-1] == "completed", ended
    assert {p["part"] for p in report["split"]["parts"]} <= {"short", "long"}
    assert_resumed_placement(report, set(), "in-turn")


@pytest.mark.ray_faults
def test_a_lost_node_stops_the_run_and_resume_finishes_it(cluster, tmp_path):
    """Last in the module: it takes the cluster's second node away."""
    out = tmp_path / "run"
    trace = trace_slice(tmp_path / "t.csv", 800)
    proc = start_driver(["run", trace, *SIM, "--ray", cluster.address, "--replicas", "2",
                         "-q", "-o", str(out)])
    wait_until(lambda: count_lines(out / "outputs.jsonl") >= 60, proc, "some outputs")
    worker = next(iter(cluster.worker_nodes))
    lost = worker.node_id
    cluster.remove_node(worker)
    assert proc.wait(timeout=300) == 1
    message = proc.stdout.read().decode()
    assert lost in message and "--resume" in message, message
    kept = outputs(out)
    assert 60 <= len(kept) < 800
    resumed = invoke(["run", trace, *SIM, "--ray", cluster.address, "--replicas", "1",
                      "--resume", "-q", "-o", str(out)])
    assert resumed.exit_code == 0, resumed.output
    ids = [row["id"] for row in outputs(out)]
    assert len(ids) == len(set(ids)) == 800
    assert report_of(out)["requests"]["completed"] == 800
