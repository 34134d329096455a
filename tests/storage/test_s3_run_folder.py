"""Run folders in S3 (`--output s3://bucket/prefix/`, storage/run_bucket.py) on a real S3
endpoint (moto's server), driven as a user drives them: `neuron-batch run` in a real process
on the simulated device. A job in and out of the bucket; a run killed -9 and resumed from no
local state at all; the lock refusing a second host and taken over when stale; a store that
stops answering mid-run (exit 4) and the resume that uploads what it kept; a bucket that
cannot be written."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from neuron_batch.storage.run_bucket import (
    PART_LINES_ENV,
    RETRY_ENV,
    STAGING_ENV,
    STALE_ENV,
    SYNC_ENV,
    staging_dir,
)

SIM = ["--device", "sim", "--instance", "inf2.xlarge", "--architecture", "llama-3.1-8b",
       "--max-model-len", "1024"]
SECRET = "testing-secret"      # the fixture's AWS_SECRET_ACCESS_KEY: must appear nowhere


def client():
    import botocore.session

    return botocore.session.get_session().create_client("s3")


def keys(bucket: str, prefix: str = "") -> dict[str, int]:
    pages = client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"][len(prefix):]: o["Size"] for page in pages for o in page.get("Contents", [])}


def read(bucket: str, key: str) -> bytes:
    return client().get_object(Bucket=bucket, Key=key)["Body"].read()


def trace(path: Path, n: int, max_tokens: int = 8) -> Path:
    path.write_text("prompt_len,max_tokens\n" + "".join(
        f"{100 + 7 * (i % 40)},{max_tokens}\n" for i in range(n)))
    return path


@pytest.fixture(autouse=True)
def _staging(tmp_path, monkeypatch):
    """Staging folders under the test's folder, for the runs and for `staging_dir` here."""
    monkeypatch.setenv(STAGING_ENV, str(tmp_path / "staging"))


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, SYNC_ENV: "0.2", PART_LINES_ENV: "10", RETRY_ENV: "2",
            STALE_ENV: "600", **extra}


def start(args, environ) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "neuron_batch.cli", "run", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=environ)


def run(args, environ, timeout=300) -> tuple[int, str]:
    proc = start(args, environ)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def outputs(bucket: str, prefix: str) -> list[dict]:
    return [json.loads(line) for line in read(bucket, f"{prefix}outputs.jsonl").splitlines()]


