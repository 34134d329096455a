"""A run folder in S3 (`--output s3://bucket/prefix/`): the run works in a local staging
folder, exactly as in a local run folder (job/folder.py), and `BucketRun` mirrors that folder
to the prefix while the run goes, so a host that dies loses at most one sync interval.

Why a staging folder and a mirror rather than writing objects directly: the run folder's
guarantees (every finished line flushed, a torn last line cut off, outputs.index, records and
attempts appended as they happen) rest on appending to files, which an object store cannot do;
a local folder keeps them, and the mirror only ever uploads whole lines.

In the bucket (the prefix holds what a local folder holds, except outputs.index and scratch):
    .lock                      who runs it (host, pid, heartbeat): storage/bucket_lock.py
    outputs/part-<offset>.jsonl  outputs as they finish: the lines of outputs.jsonl from byte
                               <offset> (15 digits) on; one every NEURON_BATCH_S3_PART_LINES
                               lines or NEURON_BATCH_S3_SYNC_S seconds, whichever comes first
    outputs.jsonl              all outputs in one object, written when an attempt ends (the
                               parts are then deleted)
    run.json, requests.jsonl.gz, attempts.json, batch.json, errors.jsonl, report.json,
    outputs.tally.json, skipped.jsonl, records-*.jsonl, previous-*/
                               as in a local folder, uploaded when changed
                               (a JSONL file of 5 MiB or more that grew: only what it grew by,
                               the rest copied within the store)

`--resume` on any host rebuilds the staging folder from the bucket first: outputs.jsonl, then
each part that starts where it ends (so nothing twice), run.json and the request digests always the
bucket's (the resume fingerprint is checked against them). A staging folder already here whose
outputs begin with the bucket's is kept as it is (same host: the outputs the bucket did not
get yet are uploaded now); any other is replaced by the bucket's copy.

A store that stops answering is retried with backoff for NEURON_BATCH_S3_RETRY_S seconds;
then the run is stopped (through its SIGTERM handler: it ends as an interrupted run, exit 4); the
outputs stay in the staging folder for the next --resume on this host. Nothing here writes a
credential anywhere: the client takes them from the standard chain and errors carry only the
URL and the service's code.
"""

from __future__ import annotations

import _thread
import hashlib
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from neuron_batch.errors import EXIT_INTERRUPTED
from neuron_batch.storage.bucket_lock import LOCK_KEY, BucketLock
from neuron_batch.storage.bucket_objects import CHUNK, BucketObjects
from neuron_batch.storage.lines import tail_crc, whole_lines_end
from neuron_batch.storage.urls import (
    EXTRAS,
    StorageError,
    is_url,
    scheme,
    storage_error,
    translated,
)

SYNC_ENV, PART_LINES_ENV = "NEURON_BATCH_S3_SYNC_S", "NEURON_BATCH_S3_PART_LINES"
RETRY_ENV, STALE_ENV = "NEURON_BATCH_S3_RETRY_S", "NEURON_BATCH_S3_LOCK_STALE_S"
STAGING_ENV = "NEURON_BATCH_STAGING"
#: A minute or 5,000 outputs a part; 5 minutes of retrying; a lock whose heartbeat (every
#: 30 s) is 5 minutes old belongs to a run that is gone.
DEFAULTS = {SYNC_ENV: 60.0, PART_LINES_ENV: 5000.0, RETRY_ENV: 300.0, STALE_ENV: 300.0}

# (the names job/folder.py gives them; storage sits below job and cannot import it)
OUTPUTS = "outputs.jsonl"
#: Local only: what is done, by job index (outputs.idx before 2026-12-05)
_DONE_INDEXES = ("outputs.index", "outputs.idx")
PARTS = "outputs/part-"
_PART = re.compile(r"outputs/part-(\d{15})\.jsonl")
#: The bucket's copies decide a resume (requests.json: a folder written before 2026-12-05).
_KEPT_FROM_BUCKET = ("run.json", "requests.jsonl.gz", "requests.json")
_MIN_PART = 5 << 20     # S3's least part but the last: a file held from this size is appended


def is_bucket_output(output: str | None) -> bool:
    return output is not None and is_url(str(output))


def check_output_url(url: str) -> None:
    """A run folder URL this module can hold: s3:// only (the lock needs S3's conditional
    writes)."""
    if scheme(url) not in EXTRAS:
        raise StorageError(url, "UnsupportedScheme", "a run folder in object storage is an "
                           "s3:// prefix (its lock needs S3's conditional writes); other "
                           "stores can hold inputs")


