"""Generation over N engines on Ray: the driver side of a `--replicas` run.

The pending requests become a Ray Data dataset (`from_items`, one small block per batch) and
flow through `map_batches(ReplicaWorker, ...)` with a fixed pool of N actors, one engine each
(`replica_actor.py`). Each actor takes several batches at once, so its engine is never drained
between batches. Ray Data restarts an actor whose process dies and retries its unfinished
batches there (its defaults: `max_restarts=-1`, `max_task_retries=-1`).

The driver is the only writer of the run folder: it appends every finished request to
outputs.jsonl (once: a request that comes back twice, from a retried batch, is dropped) and
writes each replica's scheduler records to records-<attempt>-r<k>.jsonl, a new file after each
restart of that replica's process (a new engine, a new clock). Replica numbers k follow the order
in which the replicas first deliver. SIGTERM/SIGINT and --max-runtime stop as on one engine:
stop taking results, keep what was written, exit 4.

Ray itself is imported here only inside functions, so importing this module costs nothing.
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import time
from typing import IO, Any

from neuron_batch.inputs.prepare import PreparedRequest
from neuron_batch.run.engine import Finished
from neuron_batch.run.engine_log import ENGINE_LOG, engine_output_to
from neuron_batch.run.errors import EXIT_FAILED, RunError
from neuron_batch.run.folder import OutputError, RunFolder
from neuron_batch.run.generate import MAX_ERRORS_KEPT, StopFlag, output_row, progress_bar
from neuron_batch.run.job import Job
from neuron_batch.run.replica_actor import ReplicaSpec, ReplicaWorker, decode_tokens, encode_tokens

#: Seconds between checks that no node was lost for good.
NODE_CHECK_S = 2.0
#: Environment variables the replicas get from the driver (a cluster's workers start from the
#: raylet's environment, not the driver's).
FORWARDED_ENV_PREFIXES = ("NEURON_BATCH_", "VLLM_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")


def batching(max_num_seqs: int) -> tuple[int, int]:
    """(requests per batch, batches in flight per replica). A batch comes back only when its
    last request finishes, so batches are small and many may be in flight: up to sixteen
    engines' worth of requests per replica, so that the waiting queue stays non-empty while the
    slowest request of each batch finishes and while Ray brings the next batches. Ray Data's own
    backpressure keeps fewer in flight (about ten batches of 8 per replica on the whole
    conversation trace at max_num_seqs 32, measured), enough for a busy fraction of 0.99."""
    size = max(1, min(8, max_num_seqs // 4))
    in_flight = max(4, min(256, -(-16 * max_num_seqs // size)))
    return size, in_flight


def generate_replicas(job: Job, pending: list[PreparedRequest], attempt: int) -> dict[str, Any]:
    """Run `pending` through the replicas; returns the attempt's record for attempts.json.
    What Ray itself writes to the driver's terminal (its C++ core's log lines) goes to the run
    folder's engine.log meanwhile, as vLLM's does on one engine."""
    with engine_output_to(job.folder.path / ENGINE_LOG):
        return _generate_replicas(job, pending, attempt)


def _generate_replicas(job: Job, pending: list[PreparedRequest], attempt: int
                       ) -> dict[str, Any]:
    import ray.data
    from ray.data import ActorPoolStrategy

    settings, folder, log, cluster = job.settings, job.folder, job.log, job.cluster
    placement = cluster.placement
    sim_devices = None
    if job.simulated:
        from neuron_batch.device.replica_layout import replica_devices

        sim_devices = replica_devices(job.target.instance, job.target.tp, settings.replicas,
                                      settings.sim.num_instances)
    size, in_flight = batching(settings.max_num_seqs)
    items = [_request_item(request, settings) for request in pending]
    dataset = ray.data.from_items(items, override_num_blocks=max(1, -(-len(items) // size)))
    results = dataset.map_batches(
        ReplicaWorker,
        fn_constructor_kwargs={"spec": ReplicaSpec(settings, placement.device, job.target)},
        batch_size=size, batch_format="pyarrow",
        compute=ActorPoolStrategy(size=settings.replicas,
                                  max_tasks_in_flight_per_actor=in_flight,
                                  max_concurrent_calls_per_actor=in_flight),
        num_cpus=placement.num_cpus, resources=placement.resources or None,
        runtime_env={"env_vars": _worker_env()})
    log(f"{settings.replicas} replica(s) on Ray ({placement.describe()} each), batches of "
        f"{size}, {in_flight} in flight per replica")

    by_id = {request.record.id: request for request in pending}
    writer = _ResultWriter(job, attempt, by_id, sim_devices)
    started = time.time()
    deadline = (time.monotonic() + settings.max_runtime) if settings.max_runtime else None
    inbox: queue.Queue = queue.Queue()
    threading.Thread(target=_consume, args=(results, inbox), name="ray-data-results",
                     daemon=True).start()
    bar = progress_bar(settings, len(pending))
    ended = "completed"
    next_node_check = time.monotonic() + NODE_CHECK_S
    try:
        with StopFlag() as stop:
            while True:
                if deadline is not None and time.monotonic() >= deadline:
                    stop.reason = stop.reason or "deadline"
                if stop.reason is not None:
                    ended = stop.reason
                    _write_received(inbox, writer, log)   # finished work already here: keep it
                    left = len(by_id) - writer.finished
                    log(f"{'--max-runtime reached' if ended == 'deadline' else 'stopping'}: "
                        f"abandoning {left} unfinished request(s); rerun with --resume")
                    break
                if time.monotonic() >= next_node_check:
                    next_node_check = time.monotonic() + NODE_CHECK_S
                    lost = cluster.lost_node_message()
                    if lost is not None:
                        raise RunError(f"{lost}; {writer.finished} request(s) finished and are "
                                       f"kept in {folder.path}; rerun with --resume when the "
                                       f"cluster can hold the replicas (or with fewer "
                                       f"--replicas)", EXIT_FAILED)
                try:
                    kind, value = inbox.get(timeout=0.25)
                except queue.Empty:
                    continue
                if kind == "done":
                    break
                if kind == "error":
                    cause = _root_cause(value)
                    if _failed_to_start(value) and cause.startswith("ValueError: "):
                        # vLLM's own configuration checks, as on one engine: a usage error
                        raise RunError(f"vLLM refused the configuration (in a replica): "
                                       f"{cause.removeprefix('ValueError: ')}") from None
                    raise RunError(f"a replica failed after {writer.finished} request(s): "
                                   f"{cause}; finished outputs are kept in {folder.path}; "
                                   f"rerun with --resume", EXIT_FAILED) from None
                added, tokens = writer.write(value, log)
                if bar is not None and added:
                    bar.update(added)
                    elapsed = max(time.time() - started, 1e-9)
                    bar.set_postfix_str(f"{writer.output_tokens / elapsed:,.0f} out tok/s",
                                        refresh=False)
    finally:
        if bar is not None:
            bar.close()
        writer.close()
        folder.close_outputs()
        cluster.shutdown()   # stops the replicas (they belong to this driver's job)
    if writer.duplicates:
        log(f"{writer.duplicates} request(s) came back twice (a replica restarted) and were "
            f"written once")
    return {"attempt": attempt, "ended": ended, "requests_finished": writer.finished,
            "wall_time_s": round(time.time() - started, 3),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
            "device": placement.device, "pid": os.getpid(),
            "requests_failed": len(writer.errors), "errors": writer.errors[:MAX_ERRORS_KEPT],
            "ray": cluster.address, "generation_s": writer.generation_s(),
            "replicas": writer.replica_info()}


def _write_received(inbox: queue.Queue, writer: _ResultWriter, log) -> None:
    while True:
        try:
            kind, value = inbox.get_nowait()
        except queue.Empty:
            return
        if kind == "batch":
            writer.write(value, log)


def _request_item(request: PreparedRequest, settings) -> dict[str, Any]:
    record = request.record
    temperature = settings.temperature if record.temperature is None else record.temperature
    return {"id": record.id, "tokens": encode_tokens(request.prompt_token_ids),
            "max_tokens": request.max_tokens, "temperature": float(temperature),
            "stop": json.dumps(record.stop) if record.stop else "",
            "seed": settings.seed + record.index}


def _consume(results, inbox: queue.Queue) -> None:
    """Iterate the dataset in a thread, so the driver's loop can watch signals, the deadline
    and the nodes while it waits for results."""
    try:
        for table in results.iter_batches(batch_size=None, batch_format="pyarrow",
                                          prefetch_batches=1):
            inbox.put(("batch", table))
        inbox.put(("done", None))
    except BaseException as error:  # noqa: BLE001 (handed to the driver's loop)
        inbox.put(("error", error))


def _worker_env() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if name.startswith(FORWARDED_ENV_PREFIXES)}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env["VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"] = "1"
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


#: "SomeError: message" lines of a traceback, and Ray's own wrapper names to look past.
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(\w*(?:Error|Exception)): (\S.*)$")
_RAY_WRAPPERS = ("SystemException", "UserCodeException", "RayTaskError", "ActorDiedError",
                 "RayActorError", "ActorUnavailableError", "RaySystemError")


def _root_cause(error: BaseException) -> str:
    """The replica's own error out of Ray's wrappers: Ray Data's SystemException around an
    ActorDiedError whose text carries the replica's traceback, ending in what went wrong."""
    chain, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = (getattr(current, "cause", None) or current.__cause__
                   or current.__context__)
    found = None
    for item in chain:
        for line in str(item).splitlines():
            match = _ERROR_LINE.match(line.strip())
            if match and match[1] not in _RAY_WRAPPERS:
                found = f"{match[1]}: {match[2]}"
    if found is not None:
        return found
    text = str(chain[-1]).strip().splitlines()
    return f"{type(chain[-1]).__name__}: {text[-1] if text else ''}".rstrip(": ")


