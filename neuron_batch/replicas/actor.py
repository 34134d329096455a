"""One replica of a `--replicas` run: a Ray Data callable class that holds one engine.

Ray Data's `map_batches` makes one `ReplicaWorker` per actor of the pool and sends it batches of
requests. `__call__` is a coroutine, and several run at once in one actor (Ray Data's async UDF
support, `max_concurrent_calls_per_actor`): each hands its requests to the engine thread and
waits for them. The engine thread owns the engine and never drains it between batches: it adds
every request as soon as its batch arrives, steps while anything is unfinished, and completes a
batch the moment its last request finishes. So the engine keeps running requests of the batches
still in flight while the next ones arrive.

vLLM's engine core (the scheduler and the device, real or simulated) runs in the actor's own
process, on the engine thread, as on the plain path: one process, so a replica that dies leaves
nothing behind. Ray Data's work in the same process (receiving batches, sending results) holds
the GIL against the engine thread, so it is kept rare: batches are large (`replicas.batching`).
Measured on the whole conversation trace, one simulated replica, batches of 128: 107 s of wall
time with the engine core here, 119 s with it in a child process of the actor (vLLM's
multiprocessing mode), where the child's steps and the messages between the two processes
took more of this machine's two cores than the GIL ever did.

What comes back, per finished request, is the engine's result and the scheduler's record of it
(a row of its requests' block: a record ships with its own output, never with another batch's,
whose result a killed actor may never deliver); the scheduler's other records (its config and
every step) ride along with whichever batch completes next. The scheduler writes them to a file
in the replica's own temporary folder, which the actor flushes and reads as each batch
completes. The run folder stays on the driver (`pool.py` writes outputs.jsonl and the
records), so no shared filesystem is needed. If
this actor's process dies, Ray restarts it (a new engine, a new `incarnation`) and retries its
unfinished batches there.

What travels through Ray Data is one row per batch each way: in, a key (column "batch"), which
the replica trades for the batch itself at the driver's store (replicas/feed.py: the driver
makes batches as the replicas drain, so it never holds the job); out, the results pickled
(`pack`) in one binary column ("result").
Ray Data's own work per call (building the output block, serializing and deserializing its
columns) grows with the number of columns: with a column per field, about a third of the
actor's Python time was Ray Data's (py-spy, whole trace, one replica, engine in-process).
Token ids travel as little-endian int32 bytes; a synthetic prompt (a trace's `prompt_len`) as
the few numbers that make it (`PreparedRequest.recipe`), its tokens made here as it is added.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import queue
import shutil
import sys
import tempfile
import threading
import time
import uuid
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_batch.inputs.prepare import tokens_of_recipe
from neuron_batch.scheduler.records import RequestRecord, requests_of_block
from neuron_batch.settings import RunSettings

#: Seconds between shipments of the scheduler's step blocks and checkpoints (a request's record
#: goes with its output, always). Each batch's own small blocks and checkpoint took about 370
#: bytes a request of the run folder on the conversation trace (1,500 requests, 2 replicas);
#: this makes them few and large. A replica killed loses at most this much of its step records
#: (the report then reads its steps as they reached the folder).
SHIP_EVERY_S = 5.0

#: The one column of a batch going to a replica (its key at the driver's store), and of its
#: result coming back.
BATCH_COLUMN = "batch"
RESULT_COLUMN = "result"
#: The finish reason of a request vLLM refused when the replica added it (its words in
#: stop_reason); nothing of it ran.
REFUSED = "refused"


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything a replica needs to build its engine; pickled to every actor by Ray."""

    settings: RunSettings
    device: str                  # "sim", "cpu" or "neuron"
    target: Any = None           # the run's device.target.Target (job.target), None elsewhere
    sampling: Any = None         # what the job asks of the sampler (device_sampling.JobSampling)
    store: Any = None            # the driver's batches (replicas/feed.py `_Store`, an actor)

    @property
    def simulated(self) -> bool:
        return self.target is not None and self.target.simulated