def wait_for_parts(bucket: str, prefix: str, count: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while sum(k.startswith("outputs/part-") for k in keys(bucket, prefix)) < count:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no {count} parts before the run ended: {proc.communicate()}")
        time.sleep(0.05)


def test_a_job_in_and_out_of_s3(bucket, tmp_path):
    """Input from the bucket, run folder in the bucket: one outputs.jsonl (its parts gone),
    the folder's other files beside it, the lock released, no credential anywhere."""
    data = trace(tmp_path / "t.csv", 30).read_bytes()
    client().put_object(Bucket=bucket, Key="in/t.csv", Body=data)
    url = f"s3://{bucket}/runs/night/"
    code, said = run([f"s3://{bucket}/in/t.csv", *SIM, "-o", url, "-q"], env(tmp_path))
    assert code == 0, said
    assert said == ""
    found = keys(bucket, "runs/night/")
    assert {"outputs.jsonl", "run.json", "requests.jsonl.gz", "attempts.json", "batch.json",
            "report.json", "records-1.jsonl"} <= set(found)
    assert not [k for k in found if k.startswith(("outputs/", ".lock", "outputs.idx"))]
    assert sorted(r["index"] for r in outputs(bucket, "runs/night/")) == list(range(30))
    report = json.loads(read(bucket, "runs/night/report.json"))
    assert report["requests"]["completed"] == 30
    assert json.loads(read(bucket, "runs/night/run.json"))["settings"]["output"] == url
    for key in found:
        assert SECRET.encode() not in read(bucket, f"runs/night/{key}"), key
    staging = tmp_path / "staging"
    for path in staging.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    # `report` renders the bucket's run folder as it renders a local one, naming the URL
    shown = subprocess.run([sys.executable, "-m", "neuron_batch.cli", "report", url],
                           capture_output=True, text=True, env=env(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert "30" in shown.stdout and url.rstrip("/") in shown.stdout, shown.stdout
    missing = subprocess.run([sys.executable, "-m", "neuron_batch.cli", "report",
                              f"s3://{bucket}/nothing-here/"], capture_output=True, text=True,
                             env=env(tmp_path))
    assert missing.returncode == 2
    assert f"s3://{bucket}/nothing-here/: NoSuchKey: no run folder here" in missing.stderr


def test_killed_then_resumed_from_no_local_state(bucket, tmp_path):
    """kill -9 once parts reached the bucket; the staging folder deleted (a fresh host);
    --resume rebuilds it from the bucket, takes the dead run's lock and finishes: every
    request exactly once, the killed attempt counted."""
    # (long enough to be running when the store goes, on a quiet machine too: 200 requests
    # were done before the first part reached the bucket)
    data = str(trace(tmp_path / "t.csv", 3000, max_tokens=16))
    url = f"s3://{bucket}/night/"
    args = [data, *SIM, "--max-num-seqs", "4", "-o", url, "-q"]
    proc = start(args, env(tmp_path))
    wait_for_parts(bucket, "night/", 3, proc)
    proc.kill()
    proc.wait()
    assert ".lock" in keys(bucket, "night/")
    shutil.rmtree(staging_dir(url))
    unfinished = subprocess.run([sys.executable, "-m", "neuron_batch.cli", "report", url],
                                capture_output=True, text=True, env=env(tmp_path))
    assert unfinished.returncode != 0
    assert f"run --resume -o {url.rstrip('/')}" in unfinished.stderr, unfinished.stderr
    fresh = run(args, env(tmp_path))
    assert fresh[0] == 2 and "--resume" in fresh[1], fresh     # (a run is there: not redone)
    other = str(trace(tmp_path / "other.csv", 199, max_tokens=16))
    changed = run([other, *args[1:], "--resume"], env(tmp_path))
    assert changed[0] == 2, changed       # (the fingerprint the bucket's run.json holds)
    assert f"s3://{bucket}/night holds a run of other input" in changed[1]
    code, said = run([*args, "--resume"], env(tmp_path))
    assert code == 0, said
    rows = outputs(bucket, "night/")
    assert sorted(r["index"] for r in rows) == list(range(3000))
    report = json.loads(read(bucket, "night/report.json"))
    assert report["requests"]["completed"] == 3000
    assert [a["ended"] for a in report["attempts"]][0] == "killed"
    assert not [k for k in keys(bucket, "night/") if k.startswith(("outputs/", ".lock"))]


def _lock(bucket: str, key: str, host: str) -> None:
    client().put_object(Bucket=bucket, Key=key, Body=json.dumps(
        {"host": host, "pid": 4242, "heartbeat": "now"}).encode())


def test_the_lock_refuses_a_second_host_and_a_stale_one_is_taken_over(bucket, tmp_path):
    data = str(trace(tmp_path / "t.csv", 6))
    url = f"s3://{bucket}/night/"
    _lock(bucket, "night/.lock", "other-host")
    code, said = run([data, *SIM, "-o", url], env(tmp_path))
    assert code == 5, said
    assert f"{url}: InUse: in use by a neuron-batch run on other-host (pid 4242" in said
    assert not (staging_dir(url) / "run.json").exists()     # (nothing started)
    assert json.loads(read(bucket, "night/.lock"))["host"] == "other-host"
    time.sleep(1.5)
    code, said = run([data, *SIM, "-o", url], env(tmp_path, **{STALE_ENV: "1"}))
    assert code == 0, said
    assert "took over the lock of a run that stopped answering (other-host, pid 4242" in said
    assert len(outputs(bucket, "night/")) == 6
    assert ".lock" not in keys(bucket, "night/")


class Proxy:
    """A TCP relay in front of the S3 server: the endpoint the run sees, which `stop()`
    makes stop answering (connections dropped, new ones refused)."""

    def __init__(self, port: int):
        self.target = port
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(32)
        self.port = self.server.getsockname()[1]
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.server.accept()
            except OSError:
                return
            far = socket.create_connection(("127.0.0.1", self.target))
            self.open += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def stop(self) -> None:
        self.server.close()
        for s in self.open:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass


def test_a_store_that_stops_answering_stops_the_run_and_resume_uploads_the_rest(
        bucket, s3_server, tmp_path):
    """The endpoint dies mid-run: retried for NEURON_BATCH_S3_RETRY_S, then exit 4 naming the
    URL and the code, the outputs kept in the staging folder; --resume on this host (the store
    back) uploads them and finishes: every request exactly once."""
    # (long enough to be running when the store goes, on a quiet machine too: 200 requests
    # were done before the first part reached the bucket)
    data = str(trace(tmp_path / "t.csv", 3000, max_tokens=16))
    url = f"s3://{bucket}/night/"
    args = [data, *SIM, "--max-num-seqs", "4", "-o", url, "-q"]
    proxy = Proxy(int(s3_server.rsplit(":", 1)[1]))
    proc = start(args, env(tmp_path, AWS_ENDPOINT_URL=f"http://127.0.0.1:{proxy.port}"))
    wait_for_parts(bucket, "night/", 1, proc)
    proxy.stop()
    stopped_at = time.monotonic()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, (out + err)[-3000:]
    assert time.monotonic() - stopped_at < 60
    assert f"{url}: EndpointUnreachable" in err and "--resume on this host" in err
    kept = (staging_dir(url) / "outputs.jsonl").read_text().splitlines()
    in_bucket = sum(size for k, size in keys(bucket, "night/").items()
                    if k.startswith("outputs/part-"))
    assert sum(len(line) + 1 for line in kept) >= in_bucket
    code, said = run([*args, "--resume"], env(tmp_path))
    assert code == 0, said
    assert sorted(r["index"] for r in outputs(bucket, "night/")) == list(range(3000))


def test_a_bucket_that_cannot_be_written_is_refused_before_anything_runs(
        s3_server, another_s3_server, tmp_path):
    """moto with IAM enforced: an identity that may list and read the bucket but not write
    it: exit 2 with the service's AccessDenied, nothing run; doctor says the same."""
    with another_s3_server({"INITIAL_NO_AUTH_ACTION_COUNT": "5"}) as endpoint:
        import botocore.session

        session = botocore.session.get_session()
        root = dict(endpoint_url=endpoint, region_name="us-east-1",
                    aws_access_key_id="testing", aws_secret_access_key=SECRET)
        s3 = session.create_client("s3", **root)
        iam = session.create_client("iam", **root)
        s3.create_bucket(Bucket="read-only-bucket")
        iam.create_user(UserName="reader")
        iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": [
                "s3:ListBucket", "s3:GetObject", "sts:GetCallerIdentity"], "Resource": "*"}]}))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        environ = env(tmp_path, AWS_ENDPOINT_URL=endpoint,
                      AWS_ACCESS_KEY_ID=key["AccessKeyId"],
                      AWS_SECRET_ACCESS_KEY=key["SecretAccessKey"])
        url = "s3://read-only-bucket/night/"
        code, said = run([str(trace(tmp_path / "t.csv", 3)), *SIM, "-o", url], environ)
        assert code == 2, said
        assert f"{url}: AccessDenied" in said
        assert key["SecretAccessKey"] not in said
        assert not (staging_dir(url) / "run.json").exists()
        doctor = subprocess.run([sys.executable, "-m", "neuron_batch.cli", "doctor",
                                 "--no-platform", "-o", url], capture_output=True, text=True,
                                env=environ)
        assert doctor.returncode == 1
        assert f"{url}: AccessDenied" in doctor.stdout


