"""The candidates `neuron-batch plan` weighs: every instance x tensor-parallel degree that holds
the model, replicas filling the instance's cores, 1..N instances, every max_num_seqs, with the
prefill buckets the exact optimiser picks and one decode bucket; each with its lower bounds on
time and cost. Pure Python (device/ and bench/ only, no vLLM): the whole grid is built and
bounded in seconds, before anything is simulated.

Choices made here, and why:
- Replicas per instance = cores // TP: idle cores earn nothing, and replicas are independent.
- One replica is simulated on its share of the requests: the first ceil(n / replicas) of the
  workload in a seeded random order (what `run --shuffle --seed S --limit N` reads), which is
  the largest share, so the slowest replica; the layout takes that replica's time.
- Prefill buckets: the exact optimiser's best set of k buckets for the workload's chunks,
  priced by the cost model, for the k in 1..K that minimises start-up + one replica's
  prefill time (with `--compiled` the start-up is a load whatever k, so k = K).
- Decode: one bucket, max_num_seqs. In a batch job every request is queued at once, so decode
  batches stay full until the last requests drain, a decode step is bound by reading the
  weights (padding a batch costs little), and every extra graph costs minutes of compiling.
- The runtime (runtimes/runtime.py) is each instance's own: nxdi on inf2/trn1 (whole prompts padded
  to context-encoding buckets, decode over every slot attending NxDI's default token-generation
  buckets, a static KV cache: a max_num_seqs whose slots do not fit is left out, never
  simulated), vllm-neuron on trn2 (the seed's buckets and paged KV). `--runtime` forces one.
- max_model_len: the one given and, when smaller, the tightest that holds every request
  (prompt + max_tokens, rounded up to a multiple of 128): under nxdi it frees static slots.
- Start-up (device/compile_time.py): the graphs of one replica, traced, compiled on the
  instance's host (its vCPUs compile the graphs past the first at once) and loaded, once
  before the run on every instance in parallel (billed on all of them); with `--compiled`
  only the load. An instance whose host memory cannot compile the model is left out unless
  `--compiled` (its graphs would come from a larger host).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from neuron_batch.choices import KvReserve
from neuron_batch.device.architectures import resolve_architecture
from neuron_batch.device.compile_time import host_memory_warning
from neuron_batch.device.hardware import (
    INSTANCES,
    HardwareError,
    Instance,
    get_instance,
    valid_tp_degrees,
)
from neuron_batch.device.target import NEURON_BLOCK_SIZE, Target, context_hint
from neuron_batch.errors import did_you_mean
from neuron_batch.layout.bounds import ShareStats, replica_bound
from neuron_batch.plan.candidates import (
    DecodePart,
    InstanceFit,
    Option,
    PlanError,
    PlanSpec,
)
from neuron_batch.plan.option_buckets import BucketChooser
from neuron_batch.report.cost import (
    PricingError,
    has_builtin_price,
    price_for,
)
from neuron_batch.runtimes.buckets import round_model_len
from neuron_batch.runtimes.choice import simulated_runtime
from neuron_batch.scheduler.kv_reserve import blocks_for_tokens, reachable_tokens

#: How an instance left out for its host memory is said (plan/words.py names them again).
CANNOT_COMPILE = "compiling there is killed for want of host memory"


def check_instances(names: Sequence[str]) -> tuple[str, ...]:
    """Known, simulated instance names (lower case, no repeats), or PlanError naming them."""
    return tuple(inst.name for inst in _instances(names))


def _instances(names: Sequence[str]) -> list[Instance]:
    """The Instances of the names (no repeats), looked up once for the whole plan."""
    out: list[Instance] = []
    for name in names:
        try:
            inst = get_instance(name)
        except HardwareError:
            hint = did_you_mean(name.strip().lower(), INSTANCES) or ";"
            raise PlanError(f"--instances: unknown or unsimulated instance {name!r}{hint} "
                            f"choose from {', '.join(INSTANCES)}") from None
        if inst not in out:
            out.append(inst)
    if not out:
        raise PlanError(f"--instances is empty; choose from {', '.join(INSTANCES)}")
    return out


def model_len_candidates(spec: PlanSpec, prompt_lens: Sequence[int],
                         output_lens: Sequence[int]) -> tuple[int, ...]:
    """The max_model_len values to weigh: the one given and, when smaller, the tightest that
    holds every request (its prompt + max_tokens, rounded up to MODEL_LEN_STEP)."""
    longest = max((p + o for p, o in zip(prompt_lens, output_lens)), default=0)
    tight = round_model_len(longest)
    return tuple(sorted({spec.max_model_len, tight})) if 0 < tight < spec.max_model_len \
        else (spec.max_model_len,)


def placements(spec: PlanSpec) -> tuple[list[InstanceFit], list[str]]:
    """Every (instance, TP) that holds the model with a usable KV cache under its runtime, and
    why the others do not (an instance without a price among them); PlanError when none does."""
    found: list[InstanceFit] = []
    excluded: list[str] = []
    try:
        arch = resolve_architecture(spec.architecture)
    except (ValueError, FileNotFoundError) as error:
        raise PlanError(str(error)) from None
    if spec.max_model_len > arch.max_position_embeddings:
        raise PlanError(f"--max-model-len {spec.max_model_len} exceeds {arch.name}'s context "
                        f"of {arch.max_position_embeddings} tokens; "
                        + context_hint(arch, spec.max_model_len))
    for inst in _instances(spec.instances):
        name = inst.name
        override = spec.prices.get(name)
        if override is None and not has_builtin_price(name):
            # plan's own form: with several --instances a price names its instance
            excluded.append(f"{name}: no built-in price; give --price-per-hour {name}=USD")
            continue
        try:
            price = price_for(name, spec.pricing, override)
        except PricingError as error:
            raise PlanError(str(error)) from None
        runtimes = [simulated_runtime(r, inst.family) for r in spec.runtime_names]
        for runtime in runtimes:
            refused = runtime.not_shipped_for(name, inst.family)
            if refused:                             # no layout of it loads there
                excluded.append(f"{name}: {refused}")
        runtimes = [r for r in runtimes if not r.not_shipped_for(name, inst.family)]
        if not runtimes:
            continue
        cannot_compile = None if spec.compiled else host_memory_warning(inst, arch,
                                                                        spec.weight_dtype)
        if cannot_compile:                          # its compile would be killed: no estimate
            excluded.append(f"{name}: {cannot_compile.split(': compiling')[0]}: "
                            f"{CANNOT_COMPILE} (aws-neuron-sdk issue 1222); plan with "
                            f"--compiled to weigh it with graphs compiled on a larger host")
            continue
        for runtime, tp in ((r, t) for r in runtimes for t in valid_tp_degrees(inst)):
            try:
                # Static KV (nxdi): sized for as many slots as fit; options above that are
                # left out in build_options.
                target = Target.resolve(instance=inst, arch=arch, tp=tp,
                                        weight_dtype=spec.weight_dtype,
                                        profile=spec.cost_profile, runtime=runtime,
                                        max_model_len=spec.max_model_len,
                                        kv_reserve=spec.kv_reserve)
            except FileNotFoundError as error:     # --cost-profile
                raise PlanError(str(error)) from None
            except ValueError as error:             # weights or KV cache do not fit
                entry = f"{name} TP {tp} at max_model_len {spec.max_model_len}: {error}"
                if entry not in excluded:   # (once, not per runtime)
                    excluded.append(entry)
                continue
            found.append(InstanceFit(name, tp, target.engines_per_instance, target, price))
    if not found:
        reasons = "; ".join(excluded[-3:])
        # (the sizes hint only where a candidate was too small, not unpriced or refused)
        sizes = any(" TP " in reason.split(":", 1)[0] for reason in excluded)
        raise PlanError(f"{spec.architecture} ({spec.weight_dtype}) at max_model_len "
                        f"{spec.max_model_len} fits none of the candidates "
                        f"({', '.join(spec.instances)}): {reasons}"
                        + (". Try larger instances in --instances, a smaller --max-model-len "
                           "or --weight-dtype int8" if sizes else ""))
    return found, excluded


def share_size(num_requests: int, total_replicas: int) -> int:
    """Requests of the largest share when `num_requests` are split over the replicas."""
    return math.ceil(num_requests / total_replicas)


def build_options(spec: PlanSpec, placements_: Sequence[InstanceFit], prompt_lens: Sequence[int],
                  output_lens: Sequence[int], *, seed: int,
                  progress: Callable[[str], None] = lambda m: None,
                  excluded: list[str] | None = None) -> list[Option]:
    """Every option of the grid with its bounds, in the workload's (shuffled) order: the share
    of T replicas is the first ceil(n / T) requests. A max_num_seqs whose static KV cache does
    not load on a placement is not an option; why goes to `excluded`."""
    chooser = BucketChooser(prompt_lens, spec)
    stats_by_size: dict[tuple[Any, ...], ShareStats] = {}
    options: list[Option] = []
    for placement in placements_:
        mml = placement.max_model_len
        # the largest KV reservation of any request (kv_reserve=request admits it only if
        # it fits)
        whole_cache = ((NEURON_BLOCK_SIZE, -(-mml // NEURON_BLOCK_SIZE)),)
        most_blocks = max((blocks_for_tokens(reachable_tokens(p, o, mml), whole_cache)
                           for p, o in zip(prompt_lens, output_lens)), default=0)
        too_small = None
        if (not placement.runtime.static_kv and spec.kv_reserve != KvReserve.MAX_MODEL_LEN
                and most_blocks > placement.num_blocks - 1):
            too_small = (f"the KV cache ({placement.num_blocks - 1} usable blocks) cannot hold "
                         f"the longest request ({most_blocks} blocks)")
        seqs_values = list(spec.seqs_values)
        if placement.max_slots is not None:
            too_many = [s for s in seqs_values if s > placement.max_slots]
            if too_many and excluded is not None:
                # (what is left out in the name itself: the log lists the names alone)
                excluded.append(
                    f"{placement.instance} TP {placement.tp} at max_model_len {mml} "
                    f"(max_num_seqs {min(too_many)}{' and up' if len(too_many) > 1 else ''}): "
                    f"max_num_seqs {','.join(map(str, too_many))} cannot load under "
                    f"{placement.runtime.name} (its static KV cache holds at most "
                    f"{placement.max_slots} slots of {mml} tokens beside the weights); "
                    f"weighing {placement.max_slots} instead")
            # The most slots that load stand in for the values that do not.
            seqs_values = sorted({s for s in seqs_values if s <= placement.max_slots}
                                 | ({placement.max_slots} if too_many else set()))
        budget = chooser.limits(placement)[0]
        for num_instances in range(1, spec.max_num_instances + 1):
            total = placement.replicas * num_instances
            size = share_size(len(prompt_lens), total)
            key = (size, budget, mml)
            if key not in stats_by_size:
                stats_by_size[key] = ShareStats.of(
                    prompt_lens[:size], output_lens[:size], max_num_batched_tokens=budget,
                    max_model_len=mml, block_size=NEURON_BLOCK_SIZE)
            stats = stats_by_size[key]
            prefill, compile_s = chooser.choose(placement, total)
            for seqs in seqs_values:
                num_blocks = placement.pool_blocks(seqs)
                bound = replica_bound(placement.model, stats, prefill_buckets=prefill,
                                      max_num_seqs=seqs, num_blocks=num_blocks,
                                      block_size=NEURON_BLOCK_SIZE, max_model_len=mml,
                                      kv_reserve=spec.kv_reserve)
                name = option_name(placement.instance, num_instances, placement.replicas,
                                   placement.tp, seqs, mml if mml != spec.max_model_len
                                   else None, placement.runtime.name
                                   if len(spec.runtime_names) > 1 else None)
                sim_key = (placement.hardware_key(), seqs, prefill, (seqs,), size, seed,
                           spec.kv_reserve)
                part = DecodePart(None, False, seqs, placement.attention_buckets(),
                                  bound.decode_s, bound.decode_steps, stats.context_sum)
                options.append(Option(name, placement, num_instances, seqs, prefill, (seqs,),
                                      placement.attention_buckets(), compile_s, size,
                                      bound.seconds, bound.steps, stats.output_tokens,
                                      sim_key, skip_reason=too_small, decode_parts=(part,)))
    mark_same_schedule(options, spec)
    progress(f"{len(options)} options bounded")
    return options


def option_name(instance: str, num_instances: int, replicas: int, tp: int, seqs: int,
                max_model_len: int | None = None, runtime: str | None = None) -> str:
    """'2x inf2.8xlarge 1xTP2 S8', with ' L4224' when max_model_len is not the one given and
    the runtime's name when the plan weighs several ('... S8 optimum-neuron')."""
    return (f"{num_instances}x {instance} {replicas}xTP{tp} S{seqs}"
            + (f" L{max_model_len}" if max_model_len else "") + (f" {runtime}" if runtime else ""))


