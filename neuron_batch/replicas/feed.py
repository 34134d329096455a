"""The driver hands a job to its replicas as they take it, holding only what is in flight
(issue 46: the driver streams, it does not hold the job).

Ray Data runs one row per batch through the replicas, as before, but a row is now only a key:
the batch itself is made on the driver as the replicas drain (read from the inputs, text
tokenized ahead: inputs/job_requests.py `read_ahead`) and waits in a small store actor on the
driver's node, from which a replica takes it when Ray Data hands it the row. So the driver holds
the requests of at most `cap` batches (a few times what every replica has in flight), and so
does the store; a 10M-line job's requests were all made, packed and put into Ray's object store
before the first batch ran.

A row takes whichever batch comes next, and the same one again when Ray Data retries the row
(a replica whose process died): a batch is bound to the first row that takes it until the
driver has written its results, and a row whose batch was written gets an empty one from then
on. Ray replays a row even then: Ray Data's tasks are streaming generators, and when a replica
dies after a row's output reached the driver but before Ray saw the task end, Ray runs the task
again and drops what it yields as already received (Ray's streaming generator documentation:
a replay must yield as many objects as the first run). Such a replay must not take a fresh
batch: its results would be dropped with it (seen here: 8 of 800 requests never came back).
No row waits for a batch that cannot come: a row waits only while every batch sent is bound to
a row still running, and each of those frees room when it returns. Rows that outnumber the
batches get an empty batch once the driver has sent the last one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from neuron_batch.inputs.job_requests import close_reading, read_ahead
from neuron_batch.inputs.prepare import PreparedRequest
from neuron_batch.replicas.actor import pack

#: What a row gets when there is no batch for it: none left, or a replay of a row written.
_EMPTY = pack({"number": None, "requests": []})

#: Batches sent and not yet written back, in multiples of the batches the replicas run at once:
#: one more round waits in the store while the replicas run theirs.
ROUNDS_AHEAD = 2


class _Store:
    """The batches sent to the replicas and not yet written back, on the driver's node (made a
    Ray actor by `BatchFeed`): a FIFO of batches not yet taken, and each taken batch by the row
    key that took it."""

    def __init__(self) -> None:
        import asyncio

        self._asyncio = asyncio
        self._fifo: Any = None              # (made in the actor's event loop, when first used)
        self._by_key: dict[int, Any] = {}   # row key -> the future of its batch
        self._key_of: dict[int, int] = {}   # batch number -> the row key that took it
        # Row keys (0, 1, ...: one per batch) whose batch was written back, a byte each: a
        # job's worth of them stays small (a 10M-request job in batches of 16: 625 kB).
        self._written = bytearray()
        # Batches put, and how many there are once the driver has sent the last: Ray may run
        # an actor's calls out of the order they were made (an argument still on its way), so
        # the end is told by the count, never by which call came last.
        self._received = 0
        self._total: int | None = None

    def _queue(self):
        if self._fifo is None:
            self._fifo = self._asyncio.Queue()
        return self._fifo

    async def put(self, number: int, blob: bytes) -> None:
        self._queue().put_nowait((number, blob))
        self._received += 1
        self._maybe_end()

    async def last_sent(self, total: int) -> None:
        """`total` batches in all: once every one is here, a row that finds none left gets an
        empty one."""
        self._total = total
        self._maybe_end()

    def _maybe_end(self) -> None:
        if self._total is not None and self._received == self._total:
            self._queue().put_nowait(None)      # (behind every batch)

    async def take(self, key: int) -> bytes:
        if key < len(self._written) and self._written[key]:
            return _EMPTY           # a replay of a row already written (the module text)
        got = self._by_key.get(key)
        if got is None:     # (a retried row asks again: the same future, the same batch)
            got = self._by_key[key] = self._asyncio.ensure_future(self._next(key))
        return await self._asyncio.shield(got)

    async def _next(self, key: int) -> bytes:
        item = await self._queue().get()
        if item is None:                    # the end: said to every row that comes after it
            self._queue().put_nowait(None)
            return _EMPTY
        number, blob = item
        self._key_of[number] = key
        return blob

    async def written(self, number: int) -> None:
        key = self._key_of.pop(number, None)
        if key is not None:
            self._by_key.pop(key, None)
            if key >= len(self._written):
                self._written.extend(bytes(key + 1 - len(self._written)))
            self._written[key] = 1


class BatchFeed:
    """Makes `pending`'s batches of `size` on a thread and sends each to the store while fewer
    than `cap` are out (sent, not written back); `in_flight` holds the requests sent, by id,
    until their results are written (`written`)."""

    def __init__(self, pending: Sequence[PreparedRequest], size: int, cap: int,
                 item_of: Callable[[PreparedRequest], dict[str, Any]]):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.total = len(pending)
        self.batches = -(-self.total // size)
        self.in_flight: dict[str, PreparedRequest] = {}
        self.error: BaseException | None = None     # what reading the job raised
        # On the driver's node: a node lost takes its replicas, never the batches waiting.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(),
                                              soft=False)
        self.store = ray.remote(num_cpus=0, max_restarts=0)(_Store).options(
            scheduling_strategy=here).remote()
        self._pending, self._size, self._cap, self._item_of = pending, size, cap, item_of
        self._out: set[int] = set()
        self._room = threading.Condition()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._send_all, name="neuron-batch-feed",
                                        daemon=True)
        self._thread.start()

    def _send_all(self) -> None:
        requests = read_ahead(self._pending)
        try:
            batch: list[PreparedRequest] = []
            number = 0
            for request in requests:
                batch.append(request)
                if len(batch) == self._size:
                    if not self._send(number, batch):
                        return
                    number, batch = number + 1, []
            if batch:
                if not self._send(number, batch):
                    return
                number += 1
            self.store.last_sent.remote(number)
        except BaseException as error:  # noqa: BLE001 (the driver's loop raises it)
            self.error = error
        finally:
            close_reading(requests)

    def _send(self, number: int, batch: list[PreparedRequest]) -> bool:
        items = [self._item_of(request) for request in batch]
        with self._room:
            while len(self._out) >= self._cap:
                if self._stopping.is_set():
                    return False
                self._room.wait(0.2)
            if self._stopping.is_set():
                return False
            self._out.add(number)
        for request in batch:
            self.in_flight[request.record.id] = request
        self.store.put.remote(number, pack({"number": number, "requests": items}))
        return True

    def written(self, number: int | None) -> None:
        """Batch `number`'s results are in the run folder: room for the next one."""
        if number is None:
            return
        with self._room:
            if number not in self._out:     # (a batch that came back twice)
                return
            self._out.discard(number)
            self._room.notify()
        self.store.written.remote(number)

    def stop(self) -> None:
        """End the sending thread (before Ray shuts down: a thread that calls Ray after that
        ends the process)."""
        self._stopping.set()
        self._thread.join(timeout=30)