def test_the_mirror_sends_whole_lines_and_a_fresh_host_rebuilds_them(bucket, tmp_path,
                                                                     monkeypatch):
    """BucketRun alone (no engine), in seconds: whole lines reach the bucket in parts, a torn
    last line never does; a host that stops (no close, its lock left) is taken over once its
    heartbeat is stale, and a fresh staging folder is rebuilt byte for byte; close() leaves
    one outputs.jsonl, no parts, no lock."""
    from neuron_batch.storage.run_bucket import BucketRun

    url = f"s3://{bucket}/mirror/"
    monkeypatch.setenv(SYNC_ENV, "0.05")
    monkeypatch.setenv(PART_LINES_ENV, "3")
    monkeypatch.setenv(STALE_ENV, "0.5")
    said: list[str] = []
    first = BucketRun(url, said.append)
    staging = first.open()
    lines = [json.dumps({"id": f"r{i}", "output": "x" * i}) + "\n" for i in range(10)]
    (staging / "outputs.jsonl").write_text("".join(lines) + '{"id": "r10", "outp')
    (staging / "run.json").write_text('{"input_fingerprint": "abc"}\n')
    deadline = time.monotonic() + 20
    # (outputs and the other files go up in turn: wait for both)
    while sum(size for key, size in keys(bucket, "mirror/").items()
              if key.startswith("outputs/part-")) < len("".join(lines).encode()) \
            or "run.json" not in keys(bucket, "mirror/"):
        assert time.monotonic() < deadline, keys(bucket, "mirror/")
        time.sleep(0.05)
    first._stop.set()       # (the host dies: no close, the lock left behind)
    first._thread.join()
    assert ".lock" in keys(bucket, "mirror/") and "run.json" in keys(bucket, "mirror/")
    time.sleep(0.8)
    monkeypatch.setenv(STAGING_ENV, str(tmp_path / "fresh"))
    second = BucketRun(url, said.append)
    rebuilt = second.open()
    assert rebuilt != staging
    assert any("took over the lock of a run that stopped answering" in line for line in said)
    assert (rebuilt / "outputs.jsonl").read_text() == "".join(lines)
    assert json.loads((rebuilt / "run.json").read_text()) == {"input_fingerprint": "abc"}
    with open(rebuilt / "outputs.jsonl", "a") as more:
        more.write(json.dumps({"id": "r10"}) + "\n")
    second.close()
    found = keys(bucket, "mirror/")
    assert not [k for k in found if k.startswith(("outputs/", ".lock"))], found
    assert read(bucket, "mirror/outputs.jsonl").decode() == "".join(lines) + '{"id": "r10"}\n'


