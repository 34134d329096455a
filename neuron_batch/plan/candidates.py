"""The types `neuron-batch plan` weighs: what the user asked for (PlanSpec), an instance type at
one TP degree that holds the model (InstanceFit), a candidate layout with its bounds (Option) and
a split option's short layout (SplitLayout). Data only; grid.py builds them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from neuron_batch.choices import KvReserve, Order, Pricing, WeightDtype, normalise
from neuron_batch.device.cost_model import StepCostModel
from neuron_batch.device.target import NEURON_BLOCK_SIZE, Target
from neuron_batch.report.cost import Price, usd
from neuron_batch.runtimes.runtime import Runtime
from neuron_batch.settings import BY_NAME, RunSettings
from neuron_batch.settings.plan_options import plan_default

# (plan's own options are declared once, settings/plan_options.py: these are their defaults)
DEFAULT_INSTANCES: tuple[str, ...] = tuple(plan_default("instances").split(","))
DEFAULT_SEQS: tuple[int, ...] = tuple(int(n) for n in plan_default("seqs_values").split(","))
DEFAULT_MAX_NUM_INSTANCES: int = plan_default("max_num_instances")
DEFAULT_MAX_PREFILL_BUCKETS: int = plan_default("max_prefill_buckets")


class PlanError(ValueError):
    """A plan that cannot start (bad instance names, a model that fits nowhere); the message
    says what would work."""


@dataclass(frozen=True)
class PlanSpec:
    """What the user asked to plan over: the grid's own fields, and those of the run settings
    every option starts from (`from_settings`: each field named as a declared setting is that
    setting, its default the declared one)."""

    architecture: str
    instances: tuple[str, ...] = DEFAULT_INSTANCES
    max_num_instances: int = DEFAULT_MAX_NUM_INSTANCES
    seqs_values: tuple[int, ...] = DEFAULT_SEQS
    max_prefill_buckets: int = DEFAULT_MAX_PREFILL_BUCKETS
    compiled: bool = False
    weight_dtype: WeightDtype = BY_NAME["weight_dtype"].default
    cost_profile: str | None = BY_NAME["cost_profile"].default
    max_model_len: int = BY_NAME["max_model_len"].default
    max_num_batched_tokens: int = BY_NAME["max_num_batched_tokens"].default
    kv_reserve: KvReserve = BY_NAME["kv_reserve"].default
    pricing: Pricing = BY_NAME["pricing"].default
    prices: dict[str, float] = field(default_factory=dict)   # instance -> USD/h overrides
    #: None: each instance's own (nxdi inf2/trn1, vllm-neuron trn2)
    runtime: str | None = BY_NAME["runtime"].default
    #: Several runtimes weighed side by side on each instance that runs them (`--runtimes`,
    #: e.g. nxdi,optimum-neuron on inf2); empty: `runtime` alone.
    runtimes: tuple[str, ...] = ()
    splits: bool = plan_default("splits")   # also weigh jobs split by length (static KV)
    #: how each replica submits its share (`run --order`)
    order: Order = BY_NAME["order"].default

    def __post_init__(self) -> None:
        normalise(self, {"weight_dtype": WeightDtype, "kv_reserve": KvReserve,
                         "pricing": Pricing, "order": Order})

    @property
    def runtime_names(self) -> tuple[str | None, ...]:
        """The runtime names weighed on each instance (None: the instance's own)."""
        return self.runtimes or (self.runtime,)

    def in_order(self, prompt_lens: Sequence[int], output_lens: Sequence[int]
                 ) -> tuple[list[int], list[int]]:
        """A share's (prompt lengths, output lengths) as a replica submits them: as read, or
        longest prompt + output first (inputs/prepare.py `in_order`, ties as read)."""
        pairs = list(zip(prompt_lens, output_lens))
        if self.order == Order.LENGTH:
            pairs.sort(key=lambda pair: -(pair[0] + pair[1]))
        return [p for p, _ in pairs], [o for _, o in pairs]

    @classmethod
    def from_settings(cls, settings: RunSettings, **grid: Any) -> PlanSpec:
        """The plan over `settings` (validated; the simulated device's): the model, weight
        type, cost profile, limits, KV rule, pricing and runtime come from them, `grid` gives
        the plan's own fields (instances, max_num_instances, seqs_values, max_prefill_buckets,
        compiled, prices, splits). PlanError without an architecture."""
        if settings.architecture is None:
            raise PlanError("plan needs the model's architecture (--architecture)")
        return cls(**{name: getattr(settings, name) for name in SETTINGS_FIELDS}, **grid)


#: PlanSpec's fields that are run settings: `from_settings` copies them by name (`compiled`
#: is plan's own --compiled, every option's start-up, given with the grid).
SETTINGS_FIELDS = tuple(f.name for f in fields(PlanSpec)
                        if f.name in BY_NAME and f.name != "compiled")


@dataclass(frozen=True)
class InstanceFit:
    """One instance type at one TP degree that holds the model."""

    instance: str
    tp: int
    replicas: int               # per instance: cores // tp
    target: Target
    price: Price

    @property
    def model(self) -> StepCostModel:
        return self.target.cost_model

    @property
    def runtime(self) -> Runtime:
        return self.target.runtime

    @property
    def max_model_len(self) -> int:
        return self.target.max_model_len

    @property
    def num_blocks(self) -> int:
        return int(self.target.kv["num_blocks"])

    @property
    def max_slots(self) -> int | None:
        """Under a static KV cache, the most max_num_seqs slots that load (None: paged)."""
        return int(self.target.kv["max_static_seqs"]) if self.runtime.static_kv else None

    def pool_blocks(self, max_num_seqs: int) -> int:
        """vLLM's KV pool at this max_num_seqs: a static cache holds exactly its slots (and
        vLLM's null block), a paged one what the HBM budget gives."""
        if self.runtime.static_kv:
            return max_num_seqs * -(-self.max_model_len // NEURON_BLOCK_SIZE) + 1
        return self.num_blocks

    def attention_buckets(self) -> tuple[int, ...]:
        """The decode attention lengths the runtime compiles by default: NxDI's
        token-generation buckets (nxdi), none (vllm-neuron: the max_model_len graph only, the
        seed's default), the export's sequence length (optimum-neuron)."""
        mml = self.max_model_len
        return self.runtime.shapes({}, max_num_seqs=1, max_num_batched_tokens=mml,
                                   max_model_len=mml).attention_buckets

    def hardware_key(self) -> tuple[Any, ...]:
        """What the simulated device's timing and KV size depend on besides the settings: two
        placements with equal keys simulate identically (inf2.xlarge and inf2.8xlarge have the
        same chip; inf2.24xlarge and inf2.48xlarge the same chips and links)."""
        inst = self.target.instance
        profile = {k: v for k, v in self.target.profile.to_dict().items()
                   if k not in ("instance", "source", "compile")}     # (not in a step's time)
        return (inst.family, inst.hbm_bytes_per_core, inst.hbm_bytes_s_per_core,
                inst.flops_per_core, inst.collective_bytes_s(self.tp), inst.link_gib_s,
                self.tp, self.num_blocks, tuple(sorted(profile.items())), self.runtime.name,
                self.max_model_len)


@dataclass(frozen=True)
class DecodePart:
    """One engine run of an option's replica (the whole share, or a split's short or long
    part) as its decode was first bounded, with what tightening that bound needs
    (plan/tighten.py)."""

    cut: int | None                     # None: the whole share; else the split's cut
    short: bool                         # the requests of length <= cut (else > cut)
    max_num_seqs: int
    attention_buckets: tuple[int, ...] | None   # None: fitted at run time (unpadded)
    decode_s: float                     # the first bound's decode seconds and steps
    decode_steps: int
    context_sum: int                    # ShareStats.context_sum of its requests


@dataclass
class Option:
    """One candidate layout and configuration, with its bounds; results are filled in later."""

    name: str
    placement: InstanceFit
    num_instances: int
    max_num_seqs: int
    prefill_buckets: tuple[int, ...]
    decode_buckets: tuple[int, ...]
    attention_buckets: tuple[int, ...]
    compile_s: float
    share_size: int
    bound_s: float              # lower bound on one replica's run time (seconds)
    bound_steps: int
    share_output_tokens: int
    sim_key: tuple[Any, ...]
    split: SplitLayout | None = None    # a job split by length (splits.py): its short layout
    skip_reason: str | None = None      # set when another option provably does as well
    pruned_by: str | None = None        # the best option when this one was pruned
    decode_parts: tuple[DecodePart, ...] = ()   # how its decode was bounded, to tighten
    tightened: bool = False             # its decode bound tightened already (tighten.py)
    result: dict[str, Any] | None = field(default=None, repr=False)
    prefix_caching: bool = False        # vLLM's prefix cache on (plan/prefix_options.py)
    order: str | None = None            # its submission order; None: the plan's --order

    @property
    def instance(self) -> str:
        return self.placement.instance

    @property
    def runtime(self) -> Runtime:
        return self.placement.runtime

    @property
    def max_model_len(self) -> int:
        return self.placement.max_model_len

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


@dataclass(frozen=True)
class SplitLayout:
    """The short layout of a split option, and what its share puts in it. Its bucket lists
    are the run's to fit (layout/split.py): `plan` needs only how many there are (their compile
    time) and bounds the prefills below by their unpadded sizes."""

    cut: int                            # its max_model_len: requests of length <= cut
    max_num_seqs: int
    requests: int                       # of the simulated share
    num_graphs: int
    compile_s: float                    # its own graphs (the option's compile_s has both)
