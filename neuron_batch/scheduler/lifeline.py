"""Ending vLLM's engine-core process with the process that started it.

A replica of a `--replicas` run (run/replica_actor.py) runs vLLM's engine core in a child
process of its Ray actor. Ray restarts an actor whose process dies (kill -9, out of memory), but
vLLM's engine core does not notice its parent's death: it would go on holding the replica's
NeuronCores (or a CPU core and its memory) beside the restarted replica. The scheduler runs in
that child, so it ties the child's life to the parent's here. Linux only (prctl); elsewhere a
thread polls the parent's pid.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading

#: prctl(2) option: the signal this process gets when the thread that created it ends.
PR_SET_PDEATHSIG = 1
#: Seconds between checks of the parent's pid, where prctl is not available.
POLL_S = 1.0


def exit_with_parent(parent_pid: int) -> None:
    """Make this process end when `parent_pid` ends; nothing when this is that process (the
    engine core runs in-process)."""
    if os.getpid() == parent_pid:
        return
    if not _set_death_signal():
        threading.Thread(target=_watch, args=(parent_pid,), name="parent-watch",
                         daemon=True).start()
    if os.getppid() != parent_pid:   # it died before the signal was set
        os._exit(1)


def _set_death_signal() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int) -> None:
    import time

    while os.getppid() == parent_pid:
        time.sleep(POLL_S)
    os._exit(1)
