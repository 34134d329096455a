"""Inputs and run folders named by URL (`s3://bucket/key`, and what else fsspec reads: `gs://`,
`az://`, `hf://`): one place that opens, lists, probes and names what went wrong.

fsspec and s3fs are imported only when a URL is used, so a run on local files, `--help` and the
pure modules never pay for them; without them a URL is refused with the extra that brings them
(`pip install 'neuron-batch[s3]'`). Credentials come from the store's own chain (for S3:
environment, profile, instance role; `AWS_ENDPOINT_URL` for S3-compatible stores) and are never
part of a message: errors name the URL and the service's error code, nothing else.
"""

from __future__ import annotations

import io
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, TextIO

from neuron_batch.errors import RunError

#: `scheme://...`; Hugging Face's `hf:NAME` data-set names (one colon, no slashes) are not URLs.
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")

#: What a URL's scheme needs installed, for the refusal when it is missing.
EXTRAS = {"s3": "s3", "s3a": "s3"}

#: A store that does not answer is named within seconds, not after botocore's minutes of retries
#: (issue 48: "exit 2 within seconds, before any engine starts").
_S3_OPTIONS: dict[str, Any] = {
    "config_kwargs": {"connect_timeout": 5, "read_timeout": 30,
                      "retries": {"max_attempts": 2, "mode": "standard"}},
}

_GLOB = re.compile(r"[*?\[]")


class StorageError(RunError):
    """A URL that cannot be read or written: the URL, the service's error code, what to do."""

    def __init__(self, url: str, code: str, what: str, exit_code: int = 2):
        super().__init__(f"{url}: {code}: {what}", exit_code=exit_code)
        self.url, self.code = url, code


def is_url(spec: str) -> bool:
    return bool(_URL.match(str(spec)))


def scheme(url: str) -> str:
    return url.split("://", 1)[0].lower()


@dataclass(frozen=True)
class Located:
    """A URL resolved to its filesystem and the path the filesystem takes."""

    url: str
    fs: Any
    path: str


def locate(url: str) -> Located:
    """The fsspec filesystem of `url` (made once per scheme and options: fsspec caches it)."""
    try:
        import fsspec
    except ImportError:
        raise _missing_extra(url) from None
    options = _S3_OPTIONS if scheme(url) in EXTRAS else {}
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError:
        raise _missing_extra(url) from None
    except ValueError as error:  # an unknown protocol
        raise StorageError(url, "UnknownScheme", str(error)) from None
    return Located(url, fs, path)


def _missing_extra(url: str) -> StorageError:
    extra = EXTRAS.get(scheme(url))
    how = (f"install it with `pip install 'neuron-batch[{extra}]'`" if extra else
           f"install the fsspec implementation for {scheme(url)}://")
    return StorageError(url, "MissingDependency", f"reading {scheme(url)}:// needs fsspec and "
                        f"{'s3fs' if extra else 'its filesystem'}; {how}")


def expand(url: str) -> list[str]:
    """The objects a URL names, in a stable (sorted) order: a glob's matches, a prefix's
    (`.../`) objects, or the one object; a name that matches nothing is refused here, before
    anything runs."""
    where = locate(url)
    with translated(url):
        if _GLOB.search(where.path):
            found = sorted(where.fs.glob(where.path))
        elif url.endswith("/"):
            found = sorted(p for p in where.fs.find(where.path) if not p.endswith("/"))
        else:
            info = where.fs.info(where.path)
            found = ([where.path] if info.get("type") != "directory" else
                     sorted(where.fs.find(where.path)))
    if not found:
        raise StorageError(url, "NoSuchKey", "no object matches")
    protocol = scheme(url)
    return [f"{protocol}://{path}" for path in found]


#: Bytes past the last line's start that a read of a few lines (`open_binary`'s `lines`)
#: fetches with them: a longer last line costs one more request. Lines further apart than
#: LINES_AT_ONCE (a window of a job run out of input order: --order, --shuffle) are fetched
#: LINE_SLACK at a time, each where it is.
LINE_SLACK = 1 << 16
LINES_AT_ONCE = 16 << 20
#: An object in S3 read as a stream: fetched this much at a time, read through a buffer of
#: its own. s3fs's file reads a line by reading a block (50 MB by default) and slicing it: a
#: 200k-line text job's check read 4 MB at a time and a line to end each read, and took 4x
#: the local file's, most of it copying 50 MB slices.
STREAM_BLOCK = 8 << 20


@contextmanager
def open_binary(spec: str | Path, lines: tuple[int, int] | None = None) -> Iterator[BinaryIO]:
    """One input, a local path or a URL, as a binary file object (a URL's object read in
    ranges as it is read, never downloaded whole first). `lines`: the caller reads only the
    lines that start from the first offset to the second (a window of requests read again as
    the job runs); an object is then fetched as that range and LINE_SLACK more (`_Fetched`),
    not in s3fs's blocks of 50 MB (a window of 1,024 text prompts, ~450 kB, fetched 50 MB, or
    the rest of the object). Otherwise it is streamed (STREAM_BLOCK). Local errors are the
    OSError they are; a URL's are StorageError."""
    if not is_url(str(spec)):
        with open(spec, "rb") as handle:
            yield handle
        return
    url = str(spec)
    where = locate(url)
    if lines is not None:
        span = lines[1] - lines[0]
        first = span + LINE_SLACK if span <= LINES_AT_ONCE else LINE_SLACK
        with translated(url), io.BufferedReader(_Fetched(where, lines[0], first)) as handle:
            yield handle
        return
    options = {"block_size": STREAM_BLOCK} if scheme(url) in EXTRAS else {}
    with translated(url):
        raw = where.fs.open(where.path, "rb", **options)
    try:
        with translated(url), io.BufferedReader(raw, buffer_size=1 << 20) as handle:
            yield handle
    finally:
        raw.close()


