"""scheduler/lifeline.py: vLLM's engine-core process of a replica ends with the replica's actor.

A real parent process starts a real child that ties itself to the parent; the parent is then
killed with SIGKILL (as Ray's restart test does to a replica) and the child must end too, both
through prctl's death signal and through the polling fallback used where prctl is missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from neuron_batch.scheduler.lifeline import exit_with_parent

psutil = pytest.importorskip("psutil")
ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import os, sys, time
import neuron_batch.scheduler.lifeline as lifeline
if sys.argv[2] == "poll":
    lifeline._set_death_signal = lambda: False
    lifeline.POLL_S = 0.05
lifeline.exit_with_parent(os.getppid())
open(sys.argv[1], "w").write("tied")
time.sleep(120)
"""

PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]])
print(child.pid, flush=True)
time.sleep(120)
"""


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics")
@pytest.mark.parametrize("how", ["prctl", "poll"])
def test_the_engine_core_child_ends_when_its_parent_is_killed(tmp_path, how):
    marker = tmp_path / "tied"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(marker), how],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert time.monotonic() < deadline, "the child never tied itself to its parent"
            time.sleep(0.02)
        assert not _ended(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        while not _ended(child):
            assert time.monotonic() < deadline, "the child outlived its parent"
            time.sleep(0.02)
    finally:
        parent.kill()


def test_nothing_happens_in_the_parent_itself():
    exit_with_parent(os.getpid())   # the engine core in-process: this process goes on, unwatched
    assert not any(thread.name == "parent-watch" for thread in threading.enumerate())
