"""A run's settings: one group per concern (groups.py), read by name, validated and resolved once
where options become settings. No vLLM import.

The CLI, a `--config job.toml` file and environment variables all end up here as a frozen
`RunSettings`; the runner and the engine builder only read it. Every setting is read by its
name whichever group declares it (`settings.max_num_seqs`, `settings.instance`): names are
unique across the groups, which this module checks when it is imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from neuron_batch.choices import (
    Choice,
    Device,
    KvReserve,
    parse_prefix_caching,
)
from neuron_batch.report.cost import Price, PricingError, has_builtin_price, price_for
from neuron_batch.runtimes.buckets import BucketError, parse_bucket_list, round_model_len
from neuron_batch.runtimes.choice import decide_runtime
from neuron_batch.runtimes.prefix_grid import BLOCK_SIZES
from neuron_batch.runtimes.runtime import RUNTIMES, VLLM_NEURON, Runtime, RuntimeNameError, Shapes
from neuron_batch.settings.declare import Declared, Kind, declared_in
from neuron_batch.settings.groups import (
    GROUPS,
    SPLIT_AUTO,
    ControlSettings,
    JobSettings,
    LayoutSettings,
    TargetSettings,
)
from neuron_batch.storage.urls import is_url

if TYPE_CHECKING:
    from neuron_batch.device.hardware import Instance


class SettingsError(ValueError):
    """A setting that cannot work; the message names the setting and what is allowed."""


#: Every declared setting, group by group, in declaration order.
DECLARED: tuple[Declared, ...] = tuple(d for group, cls in GROUPS.items()
                                       for d in declared_in(group, cls))
BY_NAME: dict[str, Declared] = {d.name: d for d in DECLARED}
if len(BY_NAME) != len(DECLARED) or set(BY_NAME) & set(GROUPS):
    raise TypeError("a setting's name is declared twice, or names a group: settings are read "
                    "by name, whichever group holds them")
#: The setting of each bucket list, by its key in the Neuron plugin's config (runtimes/runtime.py).
BUCKET_FIELDS: dict[str, str] = {d.setting.plugin_key: d.name for d in DECLARED
                                 if d.setting.plugin_key}


@dataclass(frozen=True)
class Resolved:
    """What a run's settings come to on their target, resolved once (`RunSettings.resolved`):
    the runtime it follows, the shapes it compiles, the instance it is billed for and that
    instance's price (None: no instance named, or no price known)."""

    runtime: Runtime
    shapes: Shapes
    priced_instance: str | None
    price: Price | None


if TYPE_CHECKING:
    # The type checker's view: every declared setting is RunSettings' own attribute, typed as
    # its group declares it (at run time they are the properties made below, from DECLARED,
    # which a checker cannot follow). Its __init__ takes only the four groups: `of` and
    # `replace` are the ways settings are made.
    class _EverySetting(JobSettings, LayoutSettings, TargetSettings, ControlSettings):
        pass
else:
    _EverySetting = object


