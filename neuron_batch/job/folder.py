"""The output folder of a run: a lock, the outputs written as requests finish, and resume.

Layout of a run folder:
    outputs.jsonl        one line per finished request, appended and flushed as it finishes
    outputs.index        per line of outputs.jsonl, 8 bytes: its request's index in the job
                         and the line's length, appended once the line is flushed: what
                         --resume reads to know what is done (`load_done`)
    skipped.jsonl        the input lines --on-error skip left out (inputs/skipped.py)
    run.json             the settings and an input fingerprint (resume checks it)
    requests.jsonl.gz    per request, in input order, its id and a digest of what it asks
                         for (resume_check.py: --resume refuses a changed one); gzip, a JSON
                         row a line after a `{"fields": ...}` line (~8 bytes a request; a
                         folder written before it has requests.json, one JSON document)
    previous-<time>/     a run --restart moved aside (nothing is deleted)
    records-N.jsonl      the scheduler's step/request records of attempt N (1, 2, ... on resume)
    records-N-rK.jsonl   the same of replica K of attempt N, in a --replicas run (written by the
                         driver from what the replica sends back); -rK-restartJ.jsonl after
                         Ray restarted that replica's process J times
    attempts.json        per attempt: wall time, requests finished, how it ended
    report.json          the report over the whole input (rewritten at the end of each attempt)
    .lock                held (flock) while a run uses the folder

Nothing here imports vLLM. A run killed at any point (kill -9 included) leaves every line it
flushed; a torn last line is cut off on resume, and requests already in outputs.jsonl are not
run again. A line flushed whose index entry was not (killed between the two writes) is read
from outputs.jsonl itself and its entry written then; a folder without outputs.index (written
before it existed) has it built from outputs.jsonl once.
"""

from __future__ import annotations

import errno
import fcntl
import gzip
import itertools
import json
import os
import re
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from neuron_batch.job.done import DoneRequests
from neuron_batch.job.outputs_tally import SAVE_EVERY, OutputsTally, load_tally, save_tally
from neuron_batch.storage.lines import whole_lines_end

OUTPUTS = "outputs.jsonl"
DONE_INDEX = "outputs.index"
#: An outputs.index entry: the request's index in the job, the length of its line.
_ENTRY = struct.Struct("<II")
#: (12-byte entries: the request's index, outputs.jsonl's size after its line; a folder written
#: before 2026-12-05 has it, and the next run builds outputs.index from outputs.jsonl once)
_OLD_DONE_INDEX = "outputs.idx"
MANIFEST = "run.json"
REQUESTS = "requests.jsonl.gz"
#: REQUESTS' gzip level: 1, not 6. A row is ~55 bytes of JSON; a million rows whose prompt
#: digests all differ took 1.37 s at level 6 to compress to 13.5 bytes a row, 0.36 s at level
#: 1 to 15.2 (a trace's rows repeat their digests and compress faster at either level).
REQUESTS_LEVEL = 1
OLD_REQUESTS = "requests.json"      # (folders written before 2026-12-05: read, never written)
PREVIOUS = "previous-"
ATTEMPTS = "attempts.json"
REPORT = "report.json"
LOCK = ".lock"
_RECORDS_NAME = re.compile(
    r"records-(?P<attempt>\d+)(?:-r(?P<replica>\d+)(?:-restart(?P<restart>\d+))?)?\.jsonl")


