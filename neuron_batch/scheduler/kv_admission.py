"""The KV side of NeuronScheduler's admission: the fourth check (`kv_saturated`) under either
`kv_reserve` rule, the reservations of the running requests, and the refusal of a request that
could never fit.

A mixin, so the scheduler module stays about scheduling; it reads and writes only this
project's attributes plus vLLM's `finish_requests` and the engine-core output types.
The rules themselves (and why prompt + max_tokens is enough) are in kv_reserve.py.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
from vllm.v1.request import Request, RequestStatus

from neuron_batch.runtimes.buckets import kv_too_small_message
from neuron_batch.scheduler.compat import cdiv
from neuron_batch.scheduler.kv_reserve import (
    DEFAULT_KV_RESERVE,
    MAX_MODEL_LEN,
    KVLedger,
    blocks_for_tokens,
    parse_kv_reserve,
    reachable_tokens,
    small_cache_warning,
    too_big_message,
)

logger = logging.getLogger("neuron_batch.scheduler.neuron")

#: Key of `additional_config["neuron_batch"]`: "request" (default) or "max_model_len".
KV_RESERVE_KEY = "kv_reserve"


if TYPE_CHECKING:
    # The checker sees the mixin on vLLM's Scheduler, whose attributes it reads and whose
    # methods it extends (vLLM is not read by mypy: Any; tests/scheduler drive the real one).
    from vllm.v1.core.sched.scheduler import Scheduler as _Scheduler
else:
    _Scheduler = object


class KVAdmission(_Scheduler):
    """KV admission for NeuronScheduler (which supplies vLLM's Scheduler attributes)."""

    def _setup_kv_admission(self, own: dict[str, Any], vllm_config: Any, kv_cache_config: Any,
                            block_size: int) -> None:
        try:
            self.kv_reserve = parse_kv_reserve(own.get(KV_RESERVE_KEY, DEFAULT_KV_RESERVE))
        except ValueError as error:
            raise ValueError(f"Neuron scheduler: additional_config neuron_batch: {error}"
                             ) from None
        # (block size, blocks of a max_model_len request) per KV cache group.
        self._kv_groups = self._kv_cache_groups(vllm_config, kv_cache_config, block_size)
        self._blocks_per_max_request = blocks_for_tokens(self.max_model_len, self._kv_groups)
        usable_blocks = kv_cache_config.num_blocks - 1   # vLLM keeps one as its null block
        if not kv_cache_config.kv_cache_groups:
            # vLLM's pool holds no KV: the model keeps its own static cache of max_num_seqs
            # slots of max_model_len (optimum-neuron's worker reports no KV spec, so vLLM
            # builds an attention-free pool of one block: its worker.py get_kv_cache_spec).
            usable_blocks = self.max_num_seqs * self._blocks_per_max_request
        self._max_kv_concurrent = self._kv_concurrency_limit(usable_blocks, block_size)
        # The running requests' reservations, and each request's own need, worked out once.
        self._kv = KVLedger(usable_blocks)
        self._kv_need: dict[str, int] = {}
        # Requests whose reservation alone exceeds the cache: finished with an error at the
        # next schedule(), the error output sent at the next update_from_output().
        self._kv_too_big: list[tuple[Request, str]] = []
        self._kv_refused: list[tuple[Request, str]] = []

    def _kv_cache_groups(self, vllm_config: Any, kv_cache_config: Any,
                         block_size: int) -> list[tuple[int, int]]:
        """(block size, blocks a max_model_len request holds) for each KV cache group that
        allocates from the block pool: every group takes its own blocks for a request."""
        groups = []
        for group in kv_cache_config.kv_cache_groups:
            if getattr(group, "host_resident", False):
                continue
            spec = group.kv_cache_spec
            groups.append((spec.block_size, cdiv(spec.max_memory_usage_bytes(vllm_config),
                                                 spec.page_size_bytes)))
        if not sum(most for _, most in groups):   # no groups described: one of block_size
            groups = [(block_size, cdiv(self.max_model_len, block_size))]
        return groups

    def _kv_concurrency_limit(self, usable_blocks: int, block_size: int) -> int:
        """Requests that fit in the KV cache at max_model_len each (the design's
        `_max_kv_concurrent`). Unlike vLLM's `get_max_concurrency_for_kv_cache_config`, which
        the AWS code uses, this leaves out the block vLLM's block pool reserves as its null
        block: counting it admits one request too many when the cache is a whole number of
        requests, and that request then never gets its last block (found by the property tests).
        Under kv_reserve=request it only informs: a cache too small for one max_model_len
        request is a warning, and the requests that fit still run.
        """
        limit = usable_blocks // self._blocks_per_max_request
        if limit <= 0:
            if self.kv_reserve == MAX_MODEL_LEN:
                # The AWS code falls back to max_num_seqs here, which switches the cap off.
                raise ValueError("Neuron scheduler: " + kv_too_small_message(
                    usable_blocks, block_size, self.max_model_len))
            logger.warning("Neuron scheduler: %s", small_cache_warning(
                usable_blocks, block_size, self.max_model_len))
        return limit

    # -- the fourth admission check --------------------------------------------------------
    def kv_blocks_needed(self, request: Request) -> int:
        """The blocks `request` reserves under this scheduler's kv_reserve rule."""
        need = self._kv_need.get(request.request_id)
        if need is None:
            if self.kv_reserve == MAX_MODEL_LEN:
                need = self._blocks_per_max_request
            else:
                need = blocks_for_tokens(reachable_tokens(
                    request.num_prompt_tokens, _max_tokens(request), self.max_model_len),
                    self._kv_groups)
            self._kv_need[request.request_id] = need
        return need

    @property
    def kv_reserved_blocks(self) -> int:
        """Blocks reserved by the running requests (a running total, O(1))."""
        return self._kv.total

    @property
    def kv_usable_blocks(self) -> int:
        return self._kv.usable_blocks

    def kv_saturated(self, request: Request | None) -> bool:
        """The fourth check: under max_model_len, running requests against
        `_max_kv_concurrent` (the seed design, unchanged); under request, the running
        reservations plus `request`'s (without a request: whether any block is unreserved)."""
        if self.kv_reserve == MAX_MODEL_LEN:
            return len(self.running) >= self._max_kv_concurrent
        return not self._kv.fits(self.kv_blocks_needed(request) if request is not None else 1)

    def _reserve_if_scheduled(self, request: Request, output: SchedulerOutput) -> None:
        """An admitted request reserves once it really runs (the base may leave it waiting);
        the blocks come back when it finishes, is aborted or is preempted (`_kv_release`)."""
        if request.request_id in output.num_scheduled_tokens:
            self._kv.reserve(request.request_id, self.kv_blocks_needed(request))

    def _kv_release(self, request: Request, *, finished: bool) -> None:
        self._kv.release(request.request_id)
        if finished:
            self._kv_need.pop(request.request_id, None)

    # -- requests that can never fit -------------------------------------------------------
    def _refuse_if_never_fits(self, request: Request) -> None:
        """On arrival: a request whose reservation alone exceeds the cache would wait at the
        head of the queue for ever (and everything behind it): say so now, with the numbers."""
        need = self.kv_blocks_needed(request)
        if need <= self._kv.usable_blocks:
            return
        message = "Neuron scheduler: " + too_big_message(
            request.request_id, request.num_prompt_tokens, _max_tokens(request),
            self.max_model_len, need, self._kv.usable_blocks, self.block_size)
        logger.error("%s", message)
        self._kv_too_big.append((request, message))

    def _refuse_too_big(self) -> None:
        """Finish the requests too big for the KV cache with an error, before admission, so
        they never reach the base scheduler."""
        too_big, self._kv_too_big = self._kv_too_big, []
        for request, message in too_big:
            if request.is_finished():        # aborted meanwhile
                continue
            request.stop_reason = message
            self.finish_requests(request.request_id, RequestStatus.FINISHED_ERROR)
            self._kv_refused.append((request, message))

    def _send_refusals(self, outputs: dict[int, EngineCoreOutputs]) -> None:
        """Tell each refused request's client that it finished with an error, the reason in
        `stop_reason`: nothing else would ever answer it, it was never scheduled."""
        refused, self._kv_refused = self._kv_refused, []
        for request, message in refused:
            out = EngineCoreOutput(request_id=request.request_id, new_token_ids=[],
                                   finish_reason=FinishReason.ERROR, stop_reason=message)
            client = outputs.get(request.client_index)
            if client is None:
                outputs[request.client_index] = EngineCoreOutputs(outputs=[out])
            else:
                client.outputs.append(out)


def _max_tokens(request: Request) -> int | None:
    params = request.sampling_params
    return params.max_tokens if params is not None else getattr(request, "max_tokens", None)
