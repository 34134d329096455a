"""URLs against a real S3 endpoint (moto's server on 127.0.0.1): listed in a stable order, read
as a stream, probed for writing, and every failure named by URL and the service's code."""

from __future__ import annotations

import socket
import time

import pytest

from neuron_batch.storage.urls import (
    StorageError,
    expand,
    identity,
    is_url,
    open_text,
    probe_writable,
)


def _put(bucket: str, key: str, text: str) -> str:
    import s3fs

    s3fs.S3FileSystem().pipe_file(f"{bucket}/{key}", text.encode())
    return f"s3://{bucket}/{key}"


def test_what_is_a_url():
    assert is_url("s3://b/k") and is_url("gs://b/k") and is_url("hf://datasets/x")
    assert not is_url("hf:imdb") and not is_url("prompts.jsonl") and not is_url("/a/b:c")


def test_a_glob_and_a_prefix_list_in_a_stable_order(bucket):
    for name in ("b.jsonl", "a.jsonl", "c.csv", "sub/d.jsonl"):
        _put(bucket, f"in/{name}", "{}\n")
    assert expand(f"s3://{bucket}/in/*.jsonl") == [f"s3://{bucket}/in/a.jsonl",
                                                   f"s3://{bucket}/in/b.jsonl"]
    assert expand(f"s3://{bucket}/in/") == [f"s3://{bucket}/in/{n}" for n in
                                            ("a.jsonl", "b.jsonl", "c.csv", "sub/d.jsonl")]
    assert expand(f"s3://{bucket}/in/c.csv") == [f"s3://{bucket}/in/c.csv"]


def test_an_object_reads_line_by_line(bucket):
    lines = [f'{{"prompt": "line {i} é"}}' for i in range(2000)]
    url = _put(bucket, "big.jsonl", "\n".join(lines) + "\n")
    with open_text(url) as text:
        read = [line.rstrip("\n") for line in text]
    assert read == lines


def test_a_missing_key_or_bucket_is_named_with_the_service_code(bucket):
    with pytest.raises(StorageError) as missing:
        expand(f"s3://{bucket}/nothing-here.jsonl")
    assert missing.value.exit_code == 2
    assert str(missing.value).startswith(f"s3://{bucket}/nothing-here.jsonl: NoSuchKey")
    with pytest.raises(StorageError) as glob:
        expand(f"s3://{bucket}/none/*.jsonl")
    assert glob.value.code == "NoSuchKey"
    with pytest.raises(StorageError) as no_bucket:
        with open_text("s3://nb-no-such-bucket-here/k.jsonl"):
            pass
    assert no_bucket.value.code == "NoSuchBucket"
    assert "testing-secret" not in str(no_bucket.value)


def test_a_writable_prefix_and_the_identity(bucket):
    import s3fs

    probe_writable(f"s3://{bucket}/runs/night-1/")
    assert s3fs.S3FileSystem().find(f"{bucket}/runs") == []   # the probe cleans up after itself
    assert identity(f"s3://{bucket}/") .startswith("arn:aws:")
    assert identity("gs://bucket/x") is None


def test_an_endpoint_that_does_not_answer_is_named_within_seconds(monkeypatch, s3_server):
    import s3fs

    with socket.socket() as sock:   # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    s3fs.S3FileSystem.clear_instance_cache()
    started = time.monotonic()
    try:
        with pytest.raises(StorageError) as error:
            expand("s3://some-bucket/in.jsonl")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    assert error.value.code == "EndpointUnreachable"
    assert error.value.exit_code == 2       # (before the run: issue 48's "exit 2 within seconds")
    assert time.monotonic() - started < 30


def test_no_credentials_are_named_without_leaking_any(monkeypatch, tmp_path, s3_server):
    import s3fs

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        with pytest.raises(StorageError) as error:
            expand("s3://some-bucket/in.jsonl")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    assert error.value.code == "NoCredentials"
