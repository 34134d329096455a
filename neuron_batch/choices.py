"""The closed sets a run's settings choose from, one enumeration each.

A setting holds a member, never one of several spellings of it: `RunSettings` turns what it is
given into members when it is built, so code below compares with members and a spelling the
comparison does not know cannot slip through. The command line's choices and the messages that
list them are generated from these classes.

Members are `str`s (StrEnum): they equal their values, write to JSON as them, and repr as them,
so run.json, the records and every digest of a settings repr read as before. Pure: imports
nothing of the package.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Self


class Choice(StrEnum):
    """A member per choice; its value is the name the report and run.json carry."""

    def __repr__(self) -> str:
        # A plain string's repr: `repr(settings)` names a plan's simulated-run folders, and
        # a member must not change those names.
        return repr(self.value)

    @property
    def cli(self) -> str:
        """How the command line and job files spell this choice."""
        return self.value

    @classmethod
    def values(cls) -> tuple[str, ...]:
        """Every choice as the command line spells it, in declaration order (the default
        first where there is one)."""
        return tuple(member.cli for member in cls)

    @classmethod
    def lookup(cls, value: object) -> Self | None:
        """The member `value` names (a member, its value or its command-line spelling), or
        None when it names none."""
        try:
            # (a member, its value or a spelling: the enumeration's own lookup decides)
            return cls(value)   # type: ignore[arg-type]
        except (ValueError, TypeError):
            return None

    @classmethod
    def parse(cls, value: object, option: str) -> Self:
        """The member `value` names; ValueError naming `option` and the choices otherwise."""
        member = cls.lookup(value)
        if member is None:
            raise ValueError(f"{option} must be one of {', '.join(cls.values())}, got {value!r}")
        return member

    @classmethod
    def _missing_(cls, value: object) -> Self | None:
        # cls(value) found no member by value: try the command-line spellings.
        return next((member for member in cls if member.cli == value), None)


def normalise(settings: Any, kinds: dict[str, type[Choice]]) -> None:
    """Each choice field of a frozen dataclass `settings` as its member, whatever spelling it
    came in (`max-model-len` and `max_model_len` alike): for `__post_init__`. A value that names
    no member stays as given, for the settings' validation to refuse with its own message."""
    for name, kind in kinds.items():
        member = kind.lookup(getattr(settings, name))
        if member is not None:
            object.__setattr__(settings, name, member)


class Device(Choice):
    """Where the engine runs (`--device`): auto picks what vLLM finds; sim is the simulated
    Neuron device."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"
    NEURON = "neuron"
    SIM = "sim"


class KvReserve(Choice):
    """The KV admission rule (`--kv-reserve`, scheduler/kv_reserve.py): what each admitted
    request reserves. The value is the scheduler config's spelling, `cli` the command line's."""

    REQUEST = "request"
    MAX_MODEL_LEN = "max_model_len"

    @property
    def cli(self) -> str:
        return self.value.replace("_", "-")

    @property
    def short(self) -> str:
        """The name in sweep configuration names (K=req, K=mml)."""
        return "req" if self is KvReserve.REQUEST else "mml"

    @classmethod
    def _missing_(cls, value: object) -> KvReserve | None:
        # Job files and the scheduler config have long taken either separator, any case, and
        # the short names.
        if not isinstance(value, str):
            return None
        text = value.strip().lower().replace("-", "_")
        return next((member for member in cls if text in (member.value, member.short)), None)


class Order(Choice):
    """The order `run --order` submits requests in (inputs/prepare.py `in_order`): as read,
    longest (prompt + max_tokens) first, or requests sharing a prefix together."""

    INPUT = "input"
    LENGTH = "length"
    PREFIX = "prefix"


class OnError(Choice):
    """What a run does with bad input lines (`--on-error`): stop before the model loads, or
    skip them and report."""

    FAIL = "fail"
    SKIP = "skip"


class PlacementMode(Choice):
    """Where `run --split-at N --replicas R` runs its two parts (`--split-placement`,
    layout/placement.py); auto becomes one of the other two there, by the estimate."""

    AUTO = "auto"
    IN_TURN = "in-turn"
    SIDE_BY_SIDE = "side-by-side"


class WeightDtype(Choice):
    """How the simulated model's weights are stored (`--weight-dtype`)."""

    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"


class Pricing(Choice):
    """Which built-in hourly price (`--pricing`, report/cost.py): AWS on-demand or the
    reserved-instance effective rate."""

    ON_DEMAND = "on-demand"
    RESERVED = "reserved"


#: `--prefix-caching`: auto (the default: on where the step model says it pays on the run's
#: layout, layout/prefix_decision.py), on, off. The setting is None, True or False.
PREFIX_CACHING = ("auto", "on", "off")


def parse_prefix_caching(value: object, option: str = "--prefix-caching") -> bool | None:
    """`--prefix-caching` (or a job file's `prefix-caching`) as the setting: auto -> None,
    on/off (and TOML's true/false) -> True/False; ValueError naming the choices else."""
    if value is None or isinstance(value, bool):
        return value
    named = {"auto": None, "on": True, "true": True, "off": False, "false": False}
    text = value.strip().lower() if isinstance(value, str) else value
    if text not in named:
        raise ValueError(f"{option} must be one of {', '.join(PREFIX_CACHING)}, got {value!r}")
    return named[text]


def prefix_caching_word(value: bool | None) -> str:
    """The setting as `--prefix-caching` spells it."""
    return "auto" if value is None else "on" if value else "off"
