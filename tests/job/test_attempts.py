"""attempts.json's lines are built as one type (report/model.py `Attempt`, `Ended` with every
way an attempt ends, "killed" included) by each writer, and read back unchanged."""

import json
import time

from neuron_batch.job.folder import RunFolder
from neuron_batch.job.stop import READING, Interrupted
from neuron_batch.report.model import Attempt, Ended
from neuron_batch.run.interrupted import stopped_attempt
from neuron_batch.run.runner import record_killed

#: Lines as the writers wrote them before they were typed (attempts.json of older runs).
OLD_LINES = [
    {"attempt": 1, "ended": "completed", "requests_finished": 3, "wall_time_s": 1.5,
     "started": "2026-12-01T02:00:00", "device": "sim", "pid": 7, "requests_failed": 0,
     "errors": [], "startup": {"compiled": False}},
    {"attempt": 2, "ended": "interrupted", "signal": "SIGTERM", "phase": READING,
     "insisted": True, "requests_finished": 0, "wall_time_s": 0.2,
     "started": "2026-12-01T02:00:00", "pid": 8},
    {"attempt": 3, "ended": "deadline", "requests_finished": 1, "max_runtime_s": 60.0},
    {"attempt": 4, "ended": "failed", "error": "the engine failed"},
    {"attempt": 5, "ended": "killed", "requests_finished": 2},
    {"attempt": 6, "ended": "completed", "ray": "127.0.0.1:6379", "generation_s": 3.0,
     "replicas": [{"replica": 0}], "part": "short", "unknown_later_key": 1},
]


def test_every_end_an_attempt_has_is_an_ended_value():
    assert {line["ended"] for line in OLD_LINES} <= {e.value for e in Ended}
    assert Ended("killed") is Ended.KILLED


def test_old_lines_read_and_write_back_unchanged():
    for line in OLD_LINES:
        attempt = Attempt.from_dict(line)
        assert isinstance(attempt.ended, Ended)
        assert attempt.to_dict() == line
        assert list(attempt.to_dict()) == list(line)      # (key order too)


def test_a_signal_before_the_engine_and_a_killed_attempt_write_typed_lines(tmp_path):
    stop = Interrupted("SIGTERM", READING, insisted=True)
    line = stopped_attempt(stop, 2, time.time(), 0)
    assert {k: line[k] for k in ("attempt", "ended", "signal", "phase", "insisted")} == {
        "attempt": 2, "ended": "interrupted", "signal": "SIGTERM", "phase": READING,
        "insisted": True}
    assert Attempt.from_dict(json.loads(json.dumps(line))).to_dict() == line
    folder = RunFolder(tmp_path / "run")
    folder.path.mkdir()
    (folder.path / "records-1.jsonl").write_text("")
    attempts = record_killed(folder, [])
    assert attempts == [{"attempt": 1, "ended": "killed", "requests_finished": 0}]
    assert folder.attempts() == attempts