def pack(value) -> bytes:
    """A batch's requests or results as one binary cell (both ends are this project's code)."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def unpack(blob: bytes):
    return pickle.loads(blob)


def encode_tokens(token_ids) -> bytes:
    data = array("i", token_ids)
    if sys.byteorder != "little":
        data.byteswap()
    return data.tobytes()


def decode_tokens(blob: bytes) -> list[int]:
    data = array("i")
    data.frombytes(blob)
    if sys.byteorder != "little":
        data.byteswap()
    return data.tolist()


class _RecordTail:
    """Reads what the scheduler (on the engine thread) has written to its records file so
    far: the requests' blocks split into one row per request, kept by request id (each travels
    with its own output, so a request whose output reached the run folder has its record there
    too, whatever happens to the batch it finished beside), every other line in order. A line
    still being written stays for the next read."""

    def __init__(self, path: Path):
        self.path = path
        self.other: list[str] = []
        self.requests: dict[str, RequestRecord] = {}
        self._handle: Any = None
        self._partial = ""

    def read(self) -> None:
        if self._handle is None:
            try:
                self._handle = open(self.path, encoding="utf-8")
            except FileNotFoundError:
                return
        text = self._partial + self._handle.read()
        lines = text.split("\n")
        self._partial = lines.pop()
        for line in lines:
            if not line:
                continue
            if line.startswith('{"type":"requests"'):
                for record in requests_of_block(json.loads(line)):
                    self.requests[record.req_id] = record
            else:
                self.other.append(line)

    def take_other(self) -> str:
        text = "".join(line + "\n" for line in self.other)
        self.other.clear()
        return text


@dataclass
class _Batch:
    requests: list[dict]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    numbers: list[int | None] = field(default_factory=list)   # the driver's, to free its room
    remaining: set[str] = field(default_factory=set)
    finished: list[Any] = field(default_factory=list)


class ReplicaWorker:
    """The Ray Data callable class: one engine per actor, kept full (see the module text)."""

    def __init__(self, spec: ReplicaSpec):
        import ray

        context = ray.get_runtime_context()
        self.spec = spec
        self.incarnation = uuid.uuid4().hex[:12]
        self.actor_id = context.get_actor_id() or f"pid-{os.getpid()}"
        self.node_id = context.get_node_id()
        self.pid = os.getpid()
        self.device = _device_label(spec.device)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._workdir = tempfile.mkdtemp(prefix="neuron-batch-replica-")
        self._records = _RecordTail(Path(self._workdir) / "records.jsonl")
        self._shipped_at = time.monotonic()
        self._thread = threading.Thread(target=self._engine_loop, name="replica-engine",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        self.ready_at = time.time()

    async def __call__(self, batch):
        if self._error is not None:
            raise RuntimeError(f"the replica's engine failed earlier: {self._error!r}")
        requests, numbers = [], []
        for key in batch.column(BATCH_COLUMN).to_pylist():
            taken = unpack(await self.spec.store.take.remote(key))
            requests += taken["requests"]
            numbers.append(taken["number"])
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._inbox.put(_Batch(requests, loop, future, numbers))
        columns = await future
        return {RESULT_COLUMN: [pack(columns)]}

    def __del__(self):
        inbox = getattr(self, "_inbox", None)
        if inbox is not None:
            inbox.put(None)      # the engine thread ends
        workdir = getattr(self, "_workdir", None)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    # -- the engine thread ---------------------------------------------------------------------
    def _engine_loop(self) -> None:
        try:
            self._engine, self._detokenize = self._build_engine()
            self._recorder = _scheduler_recorder(self._engine)
            # (its blocks wait for a shipment: written at each, they are as large as they get)
            self._recorder.flush_seconds = SHIP_EVERY_S
        except BaseException as error:  # surfaces in __init__: Ray Data reports the actor's death
            self._error = error
            self._ready.set()
            return
        self._ready.set()
        waiting: dict[str, list[_Batch]] = {}     # request id -> batches waiting for it
        engine = self._engine
        while True:
            arrived = []
            if not engine.has_unfinished():
                arrived.append(self._inbox.get())  # idle: sleep until work comes
            while True:
                try:
                    arrived.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            if any(batch is None for batch in arrived):
                return
            try:
                for batch in arrived:
                    self._admit(batch, waiting)
                    if not batch.remaining:     # every request of it refused when added
                        self._complete(batch, idle=not waiting)
                for done in engine.step():
                    for batch in waiting.pop(done.request_id, ()):
                        batch.finished.append(done)
                        batch.remaining.discard(done.request_id)
                        if not batch.remaining:
                            self._complete(batch, idle=not waiting)
            except BaseException as error:  # the engine died: every waiting batch fails
                self._error = error
                for batch in {id(b): b for bs in waiting.values() for b in bs}.values():
                    batch.loop.call_soon_threadsafe(_fail, batch.future, error)
                return

    def _admit(self, batch: _Batch, waiting: dict[str, list[_Batch]]) -> None:
        from neuron_batch.engine.engine import Finished, RequestRefused

        for request in batch.requests:
            request_id = request["id"]
            if request_id in waiting:       # already running for another batch (a retry)
                batch.remaining.add(request_id)
                waiting[request_id].append(batch)
                continue
            tokens = (tokens_of_recipe(request["recipe"]) if "recipe" in request
                      else decode_tokens(request["tokens"]))
            try:
                self._engine.add(request_id, tokens, json.loads(request["spec"]))
            except RequestRefused as error:
                # vLLM's own check of this one request: it goes back to the driver as refused
                # (its error record, or the run's error without --on-error skip), the engine and
                # the batch's other requests go on, as on one engine (job/generate.py).
                batch.finished.append(Finished(request_id, [], None, REFUSED, len(tokens),
                                               str(error)))
                continue
            batch.remaining.add(request_id)
            waiting[request_id] = [batch]

    def _complete(self, batch: _Batch, idle: bool) -> None:
        """Hand a finished batch to its `__call__` as plain columns (a dict of lists, pickled
        there), with its requests' records and, every SHIP_EVERY_S or when the engine has
        nothing left (`idle`), the scheduler's other records written since they last went."""
        records = self._records
        # (this thread runs the scheduler: what it flushes reaches the file now)
        now = time.monotonic()
        ship = idle or now - self._shipped_at >= SHIP_EVERY_S
        if ship:
            self._recorder.flush()
            self._shipped_at = now
        else:
            self._recorder.flush_requests()
        records.read()
        rows = batch.finished
        n = len(rows)
        columns = {
            "id": [d.request_id for d in rows],
            "token_ids": [encode_tokens(d.token_ids) for d in rows],
            "text": [d.text for d in rows],
            "finish_reason": [d.finish_reason for d in rows],
            "stop_reason": [None if d.stop_reason is None else str(d.stop_reason)
                            for d in rows],
            "num_prompt_tokens": [d.num_prompt_tokens for d in rows],
            "choices": [None if d.choices is None else json.dumps(d.choices) for d in rows],
            "embedding": [d.embedding for d in rows],
            "tool_calls": [None if d.tool_calls is None else json.dumps(d.tool_calls)
                           for d in rows],
            "request_record": [records.requests.pop(d.request_id, None) for d in rows],
            "lines": [records.take_other() if ship else ""] + [""] * (n - 1),
            "actor": [self.actor_id] * n,
            "incarnation": [self.incarnation] * n,
            "node": [self.node_id] * n,
            "pid": [self.pid] * n,
            "device": [self.device] * n,
            "ready_at": [self.ready_at] * n,
            "batches": batch.numbers,
        }
        batch.loop.call_soon_threadsafe(_resolve, batch.future, columns)

    def _build_engine(self):
        from neuron_batch.engine.engine import Engine, engine_kwargs

        # vLLM's engine core (scheduler and device) runs in this process: the module text says
        # why.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # The records name requests by the ids we gave them (the driver matches them to the
        # outputs), not by vLLM's randomized internal ids.
        os.environ["VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"] = "1"
        spec, settings = self.spec, self.spec.settings
        workdir = Path(self._workdir)
        if spec.simulated:
            model_path, has_tokenizer = str(workdir), False
        else:
            from neuron_batch.engine.models import resolve_model

            model = resolve_model(settings.model)   # on this host: no shared filesystem
            model_path, has_tokenizer = model.path, model.has_tokenizer
        # (On Neuron, the kwargs carry the plugin's switches, which Engine sets in this
        # process's environment before vLLM starts: see engine/neuron_host.py.)
        kwargs = engine_kwargs(settings, spec.device, model_path, self._records.path,
                               workdir, has_tokenizer=has_tokenizer, target=spec.target,
                               sampling=spec.sampling)
        return Engine(kwargs), has_tokenizer and not spec.simulated


def _scheduler_recorder(engine):
    """The scheduler's Recorder, reachable because the engine core runs in this process."""
    from neuron_batch.device.executor import engine_core

    core = engine_core(engine.llm)
    if core is None:
        raise RuntimeError("a replica needs vLLM's engine core in its own process "
                           "(VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    return core.scheduler.recorder


def _device_label(device: str) -> str:
    if device == "neuron":
        return f"neuron cores {os.environ.get('NEURON_RT_VISIBLE_CORES', '?')}"
    return device


def _resolve(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(RuntimeError(f"the replica's engine failed: {error!r}"))
