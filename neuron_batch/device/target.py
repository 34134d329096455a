"""What the simulated Neuron device pretends to be, resolved once.

`SimTarget.resolve(settings, max_model_len)` turns the user's choice (instance, architecture,
TP degree, weight type, cost profile) into one frozen object: the instance, the architecture's
shapes, the TP degree, the cost profile, the KV capacity and the checks that can fail (weights
that do not fit, a context longer than the model's, a KV cache too small). The runner builds it
once per run and hands it to the engine builder (`engine_kwargs`) and the report (`describe`);
nothing else re-reads the instance table, the architecture or the profile.

No vLLM import here (the executor class is imported only when engine arguments are built), so
a bad setting fails in milliseconds, before any engine starts.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_batch.buckets import kv_too_small_message
from neuron_batch.device.architectures import (
    ARCHITECTURES,
    Architecture,
    resolve_architecture,
)
from neuron_batch.device.cost_model import (
    WEIGHT_DTYPES,
    CapacityError,
    CostProfile,
    compile_footprint,
    kv_capacity,
    load_profile,
)
from neuron_batch.device.hardware import INSTANCES, default_tp, get_instance, validate_tp
from neuron_batch.device.static_kv import static_kv_capacity
from neuron_batch.runtime import Runtime, get_runtime
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
#: The simulated device's vLLM executor, by dotted path.
SIM_EXECUTOR = "neuron_batch.device.executor.NeuronSimExecutor"
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
    """What the simulated device pretends to be, as the user said it."""

    instance: str = "inf2.8xlarge"
    arch: str | Path | dict = "llama-3-8b"     # catalogue name, config.json path/dir, or dict
    tp_degree: int | None = None                # None: every NeuronCore of the instance
    weight_dtype: str = "bf16"
    profile: str | Path | None = None           # None: the instance's built-in cost profile
    kv_cap_fraction: float = 0.30               # VLLM_NEURON_KV_GMU_BUDGET_CAP_FRACTION
    runtime: str | None = None                  # None: nxdi on inf2/trn1, vllm-neuron on trn2


@dataclass(frozen=True)
class SimTarget:
    """The simulated device resolved and checked for one context length."""

    settings: SimSettings
    instance: str
    arch: Architecture
    arch_spec: str                  # catalogue name, or "" for a user's config (written to disk)
    tp: int
    weight_dtype: str
    profile: CostProfile
    profile_source: str             # "built-in <instance>" or the JSON path
    kv_cap_fraction: float
    max_model_len: int
    kv: dict[str, Any]              # the KV cache for max_model_len (static or paged)
    kv_reserve: str = DEFAULT_KV_RESERVE   # the scheduler's KV admission rule
    runtime: Runtime = get_runtime(None)   # what the device compiles (runtime.py)
    max_num_seqs: int | None = None        # the static cache's slots (nxdi)

    @classmethod
    def resolve(cls, settings: SimSettings, max_model_len: int,
                kv_reserve: str = DEFAULT_KV_RESERVE, *,
                max_num_seqs: int | None = None) -> SimTarget:
        """Resolve and check `settings`: SimError / CapacityError / FileNotFoundError (all
        ValueErrors but the last) with a message that says what would work.

        Under a static-KV runtime (nxdi) the cache is `max_num_seqs` slots of max_model_len
        (None: as many as fit, for planning) and a layout that does not fit is a
        CapacityError. Under the paged one (vllm-neuron) a KV cache too small for one
        max_model_len request is an error under kv_reserve=max_model_len and a warning under
        kv_reserve=request (shorter requests run)."""
        inst = get_instance(settings.instance)
        runtime = get_runtime(settings.runtime, family=inst.family)
        tp = validate_tp(inst, settings.tp_degree if settings.tp_degree is not None
                         else default_tp(inst))
        arch = resolve_architecture(settings.arch)
        # A catalogue name travels as the name; a user's config travels as the config.json
        # that engine_kwargs writes into the model directory.
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
        _check_context(arch, max_model_len)
        kv_reserve = parse_kv_reserve(kv_reserve)
        if runtime.static_kv:
            kv = static_kv_capacity(inst.name, arch, tp, settings.weight_dtype, max_model_len,
                                    max_num_seqs, NEURON_BLOCK_SIZE)
        else:
            kv = checked_kv_capacity(inst.name, arch, tp, settings.weight_dtype, max_model_len,
                                     NEURON_BLOCK_SIZE, float(settings.kv_cap_fraction),
                                     kv_reserve)
        return cls(settings, inst.name, arch, arch_spec, tp, settings.weight_dtype, profile,
                   source, float(settings.kv_cap_fraction), max_model_len, kv, kv_reserve,
                   runtime, max_num_seqs)

    @property
    def pool_blocks(self) -> int:
        """Blocks of vLLM's KV pool on this device. A static cache holds its slots plus the
        null block vLLM's pool keeps back (as the NxDI plugin 0.2.0 adds it), so every slot
        can reach max_model_len and KV never limits admission."""
        blocks = int(self.kv["num_blocks"])
        return blocks + 1 if self.runtime.static_kv else blocks

    def executor_settings(self, arch_spec: str | None = None) -> dict[str, Any]:
        """What the executor reads from `additional_config["neuron_batch"]["sim"]`."""
        return {"instance": self.instance, "tp": self.tp, "weight_dtype": self.weight_dtype,
                "arch": arch_spec if arch_spec is not None else self.arch_spec,
                "profile": self.profile_source, "profile_params": self.profile.to_dict(),
                "kv_cap_fraction": self.kv_cap_fraction, "runtime": self.runtime.name,
                "num_blocks": self.pool_blocks}

    def engine_kwargs(self, *, max_num_seqs: int, max_num_batched_tokens: int,
                      workdir: Path) -> dict[str, Any]:
        """Keyword arguments for `vllm.LLM(...)` that run this simulated device.

        `additional_config` is a fresh dict: merge your own entries into it, and into its
        "neuron_batch" dict (do not replace that one: it holds the clock and the executor's
        "sim" settings). `enable_prefix_caching=False` (the harness' and scheduler tests'
        setting) and `scheduler_cls` = NeuronScheduler may be overridden.
        """
        model_dir = _write_model_dir(self.settings.arch, self.arch, Path(workdir))
        arch_spec = self.arch_spec or str(model_dir / "config.json")
        executor = self.executor_settings(arch_spec)
        if self.runtime.static_kv:
            # One static slot of max_model_len per sequence (refused here if they do not fit),
            # whole prompts one a step: vLLM must neither chunk nor hold back a long prompt.
            kv = static_kv_capacity(self.instance, self.arch, self.tp, self.weight_dtype,
                                    self.max_model_len, max_num_seqs, NEURON_BLOCK_SIZE)
            executor["num_blocks"] = int(kv["num_blocks"]) + 1
        runtime_kwargs = self.runtime.engine_limits(
            max_model_len=self.max_model_len, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens)
        # Deterministic request ids (see _REQUEST_ID_ENV); vLLM caches its environment once an
        # engine has started, so drop that cache for the next engine to read the setting.
        if os.environ.get(_REQUEST_ID_ENV) != "1":
            os.environ[_REQUEST_ID_ENV] = "1"
            _drop_vllm_env_cache()
        return {
            "model": str(model_dir),
            "skip_tokenizer_init": True,
            "load_format": "dummy",
            # By name: vLLM imports it in the engine core (and this module stays free of the
            # executor, which imports it).
            "distributed_executor_backend": SIM_EXECUTOR,
            "scheduler_cls": SCHEDULER_CLS,
            "block_size": NEURON_BLOCK_SIZE,
            "enforce_eager": True,
            "enable_prefix_caching": False,
            "max_model_len": self.max_model_len,
            "max_num_seqs": max_num_seqs,
            **runtime_kwargs,
            "seed": 0,
            "additional_config": {"neuron_batch": {
                "clock": VIRTUAL_CLOCK, SIM_KEY: executor, "kv_reserve": self.kv_reserve,
                "runtime": self.runtime.name}},
        }

    def describe(self, *, num_prefill_buckets: int, num_decode_buckets: int,
                 num_graphs: int | None = None, compiled: bool = False) -> dict[str, Any]:
        """The simulated device in numbers, for the report (`num_graphs`: the runtime's own
        count, `Shapes.num_graphs`; default prefill + decode buckets; `compiled`: the graphs
        were compiled before, so the start-up is their load only)."""
        kv = self.kv
        blocks_per_seq = -(-self.max_model_len // NEURON_BLOCK_SIZE)
        compile_ = compile_footprint(num_prefill_buckets, num_decode_buckets, self.arch,
                                     self.weight_dtype, tp=self.tp, profile=self.profile,
                                     num_graphs=num_graphs, instance=self.instance,
                                     runtime=self.runtime, compiled=compiled)
        return {
            "instance": self.instance,
            "tp_degree": self.tp,
            "neuron_cores": get_instance(self.instance).num_cores,
            "weight_dtype": self.weight_dtype,
            "arch": self.arch.name,
            "params": self.arch.num_params,
            "weight_bytes": self.arch.weight_bytes(self.weight_dtype),
            "runtime": self.runtime.name,
            "kv_cache": {
                "layout": "static" if self.runtime.static_kv else "paged",
                "num_blocks": kv["num_blocks"],
                "block_size": NEURON_BLOCK_SIZE,
                "tokens": kv["tokens"],
                "bytes": kv["bytes"],
                "max_concurrent_at_max_model_len": kv["max_concurrent_at_max_len"],
                # what NeuronScheduler admits: vLLM keeps one block back as its null block
                "scheduler_max_concurrent": (self.pool_blocks - 1) // blocks_per_seq,
                "max_model_len": self.max_model_len,
                "cap_fraction": None if self.runtime.static_kv else self.kv_cap_fraction,
                "limited_by": kv["limited_by"],
                "derivation": kv["derivation"],
            },
            "compile": {
                "graphs": compile_["graphs"],
                "prefill_graphs": num_prefill_buckets,
                "decode_graphs": num_decode_buckets,
                "estimated_compile_s": compile_["estimated_compile_s"],
                "compiled": compiled,
                "startup": compile_["startup"],
                "host_warning": compile_["host_warning"],
            },
            "profile": {"name": self.profile.instance, "source": self.profile_source,
                        "calibrated": get_instance(self.profile.instance).calibrated
                        if self.profile.instance in INSTANCES else True,
                        "params": self.profile.to_dict()},
        }


def sim_engine_kwargs(settings: SimSettings, *, max_model_len: int, max_num_seqs: int,
                      max_num_batched_tokens: int, workdir: Path,
                      kv_reserve: str = DEFAULT_KV_RESERVE) -> dict[str, Any]:
    """`SimTarget.resolve(settings, max_model_len, kv_reserve).engine_kwargs(...)`, for scripts
    and tests that build their own `vllm.LLM`."""
    return SimTarget.resolve(settings, max_model_len, kv_reserve).engine_kwargs(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        workdir=workdir)


def describe_sim(settings: SimSettings, *, max_model_len: int, num_prefill_buckets: int,
                 num_decode_buckets: int, kv_reserve: str = DEFAULT_KV_RESERVE) -> dict[str, Any]:
    """`SimTarget.resolve(settings, max_model_len, kv_reserve).describe(...)`."""
    return SimTarget.resolve(settings, max_model_len, kv_reserve).describe(
        num_prefill_buckets=num_prefill_buckets, num_decode_buckets=num_decode_buckets)


def _is_catalogue_name(spec: Any) -> bool:
    if not isinstance(spec, str):
        return False
    path = Path(spec)
    return not (path.suffix == ".json" or (path.is_dir() and (path / "config.json").exists()))


def _check_context(arch: Architecture, max_model_len: int) -> None:
    if max_model_len <= arch.max_position_embeddings:
        return
    longer = [a.name for a in ARCHITECTURES.values()
              if a.max_position_embeddings >= max_model_len and _same_shape(a, arch)]
    hint = f" ({', '.join(longer)} has the same shapes)" if longer else ""
    raise SimError(
        f"max_model_len {max_model_len} exceeds {arch.name}'s context of "
        f"{arch.max_position_embeddings} tokens; lower it or choose a model with a "
        f"longer context{hint}")


def checked_kv_capacity(instance: str, arch: Architecture, tp: int, weight_dtype: str,
                        max_model_len: int, block_size: int, cap_fraction: float,
                        kv_reserve: str = DEFAULT_KV_RESERVE,
                        warn: bool = True) -> dict[str, Any]:
    """kv_capacity(...), or CapacityError (naming instance and TP) when the weights do not fit
    or, under kv_reserve=max_model_len, when the KV cache cannot hold one request of
    max_model_len (under kv_reserve=request that is a warning: shorter requests run)."""
    kv = kv_capacity(instance, arch, tp, weight_dtype, max_model_len=max_model_len,
                     block_size=block_size, cap_fraction=cap_fraction)
    blocks_per_seq = -(-max_model_len // block_size)
    usable = max(kv["num_blocks"] - 1, 0)       # vLLM's block pool keeps one null block
    if usable < blocks_per_seq:
        where = f"{arch.name} {weight_dtype} on TP {tp} on {instance}: "
        if parse_kv_reserve(kv_reserve) == MAX_MODEL_LEN:
            raise CapacityError(where + kv_too_small_message(usable, block_size, max_model_len))
        if warn:
            logger.warning("%s", where + small_cache_warning(usable, block_size, max_model_len))
    return kv


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