@dataclass(frozen=True)
class RunSettings(_EverySetting):
    job: JobSettings = field(default_factory=JobSettings)
    layout: LayoutSettings = field(default_factory=LayoutSettings)
    target: TargetSettings = field(default_factory=TargetSettings)
    control: ControlSettings = field(default_factory=ControlSettings)

    @classmethod
    def of(cls, inputs: Sequence[str] | None = None, **values: Any) -> RunSettings:
        """Settings from setting names (`RunSettings.of(("a.jsonl",), max_num_seqs=16,
        device="sim")`), every other one at its default; TypeError naming an unknown name."""
        if inputs is not None:
            values["inputs"] = inputs
        return cls().replace(**values)

    def replace(self, **changes: Any) -> RunSettings:
        """These settings with `changes` (setting name -> value), each into its group: the one
        way code derives a variant (bench's grid, plan's options, a split's parts)."""
        by_group: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            declared = BY_NAME.get(name)
            if declared is None:
                raise TypeError(f"RunSettings has no setting {name!r}")
            by_group.setdefault(declared.group, {})[name] = value
        return replace(self, **{group: replace(getattr(self, group), **values)
                                for group, values in by_group.items()})

    def validate(self) -> RunSettings:
        """These settings, checked: SettingsError naming the setting and what is allowed.
        Resolves them on their target (`resolved`); settings checked before return at once (the
        runner takes what the command line validated, and validates only what it was handed
        unchecked: bench's and plan's variants)."""
        if self.__dict__.get("_validated"):
            return self
        try:
            parse_prefix_caching(self.prefix_caching)
        except ValueError as error:
            raise SettingsError(str(error)) from None
        for d in DECLARED:              # each number's range, each choice's values
            check_declared(d, getattr(self, d.name))
        self._check_split()
        if self.compiled and not self.simulated:
            raise SettingsError("--compiled is for --device sim; a Neuron host finds its graphs "
                                "itself (--compiled-artifacts, the compile cache)")
        if self.ray is not None and not str(self.ray).strip():
            raise SettingsError("--ray needs a cluster address (host:port, auto or local)")
        if self.output is not None and is_url(str(self.output)) and not str(
                self.output).lower().startswith(("s3://", "s3a://")):
            # (inputs may be any fsspec URL; a run folder's lock needs S3's conditional writes:
            # storage/run_bucket.py)
            raise SettingsError(f"--output {self.output}: a run folder in object storage is an "
                                "s3:// prefix; other stores can hold inputs, not run folders")
        try:
            KvReserve.parse(self.kv_reserve, "kv-reserve")
        except ValueError as error:
            raise SettingsError(f"--{error}") from None
        self.resolved      # noqa: B018  (the runtime, shapes and price, or SettingsError)
        self.__dict__["_validated"] = True      # (frozen: a mark, not a setting)
        return self

    def _check_split(self) -> None:
        if isinstance(self.split_at, str) and self.split_at != SPLIT_AUTO:
            raise SettingsError(f"--split-at takes a number of tokens or auto, got "
                                f"{self.split_at!r}")
        cut = self.split_at
        if isinstance(cut, int):
            _positive("split-at", cut)
            if cut >= self.max_model_len:
                raise SettingsError(
                    f"--split-at {cut:,} must be below --max-model-len "
                    f"{self.max_model_len:,} (the long layout's); requests up to "
                    f"{cut:,} tokens run in a layout of that length, the rest in the "
                    f"long one: give a smaller cut, or --max-model-len "
                    f"{round_model_len(cut + 1)}")
        if self.split_placement == "side-by-side" and (self.split_at is None
                                                       or self.replicas < 2):
            raise SettingsError("--split-placement side-by-side runs the two parts of "
                                "--split-at N on separate replicas at once: it needs --split-at "
                                f"and --replicas 2 or more (got --replicas {self.replicas})")

    @cached_property
    def resolved(self) -> Resolved:
        """The runtime, shapes and price of these settings, resolved once per settings object
        (they are frozen); SettingsError where one cannot be."""
        try:
            price = self.price()
        except PricingError as error:
            raise SettingsError(str(error)) from None
        try:
            runtime = self.resolve_runtime()
        except RuntimeNameError as error:
            raise SettingsError(str(error)) from None
        self._check_runtime_runs_here(runtime)
        if runtime.static_kv and self.kv_reserve == KvReserve.MAX_MODEL_LEN:
            paged = RUNTIMES[VLLM_NEURON]
            family = self._named_family()   # (name the paged runtime only where it runs)
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
            shapes = self.shapes(runtime)    # (the lists, --prefix-buckets by prefix_grid's rules)
        except BucketError as error:
            raise SettingsError(str(error)) from None
        return Resolved(runtime, shapes, self.priced_instance(), price)

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
        """A runtime AWS does not ship for the instance named (the simulated one, or a Neuron
        host's --instance with --runtime given) is refused: none of its layouts loads there, so
        no figure of it would be true (layout/device_fit.py asks it again of an instance found
        later). Off the simulated device the runtime decided without --runtime is the
        plugin's, or on a host without one the seed's, which only shapes the scheduling."""
        family = self._named_family() if self.simulated or self.runtime else None
        if family is None:
            return          # (no instance named, or one resolve_target names as unknown)
        named = self.instance if self.simulated else self.host_instance
        refused = runtime.not_shipped_for(str(named), family)
        if refused:
            raise SettingsError(refused)

    def sim_instance(self) -> Instance:
        """The simulated instance (--instance) as the hardware table's Instance; HardwareError
        naming the choices when the table lacks it."""
        from neuron_batch.device.hardware import get_instance
        return get_instance(self.instance)

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

    def _named_family(self) -> str | None:
        """The family of the instance these settings name: the simulated one, or a Neuron
        host's --instance (doctor's too); None when none is named or it is unknown."""
        if self.simulated:
            return self._sim_family()
        from neuron_batch.device.hardware import INSTANCES
        host = INSTANCES.get(self.host_instance or "")
        return host.family if host is not None else None

    def resolve_runtime(self) -> Runtime:
        """The Neuron runtime this run follows: `--runtime`; else the simulated instance's (nxdi
        on inf2/trn1, vllm-neuron on trn2); on a Neuron host the installed plugin's line;
        elsewhere the seed design's. Read once per settings object (`decide_runtime`): the
        plugin's version is read here, so no answer outlives the settings it was read for."""
        return self._runtime

    @cached_property
    def _runtime(self) -> Runtime:
        plugin = None
        if self.runtime is None and self.device in (Device.NEURON, Device.AUTO):
            from neuron_batch.versions import neuron_plugin
            found = neuron_plugin()
            plugin = ((found.get("distribution"), found["version"])
                      if found.get("distribution") or found["version"] else None)
        return decide_runtime(self.runtime, self.device, self._sim_family(), plugin)

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
        return self.replace(runtime=runtime.name, **{
            name: (None if key not in lists else
                   list(lists[key])[-1] if key in single else tuple(lists[key]))
            for key, name in BUCKET_FIELDS.items()})

    def shapes(self, runtime: Runtime | None = None) -> Shapes:
        """The compiled shapes of this run under `runtime` (default: resolve_runtime());
        BucketError for a list the runtime refuses, or one of the other runtime."""
        if runtime is None and "resolved" in self.__dict__:    # (validated: resolved once)
            return self.resolved.shapes
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
            return self.instance
        if self.device in (Device.NEURON, Device.AUTO):
            return self.host_instance
        return None

    def price(self) -> Price | None:
        """The hourly price of `priced_instance()`, or None: no instance named, or one without
        a built-in price and no --price-per-hour (the run still runs; the report has no cost
        and says how to add one). PricingError for a bad --pricing / --price-per-hour."""
        if "resolved" in self.__dict__:                         # (validated: resolved once)
            return self.resolved.price
        instance = self.priced_instance()
        if instance is None or (self.price_per_hour is None
                                and not has_builtin_price(instance)):
            return None
        return price_for(instance, self.pricing, self.price_per_hour)

    def to_dict(self) -> dict[str, Any]:
        """Every setting as plain data by its key (choices as their strings), a declared
        table's settings under it: as run.json keeps them."""
        out: dict[str, Any] = {}
        for d in DECLARED:
            value = getattr(self, d.name)
            value = value.value if isinstance(value, Choice) else value
            value = list(value) if isinstance(value, tuple) else value
            (out.setdefault(d.setting.table, {}) if d.setting.table else out)[d.key] = value
        return out


