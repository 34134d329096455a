"""What a replica is asked to run carries every field of each request (issue 38): the driver's
row holds the request's whole spec, and the actor hands exactly that spec to its engine. No
Ray cluster: the row and the actor's admission are plain functions of their inputs."""

from __future__ import annotations

import json
from types import SimpleNamespace

from neuron_batch.engine.sampling_params import request_spec
from neuron_batch.inputs.prompt_records import PromptRecord
from neuron_batch.replicas.actor import ReplicaWorker, decode_tokens
from neuron_batch.replicas.pool import _request_item
from neuron_batch.settings import RunSettings


def test_a_replica_gets_the_requests_whole_spec():
    record = PromptRecord(3, "r", "in.jsonl:4", prompt="Hi", temperature=0.8, stop=["x"],
                          sampling={"n": 2, "logprobs": 1, "top_p": 0.9,
                                    "structured": {"json": {"type": "object"}}})
    request = SimpleNamespace(record=record, prompt_token_ids=[5, 6, 7], max_tokens=9)
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
