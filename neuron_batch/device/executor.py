"""The simulated Neuron device's executor: runs no model and charges virtual time.

`NeuronSimExecutor` plugs into vLLM as `distributed_executor_backend`. The real engine path
runs (LLM -> engine core -> NeuronScheduler -> executor -> output processing); only the model
is replaced:

- the KV-cache handshake answers with the KV cache the chosen instance, TP degree and model
  would really have (`Target.kv`, from `cost_model.kv_capacity`: HBM of the TP group minus
  weights and reserve, capped at `kv_cap_fraction` of the HBM, blocks of 32 tokens), with one
  KV spec per decoder layer shaped as the model's (KV heads replicated over TP as on Neuron);
- every step returns its tokens at once: one token for each request that finished its prompt in
  the step and for each decode, never an EOS token (the runner also sets ignore_eos), so a
  request generates exactly its max_tokens;
- every step advances a virtual clock (`virtual_clock.py`) by the step's modelled duration,
  `StepCostModel.prefill_time / decode_time` of the step's *padded* shape: the prefill bucket
  (`scheduler_output.num_scheduled_tokens_padded`) or decode batch bucket
  (`scheduler_output.num_seqs_padded`), both set by NeuronScheduler, and the KV the scheduled
  requests held before the step (the SchedulerOutput's pre-step num_computed_tokens).

Sampling (sampling_cost.py): a job that samples on the host (`host_sampling` in the engine's
config, decided from its requests) pays every step the logits over the host link and vLLM's CPU
sampler; a constrained token under the Beta/GA runtime the published on-device mask. The
charge goes on the clock and, through `SchedulerOutput.sampling_s`, into the step's record.

The executor points the scheduler's recorder at the engine's own virtual clock (it rewrites
`additional_config["neuron_batch"]["clock"]` before vLLM builds the scheduler, in the same
engine-core process), so every time in the records is simulated device time, starting at 0.0
when the engine starts. Nothing on the simulated path reads wall time: the same workload and
settings give byte-identical records (request ids included, see `Target.engine_kwargs`).

Without NeuronScheduler (no padded shapes in the SchedulerOutput) the executor still runs:
a step's prefill chunks are costed together as one unpadded prefill and its decodes as one
unpadded batch, the two times added (Neuron cannot mix them in one graph). So is a step of a
decode-then-prefill runtime (optimum-neuron), padded as the scheduler says: its decode first
(the time it took goes back as `decode_seconds`, where the step's decode record ends), then its
prefill.

A request samples its first token in the step where its prompt is complete. A request vLLM
preempted and recomputes in chunks would sample one chunk early: NeuronScheduler never preempts.

With vLLM multiprocessing on, the engine still runs and every time is simulated, but arrivals
are not all at 0 and runs are not reproducible: vLLM's front end streams the requests to the
engine-core process while it already steps. Byte-identical records need the in-process engine
core (VLLM_ENABLE_V1_MULTIPROCESSING=0, as the CLI and the tests run it).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import Any

import torch
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

from neuron_batch.device import virtual_clock
from neuron_batch.device.sampling_cost import SamplingCharge
from neuron_batch.device.target import TARGET_KEY, Target
from neuron_batch.runtimes.runtime import VLLM_NEURON, runtime_of
from neuron_batch.runtimes.sampling import HOST_SAMPLING_KEY, sampler_asks
from neuron_batch.scheduler.compat import full_attention_spec, model_runner_output
from neuron_batch.scheduler.kv_reserve import DEFAULT_KV_RESERVE

logger = logging.getLogger(__name__)


# -- the executor ------------------------------------------------------------------------------
class NeuronSimExecutor(Executor):
    """vLLM executor of the simulated Neuron device (see the module docstring)."""

    uses_ray = False
    supports_pp = False

    def _init_executor(self) -> None:
        vllm_config = self.vllm_config
        additional = vllm_config.additional_config
        if not isinstance(additional, dict):
            additional = {}
            vllm_config.additional_config = additional
        own = additional.setdefault("neuron_batch", {})
        scheduler = vllm_config.scheduler_config
        layout = (self.model_config.max_model_len, scheduler.max_num_seqs,
                  self.cache_config.block_size)
        caching = bool(self.cache_config.enable_prefix_caching)
        data = own.get(TARGET_KEY)
        if data is None:
            # Built without Target.engine_kwargs: the default device at this engine's layout,
            # the model directory's shapes, and the seed design's runtime unless the engine
            # names one (an engine built by hand has vLLM's chunked prefill on, which nxdi
            # refuses).
            own.setdefault("runtime", VLLM_NEURON)
            target = Target.resolve(arch=self.model_config.model, runtime=runtime_of(own),
                                    max_model_len=layout[0], max_num_seqs=layout[1],
                                    block_size=layout[2], prefix_caching=caching,
                                    kv_reserve=own.get("kv_reserve", DEFAULT_KV_RESERVE))
        else:
            # The runner's target, rebuilt from its one serialised form through the same
            # checks (an engine built from edited settings fails as the up-front check would).
            target = Target.from_dict(data)
            resolved = (target.max_model_len, target.max_num_seqs, target.block_size)
            if caching != target.prefix_caching:
                raise RuntimeError(
                    f"simulated Neuron device: vLLM's engine has enable_prefix_caching="
                    f"{caching}, the device was resolved with prefix_caching="
                    f"{target.prefix_caching} (its KV layout and step costs follow it); "
                    f"resolve the Target with the engine's setting")
            if layout != resolved:
                raise RuntimeError(
                    f"simulated Neuron device: vLLM's engine has max_model_len, max_num_seqs, "
                    f"block size {layout}, the device was resolved for {resolved}; build it "
                    f"from Target.engine_kwargs (or Target.with_layout) of this layout")
        self.target = target
        self.arch = target.arch
        self.cost_model = target.cost_model
        self.num_blocks = target.pool_blocks      # sized once, by the target
        # KV spec per decoder layer: the TP group's KV heads (replicated when TP > heads).
        group_kv_heads = target.tp * self.arch.kv_heads_per_core(target.tp)
        spec = full_attention_spec(block_size=target.block_size, num_kv_heads=group_kv_heads,
                                   head_size=self.arch.head_dim, dtype=torch.bfloat16)
        self._kv_specs = {f"model.layers.{i}.self_attn.attn": spec
                          for i in range(self.arch.num_layers)}
        self._block_bytes = spec.page_size_bytes * self.arch.num_layers
        self.kv_cache_config: KVCacheConfig | None = None

        # The engine's own virtual clock, at 0.0; the scheduler (built next, same process)
        # resolves the name written here.
        self.clock_name, self.clock = virtual_clock.new_engine_clock()
        own["clock"] = self.clock_name
        self.token_id = _filler_token_id(self.model_config, self.arch.vocab_size)
        # Prompt lengths of requests still in their prefill (removed when it completes).
        self._prefill_prompt_len: dict[str, int] = {}
        self.num_steps = 0
        self._prefill_time = self.cost_model.prefill_time
        self._decode_time = self.cost_model.decode_time
        self._kv_read = self.cost_model.decode_kv_tokens
        self._gathered = (self.cost_model.gathered_tokens
                          if self.cost_model.gathers_block_kv else None)
        # Sampling: on the host for the whole job where its requests need it (decided before
        # the engine was built, engine.engine_kwargs), else on the device (sampling_cost.py).
        self.sampling = SamplingCharge(target.runtime.sampling, self.arch.vocab_size,
                                       host=bool(own.get(HOST_SAMPLING_KEY)))
        # req_id -> (constrained, logprobs) of the running requests that ask for either.
        self._asks: dict[str, tuple[bool, bool]] = {}

    # -- the KV-cache handshake ----------------------------------------------------------------
    def get_kv_cache_specs(self) -> list[dict[str, Any]]:
        return [dict(self._kv_specs)]

    def determine_available_memory(self) -> list[int]:
        return [self.num_blocks * self._block_bytes]

    def initialize_from_config(self, kv_cache_configs: list[KVCacheConfig]) -> None:
        config = kv_cache_configs[0]
        if config.num_blocks != self.num_blocks:
            raise RuntimeError(f"simulated Neuron device: vLLM sized the KV cache at "
                               f"{config.num_blocks} blocks, expected {self.num_blocks}")
        self.kv_cache_config = config

    def compile_or_warm_up_model(self) -> None:
        return None   # nothing to compile; Target.describe estimates the compile time

    def get_supported_kv_cache_layouts(self) -> list[list[str]]:
        return [["LBNHC"]]

    def set_kv_cache_layout(self, layout_name: str) -> None:
        return None

    # -- steps -------------------------------------------------------------------------------
    def execute_model(self, scheduler_output, non_block: bool = False):
        output = self._step(scheduler_output)
        return _Done(output) if non_block else output

    def sample_tokens(self, grammar_output, non_block: bool = False):
        # execute_model always returns the sampled tokens, so the engine never asks.
        raise RuntimeError("simulated Neuron device: sample_tokens is not used")

    def _step(self, so) -> ModelRunnerOutput:
        num_scheduled = so.num_scheduled_tokens
        if not num_scheduled:
            return EMPTY_MODEL_RUNNER_OUTPUT
        self.num_steps += 1
        pending = self._prefill_prompt_len
        if so.finished_req_ids and (pending or self._asks):
            for req_id in so.finished_req_ids:
                pending.pop(req_id, None)
                self._asks.pop(req_id, None)
        seqs_padded = getattr(so, "num_seqs_padded", None)
        if seqs_padded is not None and not so.scheduled_new_reqs and not pending:
            return self._decode_step(so, seqs_padded)
        return self._general_step(so, seqs_padded)

    def _decode_step(self, so, seqs_padded: int) -> ModelRunnerOutput:
        """A NeuronScheduler decode step: every request samples one token."""
        req_ids = list(so.num_scheduled_tokens)
        attended = getattr(so, "attended_len", None)
        context = self._kv_read(seqs_padded, attended, sum(so.scheduled_cached_reqs
                                                           .num_computed_tokens))
        gathered = self._gathered(seqs_padded, attended) if self._gathered else 0
        self.clock.now += self._decode_time(seqs_padded, context, gathered)
        if self._asks or self.sampling.host:
            self._charge_sampling(so, req_ids, seqs_padded)
        token = self.token_id
        return model_runner_output(
            req_ids=req_ids, req_id_to_index=dict(zip(req_ids, range(len(req_ids)))),
            sampled_token_ids=[[token] for _ in req_ids])

    def _general_step(self, so, seqs_padded: int | None) -> ModelRunnerOutput:
        """Prefill chunks (NeuronScheduler: one request), a decode-then-prefill step
        (optimum-neuron), or anything a scheduler without padding produced."""
        num_scheduled, pending = so.num_scheduled_tokens, self._prefill_prompt_len
        token = self.token_id
        before = self._admit(so.scheduled_new_reqs, num_scheduled)
        cached = so.scheduled_cached_reqs
        before.update(zip(cached.req_ids, cached.num_computed_tokens))
        padded = getattr(so, "num_scheduled_tokens_padded", None)
        req_ids = list(num_scheduled)
        sampled: list[list[int]] = []
        prefill_padded = prefill_context = 0
        decode_seqs = decode_context = 0
        for req_id in req_ids:
            computed = before[req_id]
            prompt_len = pending.get(req_id)
            if prompt_len is None:                      # a decode
                decode_seqs += 1
                decode_context += computed
                sampled.append([token])
                continue
            prefill_padded += padded[req_id] if padded is not None else num_scheduled[req_id]
            prefill_context += computed
            if computed + num_scheduled[req_id] >= prompt_len:
                del pending[req_id]                     # prompt done: first token
                sampled.append([token])
            else:
                sampled.append([])
        seconds = 0.0
        if decode_seqs:
            seconds = so.decode_seconds = self._mixed_decode_time(  # (where its record ends)
                so, seqs_padded, decode_seqs, decode_context)
        if prefill_padded:
            # NeuronScheduler says what the prefill's attention reads (the grid cell's prefix
            # bucket, whole segments): Shapes.prefill_step.
            prefill_read = getattr(so, "prefill_kv_read", None)
            seconds += self._prefill_time(prefill_padded, prefill_context
                                          if prefill_read is None else prefill_read)
        self.clock.now += seconds
        if self._asks or self.sampling.host:
            rows = [r for r, got in zip(req_ids, sampled) if got]
            self._charge_sampling(so, rows, (seqs_padded or decode_seqs) if decode_seqs
                                  else len(rows))
        return model_runner_output(req_ids=req_ids,
                                   req_id_to_index=dict(zip(req_ids, range(len(req_ids)))),
                                   sampled_token_ids=sampled)

    def _admit(self, new_reqs, num_scheduled: dict[str, int]) -> dict[str, int]:
        """New requests' prompt lengths (pending until their prefill is done) and what they
        ask of the sampler; {req_id: tokens computed before this step}."""
        before: dict[str, int] = {}
        for new in new_reqs:
            before[new.req_id] = new.num_computed_tokens
            asks = sampler_asks(new.sampling_params) if new.sampling_params else None
            if asks is not None and (asks.constrained or asks.logprobs):
                self._asks[new.req_id] = (asks.constrained, asks.logprobs)
            prompt_len = len(new.prompt_token_ids) if new.prompt_token_ids is not None \
                else new.num_computed_tokens + num_scheduled[new.req_id]
            self._prefill_prompt_len[new.req_id] = prompt_len
        return before

    def _mixed_decode_time(self, so, seqs_padded: int | None, decode_seqs: int,
                           decode_context: int) -> float:
        """The decodes of a step that also prefills: a decode-then-prefill step's decode graph
        call (optimum-neuron), as padded as a decode step; else a scheduler without padding's
        decodes."""
        attended = getattr(so, "attended_len", None)
        if attended is not None and seqs_padded is not None:
            read = self._kv_read(seqs_padded, attended, decode_context)
            gathered = self._gathered(seqs_padded, attended) if self._gathered else 0
            return self._decode_time(seqs_padded, read, gathered)
        return self._decode_time(seqs_padded or decode_seqs, decode_context)

    def _charge_sampling(self, so, rows: list[str], padded_rows: int) -> None:
        """Advance the clock by the sampling of the `rows` that sample a token this step, and
        tell the scheduler's records (`so.sampling_s`, read in update_from_output)."""
        asks = self._asks
        constrained = sum(1 for r in rows if asks.get(r, (False,))[0])
        logprobs = sum(1 for r in rows if asks.get(r, (False, False))[1])
        seconds = self.sampling.step_s(padded_rows, len(rows), constrained, logprobs)
        self.clock.now += seconds
        so.sampling_s = seconds

    # -- the rest of the executor interface ----------------------------------------------------
    def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False):
        handlers = {
            "get_supported_tasks": lambda: ("generate",),
            "get_kv_cache_spec": lambda: dict(self._kv_specs),
            "determine_available_memory": lambda: self.num_blocks * self._block_bytes,
            "get_supported_kv_cache_layouts": lambda: ["LBNHC"],
            "set_kv_cache_layout": lambda *_: None,
            "check_health": lambda: None,
            "shutdown": lambda: None,
            "synchronize_device": lambda: None,
            "reset_mm_cache": lambda: None,
            "reset_encoder_cache": lambda: None,
            "list_loras": lambda: set(),
            "supports_draft_weight_updates": lambda: False,
        }
        name = method if isinstance(method, str) else getattr(method, "__name__", repr(method))
        if name not in handlers:
            raise NotImplementedError(f"the simulated Neuron device does not support {name!r}")
        result = [handlers[name](*args, **(kwargs or {}))]
        if non_block:
            future: Future = Future()
            future.set_result(result)
            return future
        return result

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        virtual_clock.release_engine_clock(self.clock_name)


