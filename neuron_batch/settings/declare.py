"""How a setting is declared: once, as a field of its concern's dataclass (groups.py), with
everything the rest of the tool derives from it in the field's metadata.

A declaration says what a setting is (type and default: the dataclass field), what it means (its
help), how it is given (the command-line flag, a short flag, an environment variable, the job
file's key and table), where it applies (`Scope`), whether a resume compares it (`checked`), how
bench's reproduced `run` command writes it (`Written`) and whether bench takes several values of
it to sweep (`sweep`). Click options (cli/options.py), job files (job_file.py), the resume check
(job/resume_check.py), bench's reproduced command (bench/command_line.py), `--help` defaults and
the table of docs/settings.md are all read from here, so a setting added to a group appears in
all of them. Pure: imports nothing of the package.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Scope(Enum):
    """Where a setting acts: its `[sim]`/`[neuron]` tag in `--help`, and docs' table."""

    EVERY = ""                 # every device
    SIM = "sim"                # the simulated Neuron device only
    NEURON = "neuron"          # a real Neuron host only
    TARGET = "sim, neuron"     # the Neuron target, simulated or real


class Written(Enum):
    """How bench's and plan's reproduced `neuron-batch run` line writes a setting."""

    ALWAYS = "always"          # what a sweep or plan chose: written whatever its value
    ALWAYS_SIM = "always-sim"  # written on --device sim whatever its value (the target)
    CHANGED = "changed"        # written where it differs from its default
    RESOLVED = "resolved"      # a bucket list: written as the runtime resolved it
    NEVER = "never"            # where and how a run reports, not what it runs


class Kind(Enum):
    """How a value is given on the command line (cli/options.py maps each to a click type)."""

    INT = "int"
    FLOAT = "float"
    TEXT = "text"
    FOLDER = "folder"          # a path that is a folder, or will be
    FILE = "file"              # a path that is a file, or will be
    FLAG = "flag"              # --name sets it
    SWITCH = "switch"          # --name / --no-name
    CHOICE = "choice"          # one of `choices` (a choices.Choice enumeration)
    BUCKETS = "buckets"        # N,N,... ascending whole numbers
    MANY = "many"              # the option repeated, one value each
    SPLIT_AT = "split-at"      # a number of tokens or auto
    PREFIX_CACHING = "prefix-caching"   # auto|on|off
    KV_RULE = "kv-rule"        # request | max-model-len


@dataclass(frozen=True)
class Setting:
    """A setting's declaration, beside its dataclass field (name, type, default)."""

    help: str
    kind: Kind = Kind.TEXT
    #: The long flag without dashes; "" derives it from the field's name (max_num_seqs ->
    #: max-num-seqs), None: not a command-line option (the CLI derives it from others).
    option: str | None = ""
    short: str | None = None
    envvar: str | None = None
    metavar: str | None = None
    choices: Any = None        # the Choice enumeration of a CHOICE
    scope: Scope = Scope.EVERY
    #: A resume compares it: it changes the outputs or the figures of the run.
    checked: bool = False
    #: It chooses which requests a job holds, or their order: named beside changed request ids.
    selects: bool = False
    written: Written = Written.CHANGED
    #: bench takes a comma-separated list of it and sweeps every value.
    sweep: bool = False
    #: The job file's and run.json's table holding it ("sim": the simulated target's [sim]
    #: table; a resume compares it only on --device sim). None: top level.
    table: str | None = None
    #: A bucket list's key in the Neuron plugin's config (runtimes/runtime.py BucketOption.key).
    plugin_key: str | None = None
    #: A job file may set it (every setting but those the CLI derives from others).
    in_job_file: bool = True
    #: The commands that take it as an option.
    commands: frozenset[str] = frozenset({"run", "bench"})
    show_default: bool = True
    #: The range of a number: "positive" (above 0) or "non-negative" (0 or more); validate
    #: refuses a value outside it (and None, unless None is the default).
    bound: str | None = None
    #: (command, help) where a command reads it otherwise (doctor: the host's instance, not the
    #: simulated one); that help says the default there.
    help_in: tuple[tuple[str, str], ...] = ()

    def flag(self, name: str) -> str | None:
        """The option's name as the command line spells it, without dashes."""
        if self.option is None:
            return None
        return self.option or name.replace("_", "-")

    def key(self, name: str) -> str:
        """Its name in job files and run.json: the flag with underscores (a setting that is no
        option keeps its field name)."""
        return (self.flag(name) or name).replace("-", "_")


def setting(default: Any = None, *, factory: Any = None, **declaration: Any) -> Any:
    """A declared dataclass field: `default` (or a `factory`) and the Setting's attributes."""
    metadata = {"setting": Setting(**declaration)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Declared:
    """One declared setting, as read from its group: the field's name, its group's attribute
    on RunSettings, its default and its declaration."""

    name: str
    group: str
    default: Any
    setting: Setting

    @property
    def flag(self) -> str | None:
        return self.setting.flag(self.name)

    @property
    def key(self) -> str:
        return self.setting.key(self.name)


def declared_in(group: str, cls: type) -> Iterator[Declared]:
    """The settings a group dataclass declares, in declaration order."""
    for f in dataclasses.fields(cls):
        declaration = f.metadata.get("setting")
        if declaration is None:
            continue
        default = (f.default_factory() if f.default_factory is not dataclasses.MISSING
                   else f.default)
        yield Declared(f.name, group, default, declaration)
