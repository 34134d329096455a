"""Where a file's last whole line ends: a run killed mid-write leaves a torn last line, which
neither a resume (job/folder.py) nor an upload (storage/run_bucket.py) may take; and the CRC-32
that tells whether a file's bytes up to a point are still the ones seen (`tail_crc`)."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import BinaryIO

_BACK = 1 << 16     # read backwards this much at a time: a line is rarely longer


def whole_lines_end(handle: BinaryIO, size: int) -> int:
    """Where the last whole line of the first `size` bytes of `handle` ends (0: none)."""
    end = size
    while end > 0:
        start = max(0, end - _BACK)
        handle.seek(start)
        newline = handle.read(end - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def tail_crc(path: Path, end: int, tail: int = 64 << 10) -> int:
    """CRC-32 of the (up to) `tail` bytes of `path` before byte `end`: a file that grew by
    appending still has them (an upload resumed, outputs summed so far)."""
    with open(path, "rb") as handle:
        handle.seek(max(0, end - tail))
        return zlib.crc32(handle.read(min(end, tail)))
