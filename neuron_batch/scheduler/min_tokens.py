"""`min_tokens` in the stop check, as AWS's Neuron plugin does in its own scheduler
(`vllm_neuron/core/scheduler.py`, `check_stop_with_min_tokens`).

vLLM's stop check trusts its sampler to mask EOS and stop tokens until a request has
`min_tokens` outputs; a sampler on the device (NxDI's on-device sampling) does not, so an early
EOS would end the request. Elsewhere the sampler already masks them and this changes nothing.

Only a request with `min_tokens > 1` can be held back (its first output token may always stop
it), and vLLM calls `_update_request_with_output` for every running request every step. So the
holding update is put on the scheduler instance, in front of the class's, when the first such
request arrives (`add_request`, which also carries a streaming session's new parameters); until
then vLLM's own update runs with nothing in front of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.v1.request import Request, RequestStatus

_UPDATE = "_update_request_with_output"


if TYPE_CHECKING:
    # The checker sees the mixin on vLLM's Scheduler, whose attributes it reads and whose
    # methods it extends (vLLM is not read by mypy: Any; tests/scheduler drive the real one).
    from vllm.v1.core.sched.scheduler import Scheduler as _Scheduler
else:
    _Scheduler = object


class MinTokensStop(_Scheduler):
    """Mixin for a vLLM Scheduler: no EOS / stop-token stop before min_tokens outputs."""

    def add_request(self, request: Request) -> None:
        params = request.sampling_params
        if params is not None and params.min_tokens > 1 and _UPDATE not in self.__dict__:
            # An instance attribute: vLLM's `self._update_request_with_output(...)` finds it
            # first; super() in it still reaches the class's own (Scheduler's or
            # AsyncScheduler's).
            setattr(self, _UPDATE, self._update_holding_min_tokens)
        super().add_request(request)

    @property
    def holds_min_tokens(self) -> bool:
        """Whether the min_tokens hold is installed (some request asked for min_tokens > 1)."""
        return _UPDATE in self.__dict__

    def _update_holding_min_tokens(self, request: Request, new_token_ids: list[int],
                                   *args: Any, **kwargs: Any) -> tuple[list[int], bool]:
        params = request.sampling_params
        # Fast path: the next token may already stop it.
        if params is None or params.min_tokens <= request.num_output_tokens + 1:
            done: tuple[list[int], bool] = super()._update_request_with_output(
                request, new_token_ids, *args, **kwargs)
            return done
        kept: list[int] = []
        for token in new_token_ids:
            if request.num_output_tokens + 1 >= params.min_tokens:
                break   # this token reaches min_tokens: vLLM's own check may stop on it
            request.append_output_token_ids(token)
            kept.append(token)
            # Only the length caps may end a request before min_tokens.
            if (request.num_tokens >= self.max_model_len
                    or request.num_output_tokens >= request.max_tokens):
                request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                return kept, True
        rest = new_token_ids[len(kept):]
        if not rest:
            return kept, False
        tail, stopped = super()._update_request_with_output(request, rest, *args, **kwargs)
        return kept + list(tail), stopped
