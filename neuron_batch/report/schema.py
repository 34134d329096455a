"""The machinery under the typed report (report/model.py): a section is a dataclass read from and
written to its JSON object in one place, here.

Two promises shape it. `report.json` must come out as it always did, field for field and in the
same order (dashboards and the golden test read it), so a section remembers the order its keys
were read in and writes them back in that order; a section built by the program writes its
fields in declaration order, which model.py declares in the order the report always had. And an
older run folder must still read, so every key may be absent (the field is then `ABSENT`, and
is written back absent, not as null: null is a value some keys really have), and a key this
version does not know is kept in `extra` and written back where it was.

Pure Python, no vLLM: `neuron-batch report DIR` reads a report without the engine.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

S = TypeVar("S", bound="Section")


class _Absent:
    """A key the JSON object did not have (older report, or a section only some runs write)."""

    _instance: ClassVar[_Absent | None] = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:     # so `if report.cost:` reads as "has a cost"
        return False

    def __repr__(self) -> str:
        return "ABSENT"


#: (typed Any: it stands in for a field of any declared type, a section's or a plain value's)
ABSENT: Any = _Absent()


def present(value: Any) -> bool:
    """Whether a field was in the report (None counts: it is a value written as null)."""
    return value is not ABSENT


def or_none(value: Any) -> Any:
    """The field's value, None where the report lacked it: for readers that print '-'."""
    return None if value is ABSENT else value


def typed(kind: Any, *, of: str = "one", default: Any = ABSENT) -> Any:
    """A field holding a nested section (`of`: "one", "list" or "dict" of `kind`), or an enum's
    value (`kind` an Enum: a value it does not know stays the plain string)."""
    return field(default=default, metadata={"kind": kind, "of": of})


def section_field(default: Any = ABSENT) -> Any:
    """A plain JSON value (number, string, list, dict) kept as it is."""
    return field(default=default)


@dataclass
class Section:
    """A JSON object as a dataclass. Subclasses declare their fields (default ABSENT: any key
    may be missing); `KEYS` renames a field whose JSON key is not an identifier."""

    #: field name -> JSON key, where they differ
    KEYS: ClassVar[dict[str, str]] = {}
    #: (field name, JSON key) pairs, set on each class by its first `_names()` call
    _names_cache: ClassVar[list[tuple[str, str]]]

    extra: dict[str, Any] = field(default_factory=dict, repr=False, kw_only=True)
    _order: tuple[str, ...] = field(default=(), repr=False, compare=False, kw_only=True)

    @classmethod
    def _names(cls) -> list[tuple[str, str]]:
        """(field name, JSON key) of the declared fields, in declaration order."""
        cached = cls.__dict__.get("_names_cache")
        if cached is None:
            cached = [(f.name, cls.KEYS.get(f.name, f.name)) for f in fields(cls)
                      if f.name not in ("extra", "_order")]
            cls._names_cache = cached
        return cached

    @classmethod
    def from_dict(cls: type[S], data: dict[str, Any] | None) -> S:
        """The section of a JSON object; absent keys ABSENT, unknown ones kept in `extra`."""
        data = data or {}
        by_key = {key: name for name, key in cls._names()}
        values: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        meta = {f.name: f.metadata for f in fields(cls)}
        for key, value in data.items():
            name = by_key.get(key)
            if name is None:
                extra[key] = value
            else:
                values[name] = _read(value, meta[name])
        section = cls(**values, extra=extra)
        section._order = tuple(data)
        return section

    def __bool__(self) -> bool:
        """False for a section with no key, as its empty JSON object was: `if report.cost:`
        reads as it did on the dict."""
        return bool(self.extra) or any(getattr(self, name) is not ABSENT
                                       for name, _ in self._names())

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: the keys read, in the order read, then any set since (declaration
        order), then unknown keys added since; absent fields left out."""
        names = dict((key, name) for name, key in self._names())
        out: dict[str, Any] = {}
        for key in (*self._order, *(key for _, key in self._names()), *self.extra):
            if key in out:
                continue
            name = names.get(key)
            if name is not None:
                value = getattr(self, name)
                if value is not ABSENT:
                    out[key] = _write(value)
            elif key in self.extra:
                out[key] = _write(self.extra[key])
        return out


def _read(value: Any, meta: Any) -> Any:
    kind = meta.get("kind")
    if kind is None or value is None:
        return value
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(value)
        except ValueError:
            return value     # a newer version's word: kept, written back as it was
    if meta["of"] == "list":
        return [kind.from_dict(item) if isinstance(item, dict) else item for item in value]
    if meta["of"] == "dict":
        return {k: kind.from_dict(item) if isinstance(item, dict) else item
                for k, item in value.items()}
    return kind.from_dict(value) if isinstance(value, dict) else value


def _write(value: Any) -> Any:
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [_write(item) for item in value]
    if isinstance(value, dict):
        return {key: _write(item) for key, item in value.items()}
    return value
