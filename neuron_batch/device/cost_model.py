"""Step-time cost model of a Neuron instance, KV-cache sizing and compile-time estimate.

One scheduler step runs one compiled graph on a tensor-parallel group of `tp` NeuronCores.
Every core runs the same program on its shard, so a step takes what one core takes:

    decode(b, C)  = decode_fixed + collectives(b)
                    + max(W / bw_w + (C + 2 G) * kv_core / bw_kv,          HBM traffic
                          b * 2 * P_core / F + C * attn / F_attn)          engine work
    prefill(T, C) = prefill_fixed + collectives(T)
                    + max(W / bw_w + (C + T) * kv_core / bw_kv,
                          T * 2 * P_dec / F + 2 * P_head / F + T * (C + T / 2) * attn / F)

    P_core    weights one core holds: P_dec, its padded share of the q/o heads, the k/v
              projections of its KV heads (replicated when TP exceeds the KV heads) and 1/tp
              of the MLP (Architecture.decoder_params_per_core), plus P_head, 1/tp of lm_head
    W         bytes one core streams per step: decoder weights at their storage size (int8 /
              fp8 at `quantized_weight_bytes`, which counts dequantization) + lm_head in bf16
    kv_core   KV bytes per token on one core: 2 * layers * ceil(kv_heads / tp) * head_dim * 2
    attn      4 * layers * ceil(q_heads / tp) * head_dim: QK^T and AV FLOPs per query and key
    bw_w/kv   core peak HBM bandwidth * weight_bw_efficiency / kv_bw_efficiency
    F         core peak bf16 FLOP/s * compute_efficiency (matmuls with many rows)
    F_attn    core peak bf16 FLOP/s * attention_efficiency: decode attention is one query row
              per head against the cached keys, a matrix-vector product that keeps one row of
              the 128-row TensorEngine busy, so it runs at a small fraction of peak
    collectives(n) = 2 * layers * (collective_latency_s * ceil(log2 tp)
                                   + 2 (tp - 1) / tp * n * hidden * 2 bytes / link bandwidth)
              two all-reduces per layer (after attention, after the MLP): a latency per tree
              stage and the ring's bytes over NeuronLink (on-chip DMA while tp <= 2)

b is the *padded* decode batch and T the *padded* prefill chunk: a compiled graph does the
work of its bucket, so padding costs time. C is the KV the step's attention reads: a decode's
compiled shape (Runtime.decode_kv_tokens); a prefill's held KV, as its kernel reads it (NxDI's
prefix bucket under prefix caching, the Beta plugin's whole kv_segment_size segments).
G is the block KV a decode gathers into a flat layout before attending it (NxDI's block
layout with prefix caching on NeuronCore-v2: every padded slot's attended length, written and
read again, hence 2 G; 0 elsewhere). No published figure measures this gather on inf2/trn1.
HBM traffic and engine work overlap on a NeuronCore (DMA queues run beside the engines),
hence the max; fixed costs and collectives do not overlap with either.
The parameters are per NeuronCore-v2, shared by Inferentia2 and Trainium; the instance
table (hardware.py) supplies peaks, link bandwidths and core counts. CALIBRATION.md gives
the fitted values, their physical readings and the held-out error.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from neuron_batch.choices import WeightDtype

from .architectures import Architecture, dtype_bytes
from .compile_time import DEFAULT_COMPILE, CompileParams, CompileProfileError
from .hardware import (
    GIB,
    INSTANCES,
    Instance,
    valid_tp_degrees,
    validate_tp,
)

logger = logging.getLogger(__name__)

PROFILES_DIR = Path(__file__).with_name("profiles")
WEIGHT_DTYPES = WeightDtype.values()
#: Weight dtypes stored at one byte and dequantized on device (cost: quantized_weight_bytes).
QUANTIZED_DTYPES = (WeightDtype.FP8.value, WeightDtype.INT8.value)
#: Activation bytes per element exchanged by the all-reduces (bf16).
ACTIVATION_BYTES = 2
#: Share of the TP group's HBM kept for compiled graphs (NEFFs), activations and runtime
#: scratch. An assumption: AWS publishes no figure; 10% of 16 GiB is 1.6 GiB per core.
RESERVE_FRACTION = 0.10
#: VLLM_NEURON_KV_GMU_BUDGET_CAP_FRACTION default (neuron-facts.md).
DEFAULT_KV_CAP_FRACTION = 0.30
#: The compile rule before compile_time.py (30 s a graph a GB): older profiles', ignored.
LEGACY_COMPILE_FIELD = "compile_s_per_graph_per_gb"


@dataclass(slots=True)
class CostProfile:
    """Per-NeuronCore cost parameters (seconds, or fractions of the hardware's peak).

    The fields added after the first release have defaults, so profiles written by older
    versions (`neuron-batch calibrate`) still load."""

    instance: str
    # Per-step costs that do not scale with the work: graph launch, host<->device
    # synchronization, sampling. Prefill and decode graphs differ, so two values.
    prefill_fixed_s: float
    decode_fixed_s: float
    # Achieved fraction of peak HBM bandwidth streaming weights.
    weight_bw_efficiency: float
    # Achieved fraction of peak HBM bandwidth reading and writing the KV cache.
    kv_bw_efficiency: float
    # Achieved fraction of peak bf16 FLOP/s on matmuls with many rows (prefill, big batches).
    compute_efficiency: float
    # Latency of one stage of an all-reduce; one over tp cores takes ceil(log2 tp) stages and
    # each layer does two (after attention, after the MLP).
    collective_latency_s: float
    # Where the numbers come from (fit, derivation, or hand-set).
    source: str = ""
    # Achieved fraction of peak bf16 FLOP/s on decode attention (one query row per head).
    attention_efficiency: float = 0.002
    # HBM-equivalent bytes one int8/fp8 weight costs per step, dequantization included:
    # 1 = the storage size, 2 = as slow as bf16.
    quantized_weight_bytes: float = 1.0
    # The compile-time model's parameters (compile_time.py); None: the built-in fit.
    compile: CompileParams | None = None

    @property
    def compile_params(self) -> CompileParams:
        return self.compile or DEFAULT_COMPILE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostProfile:
        """From a profile's JSON object; ValueError naming a field that cannot be used (the
        `compile` section's as `compile.<field>`)."""
        data = {k: v for k, v in data.items() if k != LEGACY_COMPILE_FIELD}
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown cost-profile fields {sorted(unknown)}; "
                             f"expected {sorted(names)}")
        if data.get("compile") is not None:
            data["compile"] = CompileParams.from_dict(data["compile"])
        return cls(**data)

    def replace(self, **changes: Any) -> CostProfile:
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"unknown cost-profile fields {sorted(unknown)}")
        return dataclasses.replace(self, **changes)


