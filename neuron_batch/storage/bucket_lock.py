"""The lock of a run folder in S3: one object, `<prefix>/.lock`, that says which host and
process hold the run and when it last showed it was alive (its heartbeat).

S3's conditional writes make it a lock: it is created with `If-None-Match: *` (a second
writer gets 412 PreconditionFailed), refreshed and taken over with `If-Match: <ETag>` (only
the writer that read the current version wins), and deleted with `If-Match` so a holder never
deletes the lock of the host that took it over. A holder's age is measured by the store's
clock (the object's Last-Modified against the answer's Date header), not by comparing two
hosts' clocks.

A holder is stale when its heartbeat is older than `stale_s`, or at once when it is a process
of this host that no longer exists (a run killed -9 here and resumed here).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from neuron_batch.errors import EXIT_BUSY
from neuron_batch.storage.urls import StorageError, translated

LOCK_KEY = ".lock"


class BucketBusy(StorageError):
    """The prefix is held by a live run elsewhere (exit 5, as a local folder in use)."""


@dataclass
class Holder:
    host: str
    pid: int
    age_s: float
    etag: str


def _client_error_code(error: BaseException) -> str | None:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code else None
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BucketLock:
    """`acquire()` once, `refresh()` now and then (the heartbeat), `release()` at the end."""

    def __init__(self, client: Any, url: str, bucket: str, prefix: str, stale_s: float):
        self.client, self.url, self.bucket = client, url, bucket
        self.key = f"{prefix}{LOCK_KEY}"
        self.stale_s = stale_s
        self.etag: str | None = None
        self.token = uuid.uuid4().hex
        self.started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.took_over: Holder | None = None

    def _body(self) -> bytes:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                           "started": self.started, "token": self.token,
                           "heartbeat": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                          indent=1).encode()

    def _put(self, **condition: str) -> str:
        answer = self.client.put_object(Bucket=self.bucket, Key=self.key, Body=self._body(),
                                        ContentType="application/json", **condition)
        return str(answer["ETag"])

    def acquire(self) -> None:
        """Take the lock, or BucketBusy naming its holder; a stale holder's lock is taken
        over (`took_over` says whose)."""
        import botocore.exceptions

        with translated(self.url):
            try:
                self.etag = self._put(IfNoneMatch="*")
                return
            except botocore.exceptions.ClientError as error:
                if _client_error_code(error) not in ("PreconditionFailed", "412"):
                    raise
            holder = self.holder()
            if holder is None:          # (released between the two calls: try once more)
                self.etag = self._put(IfNoneMatch="*")
                return
            if not self._stale(holder):
                raise BucketBusy(self.url, "InUse", (
                    f"in use by a neuron-batch run on {holder.host} (pid {holder.pid}, last "
                    f"heartbeat {holder.age_s:.0f} s ago); wait for it to finish or choose "
                    f"another --output (a lock without a heartbeat for {self.stale_s:.0f} s is "
                    f"taken over: this one in {max(1.0, self.stale_s - holder.age_s):.0f} s "
                    f"if its run is gone)"), exit_code=EXIT_BUSY)
            try:
                self.etag = self._put(IfMatch=holder.etag)
            except botocore.exceptions.ClientError as error:
                if _client_error_code(error) not in ("PreconditionFailed", "412", "NoSuchKey"):
                    raise
                raise BucketBusy(self.url, "InUse", "another run took the stale lock first",
                                 exit_code=EXIT_BUSY) from None
            self.took_over = holder

    def _stale(self, holder: Holder) -> bool:
        if holder.age_s > self.stale_s:
            return True
        return holder.host == socket.gethostname() and not _pid_alive(holder.pid)

    def holder(self) -> Holder | None:
        import botocore.exceptions

        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except botocore.exceptions.ClientError as error:
            if _client_error_code(error) in ("NoSuchKey", "404"):
                return None
            raise
        body = answer["Body"].read()
        try:
            fields = json.loads(body)
        except ValueError:
            fields = {}
        now = answer["ResponseMetadata"].get("HTTPHeaders", {}).get("date")
        modified = answer["LastModified"]
        age = ((parsedate_to_datetime(now) - modified).total_seconds() if now else
               time.time() - modified.timestamp())
        return Holder(str(fields.get("host", "an unknown host")), int(fields.get("pid") or 0),
                      max(0.0, age), str(answer["ETag"]))

    def refresh(self) -> bool:
        """The heartbeat; False when the lock is no longer this run's (taken over)."""
        import botocore.exceptions

        assert self.etag is not None
        try:
            self.etag = self._put(IfMatch=self.etag)
        except botocore.exceptions.ClientError as error:
            if _client_error_code(error) in ("PreconditionFailed", "412", "NoSuchKey"):
                return False
            raise
        return True

    def release(self) -> None:
        import botocore.exceptions

        if self.etag is None:
            return
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=self.etag)
        except botocore.exceptions.ClientError as error:
            if _client_error_code(error) not in ("PreconditionFailed", "412", "NoSuchKey"):
                raise
        self.etag = None
