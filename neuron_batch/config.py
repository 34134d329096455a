"""Settings of a run, validated in one place, with no vLLM import.

The CLI, a `--config job.toml` file and environment variables all end up here as a frozen
`RunSettings`; the runner and the engine builder only read it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from neuron_batch.buckets import BucketError, parse_bucket_list, round_model_len
from neuron_batch.choices import (
    Choice,
    Device,
    KvReserve,
    OnError,
    Order,
    PlacementMode,
    Pricing,
    WeightDtype,
    normalise,
    parse_prefix_caching,
)
from neuron_batch.prefix_grid import BLOCK_SIZES
from neuron_batch.report.cost import (
    DEFAULT_PRICING,
    Price,
    PricingError,
    has_builtin_price,
    price_for,
)
from neuron_batch.runtime import (
    RUNTIMES,
    VLLM_NEURON,
    Runtime,
    RuntimeNameError,
    Shapes,
)
from neuron_batch.runtime_choice import decide_runtime
from neuron_batch.scheduler.kv_reserve import DEFAULT_KV_RESERVE, parse_kv_reserve

if TYPE_CHECKING:
    from neuron_batch.device.hardware import Instance

DEVICES = Device.values()
#: How `run --order` arranges the requests it submits (FIFO): inputs/prepare.py `in_order`.
ORDERS = Order.values()
#: Where `run --split-at N --replicas R` runs its two parts (layout/placement.py).
SPLIT_PLACEMENTS = PlacementMode.values()
#: `run --split-at auto`: the cut chosen by the step-time estimate (layout/split.py choose_cut).
SPLIT_AUTO = "auto"
ON_ERROR = OnError.values()

# Defaults chosen to work on a fresh 2-core CPU machine with the built-in 135M model, and to be
# a sensible first try on an inf2 host (AWS's advice: start small, then profile).
DEFAULT_MAX_NUM_SEQS = 8
DEFAULT_MAX_MODEL_LEN = 2048
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
DEFAULT_MAX_TOKENS = 64


#: RunSettings field of each bucket list, by the plugin config key (runtime.py) it goes to.
BUCKET_FIELDS = {"num_batched_tokens_buckets": "prefill_buckets",
                 "num_seqs_buckets": "decode_buckets",
                 "context_encoding_buckets": "context_encoding_buckets",
                 "token_generation_buckets": "token_generation_buckets",
                 "decode_context_length_buckets": "decode_context_buckets",
                 "prefix_buckets": "prefix_buckets",
                 "max_context_length": "max_context_length"}


class SettingsError(ValueError):
    """A setting that cannot work; the message names the setting and what is allowed."""


@dataclass(frozen=True)
class SimOptions:
    """The simulated Neuron device (`--device sim`)."""

    instance: str = "inf2.8xlarge"
    architecture: str | None = None      # catalogue name or config.json; default: the model's
    tensor_parallel_size: int | None = None  # default: every NeuronCore of the instance
    weight_dtype: WeightDtype = WeightDtype.BF16
    cost_profile: str | None = None      # a profile JSON from `neuron-batch calibrate`
    num_instances: int = 1               # instances the --replicas engines are spread over
    compiled: bool = False               # the graphs are compiled already: count the load only

    def __post_init__(self) -> None:
        normalise(self, {"weight_dtype": WeightDtype})


@dataclass(frozen=True)
class CostOptions:
    """What the run's instances cost (`--pricing`, `--price-per-hour`). The instance priced is
    the simulated one on `--device sim`; on a real host, `instance` (set only when `--instance`
    was given: the default must not price a machine nobody named)."""

    pricing: Pricing = DEFAULT_PRICING
    price_per_hour: float | None = None  # USD per instance-hour; overrides the table
    instance: str | None = None          # the host's instance type on a real Neuron device

    def __post_init__(self) -> None:
        normalise(self, {"pricing": Pricing})


#: RunSettings fields that take one of a closed set, and its enumeration (choices.py).
CHOICE_FIELDS: dict[str, type[Choice]] = {
    "device": Device, "kv_reserve": KvReserve, "order": Order, "on_error": OnError,
    "split_placement": PlacementMode}

#: RunSettings fields named apart from their option (command line, job files, run.json): the
#: data set's split is not the length split of `split_at`.
OPTION_NAMES = {"dataset_split": "split"}


@dataclass(frozen=True)
class RunSettings:
    inputs: tuple[str, ...]
    model: str | None = None             # None: the built-in SmolLM2-135M-Instruct
    device: Device = Device.AUTO
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    prefill_buckets: tuple[int, ...] | None = None   # None: powers of two (see buckets.py)
    decode_buckets: tuple[int, ...] | None = None
    runtime: str | None = None           # runtime.RUNTIME_NAMES; None: by device/instance
    context_encoding_buckets: tuple[int, ...] | None = None   # nxdi (None: NxDI's default)
    token_generation_buckets: tuple[int, ...] | None = None   # nxdi
    decode_context_buckets: tuple[int, ...] | None = None     # vllm-neuron (opt-in)
    prefix_buckets: tuple[int, ...] | None = None  # nxdi with prefix caching: the grid's
    max_context_length: int | None = None  # optimum-neuron: its export's (None: max_model_len)
    prefix_caching: bool | None = None   # vLLM's prefix cache: True/False forced (--prefix-
                                         # caching on/off); None: auto, decided once per run
                                         # where it pays (layout/prefix_decision.py)
    block_size: int | None = None        # None: the device's default (32 on Neuron)
    compiled_artifacts: str | None = None  # Neuron: root of the compiled-graph folders
    kv_reserve: KvReserve = DEFAULT_KV_RESERVE  # KV admission (scheduler/kv_reserve.py)
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    ignore_eos: bool = False             # generate exactly max_tokens (benchmarks; always on sim)
    prompt_column: str = "prompt"
    dataset_split: str = "train"         # the data set's split to read (--split)
    limit: int | None = None
    shuffle: bool = False
    seed: int = 0
    on_error: OnError = OnError.FAIL
    ignore_field: tuple[str, ...] = ()   # JSON request fields dropped, not refused (their
                                         # names as the input spells them: body.logprobs)
    output: str | None = None            # None: results/<timestamp>-<input name>
    resume: bool = False
    restart: bool = False                # move a run in --output aside and start anew
    quiet: bool = False
    max_runtime: float | None = None     # seconds
    metrics_textfile: str | None = None
    order: Order = Order.INPUT           # submission order (longest first: length)
    split_at: int | str | None = None    # run requests of prompt + max_tokens <= N in their
                                         # own layout first (layout/split.py); "auto": the
                                         # runner picks N (split.choose_cut)
    split_placement: PlacementMode = PlacementMode.AUTO   # its parts on --replicas
    replicas: int = 1                    # engines (data parallel); more than 1 runs on Ray
    ray: str | None = None               # Ray cluster address ("local": a fresh local one)
    sim: SimOptions = field(default_factory=SimOptions)
    cost: CostOptions = field(default_factory=CostOptions)

    def __post_init__(self) -> None:
        normalise(self, CHOICE_FIELDS)
        if isinstance(self.prefix_caching, str):     # (a job file's or run.json's spelling)
            try:
                object.__setattr__(self, "prefix_caching",
                                   parse_prefix_caching(self.prefix_caching))
            except ValueError:
                pass                                # (validate names it)
        if self.prefix_caching is None and self.prefix_buckets is not None:
            # --prefix-buckets shape the caching grid: giving them asks for the cache
            object.__setattr__(self, "prefix_caching", True)

    def validate(self) -> RunSettings:
        try:
            parse_prefix_caching(self.prefix_caching)
        except ValueError as error:
            raise SettingsError(str(error)) from None
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "max_tokens"):
            _positive(name.replace("_", "-"), getattr(self, name))
        if self.block_size is not None:
            _positive("block-size", self.block_size)
        if self.limit is not None and self.limit < 0:
            raise SettingsError(f"--limit must be 0 or more, got {self.limit}")
        if self.max_runtime is not None and self.max_runtime <= 0:
            raise SettingsError(f"--max-runtime must be a positive number of seconds, "
                                f"got {self.max_runtime}")
        _positive("replicas", self.replicas)
        if self.order not in ORDERS:
            raise SettingsError(f"--order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        if isinstance(self.split_at, str) and self.split_at != SPLIT_AUTO:
            raise SettingsError(f"--split-at takes a number of tokens or auto, got "
                                f"{self.split_at!r}")
        if self.split_at is not None and self.split_at != SPLIT_AUTO:
            _positive("split-at", self.split_at)
            if self.split_at >= self.max_model_len:
                raise SettingsError(
                    f"--split-at {self.split_at:,} must be below --max-model-len "
                    f"{self.max_model_len:,} (the long layout's); requests up to {self.split_at:,} "
                    f"tokens run in a layout of that length, the rest in the long one: give a "
                    f"smaller cut, or --max-model-len {round_model_len(self.split_at + 1)}")
        if self.split_placement not in SPLIT_PLACEMENTS:
            raise SettingsError(f"--split-placement must be one of "
                                f"{', '.join(SPLIT_PLACEMENTS)}, got {self.split_placement!r}")
        if self.split_placement == "side-by-side" and (self.split_at is None
                                                       or self.replicas < 2):
            raise SettingsError("--split-placement side-by-side runs the two parts of "
                                "--split-at N on separate replicas at once: it needs --split-at "
                                f"and --replicas 2 or more (got --replicas {self.replicas})")
        _positive("num-instances", self.sim.num_instances)
        if self.sim.compiled and not self.simulated:
            raise SettingsError("--compiled is for --device sim; a Neuron host finds its graphs "
                                "itself (--compiled-artifacts, the compile cache)")
        if self.ray is not None and not str(self.ray).strip():
            raise SettingsError("--ray needs a cluster address (host:port, auto or local)")
        if self.temperature < 0:
            raise SettingsError(f"--temperature must be 0 or more, got {self.temperature}")
        if self.device not in DEVICES:
            raise SettingsError(f"--device must be one of {', '.join(DEVICES)}, "
                                f"got {self.device!r}")
        try:
            parse_kv_reserve(self.kv_reserve)
        except ValueError as error:
            raise SettingsError(f"--{error}") from None
        if self.on_error not in ON_ERROR:
            raise SettingsError(f"--on-error must be one of {', '.join(ON_ERROR)}, "
                                f"got {self.on_error!r}")
        try:
            self.price()
        except PricingError as error:
            raise SettingsError(str(error)) from None
        try:
            runtime = self.resolve_runtime()
        except RuntimeNameError as error:
            raise SettingsError(str(error)) from None
        self._check_runtime_runs_here(runtime)
        if runtime.static_kv and self.kv_reserve == KvReserve.MAX_MODEL_LEN:
            paged = RUNTIMES[VLLM_NEURON]
            family = self._sim_family()     # (name the paged runtime only where it runs)
            raise SettingsError(
                f"--kv-reserve does not apply under the {runtime.name} runtime: its static KV "
                f"cache holds max_num_seqs x max_model_len by construction, so KV never limits "
                f"admission (max_num_seqs does); drop --kv-reserve"
                + (f", or choose --runtime {paged.name}"
                   if family is None or family in paged.runs_on else ""))
        if self.prefix_caching and not runtime.prefix_caching:
            raise SettingsError(
                f"--runtime {runtime.name} runs without prefix caching (its platform turns it "
                f"off and sets the KV block to max_model_len): leave --prefix-caching auto or give "
                f"--prefix-caching off")
        try:
            self.shapes(runtime)    # (the lists, --prefix-buckets by prefix_grid.py's rules)
        except BucketError as error:
            raise SettingsError(str(error)) from None
        return self

    @property
    def simulated(self) -> bool:
        """--device sim: the simulated Neuron device (the one test of the device's name)."""
        return self.device == Device.SIM

    @property
    def uses_ray(self) -> bool:
        """More than one engine, or --ray given: the run goes through Ray (replicas/pool.py);
        otherwise it is the single-engine path, which never imports Ray."""
        return self.replicas > 1 or self.ray is not None

    def _check_runtime_runs_here(self, runtime: Runtime) -> None:
        """On the simulated device, a runtime AWS does not ship for the instance is refused:
        none of its layouts loads there, so no figure of it would be true."""
        family = self._sim_family()
        if family is None:
            return          # (not simulated, or the simulated device names the instance)
        refused = runtime.not_shipped_for(self.sim.instance, family)
        if refused:
            raise SettingsError(refused)

    def sim_instance(self) -> Instance:
        """The simulated instance (--instance): where a run's settings turn its name into the
        Instance (the runtime's decision, and job.resolve_target's Target, take this one);
        HardwareError naming the choices when the table lacks it."""
        from neuron_batch.device.hardware import get_instance
        return get_instance(self.sim.instance)

    def _sim_family(self) -> str | None:
        """The simulated instance's family (which runtimes run there, so which a hint may
        name); None when not simulated or the instance is unknown (resolve_target says so)."""
        if not self.simulated:
            return None
        from neuron_batch.device.hardware import HardwareError
        try:
            return self.sim_instance().family
        except HardwareError:
            return None

    def resolve_runtime(self) -> Runtime:
        """The Neuron runtime this run follows: `--runtime`; else the simulated instance's (nxdi
        on inf2/trn1, vllm-neuron on trn2); on a Neuron host the installed plugin's line;
        elsewhere the seed design's. Decided once for what decides it (`decide_runtime`): the
        plugin's version is read here, so a cached answer never outlives the installed plugin."""
        plugin = None
        if self.runtime is None and self.device in (Device.NEURON, Device.AUTO):
            from neuron_batch.versions import neuron_plugin
            found = neuron_plugin()
            plugin = ((found.get("distribution"), found["version"])
                      if found.get("distribution") or found["version"] else None)
        return decide_runtime(self.runtime, self.device, self._sim_family(), plugin)

    def replace(self, **changes: Any) -> RunSettings:
        """These settings with `changes` (setting name -> value): the one way code below the
        CLI derives a variant (bench's grid, plan's options, a split's parts)."""
        return replace(self, **changes)

    def bucket_lists(self) -> dict[str, list[int]]:
        """The bucket lists the user gave, by the plugin config key of their runtime (a
        one-value option, --max-context-length, as a list of one)."""
        return {key: (list(value) if isinstance(value, (list, tuple)) else [value])
                for key, name in BUCKET_FIELDS.items()
                if (value := getattr(self, name)) is not None}

    def with_buckets(self, runtime: Runtime, prefill: Sequence[int] | None,
                     decode: Sequence[int] | None = None,
                     attention: Sequence[int] | None = None) -> RunSettings:
        """These settings under `runtime` with its three bucket lists (None or empty: the
        runtime's default), every other runtime's list cleared: how bench and plan set the
        lists they sweep without naming the runtime's flags."""
        lists = {o.key: v for o, v in ((runtime.prefill, prefill), (runtime.decode, decode),
                                       (runtime.attention, attention))
                 if o is not None and v}
        single = {o.key for o in runtime.bucket_options if o.single}
        return replace(self, runtime=runtime.name,
                       **{name: (None if key not in lists else
                                 list(lists[key])[-1] if key in single else tuple(lists[key]))
                          for key, name in BUCKET_FIELDS.items()})

    def shapes(self, runtime: Runtime | None = None) -> Shapes:
        """The compiled shapes of this run under `runtime` (default: resolve_runtime());
        BucketError for a list the runtime refuses, or one of the other runtime."""
        runtime = runtime or self.resolve_runtime()
        return runtime.shapes(self.bucket_lists(), max_num_seqs=self.max_num_seqs,
                              max_num_batched_tokens=self.max_num_batched_tokens,
                              max_model_len=self.max_model_len, family=self._sim_family(),
                              prefix_caching=bool(self.prefix_caching),
                              block_size=self.block_size or BLOCK_SIZES[-1])

    def buckets(self) -> tuple[list[int], list[int]]:
        """(prefill, decode) buckets this run uses, validated against the limits."""
        shapes = self.shapes()
        return list(shapes.prefill_buckets), list(shapes.decode_buckets)

    def priced_instance(self) -> str | None:
        """The instance the run is billed for: the simulated one, or the --instance given on a
        Neuron host; None when unknown (no cost is reported then)."""
        if self.simulated:
            return self.sim.instance
        if self.device in (Device.NEURON, Device.AUTO):
            return self.cost.instance
        return None

    def price(self) -> Price | None:
        """The hourly price of `priced_instance()`, or None: no instance named, or one without
        a built-in price and no --price-per-hour (the run still runs; the report has no cost
        and says how to add one). PricingError for a bad --pricing / --price-per-hour."""
        instance = self.priced_instance()
        if instance is None or (self.cost.price_per_hour is None
                                and not has_builtin_price(instance)):
            return None
        return price_for(instance, self.cost.pricing, self.cost.price_per_hour)

    def to_dict(self) -> dict[str, Any]:
        """Every setting as plain data, by option name (choices as their strings), as run.json
        keeps them."""
        return asdict(self, dict_factory=lambda items: {
            OPTION_NAMES.get(key, key): value.value if isinstance(value, Choice) else value
            for key, value in items})


def _positive(name: str, value: int) -> None:
    if value is None or value <= 0:
        raise SettingsError(f"--{name} must be a positive whole number, got {value}")


def parse_buckets_option(text: str | None, option: str) -> tuple[int, ...] | None:
    if text is None or text == "":
        return None
    try:
        return tuple(parse_bucket_list(text, name=option))
    except BucketError as error:
        raise SettingsError(str(error)) from None
