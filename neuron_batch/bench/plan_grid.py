"""The candidates `neuron-batch plan` weighs: every instance x tensor-parallel degree that holds
the model, replicas filling the instance's cores, 1..N instances, every max_num_seqs, with the
prefill buckets the exact optimiser picks and one decode bucket; each with its lower bounds on
time and cost. Pure Python (device/ and bench/ only, no vLLM): the whole grid is built and
bounded in about a second, before anything is simulated.

Choices made here, and why:
- Replicas per instance = cores // TP: idle cores earn nothing, and replicas are independent.
- One replica is simulated on its share of the requests: the first ceil(n / replicas) of the
  workload in a seeded random order (what `run --shuffle --seed S --limit N` reads), which is
  the largest share, so the slowest replica; the layout takes that replica's time.
- Prefill buckets: the exact optimiser's best set of k buckets for the workload's chunks,
  priced by the cost model, for the k in 1..K that minimises compile time + one replica's
  prefill time (with `--compiled` compile time is free, so k = K).
- Decode: one bucket, max_num_seqs. In a batch job every request is queued at once, so decode
  batches stay full until the last requests drain, a decode step is bound by reading the
  weights (padding a batch costs little), and every extra graph costs minutes of compiling.
- Compile time: the graphs of one replica, compiled once before the run on every instance in
  parallel (billed on all of them).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from neuron_batch.bench.optimiser import plans_for_each_k, prefill_chunk_lengths
from neuron_batch.bench.plan_bounds import (
    KV_RESERVE_MAX_MODEL_LEN,
    ShareStats,
    replica_bound,
)
from neuron_batch.device.architectures import resolve_architecture
from neuron_batch.device.cost_model import StepCostModel, compile_footprint
from neuron_batch.device.hardware import HardwareError, get_instance, valid_tp_degrees
from neuron_batch.device.target import NEURON_BLOCK_SIZE, SimSettings, SimTarget
from neuron_batch.report.cost import Price, PricingError, price_for, usd
from neuron_batch.scheduler.kv_reserve import blocks_for_tokens, reachable_tokens

DEFAULT_INSTANCES = ("inf2.xlarge", "inf2.8xlarge", "inf2.24xlarge", "inf2.48xlarge",
                     "trn1.32xlarge")
DEFAULT_SEQS = (8, 16, 32, 64)
DEFAULT_MAX_NUM_INSTANCES = 4
DEFAULT_MAX_PREFILL_BUCKETS = 4


class PlanError(ValueError):
    """A plan that cannot start (bad instance names, a model that fits nowhere); the message
    says what would work."""


@dataclass(frozen=True)
class PlanSpec:
    """What the user asked to plan over."""

    architecture: str
    instances: tuple[str, ...] = DEFAULT_INSTANCES
    max_num_instances: int = DEFAULT_MAX_NUM_INSTANCES
    seqs_values: tuple[int, ...] = DEFAULT_SEQS
    max_prefill_buckets: int = DEFAULT_MAX_PREFILL_BUCKETS
    compiled: bool = False
    weight_dtype: str = "bf16"
    cost_profile: str | None = None
    max_model_len: int = 2048
    max_num_batched_tokens: int = 2048
    kv_reserve: str = KV_RESERVE_MAX_MODEL_LEN
    pricing: str = "on-demand"
    prices: dict[str, float] = field(default_factory=dict)   # instance -> USD/h overrides


@dataclass(frozen=True)
class Placement:
    """One instance type at one TP degree that holds the model."""

    instance: str
    tp: int
    replicas: int               # per instance: cores // tp
    target: SimTarget
    model: StepCostModel
    price: Price

    @property
    def num_blocks(self) -> int:
        return int(self.target.kv["num_blocks"])

    def hardware_key(self) -> tuple:
        """What the simulated device's timing and KV size depend on besides the settings: two
        placements with equal keys simulate identically (inf2.xlarge and inf2.8xlarge have the
        same chip; inf2.24xlarge and inf2.48xlarge the same chips and links)."""
        inst = get_instance(self.instance)
        profile = {k: v for k, v in self.target.profile.to_dict().items()
                   if k not in ("instance", "source")}
        return (inst.family, inst.hbm_bytes_per_core, inst.hbm_bytes_s_per_core,
                inst.flops_per_core, inst.collective_bytes_s(self.tp), inst.link_gib_s,
                self.tp, self.num_blocks, tuple(sorted(profile.items())))


@dataclass
class Option:
    """One candidate layout and configuration, with its bounds; results are filled in later."""

    name: str
    placement: Placement
    num_instances: int
    max_num_seqs: int
    prefill_buckets: tuple[int, ...]
    decode_buckets: tuple[int, ...]
    compile_s: float
    share_size: int
    bound_s: float              # lower bound on one replica's run time (seconds)
    bound_steps: int
    share_output_tokens: int
    sim_key: tuple
    skip_reason: str | None = None      # set when another option provably does as well
    pruned_by: str | None = None        # the best option when this one was pruned
    result: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def instance(self) -> str:
        return self.placement.instance

    @property
    def replicas(self) -> int:
        return self.placement.replicas

    @property
    def tp(self) -> int:
        return self.placement.tp

    @property
    def total_replicas(self) -> int:
        return self.placement.replicas * self.num_instances

    def hours_for(self, replica_s: float) -> float:
        return (self.compile_s + replica_s) / 3600.0

    def usd_for(self, replica_s: float) -> float:
        return usd(self.hours_for(replica_s), self.placement.price, self.num_instances)

    @property
    def hours_bound(self) -> float:
        return self.hours_for(self.bound_s)

    @property
    def usd_bound(self) -> float:
        return self.usd_for(self.bound_s)


def check_instances(names: Sequence[str]) -> tuple[str, ...]:
    """Known, simulated instance names (lower case, no repeats), or PlanError naming them."""
    out: list[str] = []
    for name in names:
        try:
            key = get_instance(name).name
        except HardwareError:
            raise PlanError(f"--instances: unknown or unsimulated instance {name!r}; choose "
                            f"from {', '.join(DEFAULT_INSTANCES)}") from None
        if key not in out:
            out.append(key)
    if not out:
        raise PlanError(f"--instances is empty; choose from {', '.join(DEFAULT_INSTANCES)}")
    return tuple(out)


def placements(spec: PlanSpec) -> tuple[list[Placement], list[str]]:
    """Every (instance, TP) that holds the model with a usable KV cache, and why the others do
    not; PlanError when none does or an instance has no price."""
    found: list[Placement] = []
    excluded: list[str] = []
    try:
        arch = resolve_architecture(spec.architecture)
    except (ValueError, FileNotFoundError) as error:
        raise PlanError(str(error)) from None
    if spec.max_model_len > arch.max_position_embeddings:
        raise PlanError(f"--max-model-len {spec.max_model_len} exceeds {arch.name}'s context "
                        f"of {arch.max_position_embeddings} tokens")
    for name in check_instances(spec.instances):
        try:
            price = price_for(name, spec.pricing, spec.prices.get(name))
        except PricingError as error:
            raise PlanError(str(error)) from None
        cores = get_instance(name).num_cores
        for tp in valid_tp_degrees(name):
            settings = SimSettings(instance=name, arch=spec.architecture, tp_degree=tp,
                                   weight_dtype=spec.weight_dtype, profile=spec.cost_profile)
            try:
                target = SimTarget.resolve(settings, spec.max_model_len, spec.kv_reserve)
            except FileNotFoundError as error:     # --cost-profile
                raise PlanError(str(error)) from None
            except ValueError as error:             # weights or KV cache do not fit
                excluded.append(f"{name} TP {tp}: {error}")
                continue
            model = StepCostModel(target.profile, name, target.arch, tp,
                                  weight_dtype=spec.weight_dtype)
            found.append(Placement(name, tp, cores // tp, target, model, price))
    if not found:
        reasons = "; ".join(excluded[-3:])
        raise PlanError(f"{spec.architecture} ({spec.weight_dtype}) at max_model_len "
                        f"{spec.max_model_len} fits none of the candidates "
                        f"({', '.join(spec.instances)}): {reasons}. Try larger instances in "
                        f"--instances, a smaller --max-model-len or --weight-dtype int8")
    return found, excluded


def share_size(num_requests: int, total_replicas: int) -> int:
    """Requests of the largest share when `num_requests` are split over the replicas."""
    return math.ceil(num_requests / total_replicas)


class BucketChooser:
    """The optimiser's prefill sets for 1..K buckets per placement, priced by its cost model,
    and the k worth its compile time for a given number of replicas."""

    def __init__(self, prompt_lens: Sequence[int], spec: PlanSpec):
        self.spec = spec
        self.chunks = prefill_chunk_lengths(prompt_lens, spec.max_num_batched_tokens,
                                            spec.max_model_len)
        self.maximum = min(spec.max_num_batched_tokens, spec.max_model_len)
        self._plans: dict[tuple, list] = {}

    def plans(self, placement: Placement) -> list:
        key = placement.hardware_key()
        if key not in self._plans:
            self._plans[key] = plans_for_each_k(self.chunks, self.spec.max_prefill_buckets,
                                                self.maximum, cost=placement.model.prefill_time)
        return self._plans[key]

    def choose(self, placement: Placement, total_replicas: int, num_decode: int
               ) -> tuple[tuple[int, ...], float]:
        """(prefill buckets, compile seconds) minimising compile + one replica's prefill."""
        best = None
        for plan in self.plans(placement):
            compile_s = self.compile_s(placement, len(plan.buckets), num_decode)
            score = (0.0 if self.spec.compiled else compile_s) + plan.cost / total_replicas
            if best is None or score < best[0] - 1e-9:
                best = (score, tuple(plan.buckets), compile_s)
        return best[1], (0.0 if self.spec.compiled else best[2])

    def compile_s(self, placement: Placement, num_prefill: int, num_decode: int) -> float:
        return float(compile_footprint(num_prefill, num_decode, placement.target.arch,
                                       self.spec.weight_dtype, tp=placement.tp,
                                       profile=placement.target.profile)["estimated_compile_s"])


