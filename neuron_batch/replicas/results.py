"""What the replicas of a `--replicas` run send back, on the driver: `ResultStream` reads Ray
Data's output in a thread of its own and can be stopped cleanly; `ResultWriter` writes it to the
run folder (outputs once each, scheduler records per replica process).

Stopping matters because of how a run ends early (SIGTERM, --max-runtime, a lost node, a failed
replica): the driver then calls ray.shutdown(), and any thread that touches Ray after that makes
Ray's core worker end the whole process ("The core worker has already been shutdown ... The
process will exit"), before the run can say why it stopped. Ray Data's execution runs in threads
(the streaming executor's scheduling loop, the iterator's prefetch workers) that do touch Ray, so
the stream shuts the execution down and waits for those threads first.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from types import SimpleNamespace
from typing import IO, Any

from neuron_batch.engine.engine import Finished, RequestRefused
from neuron_batch.errors import EXIT_FAILED, RunError
from neuron_batch.inputs.prepare import PreparedRequest
from neuron_batch.job.folder import OutputError, RunFolder
from neuron_batch.job.job import Job
from neuron_batch.replicas.actor import REFUSED, RESULT_COLUMN, decode_tokens, unpack
from neuron_batch.replicas.feed import BatchFeed
from neuron_batch.scheduler.records import RequestRecord, requests_block

#: Seconds to wait for Ray Data's threads after its execution is shut down (they poll every
#: 10 ms; the executor's own shutdown waits up to 2 s for its scheduling loop).
STOP_WAIT_S = 60.0


class ResultStream:
    """Iterates the replicas' results (pyarrow tables of packed batches) in a thread, so the
    driver's loop can watch signals, the deadline and the nodes while it waits. `get` returns
    ("batch", table), ("done", None) or ("error", exception), or None after `timeout`."""

    def __init__(self, results):
        self._results = results
        self._inbox: queue.Queue = queue.Queue()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._read, name="ray-data-results",
                                        daemon=True)

    def start(self) -> ResultStream:
        self._thread.start()
        return self

    def get(self, timeout: float) -> tuple[str, Any] | None:
        try:
            return self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None

    def received(self) -> list[Any]:
        """The tables already read and not yet taken."""
        tables: list[Any] = []     # (Ray Data's blocks: pyarrow tables, not read by mypy)
        while True:
            try:
                kind, value = self._inbox.get_nowait()
            except queue.Empty:
                return tables
            if kind == "batch":
                tables.append(value)

    def stop(self) -> bool:
        """Shut Ray Data's execution down (its tasks and replica actors too) and wait for the
        reading thread to end; True when it did, so that ray.shutdown() is safe."""
        self._stopping.set()
        if not self._thread.is_alive():
            return True
        _shutdown_executions()
        self._thread.join(STOP_WAIT_S)
        return not self._thread.is_alive()

    def _read(self) -> None:
        batches = iter(self._results.iter_batches(batch_size=None, batch_format="pyarrow",
                                                  prefetch_batches=1))
        try:
            for table in batches:
                self._inbox.put(("batch", table))
                if self._stopping.is_set():
                    break
            self._inbox.put(("done", None))
        except BaseException as error:  # noqa: BLE001 (handed to the driver's loop)
            if not self._stopping.is_set():
                self._inbox.put(("error", error))
        finally:
            batches.close()   # ends Ray Data's execution in this thread, if it still runs


def _shutdown_executions() -> None:
    """Shut down the Ray Data executions of this process. Ray Data has no public call to cancel
    an iteration from another thread; its StreamingExecutor is a thread, and its shutdown ends
    the scheduling loop, which marks the output finished, so the reading thread's wait ends
    (Ray 2.60; Ray is pinned to the tested range in cluster.TESTED_RAY)."""
    from ray.data._internal.execution.streaming_executor import StreamingExecutor

    for thread in threading.enumerate():
        if isinstance(thread, StreamingExecutor) and thread.is_alive():
            thread.shutdown(force=True)


class ResultWriter:
    """Writes what the replicas send back: outputs once each, records per replica process."""

    def __init__(self, job: Job, attempt: int, feed: BatchFeed,
                 sim_devices: list[str] | None, first_replica: int = 0,
                 side_by_side: int | None = None):
        self.folder: RunFolder = job.folder
        # Replica numbers start here: pools side by side (a split run's parts) number their
        # replicas one after the other, so every engine of the run has its own.
        self.first_replica = first_replica
        # Pools run side by side: each records file says so (with the first pool's attempt),
        # so the report counts them at once even when a killed driver left no attempts line.
        self.side_by_side = side_by_side
        self.attempt = attempt
        # The requests sent and not written yet, by id (what an output line is written from);
        # told when a batch is written, so that the next one can be sent.
        self.feed = feed
        self.by_id = feed.in_flight
        self.outputs = job.outputs          # (job/outputs.py: outputs, error records, batch)
        self.simulated = job.simulated
        self.sim_devices = sim_devices
        self.finished = self.output_tokens = self.duplicates = 0
        self.errors: list[str] = []       # requests the engines refused or failed
        # vLLM's refusal of a request (when a replica added it): its error record under
        # --on-error skip, else the run's error (`refusal`, raised once its batch is written).
        self.skip_refused = job.settings.on_error == "skip"
        self.refusal: str | None = None
        self._failed: set[str] = set()
        self._replica_of_actor: dict[str, int] = {}
        self._files: dict[str, IO[str]] = {}          # incarnation -> its records file
        self._info: list[dict[str, Any]] = []          # per replica
        self._first_ready: float | None = None
        self._last_output: float | None = None

    def write(self, table, log) -> tuple[int, int]:
        """Write a block of results (a row per batch); returns (outputs added, their tokens)."""
        added = tokens = 0
        for blob in table.column(RESULT_COLUMN).to_pylist():
            batch_added, batch_tokens = self._write_batch(unpack(blob), log)
            added += batch_added
            tokens += batch_tokens
        return added, tokens

    def _write_batch(self, columns: dict[str, Any], log) -> tuple[int, int]:
        try:
            return self._write_rows(columns, log)
        finally:    # (written, or raising the run's end: either way its room is free)
            for number in columns.get("batches", ()):
                self.feed.written(number)

    def _write_rows(self, columns: dict[str, Any], log) -> tuple[int, int]:
        if not columns["id"]:
            return 0, 0
        handle = self._records_file(columns, 0)
        added = tokens = 0
        kept: list[RequestRecord] = []
        folder = self.folder
        for i, request_id in enumerate(columns["id"]):
            # (written once: it leaves `by_id` then, and comes back only from a retried batch)
            request = self.by_id.pop(request_id, None)
            if request is None or folder.done.has(request.record.index, request_id) \
                    or request_id in self._failed:
                self.duplicates += 1
                continue
            if columns["finish_reason"][i] == REFUSED:   # vLLM refused it when added
                self._failed.add(request_id)
                self._refused(request, columns["stop_reason"][i] or "", log)
                continue
            if columns["finish_reason"][i] == "error":   # e.g. too big for the KV cache
                self._failed.add(request_id)
                self.errors.append(self.outputs.failed(request, SimpleNamespace(
                    request_id=request_id, stop_reason=columns["stop_reason"][i])))
                log(f"error: {self.errors[-1]}")
                continue
            token_ids = decode_tokens(columns["token_ids"][i])
            done = Finished(request_id, token_ids, columns["text"][i],
                            columns["finish_reason"][i], columns["num_prompt_tokens"][i],
                            columns["stop_reason"][i],
                            json.loads(columns["choices"][i]) if columns["choices"][i] else None,
                            embedding=columns["embedding"][i],
                            tool_calls=json.loads(columns["tool_calls"][i])
                            if columns["tool_calls"][i] else None)
            self.outputs.response(request, done)
            folder.done.add(request.record.index, request_id)
            if columns["request_record"][i] is not None:
                kept.append(columns["request_record"][i])
            added += 1
            tokens += len(token_ids)
        if kept:    # (the records of the outputs written: a request counts once)
            handle.write(requests_block(kept) + "\n")
        handle.write(columns["lines"][0])
        handle.flush()
        self.finished += added
        self.output_tokens += tokens
        self._last_output = time.time()
        if self.refusal is not None:
            # Without --on-error skip a refusal ends the run as on one engine (job/generate.py),
            # once this batch's finished outputs are written and kept.
            raise RunError(self.refusal + (f"; {self.finished:,} finished output(s) are kept "
                                           f"in {folder.path}" if self.finished else ""))
        return added, tokens

    def _refused(self, request: PreparedRequest, message: str, log) -> None:
        if self.skip_refused:
            self.errors.append(self.outputs.refused(request, RequestRefused(message)))
            log(f"error: {self.errors[-1]}")
        elif self.refusal is None:
            self.refusal = f"{request.record.source}: vLLM refused the request: {message}"

    def _records_file(self, columns: dict[str, list], i: int) -> IO[str]:
        incarnation = columns["incarnation"][i]
        handle = self._files.get(incarnation)
        if handle is not None:
            return handle
        actor = columns["actor"][i]
        index = self._replica_of_actor.setdefault(actor, len(self._replica_of_actor))
        replica = self.first_replica + index
        if index == len(self._info):
            self._info.append({"replica": replica, "node": columns["node"][i],
                               "device": self._device(index, columns["device"][i]),
                               "pids": [], "restarts": -1})
        info = self._info[index]
        info["restarts"] += 1
        info["pids"].append(columns["pid"][i])
        info["node"] = columns["node"][i]
        ready = columns["ready_at"][i]
        self._first_ready = ready if self._first_ready is None else min(self._first_ready, ready)
        path = self.folder.replica_records_path(self.attempt, replica, info["restarts"])
        try:
            handle = open(path, "w", encoding="utf-8")
        except OSError as error:
            raise OutputError(f"{path}: {error}", exit_code=EXIT_FAILED) from None
        meta = {"type": "replica", "replica": replica, "restart": info["restarts"],
                "node": columns["node"][i], "device": info["device"], "actor": actor,
                "incarnation": incarnation, "pid": columns["pid"][i]}
        if self.side_by_side is not None:
            meta["side_by_side"] = self.side_by_side
        handle.write(json.dumps(meta) + "\n")
        self._files[incarnation] = handle
        return handle

    def _device(self, index: int, reported: str) -> str:
        if self.sim_devices is not None and index < len(self.sim_devices):
            return self.sim_devices[index]
        return reported

    def generation_s(self) -> float | None:
        """Wall time from the first replica ready to the last output (clocks of the replicas'
        hosts: NTP-close on a cluster)."""
        if self._first_ready is None or self._last_output is None:
            return None
        return round(max(self._last_output - self._first_ready, 0.0), 3)

    def replica_info(self) -> list[dict[str, Any]]:
        return [dict(info, restarts=max(info["restarts"], 0)) for info in self._info]

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        self._files.clear()