def test_a_grown_records_file_sends_only_what_it_grew_by(bucket, tmp_path, monkeypatch):
    """A records file of a long run is re-sent each sync: from 5 MiB on, the bucket's copy is
    extended by a multipart upload that copies what it holds within the store and sends only
    the new lines; a file written anew (another inode) goes whole."""
    from neuron_batch.storage.run_bucket import BucketRun

    url = f"s3://{bucket}/grown/"
    monkeypatch.setenv(SYNC_ENV, "0.05")
    run = BucketRun(url, [].append)
    staging = run.open()
    sent: list[tuple[str, int]] = []

    class Counting:     # (the real client, the bytes of each upload it sends noted)
        def __init__(self, client):
            self.client = client

        def __getattr__(self, name):
            method = getattr(self.client, name)
            if name not in ("put_object", "upload_part"):
                return method

            def counted(**kwargs):
                sent.append((kwargs["Key"], len(kwargs["Body"])))
                return method(**kwargs)
            return counted

    run.objects.client = Counting(run.objects.client)    # (what sends the bytes)
    records = staging / "records-1.jsonl"
    line = json.dumps({"type": "requests", "blob": "x" * 1000}) + "\n"

    def in_bucket(expected: bytes) -> None:
        deadline = time.monotonic() + 30
        while keys(bucket, "grown/").get("records-1.jsonl") != len(expected):
            assert time.monotonic() < deadline, keys(bucket, "grown/")
            time.sleep(0.05)
        assert read(bucket, "grown/records-1.jsonl") == expected

    records.write_text(line * 6_000)                    # ~6 MiB
    in_bucket(records.read_bytes())
    sent.clear()
    with open(records, "a") as more:
        more.write(line.replace("x", "y") * 50)         # ~50 KB more, and a torn line
        more.write('{"type": "requ')
    in_bucket(records.read_bytes()[:-len('{"type": "requ')])
    grown = sum(size for key, size in sent if key.endswith("records-1.jsonl"))
    assert 0 < grown <= 50 * len(line)                  # the new lines, not the 6 MiB
    # written anew (os.replace: another file), shorter: the whole of it
    sent.clear()
    fresh = staging / ".records.tmp"
    fresh.write_text(line.replace("x", "z") * 5_500)
    os.replace(fresh, records)
    in_bucket(records.read_bytes())
    assert sum(size for key, size in sent if key.endswith("records-1.jsonl")) \
        == records.stat().st_size
    run.close()
