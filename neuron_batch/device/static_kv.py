"""NxDI's static KV cache: `max_num_seqs` slots of `max_model_len` tokens, allocated when the
model loads, beside the weights and the reserve for graphs and activations. A layout whose
slots do not fit does not load on the device, so it is refused here, before anything runs, with
what would fit instead.

The same HBM budget as the paged cache (cost_model.kv_capacity: the TP group's HBM less the
weights less RESERVE_FRACTION), but no budget cap (that is the Beta plugin's
VLLM_NEURON_KV_GMU_BUDGET_CAP_FRACTION) and whole slots of max_model_len. Example from
../shared/notes/neuron-runtimes.md: Llama-3.1-8B bf16 at 16384 on one inf2 chip holds 6 slots
with the reserve (8 without), not 32.
"""

from __future__ import annotations

from typing import Any

from neuron_batch.device.architectures import Architecture, dtype_bytes
from neuron_batch.device.cost_model import RESERVE_FRACTION, CapacityError, _fit_bytes
from neuron_batch.device.hardware import GIB, INSTANCES, Instance, valid_tp_degrees

#: The largest max_model_len suggested when saying what would fit (a whole number of these).
_LEN_STEP = 128


def kv_bytes_per_token(arch: Architecture, tp: int, kv_dtype: str = "bf16") -> int:
    """KV bytes of one token over the whole TP group (KV heads replicated when TP > heads)."""
    return (tp * 2 * arch.num_layers * arch.kv_heads_per_core(tp) * arch.head_dim
            * dtype_bytes(kv_dtype))


def static_slots(inst: Instance, arch: Architecture, tp: int, weight_dtype: str,
                 max_model_len: int, kv_dtype: str = "bf16") -> int:
    """How many slots of max_model_len fit beside the weights and reserve (0 if none, or if
    the weights alone do not fit)."""
    free = _fit_bytes(inst, tp, arch, weight_dtype)[2]
    per_slot = max_model_len * kv_bytes_per_token(arch, tp, kv_dtype)
    return max(free, 0) // per_slot