def mark_same_schedule(options: list[Option], spec: PlanSpec) -> None:
    """With max_model_len reservations a replica runs at most `fit` requests at once, so every
    max_num_seqs >= fit gives the same schedule and only the smallest of them pads decode
    steps least (the same graphs, so the same compile time): skip the others."""
    if spec.kv_reserve != KvReserve.MAX_MODEL_LEN:
        return
    blocks_per_seq = -(-spec.max_model_len // NEURON_BLOCK_SIZE)
    groups: dict[tuple[Any, ...], list[Option]] = {}
    for option in options:
        if option.runtime.static_kv or option.max_model_len != spec.max_model_len:
            continue     # static slots: max_num_seqs is what runs at once
        fit = (option.placement.num_blocks - 1) // blocks_per_seq
        if option.max_num_seqs >= fit:
            key = (option.instance, option.tp, option.num_instances, option.prefill_buckets)
            groups.setdefault(key, []).append(option)
    for group in groups.values():
        keep = min(group, key=lambda o: o.max_num_seqs)
        for option in group:
            if option is not keep:
                fit = (option.placement.num_blocks - 1) // blocks_per_seq
                option.skip_reason = (f"same schedule as {keep.name} (the KV cache holds only "
                                      f"{fit} requests at max_model_len), more decode padding")
