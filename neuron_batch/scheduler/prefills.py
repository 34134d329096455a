"""The prefills of one scheduled step: which requests are prefilling, and the compiled shape
each one runs on (the new tokens' bucket; under nxdi with prefix caching, the (prefill,
prefix) grid cell of runtimes/prefix_grid.py, through `Shapes.prefill_step`).

Pure Python over vLLM's SchedulerOutput and Request objects (read, not imported): the Neuron
scheduler calls it on the simulated device and on a Neuron host alike, so both record the
same shapes.
"""

from __future__ import annotations

from typing import Any

from neuron_batch.runtimes.runtime import Shapes
from neuron_batch.scheduler.records import RequestRecord


def split_prefills(output: Any, requests: dict[str, Any]
                   ) -> tuple[dict[str, int], int, int, int]:
    """({prefill request id: KV tokens it held before the step}, their scheduled tokens,
    number of decodes, KV tokens held before the step) of a step's scheduled requests, by
    each one's progress through its prompt."""
    new, cached = output.scheduled_new_reqs, output.scheduled_cached_reqs
    req_ids = [r.req_id for r in new] + list(cached.req_ids)
    computed = [r.num_computed_tokens for r in new] + list(cached.num_computed_tokens)
    prefills = {req_id: done for req_id, done in zip(req_ids, computed)
                if done < requests[req_id].num_prompt_tokens}
    num_scheduled = output.num_scheduled_tokens
    return (prefills, sum(num_scheduled[req_id] for req_id in prefills),
            len(req_ids) - len(prefills), sum(computed))


def pad_prefills(shapes: Shapes, output: Any, prefills: dict[str, int],
                 padded: dict[str, int], records: dict[str, RequestRecord], t_start: float
                 ) -> tuple[int, int, int, int | None]:
    """Pad each prefill of `output` to the graph it runs on (into `padded`, and the KV its
    attention reads into `output.prefill_kv_read`, the simulated device's cost) and stamp the
    new requests' admission and prefix-cache hits in `records`; (padded tokens, prefix-cache
    hits, hits computed again, prefix bucket or None)."""
    hits = 0
    for new in output.scheduled_new_reqs:   # a new request's computed tokens are hits
        hits += new.num_computed_tokens
        record = records.get(new.req_id)
        if record is not None and record.admitted is None:
            record.admitted = t_start
            record.num_cached_tokens = new.num_computed_tokens
    bucket = kv_read = recomputed = 0
    prefix_bucket = None
    for req_id, held in prefills.items():   # held: its hits, or its prior chunks
        size, again, prefix_bucket, read = shapes.prefill_step(
            output.num_scheduled_tokens[req_id], held)
        padded[req_id] = size
        bucket, kv_read, recomputed = bucket + size, kv_read + read, recomputed + again
    output.prefill_kv_read = kv_read
    return bucket, hits, recomputed, prefix_bucket