class OutputError(Exception):
    """The output folder cannot be used; `exit_code` says how the CLI should exit."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class FolderBusy(OutputError):
    pass


@dataclass
class RunFolder:
    path: Path
    _lock_file: IO[str] | None = None
    _outputs: IO[bytes] | None = None
    _index: IO[bytes] | None = None
    _size: int = 0                  # outputs.jsonl's size, as this process wrote it
    _index_ok: bool = False         # outputs.index covers every line of outputs.jsonl
    _tally: OutputsTally | None = None  # the sums over outputs.jsonl, while it is open
    done: DoneRequests = field(default_factory=DoneRequests)

    # -- locking --------------------------------------------------------------------------
    def lock(self) -> None:
        """Take the folder for this process, or fail at once if another run holds it."""
        self.path.mkdir(parents=True, exist_ok=True)
        handle = open(self.path / LOCK, "a+", encoding="utf-8")
        self._take(handle)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self._lock_file = handle

    def refuse_if_in_use(self) -> None:
        """FolderBusy if another run holds the folder now; touches nothing. The run asks this
        before it reads its inputs or loads anything, so a second run on a folder in use is
        refused in a moment; `lock` takes it later (and refuses a run that came meanwhile)."""
        try:
            handle = open(self.path / LOCK, encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return                  # (never locked: a new folder, or none yet)
        try:
            self._take(handle)
            fcntl.flock(handle, fcntl.LOCK_UN)
        finally:
            handle.close()

    def _take(self, handle: IO[str]) -> None:
        """flock `handle` for this process, or raise FolderBusy naming its holder (closed)."""
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise FolderBusy(
                f"{self.path} is in use by another neuron-batch run ({holder}); wait for it to "
                f"finish or choose another --output", exit_code=5) from None

    def unlock(self) -> None:
        self.close_outputs()
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    # -- manifest and previous attempts ---------------------------------------------------------
    def has_previous_run(self) -> bool:
        outputs = self.path / OUTPUTS
        return (self.path / MANIFEST).exists() or (outputs.exists() and outputs.stat().st_size > 0)

    def read_manifest(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.path / MANIFEST).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_json_atomic(self.path / MANIFEST, manifest)

    def iter_requests(self) -> Iterator[list[Any]] | None:
        """requests.jsonl.gz's rows one at a time (a 10M-request job's rows are not held:
        issue 46), or None where there is none (a folder written before it was)."""
        path = self.path / REQUESTS
        if path.exists():
            return _gzip_rows(path)
        try:
            with open(self.path / OLD_REQUESTS, encoding="utf-8") as handle:
                return iter(json.load(handle)["requests"])
        except FileNotFoundError:
            return None

    def write_requests(self, fields: Iterable[str], rows: Iterable[list[Any]]) -> None:
        """Written as `rows` come (a job's rows are not held: issue 46), then moved into
        place: a folder never has half a list. A spool of them (job/rows_spool.py, which
        writes this file's format with these fields) is copied as it is."""
        tmp = self.path / f".{REQUESTS}.tmp"
        copy = getattr(rows, "copy_to", None)
        if copy is not None:
            copy(tmp)
            os.replace(tmp, self.path / REQUESTS)
            return
        with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=REQUESTS_LEVEL) as handle:
            handle.write(json.dumps({"fields": ["id", *fields]}) + "\n")
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, self.path / REQUESTS)

    def move_aside(self) -> Path:
        """Move this folder's run (every entry but the hidden ones: the lock, which this
        process holds, and vLLM's scratch) into previous-<time>/ in it: --restart keeps it."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target, n = self.path / f"{PREVIOUS}{stamp}", 1
        while target.exists():
            n += 1
            target = self.path / f"{PREVIOUS}{stamp}-{n}"
        target.mkdir()
        for entry in sorted(self.path.iterdir()):
            if entry != target and not entry.name.startswith((".", PREVIOUS)):
                os.replace(entry, target / entry.name)
        self.done.clear()
        return target

    def attempts(self) -> list[dict[str, Any]]:
        try:
            return json.loads((self.path / ATTEMPTS).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []

    def write_attempts(self, attempts: list[dict[str, Any]]) -> None:
        write_json_atomic(self.path / ATTEMPTS, attempts)

    def records_path(self, attempt: int) -> Path:
        return self.path / f"records-{attempt}.jsonl"

    def records_paths(self) -> list[Path]:
        """The single-engine attempts' records files, in attempt order."""
        return [path for path in self.records_layout().values() if isinstance(path, Path)]

    def replica_records_path(self, attempt: int, replica: int, restart: int = 0) -> Path:
        suffix = f"-restart{restart}" if restart else ""
        return self.path / f"records-{attempt}-r{replica}{suffix}.jsonl"

    def records_layout(self) -> dict[int, Path | dict[int, list[Path]]]:
        """Attempt -> its records: one file (a single engine), or per replica the files of
        each of its processes in restart order (a --replicas run). In attempt order."""
        layout: dict[int, Any] = {}
        for path in self.path.glob("records-*.jsonl"):
            match = _RECORDS_NAME.fullmatch(path.name)
            if match is None:
                continue
            attempt = int(match["attempt"])
            if match["replica"] is None:
                layout[attempt] = path
                continue
            replicas = layout.setdefault(attempt, {})
            if isinstance(replicas, dict):
                replicas.setdefault(int(match["replica"]), []).append(
                    (int(match["restart"] or 0), path))
        for entry in layout.values():
            if isinstance(entry, dict):
                for replica, paths in entry.items():
                    entry[replica] = [path for _, path in sorted(paths)]
        return dict(sorted(layout.items()))

    # -- outputs ------------------------------------------------------------------------------
    def load_done(self, ids: Sequence[str | None] = (), id_key: str = "id") -> int:
        """Learn which requests are done (`done`) without holding their outputs: from
        outputs.index, whose entries give each line's request by its index in the job
        (`ids[record.index]` is its id; None where the index holds no request: a line
        --on-error skip left out); lines outputs.index does not cover (a run killed between
        its two writes, a folder from before it, a staging folder rebuilt from a bucket) are
        read from outputs.jsonl and their entries written. A torn last line of either (a run
        killed mid-write) is cut off first. Without `ids` every line is read and the index
        is left to the next run that gives them. Holds one entry or line at a time (a
        resume's memory is a first attempt's, whatever is done). Returns the number of
        output lines."""
        path, index_path = self.path / OUTPUTS, self.path / DONE_INDEX
        self._index_ok = False
        (self.path / _OLD_DONE_INDEX).unlink(missing_ok=True)   # (rebuilt as outputs.index)
        if not path.exists():
            index_path.unlink(missing_ok=True)      # (stale: no line is indexed)
            self._index_ok = True
            return 0
        size = _cut_torn_line(path)
        covered, lines = self._done_from_index(index_path, ids, size) if ids else (0, 0)
        where = _Positions(ids)
        with open(path, "rb") as handle, \
                _IndexTail(index_path, lines if ids else None) as index_file:
            handle.seek(covered)
            for line in handle:
                if not line.strip():
                    continue
                row = json.loads(line)
                # (an OpenAI batch line's `id` is its batch_req_N: its request is its custom_id)
                rid = str(row["custom_id"] if "custom_id" in row else row.get(id_key))
                position = where.of(rid, row.get("index")) if ids else None
                self.done.add(position, rid)
                index_file.add(position, len(line))
                lines += 1
            self._index_ok = index_file.whole
        return lines

    def _done_from_index(self, index_path: Path, ids: Sequence[str | None],
                         size: int) -> tuple[int, int]:
        """(bytes of outputs.jsonl, lines) the index covers, its requests added to `done`;
        (0, 0), nothing added, where it is not this file's index (outputs.jsonl decides)."""
        covered = lines = 0
        try:
            with open(index_path, "rb") as handle:
                while chunk := handle.read(_ENTRY.size * 65536):
                    chunk = chunk[:len(chunk) - len(chunk) % _ENTRY.size]   # (a torn last one)
                    for index, length in _ENTRY.iter_unpack(chunk):
                        rid = ids[index] if index < len(ids) else None
                        if not length or covered + length > size or rid is None:
                            self.done.clear()
                            return 0, 0
                        covered, lines = covered + length, lines + 1
                        self.done.add(index, rid)
        except FileNotFoundError:
            return 0, 0
        if covered and not _ends_a_line(self.path / OUTPUTS, covered):
            self.done.clear()
            return 0, 0
        return covered, lines

    def iter_outputs(self) -> Iterator[dict[str, Any]]:
        """outputs.jsonl's lines one at a time (a --resume's batch.json counts them without
        holding them)."""
        path = self.path / OUTPUTS
        if not path.exists():
            return
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    yield json.loads(line)

    def open_outputs(self) -> None:
        """Open outputs.jsonl to append; outputs.index too where `load_done` found it whole
        (else it is removed: the next --resume builds it again from outputs.jsonl)."""
        self._outputs = open(self.path / OUTPUTS, "ab")
        self._size = self._outputs.seek(0, os.SEEK_END)
        self._tally = load_tally(self.path)
        if self._index_ok:
            self._index = open(self.path / DONE_INDEX, "ab")
        else:
            (self.path / DONE_INDEX).unlink(missing_ok=True)

    def append_output(self, row: dict[str, Any], index: int | None = None) -> None:
        """Write one finished request (`index`: its position in the job, for outputs.index).
        Flushed at once: a crash keeps every finished line."""
        assert self._outputs is not None
        line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
        try:
            self._outputs.write(line)
            self._outputs.flush()
            self._size += len(line)
            if self._tally is not None:
                self._tally.add(row, len(line))
                if self._tally.completed % SAVE_EVERY == 0:
                    save_tally(self.path, self._tally)
            if self._index is not None:
                if index is None:   # (a line it cannot name: the index is given up)
                    self._drop_index()
                else:
                    self._index.write(_ENTRY.pack(index, len(line)))
                    self._index.flush()
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise OutputError(f"{self.path}: the disk is full; {len(self.done)} finished "
                                  f"outputs are kept in {OUTPUTS}; free space and rerun with "
                                  f"--resume", exit_code=1) from None
            raise

    def tally(self) -> OutputsTally:
        """The sums over outputs.jsonl as it is now (job/outputs_tally.py): the open file's, as
        kept, else loaded."""
        if self._tally is not None:
            return replace(self._tally)
        return load_tally(self.path)

    def close_outputs(self) -> None:
        if self._outputs is not None and self._tally is not None:
            # (of the lines flushed whole; a full disk leaves the last save: a reader adds
            # what it lacks)
            save_tally(self.path, self._tally)
        self._tally = None
        handles, self._outputs, self._index = (self._outputs, self._index), None, None
        for handle in handles:
            if handle is None:
                continue
            try:
                handle.close()
            except OSError as error:    # (what a full disk did not take: a torn last line,
                if error.errno != errno.ENOSPC:     # cut off by the next load_done)
                    raise

    def _drop_index(self) -> None:
        assert self._index is not None     # (its one caller has checked)
        self._index.close()
        self._index, self._index_ok = None, False
        (self.path / DONE_INDEX).unlink(missing_ok=True)