def build_options(spec: PlanSpec, placements_: Sequence[Placement], prompt_lens: Sequence[int],
                  output_lens: Sequence[int], *, seed: int,
                  progress: Callable[[str], None] = lambda m: None) -> list[Option]:
    """Every option of the grid with its bounds, in the workload's (shuffled) order: the share
    of T replicas is the first ceil(n / T) requests."""
    chooser = BucketChooser(prompt_lens, spec)
    stats_by_size: dict[int, ShareStats] = {}
    options: list[Option] = []
    # the largest KV reservation of any request (kv_reserve=request admits it only if it fits)
    whole_cache = ((NEURON_BLOCK_SIZE, -(-spec.max_model_len // NEURON_BLOCK_SIZE)),)
    most_blocks = max((blocks_for_tokens(reachable_tokens(p, o, spec.max_model_len), whole_cache)
                       for p, o in zip(prompt_lens, output_lens)), default=0)
    for placement in placements_:
        too_small = None
        if spec.kv_reserve != KV_RESERVE_MAX_MODEL_LEN and most_blocks > placement.num_blocks - 1:
            too_small = (f"the KV cache ({placement.num_blocks - 1} usable blocks) cannot hold "
                         f"the longest request ({most_blocks} blocks)")
        for num_instances in range(1, spec.max_num_instances + 1):
            total = placement.replicas * num_instances
            size = share_size(len(prompt_lens), total)
            if size not in stats_by_size:
                stats_by_size[size] = ShareStats.of(
                    prompt_lens[:size], output_lens[:size],
                    max_num_batched_tokens=spec.max_num_batched_tokens,
                    max_model_len=spec.max_model_len, block_size=NEURON_BLOCK_SIZE)
            stats = stats_by_size[size]
            prefill, compile_s = chooser.choose(placement, total, num_decode=1)
            for seqs in spec.seqs_values:
                bound = replica_bound(placement.model, stats, prefill_buckets=prefill,
                                      max_num_seqs=seqs, num_blocks=placement.num_blocks,
                                      block_size=NEURON_BLOCK_SIZE,
                                      max_model_len=spec.max_model_len,
                                      kv_reserve=spec.kv_reserve)
                name = option_name(placement.instance, num_instances, placement.replicas,
                                   placement.tp, seqs)
                sim_key = (placement.hardware_key(), seqs, prefill, (seqs,), size, seed,
                           spec.kv_reserve)
                options.append(Option(name, placement, num_instances, seqs, prefill, (seqs,),
                                      compile_s, size, bound.seconds, bound.steps,
                                      stats.output_tokens, sim_key, skip_reason=too_small))
    mark_same_schedule(options, spec)
    progress(f"{len(options)} options bounded")
    return options


def option_name(instance: str, num_instances: int, replicas: int, tp: int, seqs: int) -> str:
    return f"{num_instances}x {instance} {replicas}xTP{tp} S{seqs}"


def mark_same_schedule(options: list[Option], spec: PlanSpec) -> None:
    """With max_model_len reservations a replica runs at most `fit` requests at once, so every
    max_num_seqs >= fit gives the same schedule and only the smallest of them pads decode
    steps least (the same graphs, so the same compile time): skip the others."""
    if spec.kv_reserve != KV_RESERVE_MAX_MODEL_LEN:
        return
    blocks_per_seq = -(-spec.max_model_len // NEURON_BLOCK_SIZE)
    groups: dict[tuple, list[Option]] = {}
    for option in options:
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


def grid_counts(options: Sequence[Option]) -> Counter:
    return Counter(o.instance for o in options)