def staging_dir(url: str) -> Path:
    """Where a run folder at `url` is worked on: `$NEURON_BATCH_STAGING/<hash>`, else the
    user's cache (`$XDG_CACHE_HOME` or ~/.cache)/neuron-batch/staging/<hash>."""
    root = os.environ.get(STAGING_ENV)
    if not root:
        cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(cache) / "neuron-batch" / "staging")
    name = _normal(url)
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", name.rstrip("/").rsplit("/", 1)[-1])[:40]
    return Path(root) / f"{hashlib.sha256(name.encode()).hexdigest()[:16]}-{tail}"


def _normal(url: str) -> str:
    return url.rstrip("/") + "/"


def _bucket_and_prefix(url: str) -> tuple[str, str]:
    """(bucket, key prefix) of a normalised s3:// run folder URL."""
    bucket, _, prefix = url.split("://", 1)[1].partition("/")
    return bucket, prefix


def local_folder(output: str) -> Path:
    """The local folder a run with `--output output` works in."""
    return staging_dir(output) if is_bucket_output(output) else Path(output)


def _setting(name: str) -> float:
    try:
        return float(os.environ.get(name) or DEFAULTS[name])
    except ValueError:
        raise StorageError(name, "BadSetting", f"{name} must be a number of seconds or "
                           f"lines") from None


def s3_client() -> Any:
    """A botocore S3 client on the standard credential chain and AWS_ENDPOINT_URL; short
    timeouts: the retrying is ours (bounded by NEURON_BATCH_S3_RETRY_S)."""
    try:
        import botocore.config
        import botocore.session
    except ImportError:
        raise StorageError("s3://", "MissingDependency", "a run folder in S3 needs s3fs "
                           "(botocore); install it with `pip install 'neuron-batch[s3]'`") \
            from None
    config = botocore.config.Config(connect_timeout=5, read_timeout=30,
                                     retries={"max_attempts": 2, "mode": "standard"})
    return botocore.session.get_session().create_client("s3", config=config)