def fetch_range(url: str, start: int, end: int, chunk: int) -> Iterator[bytes]:
    """The bytes of `url`'s object from `start` to `end` (or its end), one ranged read of at
    most `chunk` bytes at a time; a store's error as StorageError."""
    where = locate(url)
    while start < end:
        with translated(url):
            data = where.fs.cat_file(where.path, start=start, end=min(start + chunk, end))
        if not data:
            return
        yield data
        start += len(data)


class _Fetched(io.RawIOBase):
    """An object's bytes from `start` on, fetched (one ranged read each) as they are read: the
    first `first` bytes at once, then as much again each time a read goes past them; a seek
    before `start` fetches from there."""

    def __init__(self, where: Located, start: int, first: int):
        self._where, self._step = where, max(first, 1)
        self._from, self._data, self._at = start, b"", start
        self._size = where.fs.size(where.path)  # (a range past the end is an error in S3)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence != io.SEEK_SET:   # (what the readers ask: a line's offset)
            raise io.UnsupportedOperation("seek from the start only")
        self._at = offset
        return offset

    def readinto(self, buffer: Any) -> int:
        if not self._from <= self._at <= self._from + len(self._data):
            self._from, self._data = self._at, b""
        end = min(self._at + len(buffer), self._size)
        if end > self._from + len(self._data):
            have = self._from + len(self._data)
            more = self._where.fs.cat_file(self._where.path, start=have, end=min(
                have + max(self._step, end - have), self._size))
            self._data += more
        data = self._data[self._at - self._from:max(end - self._from, 0)]
        buffer[:len(data)] = data
        self._at += len(data)
        return len(data)


@contextmanager
def open_text(spec: str | Path, encoding: str = "utf-8") -> Iterator[TextIO]:
    """`open_binary` as text (newlines as written: the csv module wants them so)."""
    with open_binary(spec) as raw:
        text = io.TextIOWrapper(raw, encoding=encoding, newline="")
        try:
            yield text
        finally:
            text.detach()


def read_bytes(spec: str | Path) -> bytes:
    with open_binary(spec) as handle:
        return handle.read()


def name_of(spec: str | Path) -> str:
    """The last part of a path or URL (`s3://b/in/a.jsonl` -> `a.jsonl`)."""
    return PurePosixPath(str(spec).split("://", 1)[-1]).name if is_url(str(spec)) else Path(
        spec).name


def suffix_of(spec: str | Path) -> str:
    return PurePosixPath(name_of(spec)).suffix.lower()


def probe_writable(url: str) -> None:
    """Write and delete a small object under the prefix `url`: a run folder that cannot be
    written is named before any engine starts, not at its first output."""
    where = locate(url)
    key = f"{where.path.rstrip('/')}/.neuron-batch-probe-{uuid.uuid4().hex[:12]}"
    with translated(url):
        where.fs.pipe_file(key, b"probe")
        where.fs.rm_file(key)


def identity(url: str) -> str | None:
    """Who the store sees (S3: the caller's ARN through STS), for `doctor`; None where the
    scheme has no such question."""
    if scheme(url) not in EXTRAS:
        return None
    try:
        import botocore.session
    except ImportError:
        raise _missing_extra(url) from None
    with translated(url):
        client = botocore.session.get_session().create_client("sts")
        return str(client.get_caller_identity()["Arn"])


@contextmanager
def translated(url: str) -> Iterator[None]:
    """A store's exceptions -> StorageError naming the URL and the service's error code."""
    try:
        yield
    except StorageError:
        raise
    except Exception as error:  # the stores raise many types; each is mapped or passed on
        mapped = storage_error(url, error)
        if mapped is None:
            raise
        raise mapped from None


def storage_error(url: str, error: BaseException) -> StorageError | None:
    """What went wrong, in the service's own words (its error code), or None when `error` is
    not a storage problem."""
    code = _service_code(error)
    name = type(error).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        return StorageError(url, "NoCredentials", "no credentials found (environment "
                            "variables, a profile in ~/.aws, or the instance role)")
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError",
                "ReadTimeoutError", "ClientConnectorError", "ServerTimeoutError"):
        return StorageError(url, "EndpointUnreachable", f"the endpoint does not answer "
                            f"({_first_line(error)}); check AWS_ENDPOINT_URL and the network")
    if code in ("NoSuchBucket",):
        return StorageError(url, code, "the bucket does not exist")
    if code in ("AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId",
                "SignatureDoesNotMatch", "ExpiredToken", "403"):
        return StorageError(url, code or "AccessDenied", "access denied for this identity")
    if isinstance(error, FileNotFoundError) or code in ("NoSuchKey", "404"):
        return StorageError(url, code or "NoSuchKey", "no such object")
    if isinstance(error, PermissionError):
        return StorageError(url, code or "AccessDenied", "access denied for this identity")
    if code is not None:
        return StorageError(url, code, _first_line(error))
    return None


def _service_code(error: BaseException) -> str | None:
    """The `Error.Code` of a botocore ClientError anywhere in the chain of causes."""
    seen: BaseException | None = error
    for _ in range(6):
        if seen is None:
            return None
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code:
                return str(code)
        seen = seen.__cause__ or seen.__context__
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
