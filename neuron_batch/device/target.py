"""The device a run targets, resolved once: `Target`.

`Target.resolve(...)` turns the user's choice (the `Instance` and `Runtime`, looked up where
their names enter; the architecture, TP degree, weight type, cost profile) into one frozen
object holding those objects and the `Architecture`, the cost profile and the step-time model
built from them, the layout (max_model_len, max_num_seqs) and its KV cache, after the checks
that can fail (weights that do not fit, a context longer than the model's, a KV cache too
small). The runner resolves it once per run, for the simulated device and for a Neuron host
whose instance is known alike (`simulated` tells them apart), and everything below takes the
object: the engine builder (`engine_kwargs`), the report (`describe`), a split's parts
(`with_layout`, `static_slots`), the replicas, and the executor in the engine-core process,
which rebuilds it from its one serialised form (`to_dict` / `from_dict`, in
`additional_config["neuron_batch"]["target"]`).

No vLLM import here (the executor class is named, not imported), so a bad setting fails in
milliseconds, before any engine starts.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from neuron_batch.device.architectures import Architecture, context_hint
from neuron_batch.device.compile_time import compile_footprint
from neuron_batch.device.cost_model import (
    WEIGHT_DTYPES,
    CapacityError,
    CostProfile,
    StepCostModel,
    kv_capacity,
    load_profile,
    tp_holding_one_request,
)
from neuron_batch.device.hardware import INSTANCES, Instance, get_instance, validate_tp
from neuron_batch.device.model_dir import architecture_of, write_model_dir
from neuron_batch.device.static_kv import static_kv_capacity, static_slots
from neuron_batch.runtimes.buckets import kv_too_small_message
from neuron_batch.runtimes.prefix_grid import grid_size
from neuron_batch.runtimes.runtime import Runtime, Shapes, default_runtime, runtime_of
from neuron_batch.scheduler import SCHEDULER_CLS
from neuron_batch.scheduler.kv_reserve import (
    DEFAULT_KV_RESERVE,
    MAX_MODEL_LEN,
    KvReserve,
    parse_kv_reserve,
    small_cache_warning,
)

logger = logging.getLogger(__name__)

#: KV block size of the Neuron plugin (neuron-facts.md).
NEURON_BLOCK_SIZE = 32
#: What the simulated device is when nothing is said (`--device sim` alone).
DEFAULT_INSTANCE = "inf2.8xlarge"
DEFAULT_ARCH = "llama-3-8b"
#: VLLM_NEURON_KV_GMU_BUDGET_CAP_FRACTION: the Beta plugin's cap on the paged KV cache.
DEFAULT_KV_CAP_FRACTION = 0.30
#: The clock to name in `additional_config["neuron_batch"]["clock"]`. The executor replaces it
#: with its own engine's clock when it starts; this name reads the last engine started.
VIRTUAL_CLOCK = "neuron_batch.device.virtual_clock:virtual_now"
#: The simulated device's vLLM executor, by dotted path.
SIM_EXECUTOR = "neuron_batch.device.executor.NeuronSimExecutor"
#: Key of the serialised target (`Target.to_dict`) inside `additional_config["neuron_batch"]`.
TARGET_KEY = "target"
#: vLLM appends 8 random characters to every request id unless this is set; the records carry
#: the ids, so the simulated path sets it (LLM's own ids "0", "1", ... are unique per engine).
_REQUEST_ID_ENV = "VLLM_DISABLE_REQUEST_ID_RANDOMIZATION"


class SimError(ValueError):
    """A device setting that cannot work; the message says what would."""


@dataclass(frozen=True)
class Target:
    """A Neuron device (simulated, or a host whose instance is known) resolved and checked
    for one layout. Build it with `resolve` (names) or `with_layout` (another layout of this
    one); nothing below looks a name up again."""

    instance: Instance
    arch: Architecture
    runtime: Runtime                # what the device compiles (runtimes/runtime.py)
    tp: int
    weight_dtype: str
    profile: CostProfile
    profile_source: str             # "built-in <instance>" or the JSON path
    kv_cap_fraction: float
    max_model_len: int
    max_num_seqs: int | None        # the static cache's slots (None: as many as fit, to plan)
    kv_reserve: KvReserve           # the scheduler's KV admission rule
    block_size: int                 # KV block: 32 simulated; a Neuron host's own layout
    kv: dict[str, Any]              # the KV cache of this layout (static or paged)
    cost_model: StepCostModel = field(repr=False, compare=False)
    arch_spec: str = ""             # catalogue name, or "" for a model's own config
    # The config.json a simulated model directory holds (the catalogue's, or the model's own):
    # what engine_kwargs writes and what a non-catalogue architecture travels as.
    model_config: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    simulated: bool = True          # False: a Neuron host's twin, for estimates only
    # vLLM's prefix cache over this pool; under nxdi the block layout (pa_num_blocks of 32)
    # in place of the contiguous slots: as many tokens, and the same pool of vLLM blocks.
    prefix_caching: bool = False

    @classmethod
    def resolve(cls, *, max_model_len: int, instance: Instance = INSTANCES[DEFAULT_INSTANCE],
                arch: str | Path | dict | Architecture = DEFAULT_ARCH, tp: int | None = None,
                weight_dtype: str = "bf16", profile: str | Path | CostProfile | None = None,
                profile_source: str | None = None,
                kv_cap_fraction: float = DEFAULT_KV_CAP_FRACTION,
                runtime: Runtime | None = None, max_num_seqs: int | None = None,
                kv_reserve: str = DEFAULT_KV_RESERVE, block_size: int = NEURON_BLOCK_SIZE,
                simulated: bool = True, warn: bool = True,
                prefix_caching: bool = False) -> Target:
        """The device, its layout checked: SimError / CapacityError / FileNotFoundError (all
        ValueErrors but the last) saying what would work. `arch`: a catalogue name, a
        config.json (path or directory), a config dict or an Architecture; `tp` None: every
        NeuronCore; `profile` None: the instance's built-in one; `runtime` None: its family's.

        Under a static-KV runtime (nxdi) the cache is `max_num_seqs` slots of max_model_len
        (None: as many as fit, for planning) and a layout that does not fit is a
        CapacityError. Under the paged one (vllm-neuron) a KV cache too small for one
        max_model_len request is an error under kv_reserve=max_model_len and a warning (when
        `warn` and simulated) under kv_reserve=request (shorter requests run)."""
        inst, runtime = instance, runtime or default_runtime(instance.family)
        tp = validate_tp(inst, tp if tp is not None else inst.num_cores)
        architecture, arch_spec, model_config = architecture_of(arch)
        cost_profile, source = _profile(profile, profile_source, inst)
        if weight_dtype not in WEIGHT_DTYPES:
            raise SimError(f"weight_dtype must be one of {list(WEIGHT_DTYPES)}, "
                           f"got {weight_dtype!r}")
        if not 0.0 < kv_cap_fraction <= 1.0:
            raise SimError(f"kv_cap_fraction must be in (0, 1], got {kv_cap_fraction}")
        model = StepCostModel(cost_profile, inst, architecture, tp, weight_dtype,
                              runtime=runtime, prefix_caching=prefix_caching)
        # The device without a layout yet: with_layout is the one place a layout is checked
        # and its KV cache sized, for this first one as for a split's parts.
        unsized = cls(inst, architecture, runtime, tp, weight_dtype, cost_profile, source,
                      float(kv_cap_fraction), 0, None, parse_kv_reserve(kv_reserve),
                      block_size, {}, model, arch_spec, model_config, simulated,
                      bool(prefix_caching))
        return unsized.with_layout(max_model_len, max_num_seqs, warn=warn)

    def with_layout(self, max_model_len: int, max_num_seqs: int | None, *,
                    warn: bool = True) -> Target:
        """This device at another layout (a split's part, the engine's own): checked and its
        KV cache sized for it; the device's objects and step-time model are kept."""
        _check_context(self.arch, max_model_len)
        where = (self.instance, self.arch, self.tp, self.weight_dtype, max_model_len)
        if self.runtime.static_kv:
            kv = static_kv_capacity(*where, max_num_seqs, self.block_size,
                                    runtime=self.runtime.name)
            if self.kv_layout == "block":
                # pa_num_blocks: vLLM's pool and null block (as the plugin) + 1 NxDI reserves
                blocks = kv["num_blocks"] + 1
                kv = {**kv, "layout": "block", "pa_num_blocks": blocks,
                      "derivation": kv["derivation"] + f"; block layout: pa_num_blocks "
                      f"{blocks} of {self.block_size} + 1 NxDI reserves"}
        else:
            kv = checked_kv_capacity(*where, self.block_size, self.kv_cap_fraction,
                                     self.kv_reserve, warn=warn and self.simulated)
        return replace(self, max_model_len=max_model_len, max_num_seqs=max_num_seqs, kv=kv)

    def static_slots(self, max_model_len: int) -> int | None:
        """Slots of `max_model_len` a static KV cache holds beside the weights (what a split's
        short layout takes); None under a paged cache, or when none fit."""
        if not self.runtime.static_kv:
            return None
        return static_slots(self.instance, self.arch, self.tp, self.weight_dtype,
                            max_model_len) or None

    @property
    def kv_layout(self) -> str:
        """"static" (NxDI's contiguous slots), "block" (NxDI's block layout, what its prefix
        caching needs: pa_num_blocks = the slots' blocks, plus one NxDI reserves) or "paged"."""
        if not self.runtime.static_kv:
            return "paged"
        return "block" if self.prefix_caching and self.runtime.prefix_grid else "static"

    @property
    def engines_per_instance(self) -> int:
        """Engines of this TP degree one instance holds."""
        return self.instance.num_cores // self.tp

    @property
    def pool_blocks(self) -> int:
        """Blocks of vLLM's KV pool on this device. A static cache holds its slots plus the
        null block vLLM's pool keeps back (as the NxDI plugin 0.2.0 adds it), so every slot
        can reach max_model_len and KV never limits admission."""
        blocks = int(self.kv["num_blocks"])
        return blocks + 1 if self.runtime.static_kv else blocks

    def compile_estimate(self, num_prefill_buckets: int, num_decode_buckets: int,
                         num_graphs: int | None = None, *, compiled: bool = False) -> dict:
        """`compile_footprint` of these bucket counts on this device (`compiled`: loaded only)."""
        return compile_footprint(num_prefill_buckets, num_decode_buckets, self.arch,
                                 self.weight_dtype, tp=self.tp, profile=self.profile,
                                 num_graphs=num_graphs, instance=self.instance,
                                 runtime=self.runtime, compiled=compiled)

    def compile_s(self, shapes: Shapes, compiled: bool = False) -> float | None:
        """Estimated start-up of the graphs of `shapes` (a layout of this runtime): tracing,
        compiling and loading them, or (`compiled`) loading only; None where the host's
        memory cannot compile them (device/compile_time.py)."""
        prefill = grid_size(shapes.prefill_buckets, shapes.prefix_buckets or (0,))  # (grid)
        return self.compile_estimate(prefill, len(shapes.decode_buckets), shapes.num_graphs,
                                     compiled=compiled)["estimated_compile_s"]

    # -- the one serialised form -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The target as JSON-able values: what `from_dict` rebuilds it from (the engine-core
        process does, from `additional_config`). `num_blocks` is what this side sized."""
        return {"instance": self.instance.name, "arch": self.arch_spec or self.model_config,
                "tp": self.tp, "weight_dtype": self.weight_dtype, "profile": self.profile_source,
                "profile_params": self.profile.to_dict(), "kv_cap_fraction": self.kv_cap_fraction,
                "runtime": self.runtime.name, "max_model_len": self.max_model_len,
                "max_num_seqs": self.max_num_seqs, "kv_reserve": self.kv_reserve,
                "block_size": self.block_size, "simulated": self.simulated,
                "prefix_caching": self.prefix_caching, "num_blocks": self.pool_blocks}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Target:
        """`to_dict`'s target again (its instance and runtime looked up by name), through
        `resolve` and its checks (a hand-edited dict fails as the up-front check would);
        RuntimeError when it sizes another KV pool than the one named."""
        given = {k: data[k] for k in ("arch", "tp", "weight_dtype", "kv_cap_fraction",
                                      "max_model_len", "max_num_seqs", "kv_reserve",
                                      "block_size", "simulated")}
        given["prefix_caching"] = bool(data.get("prefix_caching", False))
        target = cls.resolve(**given, instance=get_instance(data["instance"]),
                             runtime=runtime_of(data),
                             profile=CostProfile.from_dict(data["profile_params"]),
                             profile_source=data["profile"], warn=False)  # (said already)
        if data.get("num_blocks") is not None and int(data["num_blocks"]) != target.pool_blocks:
            raise RuntimeError(f"simulated Neuron device: settings name {data['num_blocks']} "
                               f"KV blocks, the device holds {target.pool_blocks}")
        return target

    # -- what uses it --------------------------------------------------------------------------
    def engine_kwargs(self, *, max_num_batched_tokens: int, workdir: Path) -> dict[str, Any]:
        """Keyword arguments for `vllm.LLM(...)` that run this simulated device at its layout.

        `additional_config` is a fresh dict: merge your own entries into it, and into its
        "neuron_batch" dict (do not replace that one: it holds the clock and the serialised
        target). `scheduler_cls` = NeuronScheduler may be overridden; `enable_prefix_caching`
        is the target's (the executor checks they agree).
        """
        if self.max_num_seqs is None:
            raise ValueError("an engine needs the target resolved with its max_num_seqs")
        model_dir = write_model_dir(self.model_config, self.arch, Path(workdir))
        # Under nxdi: whole prompts one a step, so vLLM neither chunks nor holds back one.
        runtime_kwargs = self.runtime.engine_limits(
            max_model_len=self.max_model_len, max_num_seqs=self.max_num_seqs,
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
            "block_size": self.block_size,
            "enforce_eager": True,
            "enable_prefix_caching": self.prefix_caching,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            **runtime_kwargs,
            "seed": 0,
            "additional_config": {"neuron_batch": {
                "clock": VIRTUAL_CLOCK, TARGET_KEY: self.to_dict(),
                "kv_reserve": self.kv_reserve.value, "runtime": self.runtime.name}},
        }

    def describe(self, *, num_prefill_buckets: int, num_decode_buckets: int,
                 num_graphs: int | None = None, compiled: bool = False) -> dict[str, Any]:
        """The simulated device in numbers, for the report (`num_graphs`: the runtime's own
        count, `Shapes.num_graphs`; default prefill + decode buckets; `compiled`: see above)."""
        kv = self.kv
        blocks_per_seq = -(-self.max_model_len // self.block_size)
        compile_ = self.compile_estimate(num_prefill_buckets, num_decode_buckets, num_graphs,
                                         compiled=compiled)
        calibrated = INSTANCES[self.profile.instance].calibrated \
            if self.profile.instance in INSTANCES else True     # (a profile of the user's)
        return {
            "instance": self.instance.name,
            "tp_degree": self.tp,
            "neuron_cores": self.instance.num_cores,
            "weight_dtype": self.weight_dtype,
            "arch": self.arch.name,
            "params": self.arch.num_params,
            "weight_bytes": self.arch.weight_bytes(self.weight_dtype),
            "runtime": self.runtime.name,
            "kv_cache": {
                "layout": self.kv_layout,
                "pa_num_blocks": kv.get("pa_num_blocks"),
                "num_blocks": kv["num_blocks"],
                "block_size": self.block_size,
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
                        "calibrated": calibrated, "params": self.profile.to_dict()},
        }


def sim_engine_kwargs(*, max_model_len: int, max_num_seqs: int, max_num_batched_tokens: int,
                      workdir: Path, **device: Any) -> dict[str, Any]:
    """`Target.resolve(**device, ...).engine_kwargs(...)`, for scripts and tests that build
    their own `vllm.LLM` (`device`: resolve's keywords, e.g. instance, arch, tp, runtime,
    kv_reserve)."""
    return Target.resolve(max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                          **device).engine_kwargs(
        max_num_batched_tokens=max_num_batched_tokens, workdir=workdir)


def describe_sim(*, max_model_len: int, num_prefill_buckets: int, num_decode_buckets: int,
                 **device: Any) -> dict[str, Any]:
    """`Target.resolve(**device, max_model_len=...).describe(...)`."""
    return Target.resolve(max_model_len=max_model_len, **device).describe(
        num_prefill_buckets=num_prefill_buckets, num_decode_buckets=num_decode_buckets)


def _profile(profile: str | Path | CostProfile | None, source: str | None,
             inst: Instance) -> tuple[CostProfile, str]:
    """The cost profile and where it comes from: given, the instance's built-in, or a file."""
    if isinstance(profile, CostProfile):
        return profile, source or f"given {profile.instance}"
    if profile is None:
        return load_profile(inst.name), f"built-in {inst.name}"
    loaded = load_profile(profile)
    if Path(str(profile)).is_file() and loaded.instance != inst.name:
        logger.warning("cost profile %s was made for %s, used here for %s",
                       profile, loaded.instance, inst.name)
    return loaded, str(profile)


def _check_context(arch: Architecture, max_model_len: int) -> None:
    if max_model_len <= arch.max_position_embeddings:
        return
    raise SimError(f"max_model_len {max_model_len} exceeds {arch.name}'s context of "
                   f"{arch.max_position_embeddings} tokens; "
                   + context_hint(arch, max_model_len))


def checked_kv_capacity(instance: Instance, arch: Architecture, tp: int, weight_dtype: str,
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
        where = f"{arch.name} {weight_dtype} on TP {tp} on {instance.name}: "
        if parse_kv_reserve(kv_reserve) == MAX_MODEL_LEN:
            bigger = tp_holding_one_request(instance, arch, tp, weight_dtype, max_model_len,
                                            block_size, cap_fraction)
            raise CapacityError(where + kv_too_small_message(usable, block_size, max_model_len)
                                + (f" On {instance.name}: --tensor-parallel-size {bigger} holds "
                                   f"one."
                                   if bigger else ""))
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
