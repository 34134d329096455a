"""What a run that a signal stopped where it does not wait leaves behind (job/stop.py): its
attempt in attempts.json and the words of the one line the CLI prints. A run stopped in a
phase that waits (the engine loop, the report) ends through the runner's usual path."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from neuron_batch.job.folder import OutputError, RunFolder
from neuron_batch.job.stop import Interrupted
from neuron_batch.report.model import Attempt, Ended
from neuron_batch.report.notes import interrupted_line
from neuron_batch.report.schema import ABSENT
from neuron_batch.settings import RunSettings


def record_early_stop(settings: RunSettings, out_dir: Path, stop: Interrupted,
                      started: float) -> str:
    """A run stopped while its inputs were read: the attempt goes into the run folder's
    attempts.json (taken for the moment) where that folder is this job's to write to (new, or
    --resume'd; a run there this job was not checked against yet is left alone); returns the
    line the CLI prints."""
    folder = RunFolder(out_dir)
    try:
        folder.lock()
    except OutputError:      # (another run holds it: nothing of ours to record there)
        pass
    else:
        try:
            if settings.resume or not folder.has_previous_run():
                record_stop(folder, stop, started, 0)
        finally:
            folder.unlock()
    return interrupted_line(stop.signal, stop.phase, insisted=stop.insisted, completed=None,
                            total=None, folder=out_dir)


def stopped_attempt(stop: Interrupted, attempt: int, started: float,
                    finished: int) -> dict[str, Any]:
    """attempts.json's line of an attempt a signal stopped where it does not wait."""
    return Attempt(attempt=attempt, ended=Ended.INTERRUPTED, signal=stop.signal,
                   phase=stop.phase, insisted=True if stop.insisted else ABSENT,
                   requests_finished=finished, wall_time_s=round(time.time() - started, 3),
                   started=time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
                   pid=os.getpid()).to_dict()


def record_stop(folder: RunFolder, stop: Interrupted, started: float, finished: int,
                attempt: int | None = None) -> None:
    """The attempt a signal stopped where it does not wait, added to attempts.json: number
    `attempt` (the one whose records it may have begun), else the next after the folder's."""
    attempts = folder.attempts()
    if attempt is None:
        attempt = max([len(attempts), *folder.records_layout()]) + 1
    folder.write_attempts([*attempts, stopped_attempt(stop, attempt, started, finished)])
