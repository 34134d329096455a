"""Decode first, then the new prompts, in one engine step: what optimum-neuron's runner does
with a step that holds both (`Runtime.decode_then_prefill`; its `runner.py` `execute_model`
runs the token-generation graph for the running requests, then context encoding for the new
ones). The step's decode gets a DECODE record and its prefill a PREFILL record, each timed as
its own graph call, so the report's padding and time per state read as for any other step.

A mixin of NeuronScheduler (it uses the scheduler's shapes, recorder and KV manager); under
the other runtimes nothing calls it. Imports no vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuron_batch.scheduler.records import DECODE, SchedulerState, StepRecord

_DECODING = SchedulerState.ACTIVE_DECODE.value


if TYPE_CHECKING:
    # The checker sees the mixin on vLLM's Scheduler, whose attributes it reads and whose
    # methods it extends (vLLM is not read by mypy: Any; tests/scheduler drive the real one).
    from vllm.v1.core.sched.scheduler import Scheduler as _Scheduler
else:
    _Scheduler = object


class DecodeFirst(_Scheduler):
    """The decode record of a decode-then-prefill step, and its end."""

    #: Records (by step number) a prefill record follows in the same engine step.
    _decode_first: set[int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._decode_first = set()
        super().__init__(*args, **kwargs)

    def _record_decode_first(self, output: Any, cached_computed: list[int], t_start: float,
                             blocked: str | None, num_waiting: int) -> tuple[int, int]:
        """A step that decodes the running requests and then prefills new prompts (a
        `decode_then_prefill` runtime, optimum-neuron: two graph calls): its decode gets a
        DECODE record of its own, padded as a decode step, before the step's PREFILL record;
        the device says where the decode ended (`decode_seconds` on the output) and
        update_from_output closes both (`_finish_decode_first`); (padded batch, attended
        length) of the decode. (Every cached request is a decode here: such a runtime
        prefills whole prompts.)"""
        num_decode = len(cached_computed)
        longest = max(cached_computed, default=0)
        bucket, attended = self.shapes.decode(num_decode, longest)
        recorder = self.recorder
        recorder.add_step(StepRecord(  # arguments in STEP_FIELDS_FILLED order
            recorder.num_steps, _DECODING, DECODE,
            list(output.scheduled_cached_reqs.req_ids), num_decode, num_decode, num_decode,
            bucket, bucket, sum(cached_computed), blocked, num_waiting, len(self.running),
            self.kv_cache_manager.usage, t_start, None, self.kv_reserved_blocks, 0, attended,
            longest + 1))
        self._decode_first.add(recorder.last_step.step)
        return bucket, attended

    def _finish_decode_first(self, scheduler_output: Any) -> None:
        """Close the decode record of the step whose output came back, if it has one: it
        ends where the device says (`decode_seconds` on the output; else now), and the
        step's prefill record starts there."""
        recorder = self.recorder
        first = recorder.oldest_unfinished()
        if first is None or first.step not in self._decode_first:
            return
        self._decode_first.discard(first.step)
        seconds = getattr(scheduler_output, "decode_seconds", None)
        end = first.t_start + seconds if seconds is not None else recorder.clock()
        recorder.finish_oldest_step(t_end=end)
        following = recorder.oldest_unfinished()
        if following is not None:
            following.t_start = end