def save_profile(profile: CostProfile, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile.to_dict(), indent=2) + "\n", encoding="utf-8")
    return path


def load_profile(source: str | Path) -> CostProfile:
    """Load a profile from a JSON file, or the built-in one for an instance name."""
    path = Path(source)
    if not path.is_file():
        name = str(source).strip().lower()
        if name not in INSTANCES:
            raise FileNotFoundError(f"no profile file {str(source)!r} and no built-in profile of "
                                    f"that name; built-in: {', '.join(INSTANCES)}")
        path = PROFILES_DIR / f"{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))     # (JSONDecodeError: a ValueError)
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object of parameters")
        profile = CostProfile.from_dict(data)
    except (CompileProfileError, TypeError, ValueError) as error:
        raise ValueError(f"cost profile {path}: {error}") from None
    if profile.compile is None:
        logger.warning("cost profile %s has no `compile` section%s: compile times use the "
                       "built-in fit (neuron_batch/device/CALIBRATION.md, \"Compile time\"); "
                       "add one, or refit with `neuron-batch calibrate`", path,
                       f" (its {LEGACY_COMPILE_FIELD} is no longer used)"
                       if LEGACY_COMPILE_FIELD in data else "")
    return profile


class StepCostModel:
    """Seconds per scheduler step for one (profile, instance, model, TP, dtype) setting.

    Everything that does not depend on the step's shape is folded into a few constants here,
    so `prefill_time` / `decode_time` cost about a microsecond of arithmetic.
    """

    def __init__(self, profile: CostProfile, instance: Instance,
                 arch: Architecture, tp_degree: int, weight_dtype: str = "bf16",
                 kv_dtype: str = "bf16", runtime: Any = None,
                 prefix_caching: bool = False) -> None:
        if weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"weight_dtype must be one of {WEIGHT_DTYPES}, got {weight_dtype!r}")
        self.profile = profile
        self.instance = inst = instance
        self.arch = arch
        self.tp = tp = validate_tp(inst, tp_degree)
        self.weight_dtype, self.kv_dtype = weight_dtype, kv_dtype
        # The runtime (runtime.Runtime) says how much KV a decode step's compiled shape reads;
        # without one, a decode reads what its requests hold.
        self.runtime = runtime
        self.gathers_block_kv = bool(runtime is not None and runtime.gathers_block_kv(
            prefix_caching, inst.core_generation))
        p = profile

        bw_weights = inst.hbm_bytes_s_per_core * p.weight_bw_efficiency
        bw_kv = inst.hbm_bytes_s_per_core * p.kv_bw_efficiency
        flops = inst.flops_per_core * p.compute_efficiency
        attn_flops = inst.flops_per_core * p.attention_efficiency
        decoder, head = arch.decoder_params_per_core(tp), arch.lm_head_params / tp
        layers = arch.num_layers

        # Weights each core streams per step: its shard of the decoder matmuls and lm_head.
        per_weight = (p.quantized_weight_bytes if weight_dtype in QUANTIZED_DTYPES
                      else dtype_bytes(weight_dtype))
        self.weight_read_bytes = decoder * per_weight + head * 2
        self._weights_s = self.weight_read_bytes / bw_weights
        self.kv_bytes_per_token_core = (2 * layers * arch.kv_heads_per_core(tp)
                                        * arch.head_dim * dtype_bytes(kv_dtype))
        self._kv_s_per_token = self.kv_bytes_per_token_core / bw_kv
        self._gather_s_per_token = 2 * self._kv_s_per_token     # written flat, read again
        # Matmul FLOPs: 2 per parameter per token. Decode runs lm_head for every sequence;
        # prefill only for each sequence's last token.
        self._decode_s_per_seq = 2 * (decoder + head) / flops
        self._prefill_s_per_token = 2 * decoder / flops
        self._prefill_head_s_per_seq = 2 * head / flops
        # Attention FLOPs per query per key: QK^T and AV over the core's (padded) q heads.
        per_key = 4 * layers * arch.q_heads_per_core(tp) * arch.head_dim
        self._attn_s = per_key / flops
        self._decode_attn_s = per_key / attn_flops
        # Collectives: two all-reduces per layer of n tokens * hidden activations.
        num_allreduce = 2 * layers if tp > 1 else 0
        stages = math.ceil(math.log2(tp)) if tp > 1 else 0
        self._collective_fixed_s = num_allreduce * p.collective_latency_s * stages
        ring_bytes_per_token = 2 * (tp - 1) / tp * arch.hidden_size * ACTIVATION_BYTES
        self._collective_s_per_token = (num_allreduce * ring_bytes_per_token
                                        / inst.collective_bytes_s(tp))
        self._prefill_base = p.prefill_fixed_s + self._collective_fixed_s
        self._decode_base = p.decode_fixed_s + self._collective_fixed_s

    def decode_time(self, padded_seqs: int, context_tokens: int, gathered: int = 0) -> float:
        """One decode step of `padded_seqs` sequences (the batch bucket) that together read
        `context_tokens` KV tokens, `gathered` of them first gathered from blocks
        (`gathered_tokens`)."""
        memory = (self._weights_s + self._kv_s_per_token * context_tokens
                  + self._gather_s_per_token * gathered)
        compute = (self._decode_s_per_seq * padded_seqs
                   + self._decode_attn_s * context_tokens)
        return (self._decode_base + self._collective_s_per_token * padded_seqs
                + (memory if memory > compute else compute))

    def prefill_time(self, padded_tokens: int, context_tokens: int = 0, num_seqs: int = 1) -> float:
        """One prefill step of `padded_tokens` (the bucket) after `context_tokens` of prior
        chunks. `num_seqs` > 1 splits the tokens into equal sequences prefilled together
        (static batching, as in AWS's published runs); the Neuron scheduler always uses 1."""
        per_seq = padded_tokens / num_seqs
        memory = self._weights_s + self._kv_s_per_token * (context_tokens + padded_tokens)
        compute = (self._prefill_s_per_token * padded_tokens
                   + self._prefill_head_s_per_seq * num_seqs
                   + self._attn_s * per_seq * (context_tokens + 0.5 * padded_tokens))
        return (self._prefill_base + self._collective_s_per_token * padded_tokens
                + (memory if memory > compute else compute))

    def gathered_tokens(self, padded_seqs: int, attended: int | None) -> int:
        """Block KV tokens a decode step gathers into a flat layout first: every padded slot's
        attended length where the device gathers (`gathers_block_kv`), else 0."""
        if not self.gathers_block_kv or attended is None:
            return 0
        return padded_seqs * attended

    def prefill_kv_read(self, held: int, prefix_bucket: int | None = None) -> int:
        """KV tokens a prefill's attention reads after `held` tokens: the grid cell's prefix
        bucket where there is one, else as the runtime's kernel reads them."""
        if prefix_bucket is not None:
            return prefix_bucket
        return held if self.runtime is None else self.runtime.prefill_kv_read(held)

    def decode_kv_tokens(self, padded_seqs: int, attended: int | None, held: int) -> int:
        """KV tokens a decode step reads: its compiled shape (padded slots x attended length)
        where the runtime's kernel reads it whole, else `held`, what its requests hold."""
        if attended is None or self.runtime is None:
            return held
        return self.runtime.decode_kv_tokens(padded_seqs, attended, held,
                                             head_dim=self.arch.head_dim, kv_dtype=self.kv_dtype)

    def step_time(self, record: Any) -> float:
        """Time of a StepRecord-like object (kind, num_tokens_padded, num_seqs_padded,
        context_tokens, attended_len); 0 for an empty step."""
        if record.kind == "prefill":
            return self.prefill_time(record.num_tokens_padded or record.num_tokens,
                                     self.prefill_kv_read(record.context_tokens, getattr(
                                         record, "prefix_bucket", None)))
        if record.kind == "decode":
            padded = record.num_seqs_padded or record.num_seqs
            attended = getattr(record, "attended_len", None)
            return self.decode_time(padded, self.decode_kv_tokens(
                padded, attended, record.context_tokens), self.gathered_tokens(padded, attended))
        return 0.0

    def breakdown(self, kind: str, padded: int, context_tokens: int) -> dict[str, float]:
        """The terms of one step's time (seconds), for reports and debugging: `memory` and
        `compute` overlap (the larger counts), the others add."""
        if kind == "prefill":
            memory = self._weights_s + self._kv_s_per_token * (context_tokens + padded)
            compute = (self._prefill_s_per_token * padded + self._prefill_head_s_per_seq
                       + self._attn_s * padded * (context_tokens + 0.5 * padded))
            fixed = self.profile.prefill_fixed_s
        else:
            memory = self._weights_s + self._kv_s_per_token * context_tokens
            compute = self._decode_s_per_seq * padded + self._decode_attn_s * context_tokens
            fixed = self.profile.decode_fixed_s
        collectives = self._collective_fixed_s + self._collective_s_per_token * padded
        return {"fixed": fixed, "collectives": collectives, "memory": memory,
                "compute": compute, "total": fixed + collectives + max(memory, compute)}


