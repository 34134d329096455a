"""A job's request rows (requests.jsonl.gz's: job/resume_check.py) made by the check before the
run, as it reads each request, into an anonymous temporary file: a run whose order is the
input's (no --shuffle) then needs no pass of its own over its inputs to make them, which read
and parsed every line again (a third of the time before a 10M-line job's first step, issue
48). Read back as often as asked (a resume compares them), or copied into the run folder as
they are (a fresh run: nothing decoded). What the job asks beyond its tokens (job/facts.py) is
tallied on the way. Nothing is left on disk whatever ends the process: the file has no name.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from neuron_batch.job.facts import FactsTally, JobFacts
from neuron_batch.job.folder import REQUESTS_LEVEL


class RowsSpool:
    """Rows added in input order (`add`), then `close`d: iterable again and again."""

    def __init__(self, fields: list[str] | None, path: Path | None = None):
        """`fields` None, with a `path`: a part's rows (job/check_parts.py), plain JSON lines
        in a file named so that another process can number and compress them, the fields
        line left to the spool they join (`joined`)."""
        self._file: Any = open(path, "w+b") if path is not None else tempfile.TemporaryFile()
        # (as RunFolder.write_requests writes: its gzip level, the fields line first)
        self._gzip: Any = (gzip.GzipFile(fileobj=self._file, mode="wb",
                                         compresslevel=REQUESTS_LEVEL)
                           if fields is not None else self._file)
        if fields is not None:
            self._gzip.write((json.dumps({"fields": fields}) + "\n").encode("utf-8"))
        self.tally = FactsTally()
        self._pending: list[str] = []

    @classmethod
    def joined(cls, fields: list[str], parts: list[Path], tally: FactsTally) -> RowsSpool:
        """One closed spool of the fields line and then each part's rows, as they are (gzip
        members one after another are one gzip file's data), what they ask `tally`."""
        spool = cls(fields)
        assert spool._gzip is not None
        spool._gzip.close()
        spool._gzip = None
        for part in parts:
            with open(part, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    spool._file.write(chunk)
        spool._file.flush()
        spool.tally = tally
        return spool

    def add(self, row: list[Any], request, spec: dict[str, Any]) -> None:
        assert self._gzip is not None, "a closed spool takes no row"
        self.tally.add(request, spec)
        # (a write a row was a third of the spool's cost: gzip's own work per call)
        self._pending.append(_ENCODE(row))
        if len(self._pending) >= _PENDING:
            self._flush()

    def write(self, rows: str) -> None:
        """Rows already made (lines of JSON, as `add` writes them), their requests told to
        `tally` by the caller (a trace's plain rows: job/plain_check.py)."""
        assert self._gzip is not None, "a closed spool takes no row"
        self._flush()
        self._gzip.write(rows.encode("utf-8", "surrogatepass"))

    def _flush(self) -> None:
        if self._pending:
            self._pending.append("")
            self._gzip.write("\n".join(self._pending).encode("utf-8", "surrogatepass"))
            self._pending = []

    def close(self) -> JobFacts:
        """Every row written; what the rows' requests ask beyond their tokens."""
        if self._gzip is not None:
            self._flush()
            if self._gzip is not self._file:
                self._gzip.close()  # (the temporary file stays open: it is the spool)
            self._file.flush()      # (read by os.pread: from the file, not its buffer)
            self._gzip = None
        return self.tally.result()

    def release(self) -> None:
        """A part's file closed (it stays on disk, named, for its spool to join)."""
        self.close()
        self._file.close()

    def __iter__(self) -> Iterator[list[Any]]:
        """The rows, one at a time (each iteration reads the file on its own)."""
        assert self._gzip is None, "close the spool before reading it"
        with gzip.GzipFile(fileobj=io.BufferedReader(_At(self._file.fileno())),
                           mode="rb") as handle:
            next(handle, None)          # (the fields line)
            for line in handle:
                yield json.loads(line)

    def copy_to(self, path: Path) -> None:
        """The gzip file as it is, at `path` (requests.jsonl.gz's bytes: nothing decoded)."""
        assert self._gzip is None, "close the spool before copying it"
        source = _At(self._file.fileno())
        with open(path, "wb") as out:
            while chunk := source.read(1 << 20):
                out.write(chunk)

    def discard(self) -> None:
        self._gzip = None
        self._file.close()


#: A row as `add` writes it (one encoder: json.dumps made one a call).
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode
#: Rows `add` holds before it writes them.
_PENDING = 256


class _At(io.RawIOBase):
    """The spool's file read from its start at an offset of this reader's own (os.pread), so
    two readers never move each other's place."""

    def __init__(self, fd: int):
        self._fd, self._at = fd, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = os.pread(self._fd, len(buffer), self._at)
        buffer[:len(data)] = data
        self._at += len(data)
        return len(data)
