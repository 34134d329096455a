"""The output folder of a run: a lock, the outputs written as requests finish, and resume.

Layout of a run folder:
    outputs.jsonl        one line per finished request, appended and flushed as it finishes
    skipped.jsonl        the input lines --on-error skip left out (inputs/skipped.py)
    run.json             the settings and an input fingerprint (resume checks it)
    requests.json        per request, in input order, its id and a digest of what it asks
                         for (resume_check.py: --resume refuses a changed one)
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
run again.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

OUTPUTS = "outputs.jsonl"
MANIFEST = "run.json"
REQUESTS = "requests.json"
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
    _outputs: IO[str] | None = None
    done_ids: set[str] = field(default_factory=set)

    # -- locking --------------------------------------------------------------------------
    def lock(self) -> None:
        """Take the folder for this process, or fail at once if another run holds it."""
        self.path.mkdir(parents=True, exist_ok=True)
        handle = open(self.path / LOCK, "a+", encoding="utf-8")
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
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        self._lock_file = handle

    def unlock(self) -> None:
        self.close_outputs()
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    # -- manifest and previous attempts ---------------------------------------------------------
    def has_previous_run(self) -> bool:
        outputs = self.path / OUTPUTS
        return (self.path / MANIFEST).exists() or (outputs.exists() and outputs.stat().st_size)

    def read_manifest(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.path / MANIFEST).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_json_atomic(self.path / MANIFEST, manifest)

    def read_requests(self) -> list[list[Any]] | None:
        """requests.json's rows, or None where there is none (a folder written before it was)."""
        try:
            return json.loads((self.path / REQUESTS).read_text(encoding="utf-8"))["requests"]
        except FileNotFoundError:
            return None

    def write_requests(self, fields: Iterable[str], rows: list[list[Any]]) -> None:
        """One row a line: 20,000 requests stay a small file that a diff can read."""
        body = ",\n".join(json.dumps(row, ensure_ascii=False) for row in rows)
        tmp = self.path / f".{REQUESTS}.tmp"
        head = json.dumps(["id", *fields])
        tmp.write_text(f'{{"fields": {head},\n"requests": [\n{body}\n]}}\n', encoding="utf-8")
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
        self.done_ids.clear()
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
    def load_done(self, id_key: str = "id") -> list[dict[str, Any]]:
        """Read outputs.jsonl, cutting off a torn last line (a run killed mid-write), and
        remember which ids are done. Returns the output rows."""
        path = self.path / OUTPUTS
        rows: list[dict[str, Any]] = []
        if not path.exists():
            return rows
        data = path.read_bytes()
        cut = data.rfind(b"\n") + 1
        if cut != len(data):
            with open(path, "r+b") as handle:
                handle.truncate(cut)
        for line in data[:cut].splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            rows.append(row)
            # (an OpenAI batch line's `id` is its batch_req_N: its request is its custom_id)
            self.done_ids.add(str(row["custom_id"] if "custom_id" in row else row.get(id_key)))
        return rows

    def read_outputs(self) -> list[dict[str, Any]]:
        path = self.path / OUTPUTS
        if not path.exists():
            return []
        with open(path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def open_outputs(self) -> None:
        self._outputs = open(self.path / OUTPUTS, "a", encoding="utf-8")

    def append_output(self, row: dict[str, Any]) -> None:
        """Write one finished request. Flushed at once: a crash keeps every finished line."""
        assert self._outputs is not None
        try:
            self._outputs.write(json.dumps(row, ensure_ascii=False) + "\n")
            self._outputs.flush()
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise OutputError(f"{self.path}: the disk is full; {len(self.done_ids)} finished "
                                  f"outputs are kept in {OUTPUTS}; free space and rerun with "
                                  f"--resume", exit_code=1) from None
            raise

    def close_outputs(self) -> None:
        if self._outputs is not None:
            self._outputs.close()
            self._outputs = None


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def input_fingerprint(ids: Iterable[str]) -> str:
    """A short hash of the request ids in order: resume refuses a folder made from other input."""
    import hashlib

    digest = hashlib.sha256()
    for item in ids:
        digest.update(item.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def default_output_dir(inputs: tuple[str, ...], root: Path = Path("results")) -> Path:
    name = Path(inputs[0]).stem if inputs else "prompts"
    if inputs and inputs[0].startswith("hf:"):
        name = inputs[0][3:].replace("/", "_").replace(":", "_")
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)[:60] or "prompts"
    return root / f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}"
