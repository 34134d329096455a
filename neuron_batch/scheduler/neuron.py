"""NeuronScheduler and NeuronAsyncScheduler: vLLM's v1 scheduler, made to run on Neuron.

Neuron runs precompiled graphs, so the scheduler must (see the design document,
`docs/neuron-scheduler-design.md` in AWS's plugin and in this project's README):
- never mix prefill and decode in one step, and prefill one request per step (a runtime whose
  runner decodes first and then prefills, optimum-neuron, gets both in one step, recorded as
  two graph calls: decode_first.py);
- pad every prefill chunk to a compiled token bucket and every decode batch to a compiled
  batch-size bucket, without letting the padding leak into vLLM's token accounting;
- never admit a request unless every running request can still reach its end in the KV cache,
  because Neuron cannot preempt (and hiding decodes behind a prefill that cannot get KV blocks
  deadlocks). What "its end" is depends on the `kv_reserve` rule (kv_reserve.py): its own
  prompt + max_tokens (the default), or max_model_len for every request (the seed design).

It does this around vLLM's own `schedule()`, which still allocates blocks and tracks requests:
the waiting queue is swapped out (the holdback queue), the requests that pass admission are put
back one at a time in FIFO order, decodes are hidden while a prefill runs, and everything is
restored after the base scheduler returns.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from neuron_batch.runtimes.runtime import runtime_of
from neuron_batch.scheduler.compat import (
    by_arrival,
    create_request_queue,
    gather_skipped_waiting,
    lower_running_caps,
    prepend_in_order,
    take_skipped_waiting,
)
from neuron_batch.scheduler.decode_first import DecodeFirst
from neuron_batch.scheduler.kv_admission import KVAdmission
from neuron_batch.scheduler.kv_reserve import MAX_MODEL_LEN
from neuron_batch.scheduler.min_tokens import MinTokensStop
from neuron_batch.scheduler.prefills import pad_prefills, split_prefills
from neuron_batch.scheduler.records import (
    DECODE,
    EMPTY,
    PREFILL,
    Recorder,
    RunConfig,
    SchedulerState,
    StepRecord,
    resolve_clock,
)

logger = logging.getLogger(__name__)

#: The StepRecord fields `_pad_and_record` fills, in the order it passes them: positional
#: arguments build a record about 1 us faster than keywords, every step. A test checks that
#: this order is StepRecord's.
STEP_FIELDS_FILLED = ("step", "state", "kind", "req_ids", "num_tokens", "num_tokens_padded",
                      "num_seqs", "num_seqs_padded", "bucket", "context_tokens", "blocked",
                      "num_waiting", "num_running", "kv_usage", "t_start", "t_end",
                      "kv_reserved_blocks", "num_preempted", "attended_len", "longest_len")
_STATE_VALUES = {state: state.value for state in SchedulerState}

#: Keys of `additional_config["neuron_batch"]` (this project's own settings).
RECORDS_PATH_KEY = "records_path"   # write step/request records here as JSON lines
CLOCK_KEY = "clock"                 # "module:attribute" of a zero-argument clock
RUNTIME_KEY = "runtime"             # "nxdi" or "vllm-neuron" (runtimes/runtime.py;
#                                     default vllm-neuron)
# True where the engine runs one batch job fed as it drains (job/generate.py `Feed`): every
# request is recorded as arriving with the first, as if handed over whole, so that latencies
# count from the job's start, not from the hand-off.
BATCH_ARRIVAL_KEY = "batch_arrival"
# (and KV_RESERVE_KEY in kv_admission.py: the kv_reserve rule)


class NeuronScheduler(KVAdmission, MinTokensStop, DecodeFirst, Scheduler):
    """vLLM's scheduler with Neuron's admission control, prefill/decode separation and padding."""

    # vLLM's queues, swapped each step with the holdback queue (vLLM is Any to the checker)
    waiting: Any
    holdback_queue: Any
    running: list[Request]

    def __init__(self, vllm_config: Any, kv_cache_config: Any, structured_output_manager: Any,
                 *args: Any, **kwargs: Any) -> None:
        # (vLLM 0.13 and later pass block_size, 0.11 and earlier do not: see compat.py)
        super().__init__(vllm_config, kv_cache_config, structured_output_manager,
                         *args, **kwargs)
        block_size = self.block_size
        additional = vllm_config.additional_config or {}
        own = additional.get("neuron_batch") or {}

        self.max_num_seqs: int = self.scheduler_config.max_num_seqs
        # Hard-coded as in the AWS plugin: Neuron prefills one request per step.
        self.max_prefills_per_batch = 1
        # Requests kept out of the base scheduler's sight this step (the design's holdback).
        self.holdback_queue = create_request_queue(self.policy)
        # The runtime says what the device compiles; its bucket lists are read where its
        # plugin reads them, so the records pad to exactly the graphs that exist.
        self.runtime = runtime_of(own)
        self.shapes = self.runtime.shapes(
            self.runtime.bucket_lists_in(additional.get(self.runtime.config_section)),
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens,
            max_model_len=self.max_model_len, block_size=block_size,
            prefix_caching=bool(self.cache_config.enable_prefix_caching))
        self.num_batched_tokens_buckets = list(self.shapes.prefill_buckets)
        self.num_seqs_buckets = list(self.shapes.decode_buckets)
        if not self.runtime.chunked_prefill:
            self._check_whole_prompts()
        self._setup_kv_admission(own, vllm_config, kv_cache_config, block_size)
        self._state = SchedulerState.IDLE
        self.total_padding_tokens = 0

        records_path = own.get(RECORDS_PATH_KEY)
        # (None: each request arrives when added; else the first arrival, once there is one)
        self._batch_start: float | None = None
        self._batch_arrival = bool(own.get(BATCH_ARRIVAL_KEY))
        self.recorder = Recorder(clock=resolve_clock(own.get(CLOCK_KEY)),
                                 path=Path(records_path) if records_path else None)
        self.recorder.start(RunConfig(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens,
            max_model_len=self.max_model_len, block_size=block_size,
            num_kv_blocks=kv_cache_config.num_blocks, max_kv_concurrent=self._max_kv_concurrent,
            prefill_buckets=list(self.num_batched_tokens_buckets),
            decode_buckets=list(self.num_seqs_buckets),
            scheduler_cls=f"{type(self).__module__}.{type(self).__name__}",
            enable_prefix_caching=bool(self.cache_config.enable_prefix_caching),
            kv_reserve=self.kv_reserve, runtime=self.runtime.name,
            attention_buckets=list(self.shapes.attention_buckets),
            prefix_buckets=list(self.shapes.prefix_buckets)))
        # Time of the update_from_output call in progress, for requests finishing in it.
        self._update_time: float | None = None
        if self._max_kv_concurrent < self.max_num_seqs:
            logger.info("Neuron scheduler: the KV cache holds %d requests at max_model_len=%d, "
                        "fewer than max_num_seqs=%d; %s", self._max_kv_concurrent,
                        self.max_model_len, self.max_num_seqs,
                        "admission stops there" if self.kv_reserve == MAX_MODEL_LEN else
                        "kv_reserve=request admits more while their prompt + max_tokens fit")

    def _check_whole_prompts(self) -> None:
        """Under a runtime that prefills whole prompts (nxdi), vLLM must never split one: its
        model runner feeds a new request's whole prompt whatever the step says."""
        config = self.scheduler_config
        chunked = getattr(config, "chunked_prefill_enabled",
                          getattr(config, "enable_chunked_prefill", False))
        if chunked or config.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"Neuron scheduler: the {self.runtime.name} runtime prefills whole prompts, one "
                f"a step; it needs chunked prefill off (it is {'on' if chunked else 'off'}) and "
                f"max_num_batched_tokens >= max_model_len (they are "
                f"{config.max_num_batched_tokens} and {self.max_model_len})")

    # -- the design's properties ------------------------------------------------------------
    @property
    def state(self) -> SchedulerState:
        return self._state

    @property
    def at_capacity(self) -> bool:
        """True if running requests >= max_num_seqs."""
        return len(self.running) >= self.max_num_seqs

    @property
    def has_prefill_in_running(self) -> bool:
        """True if any running request is still in its prefill phase."""
        return any(r.num_computed_tokens < r.num_prompt_tokens for r in self.running)

    def admission_refusal(self, request: Request | None = None,
                          prefill_in_running: bool | None = None) -> str | None:
        """Why the next waiting request may not start now (None: it may), checked in the
        design's order. Bucket fit needs no check because chunked prefill makes every chunk
        fit. The fourth check depends on the kv_reserve rule: under max_model_len it counts
        running requests against `_max_kv_concurrent` (the seed design, unchanged); under
        request it adds `request`'s reservation to the running total (without a request: any
        block still unreserved)."""
        if len(self.running) >= self.max_num_seqs:
            return "at_capacity"
        if prefill_in_running if prefill_in_running is not None else self.has_prefill_in_running:
            return "prefill_in_running"
        if len(self.waiting) >= self.max_prefills_per_batch:
            return "prefill_batch_full"
        if self.kv_saturated(request):
            return "kv_saturated"  # deadlock prevention: see the design's last section
        return None

    def can_schedule(self, request: Request | None = None) -> bool:
        """Admission control for the next waiting request."""
        return self.admission_refusal(request) is None

    # -- scheduling ---------------------------------------------------------------------------
    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        t_start = self.recorder.clock()
        if self._kv_too_big:
            self._refuse_too_big()
        gather_skipped_waiting(self)     # (vLLM 0.21-0.29: grammars not compiled yet)
        num_waiting = len(self.waiting)

        # Step 1: move waiting -> holdback. Swapping the queue objects is O(1), where draining
        # one by one would cost O(waiting) per step (thousands of requests in a batch job).
        self.holdback_queue, self.waiting = self.waiting, self.holdback_queue

        # Step 2: restore in FIFO order through admission control, stopping at the first refusal.
        prefill_running = [r for r in self.running
                           if r.num_computed_tokens < r.num_prompt_tokens]
        blocked = None
        admitted = None
        while self.holdback_queue:
            blocked = self.admission_refusal(self.holdback_queue.peek_request(),
                                             prefill_in_running=bool(prefill_running))
            if blocked is not None:
                self.recorder.blocked_counts[blocked] += 1
                break
            admitted = self.holdback_queue.pop_request()
            self.waiting.add_request(admitted)

        # Step 3: prefill/decode separation (three branches).
        hidden: list[Request] = []
        num_decoding = -1   # decode only: how many running requests the base sees (all decodes)
        if prefill_running:
            # An ongoing segmented prefill: run only it; decodes wait.
            if len(prefill_running) != len(self.running):
                hidden = [r for r in self.running if r.num_computed_tokens >= r.num_prompt_tokens]
                self.running = prefill_running
        elif self.waiting and not self.runtime.decode_then_prefill:
            # A new prefill starts: hide every decode (optimum-neuron's runner decodes them
            # first and then prefills it, in one step: they stay).
            hidden, self.running = self.running, []
        else:
            num_decoding = len(self.running)

        # Step 4: the base scheduler on the filtered view. Its caps are lowered by the number of
        # hidden requests, or it would admit past max_num_seqs and trip its own assertion.
        num_hidden = len(hidden)
        if num_hidden:
            self._lower_running_caps(num_hidden)
        try:
            output = self._call_base_schedule(*args, **kwargs)
            # Every request it scheduled was one of those decodes unless it resumed one (that
            # joins running; vLLM never resumes in a step it preempts in) or started one.
            only_decodes = 0 <= len(self.running) <= num_decoding
        finally:
            if num_hidden:
                self._lower_running_caps(-num_hidden)
            # Step 5: restore everything: hidden decodes behind the scheduled requests, and
            # whatever the base left in waiting (unscheduled or preempted) ahead of the holdback.
            if hidden:
                self.running = self.running + hidden
            skipped = take_skipped_waiting(self)
            if self.waiting or skipped:
                left = list(self.waiting)
                self.waiting.remove_requests(left)
                prepend_in_order(self.holdback_queue, by_arrival(left, skipped) if skipped
                                 else left)
            self.holdback_queue, self.waiting = self.waiting, self.holdback_queue

        if admitted is not None:
            self._reserve_if_scheduled(admitted, output)

        # Steps 6-8: padding, the mixed-batch check, state, records.
        self._pad_and_record(output, t_start, blocked, num_waiting, only_decodes)
        return output

    def _lower_running_caps(self, amount: int) -> None:
        lower_running_caps(self, amount)

    def _call_base_schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        """The base scheduler's schedule(); NeuronAsyncScheduler overrides this."""
        return Scheduler.schedule(self, *args, **kwargs)

    def _pad_and_record(self, output: SchedulerOutput, t_start: float, blocked: str | None,
                        num_waiting: int, only_decodes: bool = False) -> None:
        num_scheduled = output.num_scheduled_tokens
        cached_computed = output.scheduled_cached_reqs.num_computed_tokens
        if only_decodes and not output.scheduled_new_reqs:
            # schedule() saw only decodes go in: nothing to classify, one sum in C.
            prefill_ids: dict[str, int] = {}
            prefill_tokens = 0
            num_decode, context_tokens = len(cached_computed), sum(cached_computed)
        else:
            prefill_ids, prefill_tokens, num_decode, context_tokens = split_prefills(
                output, self.requests)
        num_prefill = len(prefill_ids)
        decode_first = None
        if num_prefill and num_decode and self.runtime.decode_then_prefill:
            decode_first = self._record_decode_first(output, cached_computed, t_start,
                                                     blocked, num_waiting)
            blocked = None      # (counted on the decode's record)
        elif num_prefill and num_decode:
            raise RuntimeError(
                f"Neuron constraint violated: Mixed prefill ({num_prefill}) "
                f"and decode ({num_decode}) in the same batch.")

        # num_scheduled_tokens stays the actual count (vLLM advances num_computed_tokens by it);
        # the padded size travels separately for the model runner.
        padded = dict(num_scheduled)
        attended = longest = None
        if num_prefill:
            kind = PREFILL
            bucket, cached, recomputed, prefix_bucket = pad_prefills(
                self.shapes, output, prefill_ids, padded, self.recorder.requests, t_start)
            self.total_padding_tokens += bucket - prefill_tokens
            num_tokens, num_tokens_padded = prefill_tokens, bucket
            num_seqs = num_seqs_padded = num_prefill
            output.num_seqs_padded = None
            self._state = SchedulerState.ACTIVE_PREFILL
        elif num_decode:
            kind = DECODE
            num_tokens = num_tokens_padded = output.total_num_scheduled_tokens
            num_seqs = num_decode
            # The longest position written this step is the largest num_computed_tokens (a
            # decode step holds only decodes: the mixed check above guarantees it).
            longest = max(cached_computed, default=0)
            for new in output.scheduled_new_reqs:
                longest = max(longest, new.num_computed_tokens)
            bucket, attended = self.shapes.decode(num_decode, longest)
            num_seqs_padded = bucket
            output.num_seqs_padded = bucket
            self._state = SchedulerState.ACTIVE_DECODE
        else:
            kind, bucket = EMPTY, None
            num_tokens = num_tokens_padded = num_seqs = num_seqs_padded = 0
            output.num_seqs_padded = None
        output.num_scheduled_tokens_padded = padded
        output.attended_len = attended
        if decode_first is not None:    # (the step's decode graph call, before its prefill)
            output.num_seqs_padded, output.attended_len = decode_first
        if not self.running and not self.waiting:
            self._state = SchedulerState.IDLE

        recorder = self.recorder
        step = StepRecord(  # arguments in STEP_FIELDS_FILLED order
            recorder.num_steps, _STATE_VALUES[self._state], kind, list(num_scheduled),
            num_tokens, num_tokens_padded, num_seqs, num_seqs_padded, bucket, context_tokens,
            blocked, num_waiting, len(self.running), self.kv_cache_manager.usage, t_start,
            None, self.kv_reserved_blocks,
            len(getattr(output, "preempted_req_ids", None) or ()), attended,
            None if longest is None else longest + 1)
        recorder.add_step(step)
        if kind == PREFILL:     # (decode steps keep the defaults: nothing more per step)
            step.cached_tokens, step.recomputed_tokens = cached, recomputed
            step.prefix_bucket = prefix_bucket
            if num_decode:      # (decode_then_prefill: the prefill record holds only it)
                step.req_ids = list(prefill_ids)
                step.context_tokens = sum(prefill_ids.values())

    # -- outputs and request life ------------------------------------------------------------
    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        if self._decode_first:
            self._finish_decode_first(scheduler_output)
        # (with what the simulated device charged for the step's sampling)
        step = self.recorder.finish_oldest_step(
            sampling_s=getattr(scheduler_output, "sampling_s", 0.0))
        now = step.t_end if step is not None else self.recorder.clock()
        if step is not None and step.kind == PREFILL:
            # A request's first token comes from the step that finishes its prompt.
            index = model_runner_output.req_id_to_index
            sampled = model_runner_output.sampled_token_ids
            for req_id in step.req_ids:
                i = index.get(req_id)
                record = self.recorder.requests.get(req_id)
                if (i is not None and i < len(sampled) and sampled[i]
                        and record is not None and record.first_token is None):
                    record.first_token = now
        self._update_time = now
        try:
            outputs = super().update_from_output(scheduler_output, model_runner_output)
        finally:
            self._update_time = None
        if self._kv_refused:
            self._send_refusals(outputs)
        return outputs

    def add_request(self, request: Request) -> None:
        super().add_request(request)
        if request.request_id not in self.recorder.requests:
            self.recorder.request_arrived(request.request_id, request.num_prompt_tokens)
            if self._batch_arrival:
                record = self.recorder.requests[request.request_id]
                if self._batch_start is None:
                    self._batch_start = record.arrival
                record.arrival = self._batch_start
            self.recorder.request_asks(request.request_id, request.sampling_params)
        self._refuse_if_never_fits(request)

    def _free_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        now = self._update_time if self._update_time is not None else self.recorder.clock()
        reason = request.get_finished_reason()
        self.recorder.request_finished(request.request_id, request.num_output_tokens,
                                       str(reason) if reason is not None else None, now)
        self._kv_release(request, finished=True)   # at once, also when EOS or a stop ends it
        return super()._free_request(request, *args, **kwargs)

    def _preempt_request(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        # Never expected (admission keeps every reservation inside the cache); if vLLM does
        # preempt, the request gives its blocks back and reserves again when re-admitted.
        self._kv_release(request, finished=False)
        return super()._preempt_request(request, *args, **kwargs)

    def shutdown(self) -> None:
        self.recorder.close()
        super().shutdown()


class NeuronAsyncScheduler(NeuronScheduler, AsyncScheduler):
    """NeuronScheduler with vLLM's async scheduling (output placeholders, overlapped steps)."""

    def _call_base_schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        return AsyncScheduler.schedule(self, *args, **kwargs)