def _read(name: str, group: str) -> property:
    return property(lambda self: getattr(getattr(self, group), name),
                    doc=BY_NAME[name].setting.help)


for _declared in DECLARED:          # settings.max_num_seqs reads settings.layout.max_num_seqs
    setattr(RunSettings, _declared.name, _read(_declared.name, _declared.group))
del _declared


def check_declared(d: Declared, value: Any) -> None:
    """SettingsError where `value` is outside the declared range (`bound`) of setting `d`, or
    no value of its declared choices (a Choice enumeration's)."""
    s, flag = d.setting, f"--{d.flag or d.name.replace('_', '-')}"
    if s.bound is not None and not (value is None and d.default is None):
        whole = s.kind is Kind.INT
        if s.bound == "positive" and (value is None or value <= 0):
            unit = f" of {s.metavar.lower()}" if s.metavar and not whole else ""
            raise SettingsError(f"{flag} must be a positive {'whole ' if whole else ''}"
                                f"number{unit}, got {value}")
        if s.bound == "non-negative" and (value is None or value < 0):
            raise SettingsError(f"{flag} must be 0 or more, got {value}")
    if s.kind is Kind.CHOICE and isinstance(s.choices, type) and issubclass(s.choices, Choice) \
            and value not in s.choices.values() and not (value is None and d.default is None):
        raise SettingsError(f"{flag} must be one of {', '.join(s.choices.values())}, "
                            f"got {value!r}")


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