def _cut_torn_line(path: Path) -> int:
    """Cut a torn last line (no newline: a run killed mid-write) off `path`; its size after."""
    with open(path, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        end = whole_lines_end(handle, size)
        if end != size:
            handle.truncate(end)
        return end


def _ends_a_line(path: Path, offset: int) -> bool:
    with open(path, "rb") as handle:
        handle.seek(offset - 1)
        return handle.read(1) == b"\n"


class _Positions:
    """A request's index in the job from its output line: the line's own `index` where the job
    has that id there (a native line), else by its id (an OpenAI batch line): a scan for the
    first few in a small job, else a table of the ids' hashes (8 + 8 bytes a request, built
    once; a scan of 10M ids decoded one by one takes ~10 s)."""

    _SCANS, _SCANNED_JOB = 8, 100_000

    def __init__(self, ids: Sequence[str | None]):
        self.ids, self.scans = ids, 0
        self.hashes: Any = None     # (numpy arrays: sorted hashes, their indices)

    def of(self, rid: str, index: Any) -> int | None:
        ids = self.ids
        if isinstance(index, int) and 0 <= index < len(ids) and ids[index] == rid:
            return index
        if self.scans < self._SCANS and len(ids) <= self._SCANNED_JOB:
            self.scans += 1
            try:
                return ids.index(rid)
            except ValueError:
                return None
        if self.hashes is None:
            import numpy as np  # (only here: most resumes never need the table)

            keys = np.fromiter((0 if r is None else hash(r) for r in ids), np.int64, len(ids))
            order = np.argsort(keys, kind="stable")
            self.hashes = (keys[order], order)
        keys, order = self.hashes
        at = int(keys.searchsorted(hash(rid)))
        while at < len(keys) and keys[at] == hash(rid):
            if ids[int(order[at])] == rid:
                return int(order[at])
            at += 1
        return None


class _IndexTail:
    """outputs.index from its first `kept` entries on, entries added as lines are read (None:
    no index is written). `whole`: every line read has its entry (a line no request of the job
    names ends the index there)."""

    def __init__(self, path: Path, kept: int | None):
        self.path, self.kept, self.whole = path, kept, kept is not None
        self.handle: IO[bytes] | None = None

    def __enter__(self) -> _IndexTail:
        if self.kept is not None:
            self.handle = open(self.path, "r+b" if self.path.exists() else "wb")
            self.handle.truncate(self.kept * _ENTRY.size)
            self.handle.seek(0, os.SEEK_END)
        return self

    def add(self, position: int | None, length: int) -> None:
        if self.handle is None or not self.whole:
            return
        if position is None:    # (an output of no request of this job)
            self.whole = False
            return
        self.handle.write(_ENTRY.pack(position, length))

    def __exit__(self, *_: object) -> None:
        if self.handle is not None:
            self.handle.close()


def guard_disk_full(path: Path, write: Callable[[], object]) -> None:
    """`write()`, a full disk an OutputError naming `path` (the run stops; what is written is
    kept, and --resume finishes it): outputs, errors.jsonl and batch.json alike."""
    try:
        write()
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise OutputError(f"{path}: the disk is full; finished outputs are kept in "
                              f"outputs.jsonl; free space and rerun with --resume",
                              exit_code=1) from None
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def input_fingerprint(ids: Iterable[str]) -> str:
    """A short hash of the request ids in order: resume refuses a folder made from other input."""
    import hashlib

    digest = hashlib.sha256()
    ids = iter(ids)
    # (the same bytes, a batch of ids a call: two calls an id were ~1 s a million)
    while batch := list(itertools.islice(ids, 65536)):
        batch.append("")
        digest.update("\0".join(batch).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:16]


def default_output_dir(inputs: tuple[str, ...], root: Path = Path("results")) -> Path:
    name = Path(inputs[0]).stem if inputs else "prompts"
    if inputs and inputs[0].startswith("hf:"):
        name = inputs[0][3:].replace("/", "_").replace(":", "_")
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:60] or "prompts"
    return root / f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}"


def _gzip_rows(path: Path) -> Iterator[list[Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        next(handle, None)          # (the fields line)
        for line in handle:
            yield json.loads(line)
