"""`batch.json`: a run folder's state as OpenAI's Batch object, kept current while it runs.

People moving a job from OpenAI's Batch API poll the batch (`status`, `request_counts`,
`usage`) rather than parse a report; this file is that object for a run folder
(../shared/notes/batch-formats.md lists the fields). It is rewritten atomically when the run
starts, at most once a `interval_s` while requests finish (a monitor polling it reads a whole
object, at most that stale), and when the attempt ends:

- `status`: in_progress while an engine runs; completed when the attempt ran to its end;
  cancelled when a signal stopped it, expired when --max-runtime did, failed when the run
  failed (a --resume starts it in_progress again);
- `request_counts`: total (every request line of the input, skipped ones included),
  completed (lines in outputs.jsonl) and failed (lines in errors.jsonl);
- `usage`: input (prompt), cached and output tokens of the completed requests, across
  attempts (a --resume counts the outputs already written);
- `input_file_id`, `output_file_id`, `error_file_id`: the file names (the inputs as given, the
  run folder's outputs.jsonl and errors.jsonl, null while nothing failed); `created_at` is the
  first attempt's (Unix seconds), the other times this attempt's.

A batch.json that cannot be written (a full disk) stops the run as an output that cannot be
written does (OutputError). Nothing here imports vLLM.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from neuron_batch.job.folder import guard_disk_full, write_json_atomic
from neuron_batch.job.outputs_tally import OutputsTally

BATCH = "batch.json"

#: How an attempt ended (attempts.json's `ended`) -> the Batch object's status and the time
#: field it sets.
STATUS_OF_ENDED = {"completed": ("completed", "completed_at"),
                   "nothing to do": ("completed", "completed_at"),
                   "interrupted": ("cancelled", "cancelled_at"),
                   "deadline": ("expired", "expired_at"),
                   "failed": ("failed", "failed_at")}


class BatchFile:
    """batch.json of one run folder, as requests finish."""

    def __init__(self, folder: Path, error_file: Path, *, total: int, inputs: Iterable[str],
                 endpoint: str | None, model: str, max_runtime_s: float | None = None,
                 interval_s: float = 1.0, clock=time.time):
        self.path = folder / BATCH
        self.error_file = error_file
        self.clock = clock
        self.interval_s = interval_s
        previous = self._previous()
        now = int(clock())
        self.obj: dict[str, Any] = {
            "id": previous.get("id") or f"batch_{uuid.uuid4().hex[:24]}",
            "object": "batch", "endpoint": endpoint, "model": model,
            "input_file_id": ",".join(inputs), "output_file_id": "outputs.jsonl",
            "error_file_id": None,
            # (OpenAI takes "24h" only; here the window is --max-runtime's, if any)
            "completion_window": (f"{max_runtime_s:g}s" if max_runtime_s else "unlimited"),
            "status": "in_progress",
            "created_at": previous.get("created_at") or now, "in_progress_at": now,
            "finalizing_at": None, "completed_at": None, "failed_at": None,
            "cancelled_at": None, "expired_at": None,
            "request_counts": {"total": total, "completed": 0, "failed": 0},
            "usage": {}, "errors": None, "metadata": None}
        self.prompt = self.completion = self.cached = 0
        self._written = 0.0

    def _previous(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    # -- counting --------------------------------------------------------------------------
    def start(self, done: OutputsTally, failed: int) -> None:
        """An attempt begins: the outputs already written (a --resume's, their sums: nothing
        read again) and the error records written so far counted, and the file written."""
        counts = self.obj["request_counts"]
        counts["completed"] += done.completed
        self.prompt += done.prompt_tokens
        self.completion += done.completion_tokens
        self.cached += done.cached_tokens
        counts["failed"] = failed
        self.write()

    def completed(self, prompt: int, completion: int, cached: int) -> None:
        self._add(prompt, completion, cached)
        self._maybe_write()

    def failed(self) -> None:
        self.obj["request_counts"]["failed"] += 1
        self._maybe_write()

    def _add(self, prompt: int, completion: int, cached: int) -> None:
        self.obj["request_counts"]["completed"] += 1
        self.prompt += prompt
        self.completion += completion
        self.cached += cached

    def end(self, ended: str) -> None:
        """The attempt ended (attempts.json's `ended` word): the status it gives, written."""
        status, stamp = STATUS_OF_ENDED.get(ended, ("failed", "failed_at"))
        self.obj["status"] = status
        self.obj[stamp] = int(self.clock())
        if status == "completed":
            self.obj["finalizing_at"] = self.obj[stamp]
        self.write()

    # -- writing ---------------------------------------------------------------------------
    def _maybe_write(self) -> None:
        if self.clock() - self._written >= self.interval_s:
            self.write()

    def write(self) -> None:
        self.obj["usage"] = {
            "input_tokens": self.prompt,
            "input_tokens_details": {"cached_tokens": self.cached},
            "output_tokens": self.completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.prompt + self.completion}
        self.obj["error_file_id"] = self.error_file.name if self.error_file.exists() else None
        guard_disk_full(self.path, lambda: write_json_atomic(self.path, self.obj))
        self._written = self.clock()