def static_kv_capacity(inst: Instance, arch: Architecture, tp: int, weight_dtype: str,
                       max_model_len: int, max_num_seqs: int | None, block_size: int,
                       kv_dtype: str = "bf16", runtime: str = "nxdi") -> dict[str, Any]:
    """The static cache of `max_num_seqs` slots (None: as many as fit), in the keys
    `kv_capacity` uses, plus `max_static_seqs` (slots that fit). CapacityError, naming the
    numbers, the `runtime` (nxdi, optimum-neuron: the same static cache) and what would fit,
    when the weights or the slots do not fit."""
    budget, reserve, free = _fit_bytes(inst, tp, arch, weight_dtype)
    weights = arch.weight_bytes(weight_dtype)
    per_token = kv_bytes_per_token(arch, tp, kv_dtype)
    fit = max(free, 0) // (max_model_len * per_token)
    if free <= 0 or fit < 1 or (max_num_seqs is not None and max_num_seqs > fit):
        raise CapacityError(_does_not_fit(inst, arch, tp, weight_dtype, max_model_len,
                                          max_num_seqs or 1, kv_dtype, runtime))
    slots = fit if max_num_seqs is None else max_num_seqs
    blocks_per_seq = -(-max_model_len // block_size)
    num_blocks = slots * blocks_per_seq
    tokens = slots * max_model_len
    return {
        "layout": "static", "num_blocks": num_blocks, "tokens": tokens,
        "bytes": tokens * per_token, "block_size": block_size, "bytes_per_token": per_token,
        "max_concurrent_at_max_len": slots, "max_static_seqs": fit,
        "budget_bytes": budget, "weight_bytes": weights, "reserve_bytes": reserve,
        "free_bytes": free, "cap_bytes": None, "limited_by": "max_num_seqs",
        "derivation": (f"HBM of {tp} cores {budget / GIB:.1f} GiB - {weight_dtype} weights "
                       f"{weights / GIB:.2f} GiB - reserve {reserve / GIB:.2f} GiB = "
                       f"{free / GIB:.2f} GiB free; static KV of {slots} slots x "
                       f"{max_model_len} tokens x {per_token} B = "
                       f"{tokens * per_token / GIB:.2f} GiB ({fit} slots fit)"),
    }


def _does_not_fit(inst: Instance, arch: Architecture, tp: int, weight_dtype: str,
                  max_model_len: int, max_num_seqs: int, kv_dtype: str, runtime: str) -> str:
    budget, reserve, free = _fit_bytes(inst, tp, arch, weight_dtype)
    weights = arch.weight_bytes(weight_dtype)
    per_token = kv_bytes_per_token(arch, tp, kv_dtype)
    need = max_num_seqs * max_model_len * per_token
    head = (f"{arch.name} {weight_dtype} on TP {tp} on {inst.name} cannot load under {runtime}: "
            f"its static KV cache of max_num_seqs {max_num_seqs} x max_model_len "
            f"{max_model_len:,} x {per_token:,} B = {need / GIB:.1f} GiB must fit beside "
            f"{weights / GIB:.2f} GiB of weights in {budget / GIB:.0f} GiB of HBM "
            f"({free / GIB:.2f} GiB left after the weights and the {RESERVE_FRACTION:.0%} "
            f"reserve, {reserve / GIB:.1f} GiB).")
    options = []
    fit = max(free, 0) // (max_model_len * per_token)
    if fit >= 1:
        options.append(f"--max-num-seqs {fit} at this max_model_len")
    longest = max(free, 0) // (max_num_seqs * per_token) // _LEN_STEP * _LEN_STEP
    if longest >= _LEN_STEP:
        options.append(f"--max-model-len {longest} at this max_num_seqs")
    holder = where_it_fits(arch, weight_dtype, max_model_len, max_num_seqs, kv_dtype,
                           prefer=inst)
    if holder:
        options.append(holder)
    what = "; or ".join(options) if options else "a smaller model or int8 weights"
    return f"{head} What fits: {what}."


def where_it_fits(arch: Architecture, weight_dtype: str, max_model_len: int, max_num_seqs: int,
                  kv_dtype: str = "bf16", prefer: Instance | None = None) -> str | None:
    """'--instance <instance> --tensor-parallel-size d' for the smallest TP group that holds
    the layout, on `prefer` first (then only the TP), then on the other instances in table
    order; None if none does."""
    for inst in ([prefer] if prefer else []) + [i for i in INSTANCES.values() if i != prefer]:
        for tp in valid_tp_degrees(inst):
            if static_slots(inst, arch, tp, weight_dtype, max_model_len, kv_dtype) \
                    >= max_num_seqs:
                # As typed on the command line, so the hint can be pasted back.
                flags = f"--tensor-parallel-size {tp}"
                return flags if inst == prefer else f"--instance {inst.name} {flags}"
    return None


def layout_that_fits(inst: Instance, arch: Architecture, tp: int, weight_dtype: str,
                     max_model_len: int, max_num_seqs: int, *, other_layouts: bool = True,
                     kv_dtype: str = "bf16") -> str | None:
    """The flags that, beside --max-model-len `max_model_len`, make a static KV layout load,
    as typed: "" when `max_num_seqs` slots fit on this TP group; "--max-num-seqs S" when only
    S do; else (`other_layouts`: the simulated device, whose TP and instance are settings) the
    smallest TP group, on this instance first, then its family's (the same runtime), that
    holds them all, or the first there that holds one slot, with its --max-num-seqs; only then
    the other families'. None when nothing holds a slot of that length."""
    slots = static_slots(inst, arch, tp, weight_dtype, max_model_len, kv_dtype)
    if slots >= max_num_seqs:
        return ""
    if slots >= 1:
        return f"--max-num-seqs {slots}"
    if not other_layouts:
        return None
    family = [inst, *(i for i in INSTANCES.values() if i != inst and i.family == inst.family)]
    for group in (family, [i for i in INSTANCES.values() if i.family != inst.family]):
        first_with_one = None
        for other in group:
            for degree in valid_tp_degrees(other):
                held = static_slots(other, arch, degree, weight_dtype, max_model_len, kv_dtype)
                flags = (f"--tensor-parallel-size {degree}" if other == inst
                         else f"--instance {other.name} --tensor-parallel-size {degree}")
                if held >= max_num_seqs:
                    return flags
                if held >= 1 and first_with_one is None:
                    first_with_one = f"{flags} --max-num-seqs {held}"
        if first_with_one is not None:
            return first_with_one
    return None