class CapacityError(ValueError):
    """The weights do not fit in the HBM of the cores in use; the message says what would."""


def _fit_bytes(inst: Instance, tp: int, arch: Architecture,
               weight_dtype: str) -> tuple[int, int, int]:
    """(HBM budget, reserve, free bytes after weights and reserve) of a TP group."""
    budget = tp * inst.hbm_bytes_per_core
    reserve = int(RESERVE_FRACTION * budget)
    return budget, reserve, budget - reserve - arch.weight_bytes(weight_dtype)


def _where_it_fits(arch: Architecture, weight_dtype: str) -> str:
    """The first instance and TP that hold the weights, as the flags a run takes."""
    for inst in INSTANCES.values():
        for tp in valid_tp_degrees(inst):
            if _fit_bytes(inst, tp, arch, weight_dtype)[2] > 0:
                return f"--instance {inst.name} --tensor-parallel-size {tp}"
    return "no single instance"


def kv_capacity(inst: Instance, arch: Architecture, tp_degree: int,
                weight_dtype: str = "bf16", max_model_len: int = 4096, block_size: int = 32,
                cap_fraction: float = DEFAULT_KV_CAP_FRACTION, max_num_seqs: int | None = None,
                kv_dtype: str = "bf16") -> dict[str, Any]:
    """KV-cache size for a TP group: the HBM of the cores in use, minus the weights, minus a
    reserve for graphs and activations, capped at `cap_fraction` of that HBM (the plugin's
    VLLM_NEURON_KV_GMU_BUDGET_CAP_FRACTION), and at what `max_num_seqs` sequences of
    `max_model_len` can use. Raises CapacityError when the weights do not fit."""
    tp = validate_tp(inst, tp_degree)
    budget, reserve, free = _fit_bytes(inst, tp, arch, weight_dtype)
    weights = arch.weight_bytes(weight_dtype)
    if free <= 0:
        others = [d for d in valid_tp_degrees(inst)
                  if _fit_bytes(inst, d, arch, weight_dtype)[2] > 0]
        here = (f"--tensor-parallel-size {others[0]}" if others
                else _where_it_fits(arch, weight_dtype))
        smaller = "" if weight_dtype != "bf16" else (
            f"; with int8 weights: {_where_it_fits(arch, 'int8')} --weight-dtype int8")
        raise CapacityError(
            f"{arch.name} {weight_dtype} weights ({weights / GIB:.1f} GiB) do not fit in TP {tp} "
            f"on {inst.name}: {budget / GIB:.0f} GiB of HBM, {(budget - reserve) / GIB:.1f} GiB "
            f"after the {RESERVE_FRACTION:.0%} reserve. It fits with {here}{smaller}.")
    # Bytes one token's KV takes over the whole group (GQA heads replicated when tp > kv_heads).
    per_token = (tp * 2 * arch.num_layers * arch.kv_heads_per_core(tp) * arch.head_dim
                 * dtype_bytes(kv_dtype))
    cap = int(cap_fraction * budget)
    usable, limited_by = (cap, "cap_fraction") if cap < free else (free, "free_memory")
    num_blocks = usable // per_token // block_size
    blocks_per_seq = -(-max_model_len // block_size)
    if max_num_seqs is not None and max_num_seqs * blocks_per_seq < num_blocks:
        num_blocks, limited_by = max_num_seqs * blocks_per_seq, "max_num_seqs"
    tokens = num_blocks * block_size
    return {
        "num_blocks": num_blocks, "tokens": tokens, "bytes": tokens * per_token,
        "block_size": block_size, "bytes_per_token": per_token,
        "max_concurrent_at_max_len": num_blocks // blocks_per_seq,
        "budget_bytes": budget, "weight_bytes": weights, "reserve_bytes": reserve,
        "free_bytes": free, "cap_bytes": cap, "limited_by": limited_by,
        "derivation": (f"HBM of {tp} cores {budget / GIB:.1f} GiB - {weight_dtype} weights "
                       f"{weights / GIB:.2f} GiB - reserve {reserve / GIB:.2f} GiB = "
                       f"{free / GIB:.2f} GiB free; cap {cap_fraction:g} x budget = "
                       f"{cap / GIB:.2f} GiB; limited by {limited_by}; {per_token} B/token "
                       f"-> {num_blocks} blocks of {block_size}"),
    }


def tp_holding_one_request(instance: Instance, arch: Architecture, tp: int, weight_dtype: str,
                           max_model_len: int, block_size: int,
                           cap_fraction: float) -> int | None:
    """The smallest TP above `tp` on `instance` whose paged KV cache holds one request of
    max_model_len (vLLM's null block left out), or None: what a too-small cache's error
    suggests."""
    for bigger in (d for d in valid_tp_degrees(instance) if d > tp):
        try:
            kv = kv_capacity(instance, arch, bigger, weight_dtype, max_model_len=max_model_len,
                             block_size=block_size, cap_fraction=cap_fraction)
        except CapacityError:
            continue
        if kv["num_blocks"] - 1 >= -(-max_model_len // block_size):
            return bigger
    return None
