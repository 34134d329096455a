"""Keep third-party chatter out of the terminal: while the engine runs, everything written to
file descriptors 1 and 2 goes to `engine.log` in the run folder.

vLLM, torch and the C++ kernels write in ways no Python setting silences: log handlers bound to
the process's stdout when vLLM was imported, C++ warnings straight to fd 2 (the NUMA line),
print()s in plugins. A cron job mails whatever reaches the terminal, so they all go to the log
instead. Our own messages and progress bar (written to `sys.stderr`) still reach the terminal:
when `sys.stderr` is the process's real stream it is pointed at a duplicate of the original
descriptor for the duration; when something else already captured it (a test runner, click's
CliRunner) it is left alone. `sys.stdout` is not swapped: vLLM resolves its log stream,
`ext://sys.stdout`, again whenever it reconfigures logging, and it must keep finding fd 1.
Python warnings raised meanwhile are written to the log too.

Order matters: a module that warns while it is imported, before vLLM's logging is set up, does
so through Python's last-resort handler on `sys.stderr` (vLLM's "Triton is installed, but doesn't
include CPU backend"), so `preload` (importing such modules) runs after the descriptors point
at the log and before `sys.stderr` is swapped.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

ENGINE_LOG = "engine.log"


def _is_process_stream(stream: IO[str], fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, OSError, ValueError):   # a Python-level capture, not the fd
        return False


@contextlib.contextmanager
def engine_output_to(log_path: Path, preload: Callable[[], object] | None = None
                     ) -> Iterator[None]:
    """fd 1 and fd 2 (and Python warnings) -> `log_path` (appended) inside the block."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    log = open(log_path, "a", encoding="utf-8", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    try:
        if preload is not None:
            preload()
    except BaseException:
        for fd, saved_fd in saved.items():
            os.dup2(saved_fd, fd)
            os.close(saved_fd)
        log.close()
        raise
    swapped: dict[str, IO[str]] = {}
    own_streams: list[IO[str]] = []
    for name, fd in (("stderr", 2),):
        stream = getattr(sys, name)
        if _is_process_stream(stream, fd):
            # Our own output keeps going where it went: a stream on a copy of the original fd.
            copy = os.fdopen(os.dup(saved[fd]), "w", buffering=1,
                             encoding=getattr(stream, "encoding", None) or "utf-8",
                             errors="backslashreplace")
            own_streams.append(copy)
            swapped[name] = stream
            setattr(sys, name, copy)
    previous_showwarning = warnings.showwarning

    def to_log(message, category, filename, lineno, file=None, line=None):
        log.write(warnings.formatwarning(message, category, filename, lineno, line))

    warnings.showwarning = to_log
    try:
        yield
    finally:
        warnings.showwarning = previous_showwarning
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, saved_fd in saved.items():
            os.dup2(saved_fd, fd)
            os.close(saved_fd)
        for name, stream in swapped.items():
            setattr(sys, name, stream)
        for stream in own_streams:
            with contextlib.suppress(Exception):
                stream.close()
        log.close()
