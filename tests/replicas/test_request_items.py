"""What a replica is asked to run carries every field of each request (issue 38): the driver's
row holds the request's whole spec, and the actor hands exactly that spec to its engine. No
Ray cluster: the row and the actor's admission are plain functions of their inputs."""

from __future__ import annotations

import json
import pickle
from types import SimpleNamespace

from neuron_batch.engine.sampling_params import request_spec
from neuron_batch.inputs.prepare import PreparedRequest, prepare_requests
from neuron_batch.inputs.prompt_records import PromptRecord
from neuron_batch.replicas.actor import ReplicaWorker, decode_tokens
from neuron_batch.replicas.pool import _request_item
from neuron_batch.settings import RunSettings


def test_a_replica_gets_the_requests_whole_spec():
    record = PromptRecord(3, "r", "in.jsonl:4", prompt="Hi", temperature=0.8, stop=["x"],
                          sampling={"n": 2, "logprobs": 1, "top_p": 0.9,
                                    "structured": {"json": {"type": "object"}}})
    request = PreparedRequest(record, [5, 6, 7], 9)
    settings = RunSettings.of(inputs=("in.jsonl",), device="cpu", seed=10)
    item = _request_item(request, settings)
    assert decode_tokens(item["tokens"]) == [5, 6, 7]
    assert json.loads(item["spec"]) == request_spec(request, settings) == {
        "max_tokens": 9, "temperature": 0.8, "stop": ["x"], "n": 2, "logprobs": 1,
        "top_p": 0.9, "structured": {"json": {"type": "object"}}, "seed": 13}

    added = []
    worker = SimpleNamespace(_engine=SimpleNamespace(add=lambda *args: added.append(args)))
    batch = SimpleNamespace(requests=[item], remaining=set())
    ReplicaWorker._admit(worker, batch, {})
    assert added == [("r", [5, 6, 7], json.loads(item["spec"]))]


def test_a_synthetic_prompt_travels_as_its_recipe_and_arrives_as_its_tokens():
    """A trace's prompt_len request: the driver sends the few numbers that make its tokens
    (not ~4 bytes a token), and the replica adds exactly the tokens the plain path would."""
    records = [PromptRecord(70_000, "t", "trace.csv:2", prompt_len=700, max_tokens=5),
               PromptRecord(1, "m", "moon.jsonl:1", prompt_len=600, hash_ids=[4, 9],
                            max_tokens=5),
               PromptRecord(2, "p", "p.jsonl:3", prompt_len=300, prefix_id="sys",
                            prefix_len=100, max_tokens=5)]
    prepared = prepare_requests(records, tokenizer=None, tokenizer_name=None,
                                vocab_size=32_000, max_model_len=2048, default_max_tokens=5)
    settings = RunSettings.of(inputs=("trace.csv",), device="cpu")
    items = [_request_item(request, settings) for request in prepared.requests]
    assert all("tokens" not in item and len(pickle.dumps(item)) < 400 for item in items)
    added = []
    worker = SimpleNamespace(_engine=SimpleNamespace(add=lambda *args: added.append(args)))
    ReplicaWorker._admit(worker, SimpleNamespace(requests=items, remaining=set()), {})
    assert [tokens for _, tokens, _ in added] == [r.prompt_token_ids for r in prepared.requests]
    assert [len(tokens) for _, tokens, _ in added] == [700, 600, 300]


def test_a_finished_requests_record_travels_with_its_own_output(tmp_path):
    """A replica ships each request's record with that request's output, not inside the block
    lines that ride along with whichever batch completes next: a killed actor may never deliver
    that batch's result while the request's own output reaches the run folder (CI, stop 50:
    8 of 1,500 requests had an output and no record)."""
    from neuron_batch.replicas.actor import _RecordTail
    from neuron_batch.scheduler.records import Recorder, RunConfig

    path = tmp_path / "records.jsonl"
    recorder = Recorder(clock=lambda: 1.0, path=path, keep=False)
    recorder.start(RunConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64,
                             block_size=4, num_kv_blocks=64, max_kv_concurrent=4,
                             prefill_buckets=[16], decode_buckets=[4],
                             scheduler_cls="NeuronScheduler"))
    for req_id in ("a", "b", "c"):
        recorder.request_arrived(req_id, 8)
    recorder.request_finished("a", 3, "length", 2.0)
    recorder.request_finished("c", 5, "stop", 2.5)
    recorder.flush()
    tail = _RecordTail(path)
    tail.read()
    assert sorted(tail.requests) == ["a", "c"]
    assert (tail.requests["c"].num_output_tokens, tail.requests["c"].finish_reason) == (5, "stop")
    other = tail.take_other()
    assert '"type":"requests"' not in other and '"type":"config"' in other
    recorder.request_finished("b", 1, "length", 3.0)
    recorder.flush()
    tail.read()
    assert sorted(tail.requests) == ["a", "b", "c"]


def test_the_drivers_store_gives_a_retried_row_its_batch_and_every_row_one():
    """The store between the driver and the replicas (feed.py), without a cluster: rows take
    batches in the order sent, whichever row asks first; a row asked again (Ray Data retrying
    it on a restarted replica) gets the batch it took, even while the first ask still waits;
    once every batch has arrived (told by their count: Ray may run the calls out of order), a
    row with none left gets an empty one; a batch written back is forgotten."""
    import asyncio

    from neuron_batch.replicas.actor import unpack
    from neuron_batch.replicas.feed import _Store

    async def scenario():
        store = _Store()
        waiting = asyncio.ensure_future(store.take(7))      # asks before anything is sent
        retried = asyncio.ensure_future(store.take(7))
        await asyncio.sleep(0)
        assert not waiting.done()
        await store.put(0, b"first")
        await store.put(1, b"second")
        assert await waiting == await retried == b"first"
        assert await store.take(3) == b"second"
        assert await store.take(7) == b"first"              # (a retry after it came)
        await store.written(0)
        await store.last_sent(3)                            # (the third is still on its way)
        late = asyncio.ensure_future(store.take(9))
        await asyncio.sleep(0)
        assert not late.done()
        await store.put(2, b"third")
        assert await late == b"third"
        ends = [unpack(await store.take(key)) for key in (7, 8)]
        assert ends == [{"number": None, "requests": []}] * 2
        assert await store.take(3) == b"second"             # (not written back yet)

    asyncio.run(scenario())


def test_a_row_replayed_after_its_batch_was_written_takes_no_other_batch():
    """Ray replays a row whose output already reached the driver when its replica dies before
    Ray saw the task end, and drops what the replay yields (feed.py). The replay must get an
    empty batch, never the next one: that batch's requests would be dropped with it. (The
    two-node run that killed a replica lost 8 of 800 requests this way, now and then.)"""
    import asyncio

    from neuron_batch.replicas.actor import unpack
    from neuron_batch.replicas.feed import _Store

    async def scenario():
        store = _Store()
        for number in range(3):
            await store.put(number, f"batch {number}".encode())
        assert await store.take(5) == b"batch 0"
        await store.written(0)
        assert unpack(await store.take(5)) == {"number": None, "requests": []}
        assert await store.take(6) == b"batch 1"        # the next batch waits for a new row
        assert await store.take(6) == b"batch 1"        # (retried before it was written)
        assert await store.take(2) == b"batch 2"
        await store.written(2)
        assert unpack(await store.take(2))["requests"] == []
        assert await store.take(6) == b"batch 1"

    asyncio.run(scenario())
