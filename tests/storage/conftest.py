"""A real S3 endpoint on this machine: moto's server on 127.0.0.1, one per test session, with
the standard AWS environment pointed at it (never a mock of the client)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def moto_server(folder: Path, environ: dict[str, str] | None = None) -> Iterator[str]:
    """A moto server on a free port of 127.0.0.1 (its log in `folder`), with `environ` added
    to its environment (INITIAL_NO_AUTH_ACTION_COUNT enforces IAM); its endpoint URL."""
    pytest.importorskip("s3fs")
    server = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    if server is None:
        pytest.skip("moto[server] is not installed (the test extra brings it)")
    port = _free_port()
    log = folder / f"moto-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)], stdout=out,
                                   stderr=subprocess.STDOUT,
                                   env={**os.environ, **(environ or {})})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"moto server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def another_s3_server(tmp_path):
    """Start servers of their own (`with another_s3_server(environ) as endpoint:`), for a
    test that changes how the server behaves."""
    return lambda environ=None: moto_server(tmp_path, environ)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """The endpoint URL of a running moto server; AWS_* variables set for the session."""
    with moto_server(tmp_path_factory.mktemp("moto")) as endpoint:
        saved = {key: os.environ.get(key) for key in _ENV}
        os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                           "AWS_SECRET_ACCESS_KEY": "testing-secret", "AWS_DEFAULT_REGION":
                           "us-east-1"})
        os.environ.pop("AWS_PROFILE", None)
        try:
            yield endpoint
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


_ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION",
        "AWS_PROFILE")


@pytest.fixture
def bucket(s3_server):
    """A fresh bucket of the session's server, named for the test."""
    import uuid

    import s3fs

    name = f"nb-{uuid.uuid4().hex[:16]}"
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    fs.mkdir(name)
    return name