class _Done:
    """An already finished future: what `execute_model(non_block=True)` returns. The engine
    only calls result() on it; a concurrent.futures.Future (a lock and a condition per step)
    costs more than the rest of the simulated step."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    def result(self, timeout: float | None = None) -> Any:
        return self._value

    def done(self) -> bool:
        return True

    def cancelled(self) -> bool:
        return False

    def exception(self, timeout: float | None = None) -> None:
        return None

    def add_done_callback(self, fn) -> None:
        fn(self)


def _filler_token_id(model_config, vocab_size: int) -> int:
    """A token id that is never a special token of the model (so never EOS)."""
    special: set[int] = set()
    hf = getattr(model_config, "hf_config", None)
    for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
        value = getattr(hf, name, None)
        if isinstance(value, int):
            special.add(value)
        elif isinstance(value, (list, tuple)):
            special.update(v for v in value if isinstance(v, int))
    token = 1000 % vocab_size
    while token in special:
        token = (token + 1) % vocab_size
    return token


# -- helpers for callers -------------------------------------------------------------------------
def engine_core(llm) -> Any:
    """The in-process EngineCore of an `LLM` (VLLM_ENABLE_V1_MULTIPROCESSING=0), else None."""
    client = llm.llm_engine.engine_core
    return getattr(client, "engine_core", None)


def sim_executor(llm) -> NeuronSimExecutor | None:
    """The simulated executor of an in-process `LLM`, else None."""
    core = engine_core(llm)
    executor = getattr(core, "model_executor", None)
    return executor if isinstance(executor, NeuronSimExecutor) else None


def shutdown_llm(llm, timeout: float | None = None) -> None:
    """Shut an LLM's engine down now: the scheduler then writes the records' last lines and
    summary and closes the records file (vLLM otherwise does it only when the LLM is
    garbage-collected).

    With vLLM multiprocessing the engine core's own teardown (`EngineCore.shutdown`, which shuts
    the executor and the scheduler down) is first called as a utility in the engine-core
    process: vLLM's SIGTERM-based shutdown can miss an idle engine core (the signal lands on
    another thread while the main one waits for input) and kill it after `timeout` seconds
    (vLLM's default: 5), which would lose the records not yet flushed.
    """
    client = llm.llm_engine.engine_core
    call_utility = getattr(client, "call_utility", None)
    if call_utility is not None:            # the engine core runs in another process
        try:
            call_utility("shutdown")
        except Exception:                   # already gone: nothing left to save
            logger.debug("engine-core teardown call failed", exc_info=True)
    client.shutdown(timeout=timeout)