def _failed_to_start(error: BaseException) -> bool:
    """Whether a replica died building its engine (an error in the actor's creation task)."""
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if "error raised in its creation task" in str(current):
            return True
        current = (getattr(current, "cause", None) or current.__cause__
                   or current.__context__)
    return False


class _ResultWriter:
    """Writes what the replicas send back: outputs once each, records per replica process."""

    def __init__(self, job: Job, attempt: int, by_id: dict[str, PreparedRequest],
                 sim_devices: list[str] | None):
        self.folder: RunFolder = job.folder
        self.attempt = attempt
        self.by_id = by_id
        self.model_name = job.workload.model.name
        self.simulated = job.simulated
        self.sim_devices = sim_devices
        self.finished = self.output_tokens = self.duplicates = 0
        self.errors: list[str] = []       # requests the engines finished with an error
        self._failed: set[str] = set()
        self._replica_of_actor: dict[str, int] = {}
        self._files: dict[str, IO[str]] = {}          # incarnation -> its records file
        self._info: list[dict[str, Any]] = []          # per replica
        self._first_ready: float | None = None
        self._last_output: float | None = None

    def write(self, table, log) -> tuple[int, int]:
        columns = table.to_pydict()
        if not columns["id"]:
            return 0, 0
        handle = self._records_file(columns, 0)
        added = tokens = 0
        folder = self.folder
        for i, request_id in enumerate(columns["id"]):
            request = self.by_id.get(request_id)
            if request is None or request_id in folder.done_ids or request_id in self._failed:
                self.duplicates += request is not None
                continue
            if columns["finish_reason"][i] == "error":   # e.g. too big for the KV cache
                self._failed.add(request_id)
                self.errors.append(columns["stop_reason"][i]
                                   or f"request {request_id} failed in the engine")
                log(f"error: {self.errors[-1]}")
                continue
            token_ids = decode_tokens(columns["token_ids"][i])
            done = Finished(request_id, token_ids, columns["text"][i],
                            columns["finish_reason"][i], columns["num_prompt_tokens"][i],
                            columns["stop_reason"][i])
            folder.append_output(output_row(request, done, self.model_name, self.simulated))
            folder.done_ids.add(request_id)
            if columns["request_line"][i]:
                handle.write(columns["request_line"][i] + "\n")
            added += 1
            tokens += len(token_ids)
        handle.write(columns["lines"][0])
        handle.flush()
        self.finished += added
        self.output_tokens += tokens
        self._last_output = time.time()
        return added, tokens

    def _records_file(self, columns: dict[str, list], i: int) -> IO[str]:
        incarnation = columns["incarnation"][i]
        handle = self._files.get(incarnation)
        if handle is not None:
            return handle
        actor = columns["actor"][i]
        replica = self._replica_of_actor.setdefault(actor, len(self._replica_of_actor))
        if replica == len(self._info):
            self._info.append({"replica": replica, "node": columns["node"][i],
                               "device": self._device(replica, columns["device"][i]),
                               "pids": [], "restarts": -1})
        info = self._info[replica]
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
        handle.write(json.dumps(meta) + "\n")
        self._files[incarnation] = handle
        return handle

    def _device(self, replica: int, reported: str) -> str:
        if self.sim_devices is not None and replica < len(self.sim_devices):
            return self.sim_devices[replica]
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