class BucketRun:
    """One run's hold on an s3:// run folder: `open()` before the run (lock, staging folder
    rebuilt, mirroring started), `close()` after it (last outputs, one outputs.jsonl, lock
    released)."""

    def __init__(self, url: str, log: Callable[[str], None]):
        check_output_url(url)
        self.url = _normal(url)
        self.log = log
        self.staging = staging_dir(url)
        self.bucket, self.prefix = _bucket_and_prefix(self.url)   # (prefix "" or ending "/")
        self.sync_s, self.part_lines = _setting(SYNC_ENV), int(_setting(PART_LINES_ENV))
        self.retry_s, self.stale_s = _setting(RETRY_ENV), _setting(STALE_ENV)
        self.client: Any = None
        self.objects: BucketObjects     # (with the client, in open())
        self.lock: BucketLock | None = None
        self.failed: StorageError | None = None    # the store stopped answering: run stopped
        self.lost = False                           # another run took the lock over
        self._end = 0                       # bytes of outputs.jsonl the bucket holds
        self._scanned = 0                   # bytes of it whose lines are counted
        self._lines_end = 0                 # where its last whole line read so far ends
        self._pending = 0                   # lines in [_end, _lines_end): not in the bucket
        self._inode: int | None = None
        self._parts: list[str] = []         # part keys in the bucket
        self._whole = 0                     # size of the bucket's outputs.jsonl (0: none)
        self._files: dict[str, tuple[int, int]] = {}    # rel -> local (size, mtime) uploaded
        # rel -> (inode, bytes uploaded, CRC-32 of their last 64 KiB): what an append extends
        self._appended: dict[str, tuple[int, int, int]] = {}
        self._remote: set[str] = set()      # other files in the bucket
        self._last_part = self._last_files = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The heartbeat goes on from the lock to its release (a long rebuild or a long last
        # upload included); the mirror only between the rebuild and close(), under `_turn`
        # so that close() never uploads beside it.
        self._mirroring = False
        self._turn = threading.Lock()

    # -- open and close --------------------------------------------------------------------
    def open(self) -> Path:
        """Lock the prefix, rebuild the staging folder from it, start mirroring; the staging
        folder. StorageError (exit 2; 4 unreachable; 5 in use) before anything is written."""
        with translated(self.url):
            self.client = s3_client()
            self.objects = BucketObjects(self.client, self.bucket)
            self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
            self.lock = BucketLock(self.client, self.url, self.bucket, self.prefix,
                                   self.stale_s)
            self.lock.acquire()
        if self.lock.took_over is not None:
            held = self.lock.took_over
            self.log(f"{self.url}: took over the lock of a run that stopped answering "
                     f"({held.host}, pid {held.pid}, last heartbeat {held.age_s:.0f} s ago)")
        self._thread = threading.Thread(target=self._loop, name="neuron-batch-s3-sync",
                                        daemon=True)
        self._thread.start()
        try:
            with translated(self.url):
                self._rebuild()
        except BaseException:
            self._stop_heartbeat()
            self._release()
            raise
        self.log(f"{self.url}: the run works in {self.staging}, mirrored to the bucket as it "
                 f"goes")
        self._last_part = self._last_files = time.monotonic()
        self._mirroring = True
        return self.staging

    def _stop_heartbeat(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def close(self, *, failing: bool = False) -> None:
        """Upload what is left, end the outputs as one outputs.jsonl, release the lock. A
        store that does not answer: StorageError exit 4, the outputs kept in the staging
        folder (logged instead where the run is already `failing`)."""
        with self._turn:
            self._mirroring = False
        problem = self.failed
        if problem is None and not self.lost:
            try:
                self._retrying(lambda: self._sync(final=True))
                if not self.lost:
                    self._retrying(self._consolidate)
            except StorageError as error:
                problem = error
        self._stop_heartbeat()
        if self.lost:
            return
        if problem is None:
            self._release()
            return
        stopped = StorageError(self.url, problem.code, (
            f"the store stopped answering ({str(problem).rsplit(': ', 1)[-1]}); the run's "
            f"outputs are kept in {self.staging} and reach the bucket with --resume on this "
            f"host"), exit_code=EXIT_INTERRUPTED)
        if failing:
            self.log(str(stopped))
            return
        raise stopped

    def _release(self) -> None:
        if self.lock is not None:
            try:
                with translated(self.url):
                    self.lock.release()
            except StorageError as error:
                self.log(f"{self.url}: the lock was not released ({error.code}); it is taken "
                         f"over once its heartbeat is {self.stale_s:.0f} s old")

    # -- the mirror, in the background ---------------------------------------------------------
    def _loop(self) -> None:
        tick = max(0.05, min(1.0, self.sync_s / 4))
        beat_every = max(0.2, min(30.0, self.stale_s / 3))
        last_beat = time.monotonic()
        failing_since: float | None = None
        wait = tick
        while not self._stop.wait(wait):
            try:
                with translated(self.url):
                    if time.monotonic() - last_beat >= beat_every:
                        assert self.lock is not None
                        if not self.lock.refresh():
                            self._lose()
                            return
                        last_beat = time.monotonic()
                    with self._turn:
                        if self._mirroring:
                            self._sync(final=False)
                failing_since, wait = None, tick
            except Exception as error:  # (any store failure: retried, then the run stops)
                if not self._mirroring:     # (rebuild and close() see the store themselves)
                    wait = min(10.0, max(tick, wait * 2))
                    continue
                mapped = error if isinstance(error, StorageError) else storage_error(
                    self.url, error)
                if mapped is None:
                    mapped = StorageError(self.url, type(error).__name__, str(error))
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    self.log(f"{mapped}; retrying for up to {self.retry_s:.0f} s")
                if now - failing_since >= self.retry_s:
                    self.failed = mapped
                    self.log(f"{self.url}: the store has not answered for "
                             f"{self.retry_s:.0f} s: stopping the run (exit 4); its outputs "
                             f"are kept in {self.staging}; rerun with --resume on this host")
                    _stop_the_run()
                    return
                wait = min(10.0, max(tick, wait * 2))

    def _lose(self) -> None:
        self.lost = True
        self.log(f"{self.url}: another run took the lock over; stopping this one (exit 4), "
                 f"nothing more is written to the bucket")
        if self._mirroring:     # (the run is going: it stops as a signalled run does)
            _stop_the_run()

    def _retrying(self, action: Callable[[], None]) -> None:
        """`action`, retried with backoff for up to retry_s; StorageError after that."""
        since, wait = time.monotonic(), 0.2
        while True:
            try:
                with translated(self.url):
                    action()
                return
            except StorageError as error:
                if time.monotonic() - since + wait > self.retry_s or error.exit_code == 2 \
                        and error.code in ("AccessDenied", "NoSuchBucket"):
                    raise
            time.sleep(wait)
            wait = min(10.0, wait * 2)

    def _sync(self, *, final: bool) -> None:
        now = time.monotonic()
        self._sync_outputs(final or now - self._last_part >= self.sync_s)
        if final or now - self._last_files >= self.sync_s:
            self._sync_files()
            self._last_files = now

    def _sync_outputs(self, due: bool) -> None:
        path = self.staging / OUTPUTS
        try:
            stat = path.stat()
        except FileNotFoundError:
            if self._end or self._parts or self._whole:
                self._sync_files()          # (moved aside by --restart: previous-*/ first)
                self._reset_outputs()
            return
        if (self._inode is not None and stat.st_ino != self._inode) or stat.st_size < self._end:
            self._sync_files()      # (the old outputs up as previous-*/ before they go)
            self._reset_outputs()
        self._inode = stat.st_ino
        with open(path, "rb") as handle:
            if stat.st_size > self._scanned:    # (each byte read once to count its lines)
                handle.seek(self._scanned)
                new = handle.read(stat.st_size - self._scanned)
                if (last := new.rfind(b"\n")) >= 0:
                    self._lines_end = self._scanned + last + 1
                    self._pending += new.count(b"\n")
                self._scanned = self._lines_end
            while self._lines_end > self._end and (due or self._pending >= self.part_lines):
                handle.seek(self._end)
                part = handle.read(min(self._lines_end - self._end, CHUNK))
                cut = part.rfind(b"\n") + 1
                if cut == 0:        # (one line over 64 MiB: to its end)
                    part += handle.read(self._lines_end - self._end - len(part))
                    cut = part.find(b"\n", CHUNK) + 1
                key = f"{self.prefix}{PARTS}{self._end:015d}.jsonl"
                self.objects.put_bytes(key, part[:cut])
                self._parts.append(key)
                self._pending = max(0, self._pending - part[:cut].count(b"\n"))
                self._end += cut
                self._last_part = time.monotonic()

    def _reset_outputs(self) -> None:
        keys = list(self._parts) + ([f"{self.prefix}{OUTPUTS}"] if self._whole else [])
        self.objects.delete(keys)
        self._parts, self._whole, self._end, self._inode = [], 0, 0, None
        self._scanned = self._lines_end = self._pending = 0

    def _sync_files(self) -> None:
        present: set[str] = set()
        for rel, path in _files_of(self.staging):
            present.add(rel)
            stat = path.stat()
            signature = (stat.st_size, stat.st_mtime_ns)
            if self._files.get(rel) == signature:
                continue
            # (a JSONL file being appended to goes up to its last whole line)
            end = _lines_end(path, stat.st_size) if rel.endswith(".jsonl") else stat.st_size
            key = f"{self.prefix}{rel}"
            inode, held, tail = self._appended.get(rel, (None, 0, 0))
            # (appended to, not written anew: the same file, and the bytes before where the
            # bucket's copy ends are still what they were)
            if rel.endswith(".jsonl") and inode == stat.st_ino and _MIN_PART <= held <= end \
                    and tail_crc(path, held) == tail:
                self.objects.append_file(key, path, held, end)
            else:
                self.objects.put_file(key, path, 0, end)
            self._appended[rel] = (stat.st_ino, end, tail_crc(path, end))
            self._files[rel] = signature
            self._remote.add(rel)
        gone = sorted(self._remote - present)
        self.objects.delete([f"{self.prefix}{rel}" for rel in gone])
        self._remote -= set(gone)
        for rel in gone:
            self._files.pop(rel, None)

    def _consolidate(self) -> None:
        """The bucket's outputs as one outputs.jsonl (the parts deleted after it is whole)."""
        if not self._parts and self._whole == self._end:
            return
        self.objects.put_file(f"{self.prefix}{OUTPUTS}", self.staging / OUTPUTS, 0, self._end)
        self._whole = self._end
        self.objects.delete(self._parts)
        self._parts = []

    # -- resume: the staging folder from the bucket ----------------------------------------
    def _rebuild(self) -> None:
        whole, parts, files = 0, [], []
        for rel, size in self.objects.listing(self.prefix):
            if rel == LOCK_KEY or rel.startswith(".neuron-batch-probe-"):
                continue
            match = _PART.fullmatch(rel)
            if rel == OUTPUTS:
                whole = size
            elif match is not None:
                parts.append((int(match[1]), size, rel))
            elif not any(part.startswith(".") for part in rel.split("/")):
                files.append(rel)
        self.staging.mkdir(parents=True, exist_ok=True)
        fetched = self.staging / ".outputs.bucket"
        end = self._fetch_outputs(fetched, whole, sorted(parts))
        local = self.staging / OUTPUTS
        keep = local.exists() and _starts_with(local, fetched)
        if not keep:
            if any(_files_of(self.staging)) or local.exists():
                self.log(f"{self.url}: the staging folder {self.staging} differs from the "
                         f"bucket; it is replaced by the bucket's copy")
            _clear(self.staging, but=fetched)
            if end:
                os.replace(fetched, local)
        fetched.unlink(missing_ok=True)
        if not keep:
            for name in _DONE_INDEXES:
                (self.staging / name).unlink(missing_ok=True)
        for rel in files:
            target = self.staging / rel
            if keep and target.exists() and rel not in _KEPT_FROM_BUCKET:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            self.objects.download(f"{self.prefix}{rel}", target)
            stat = target.stat()
            self._files[rel] = (stat.st_size, stat.st_mtime_ns)
        self._remote = set(files)
        self._whole = whole
        self._parts = [f"{self.prefix}{rel}" for _, _, rel in sorted(parts)]
        self._end = self._scanned = self._lines_end = end
        self._inode = local.stat().st_ino if local.exists() else None

    def _fetch_outputs(self, target: Path, whole: int,
                       parts: list[tuple[int, int, str]]) -> int:
        """outputs.jsonl as the bucket has it (its whole object, then each part that goes on
        where the file ends) into `target`; its size."""
        end = 0
        with open(target, "wb") as out:
            if whole:
                end += self.objects.copy_into(f"{self.prefix}{OUTPUTS}", out)
            for start, size, rel in parts:
                if start + size <= end:
                    continue            # (already in outputs.jsonl)
                if start != end:
                    self.log(f"{self.url}: {rel} does not go on from byte {end:,} of the "
                             f"outputs; it and the parts after it are left out (their requests "
                             f"run again)")
                    break
                end += self.objects.copy_into(f"{self.prefix}{rel}", out)
        return end


def _stop_the_run() -> None:
    """Stop the run as a SIGTERM would, through its own handler, from this thread. No OS
    signal: one sent just after the run's handler was put away (the run finished while the
    store failed) killed the process outright (-15, no words); `interrupt_main` does nothing
    then, and close() ends the run with exit 4 from `failed`."""
    _thread.interrupt_main(signal.SIGTERM)


#: What `neuron-batch report` reads of a run folder (report.json; the others say why a folder
#: has none).
REPORT_FILES = ("report.json", "attempts.json", "run.json")


def fetch_report_files(url: str, into: Path) -> list[str]:
    """`neuron-batch report s3://...`: the files of the run folder at `url` that the report
    reads (REPORT_FILES), copied into `into`, without its lock (reading takes none); the names
    found. StorageError (exit 2) where the bucket cannot be read; a prefix holding none of
    them: NoSuchKey."""
    check_output_url(url)
    url = _normal(url)
    bucket, prefix = _bucket_and_prefix(url)
    found = []
    with translated(url):
        client = s3_client()
        client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
        for name in REPORT_FILES:
            try:
                BucketObjects(client, bucket).download(prefix + name, into / name)
            except Exception as error:
                mapped = storage_error(url, error)
                if mapped is None or mapped.code not in ("NoSuchKey", "404"):
                    raise
                (into / name).unlink(missing_ok=True)     # (not there: the next)
                continue
            found.append(name)
    if not found:
        raise StorageError(url, "NoSuchKey", f"no run folder here (none of "
                           f"{', '.join(REPORT_FILES)})")
    return found


def _files_of(folder: Path) -> Iterator[tuple[str, Path]]:
    """(relative name, path) of the files the bucket mirrors: every one but outputs.jsonl,
    outputs.index and hidden ones (the lock, temporary files, scratch)."""
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            path = Path(root) / name
            rel = path.relative_to(folder).as_posix()
            if name.startswith(".") or rel == OUTPUTS or rel in _DONE_INDEXES:
                continue
            yield rel, path


def _lines_end(path: Path, size: int) -> int:
    """Where the last whole line of the first `size` bytes of `path` ends."""
    with open(path, "rb") as handle:
        return whole_lines_end(handle, size)


def _starts_with(path: Path, head: Path) -> bool:
    """Whether `path` begins with the bytes of `head`."""
    with open(path, "rb") as whole, open(head, "rb") as start:
        while True:
            expected = start.read(1 << 20)
            if not expected:
                return True
            if whole.read(len(expected)) != expected:
                return False


def _clear(folder: Path, but: Path) -> None:
    """Every entry of `folder` but hidden ones (the local lock) and `but`."""
    for entry in folder.iterdir():
        if entry.name.startswith(".") or entry == but:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
