"""The simulated Neuron device: a vLLM executor that runs no model and charges virtual time.

`NeuronSimExecutor` plugs into vLLM as `distributed_executor_backend`. The real engine path
runs (LLM -> engine core -> NeuronScheduler -> executor -> output processing); only the model
is replaced:

- the KV-cache handshake answers with the KV cache the chosen instance, TP degree and model
  would really have (`cost_model.kv_capacity`: HBM of the TP group minus weights and reserve,
  capped at `kv_cap_fraction` of the HBM, blocks of 32 tokens), with one KV spec per decoder
  layer shaped as the model's (KV heads replicated over TP as on Neuron);
- every step returns its tokens at once: one token for each request that finished its prompt in
  the step and for each decode, never an EOS token (the runner also sets ignore_eos), so a
  request generates exactly its max_tokens;
- every step advances a virtual clock (`virtual_clock.py`) by the step's modelled duration,
  `StepCostModel.prefill_time / decode_time` of the step's *padded* shape: the prefill bucket
  (`scheduler_output.num_scheduled_tokens_padded`) or decode batch bucket
  (`scheduler_output.num_seqs_padded`), both set by NeuronScheduler, and the KV the scheduled
  requests held before the step (the SchedulerOutput's pre-step num_computed_tokens).

The executor points the scheduler's recorder at the engine's own virtual clock (it rewrites
`additional_config["neuron_batch"]["clock"]` before vLLM builds the scheduler, in the same
engine-core process), so every time in the records is simulated device time, starting at 0.0
when the engine starts. Nothing on the simulated path reads wall time: the same workload and
settings give byte-identical records (request ids included, see `sim_engine_kwargs`).

Without NeuronScheduler (no padded shapes in the SchedulerOutput) the executor still runs:
a step's prefill chunks are costed together as one unpadded prefill and its decodes as one
unpadded batch, the two times added (Neuron cannot mix them in one graph).

A request samples its first token in the step where its prompt is complete. A request vLLM
preempted and recomputes in chunks would sample one chunk early: NeuronScheduler never preempts.

With vLLM multiprocessing on, the engine still runs and every time is simulated, but arrivals
are not all at 0 and runs are not reproducible: vLLM's front end streams the requests to the
engine-core process while it already steps. Byte-identical records need the in-process engine
core (VLLM_ENABLE_V1_MULTIPROCESSING=0, as the CLI and the tests run it).
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

from neuron_batch.buckets import kv_too_small_message
from neuron_batch.device import virtual_clock
from neuron_batch.device.architectures import (
    ARCHITECTURES,
    Architecture,
    resolve_architecture,
)
from neuron_batch.device.cost_model import (
    CapacityError,
    WEIGHT_DTYPES,
    CostProfile,
    StepCostModel,
    compile_footprint,
    kv_capacity,
    load_profile,
)
from neuron_batch.device.hardware import default_tp, get_instance, validate_tp
from neuron_batch.device.virtual_clock import virtual_now  # noqa: F401  (also named here)
from neuron_batch.scheduler.kv_reserve import (
    DEFAULT_KV_RESERVE,
    MAX_MODEL_LEN,
    parse_kv_reserve,
    small_cache_warning,
)

logger = logging.getLogger(__name__)

#: KV block size of the Neuron plugin (neuron-facts.md).
NEURON_BLOCK_SIZE = 32
#: The clock to name in `additional_config["neuron_batch"]["clock"]`. The executor replaces it
#: with its own engine's clock when it starts; this name reads the last engine started.
VIRTUAL_CLOCK = "neuron_batch.device.virtual_clock:virtual_now"
#: The scheduler the simulated device is built for (it sets the padded shapes).
SCHEDULER_CLS = "neuron_batch.scheduler.NeuronScheduler"
#: Key of the executor's settings inside `additional_config["neuron_batch"]`.
SIM_KEY = "sim"
#: vLLM appends 8 random characters to every request id unless this is set; the records carry
#: the ids, so the simulated path sets it (LLM's own ids "0", "1", ... are unique per engine).
_REQUEST_ID_ENV = "VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"


class SimError(ValueError):
    """A simulated-device setting that cannot work; the message says what would."""


@dataclass(frozen=True)
class SimSettings:
    """What the simulated device pretends to be."""

    instance: str = "inf2.8xlarge"
    arch: str | Path | dict = "llama-3-8b"     # catalogue name, config.json path/dir, or dict
    tp_degree: int | None = None                # None: every NeuronCore of the instance
    weight_dtype: str = "bf16"
    profile: str | Path | None = None           # None: the instance's built-in cost profile
    kv_cap_fraction: float = 0.30               # VLLM_NEURON_KV_GMU_BUDGET_CAP_FRACTION


# -- resolving settings ------------------------------------------------------------------------
@dataclass(frozen=True)
class _Resolved:
    instance: str
    arch: Architecture
    arch_spec: str                  # catalogue name or config.json path (what the executor reads)
    tp: int
    weight_dtype: str
    profile: CostProfile
    profile_source: str             # "built-in <instance>" or the JSON path
    kv_cap_fraction: float


def _resolve(settings: SimSettings) -> _Resolved:
    inst = get_instance(settings.instance)
    tp = validate_tp(inst, settings.tp_degree if settings.tp_degree is not None
                     else default_tp(inst))
    arch = resolve_architecture(settings.arch)
    # A catalogue name travels as the name; a user's config travels as the config.json that
    # sim_engine_kwargs writes into the model directory.
    arch_spec = arch.name if _is_catalogue_name(settings.arch) else ""
    if settings.profile is None:
        profile, source = load_profile(inst.name), f"built-in {inst.name}"
    else:
        profile, source = load_profile(settings.profile), str(settings.profile)
        if Path(str(settings.profile)).is_file() and profile.instance != inst.name:
            logger.warning("cost profile %s was made for %s, used here for %s",
                           settings.profile, profile.instance, inst.name)
    if settings.weight_dtype not in WEIGHT_DTYPES:
        raise SimError(f"weight_dtype must be one of {list(WEIGHT_DTYPES)}, "
                       f"got {settings.weight_dtype!r}")
    if not 0.0 < settings.kv_cap_fraction <= 1.0:
        raise SimError(f"kv_cap_fraction must be in (0, 1], got {settings.kv_cap_fraction}")
    return _Resolved(inst.name, arch, arch_spec, tp, settings.weight_dtype, profile, source,
                     float(settings.kv_cap_fraction))


def _is_catalogue_name(spec: Any) -> bool:
    if not isinstance(spec, str):
        return False
    path = Path(spec)
    return not (path.suffix == ".json" or (path.is_dir() and (path / "config.json").exists()))


def _kv(resolved: _Resolved, max_model_len: int, kv_reserve: str) -> dict[str, Any]:
    """kv_capacity for the settings. CapacityError (naming instance and TP) when the weights
    do not fit or, under kv_reserve=max_model_len, when the KV cache cannot hold one request
    of max_model_len (under kv_reserve=request that is a warning: shorter requests run)."""
    return _checked_kv_capacity(resolved.instance, resolved.arch, resolved.tp,
                                resolved.weight_dtype, max_model_len, NEURON_BLOCK_SIZE,
                                resolved.kv_cap_fraction, kv_reserve)


def _checked_kv_capacity(instance: str, arch: Architecture, tp: int, weight_dtype: str,
                         max_model_len: int, block_size: int, cap_fraction: float,
                         kv_reserve: str, warn: bool = True) -> dict[str, Any]:
    kv = kv_capacity(instance, arch, tp, weight_dtype, max_model_len=max_model_len,
                     block_size=block_size, cap_fraction=cap_fraction)
    blocks_per_seq = -(-max_model_len // block_size)
    usable = max(kv["num_blocks"] - 1, 0)       # vLLM's block pool keeps one null block
    if usable < blocks_per_seq:
        where = f"{arch.name} {weight_dtype} on TP {tp} on {instance}: "
        if parse_kv_reserve(kv_reserve) == MAX_MODEL_LEN:
            raise CapacityError(where + kv_too_small_message(usable, block_size,
                                                             max_model_len))
        if warn:
            logger.warning("%s", where + small_cache_warning(usable, block_size,
                                                              max_model_len))
    return kv


# -- engine arguments --------------------------------------------------------------------------
def sim_engine_kwargs(settings: SimSettings, *, max_model_len: int, max_num_seqs: int,
                      max_num_batched_tokens: int, workdir: Path,
                      kv_reserve: str = DEFAULT_KV_RESERVE) -> dict[str, Any]:
    """Keyword arguments for `vllm.LLM(...)` that run the simulated device.

    Checks the settings first, in the caller's process: an unknown instance/model/TP, weights
    that do not fit (CapacityError naming instance and TP) or a KV cache too small for one
    request of max_model_len (under kv_reserve=max_model_len) raise here rather than inside
    vLLM's engine start-up. `kv_reserve` is the scheduler's KV admission rule.

    `additional_config` is a fresh dict: merge your own entries into it, and into its
    "neuron_batch" dict (do not replace that one: it holds the clock and the executor's "sim"
    settings). `enable_prefix_caching=False` (the harness' and scheduler tests' setting) and
    `scheduler_cls` = NeuronScheduler may be overridden.
    """
    resolved = _resolve(settings)
    if max_model_len > resolved.arch.max_position_embeddings:
        longer = [a.name for a in ARCHITECTURES.values()
                  if a.max_position_embeddings >= max_model_len
                  and _same_shape(a, resolved.arch)]
        hint = f" ({', '.join(longer)} has the same shapes)" if longer else ""
        raise SimError(
            f"max_model_len {max_model_len} exceeds {resolved.arch.name}'s context of "
            f"{resolved.arch.max_position_embeddings} tokens; lower it or choose a model with a "
            f"longer context{hint}")
    kv_reserve = parse_kv_reserve(kv_reserve)
    _kv(resolved, max_model_len, kv_reserve)
    model_dir = _write_model_dir(settings.arch, resolved.arch, Path(workdir))
    arch_spec = resolved.arch_spec or str(model_dir / "config.json")
    # Deterministic request ids (see _REQUEST_ID_ENV); vLLM caches its environment once an
    # engine has started, so drop that cache for the next engine to read the setting.
    if os.environ.get(_REQUEST_ID_ENV) != "1":
        os.environ[_REQUEST_ID_ENV] = "1"
        _drop_vllm_env_cache()
    sim = {
        "instance": resolved.instance,
        "tp": resolved.tp,
        "weight_dtype": resolved.weight_dtype,
        "arch": arch_spec,
        "profile": resolved.profile_source,
        "profile_params": resolved.profile.to_dict(),
        "kv_cap_fraction": resolved.kv_cap_fraction,
    }
    return {
        "model": str(model_dir),
        "skip_tokenizer_init": True,
        "load_format": "dummy",
        "distributed_executor_backend": NeuronSimExecutor,
        "scheduler_cls": SCHEDULER_CLS,
        "block_size": NEURON_BLOCK_SIZE,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "seed": 0,
        "additional_config": {"neuron_batch": {"clock": VIRTUAL_CLOCK, SIM_KEY: sim,
                                               "kv_reserve": kv_reserve}},
    }


def _drop_vllm_env_cache() -> None:
    try:
        import vllm.envs as envs
        if envs._is_envs_cache_enabled():
            envs.disable_envs_cache()
    except (ImportError, AttributeError):   # another vLLM release: nothing cached to drop
        pass


def _same_shape(a: Architecture, b: Architecture) -> bool:
    return (a.num_layers, a.hidden_size, a.intermediate_size, a.num_attention_heads,
            a.num_kv_heads, a.head_dim, a.vocab_size) == (
        b.num_layers, b.hidden_size, b.intermediate_size, b.num_attention_heads,
        b.num_kv_heads, b.head_dim, b.vocab_size)


def arch_config_json(arch: Architecture) -> dict[str, Any]:
    """A Hugging Face config.json for a catalogue architecture (enough for vLLM's ModelConfig;
    no weights are ever loaded)."""
    qwen = arch.attention_bias
    return {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen else "llama",
        "_name_or_path": arch.name,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "num_hidden_layers": arch.num_layers,
        "vocab_size": arch.vocab_size,
        "max_position_embeddings": arch.max_position_embeddings,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def _write_model_dir(spec: str | Path | dict, arch: Architecture, workdir: Path) -> Path:
    """workdir/sim-model-<name>/config.json: the catalogue's config, or the user's own."""
    if isinstance(spec, dict):
        config = dict(spec)
    elif isinstance(spec, (str, Path)) and (Path(spec).suffix == ".json" or Path(spec).is_dir()):
        path = Path(spec)
        config = json.loads((path / "config.json" if path.is_dir() else path)
                            .read_text(encoding="utf-8"))
    else:
        config = arch_config_json(arch)
    config.setdefault("architectures", ["LlamaForCausalLM"])
    config.setdefault("model_type", "llama")
    slug = "".join(c if c.isalnum() or c in ".-" else "-" for c in arch.name.lower())
    model_dir = workdir / f"sim-model-{slug}"
    model_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    target = model_dir / "config.json"
    if not target.exists() or target.read_text(encoding="utf-8") != text:
        target.write_text(text, encoding="utf-8")
    return model_dir


# -- description for the report ----------------------------------------------------------------
def describe_sim(settings: SimSettings, *, max_model_len: int, num_prefill_buckets: int,
                 num_decode_buckets: int,
                 kv_reserve: str = DEFAULT_KV_RESERVE) -> dict[str, Any]:
    """The simulated device in numbers, for the report."""
    resolved = _resolve(settings)
    kv = _kv(resolved, max_model_len, kv_reserve)
    blocks_per_seq = -(-max_model_len // NEURON_BLOCK_SIZE)
    compile_ = compile_footprint(num_prefill_buckets, num_decode_buckets, resolved.arch,
                                 resolved.weight_dtype, tp=resolved.tp, profile=resolved.profile)
    inst = get_instance(resolved.instance)
    return {
        "instance": resolved.instance,
        "tp_degree": resolved.tp,
        "neuron_cores": inst.num_cores,
        "weight_dtype": resolved.weight_dtype,
        "arch": resolved.arch.name,
        "params": resolved.arch.num_params,
        "weight_bytes": resolved.arch.weight_bytes(resolved.weight_dtype),
        "kv_cache": {
            "num_blocks": kv["num_blocks"],
            "block_size": NEURON_BLOCK_SIZE,
            "tokens": kv["tokens"],
            "bytes": kv["bytes"],
            "max_concurrent_at_max_model_len": kv["max_concurrent_at_max_len"],
            # what NeuronScheduler admits: vLLM keeps one block back as its null block
            "scheduler_max_concurrent": (kv["num_blocks"] - 1) // blocks_per_seq,
            "max_model_len": max_model_len,
            "cap_fraction": resolved.kv_cap_fraction,
            "limited_by": kv["limited_by"],
            "derivation": kv["derivation"],
        },
        "compile": {
            "graphs": compile_["graphs"],
            "prefill_graphs": num_prefill_buckets,
            "decode_graphs": num_decode_buckets,
            "estimated_compile_s": compile_["estimated_compile_s"],
        },
        "profile": {"name": resolved.profile.instance, "source": resolved.profile_source,
                    "params": resolved.profile.to_dict()},
    }


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
        sim = own.get(SIM_KEY)
        if sim is None:
            # Built without sim_engine_kwargs: default settings, the model directory's shapes.
            resolved = _resolve(SimSettings(arch=self.model_config.model))
            sim = {"instance": resolved.instance, "tp": resolved.tp,
                   "weight_dtype": resolved.weight_dtype, "arch": self.model_config.model,
                   "profile": resolved.profile_source,
                   "profile_params": resolved.profile.to_dict(),
                   "kv_cap_fraction": resolved.kv_cap_fraction}
        self.instance = sim["instance"]
        self.tp = sim["tp"]
        self.weight_dtype = sim["weight_dtype"]
        self.arch = resolve_architecture(sim["arch"])
        self.profile = CostProfile.from_dict(sim["profile_params"]) if sim.get(
            "profile_params") else load_profile(sim.get("profile") or self.instance)
        self.cost_model = StepCostModel(self.profile, self.instance, self.arch, self.tp,
                                        self.weight_dtype)
        self.block_size = self.cache_config.block_size
        max_model_len = self.model_config.max_model_len
        self.kv = _checked_kv_capacity(self.instance, self.arch, self.tp, self.weight_dtype,
                                       max_model_len, self.block_size,
                                       float(sim["kv_cap_fraction"]),
                                       own.get("kv_reserve", DEFAULT_KV_RESERVE),
                                       warn=False)  # the scheduler says it again
        self.num_blocks = self.kv["num_blocks"]
        # KV spec per decoder layer: the TP group's KV heads (replicated when TP > heads).
        group_kv_heads = self.tp * self.arch.kv_heads_per_core(self.tp)
        spec = FullAttentionSpec(block_size=self.block_size, num_kv_heads=group_kv_heads,
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
        return None   # nothing to compile; describe_sim estimates the real compile time

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
        if so.finished_req_ids and pending:
            for req_id in so.finished_req_ids:
                pending.pop(req_id, None)
        token = self.token_id
        new_reqs = so.scheduled_new_reqs
        cached = so.scheduled_cached_reqs
        seqs_padded = getattr(so, "num_seqs_padded", None)

        if seqs_padded is not None and not new_reqs and not pending:
            # NeuronScheduler decode step: every request samples one token.
            req_ids = list(num_scheduled)
            context = sum(cached.num_computed_tokens)
            self.clock.now += self._decode_time(seqs_padded, context)
            return ModelRunnerOutput(
                req_ids=req_ids, req_id_to_index=dict(zip(req_ids, range(len(req_ids)))),
                sampled_token_ids=[[token] for _ in req_ids])

        # General path: prefill chunks (NeuronScheduler: one request), or anything a
        # scheduler without padding produced.
        before: dict[str, int] = {}
        for new in new_reqs:
            before[new.req_id] = new.num_computed_tokens
            prompt_len = len(new.prompt_token_ids) if new.prompt_token_ids is not None \
                else new.num_computed_tokens + num_scheduled[new.req_id]
            pending[new.req_id] = prompt_len
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
        if prefill_padded:
            seconds += self._prefill_time(prefill_padded, prefill_context)
        if decode_seqs:
            seconds += self._decode_time(seqs_padded or decode_seqs, decode_context)
        self.clock.now += seconds
        return ModelRunnerOutput(req_ids=req_ids,
                                 req_id_to_index=dict(zip(req_ids, range(len(req_ids)))),
                                 sampled_token_ids=sampled)

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
