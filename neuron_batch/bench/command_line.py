"""RunSettings -> the `neuron-batch run ...` command line that gives them back, so every plan
option can be reproduced by hand. Pure Python.

The device, instance, architecture, TP, limits, max_num_seqs and buckets are always written
(they are what a plan chose); any other setting only where it differs from the default.
"""

from __future__ import annotations

import shlex
from dataclasses import fields
from typing import Any

from neuron_batch.choices import Choice
from neuron_batch.config import (
    BUCKET_FIELDS,
    OPTION_NAMES,
    CostOptions,
    RunSettings,
    SimOptions,
)
from neuron_batch.prefix_grid import PREFIX_BUCKETS_KEY

#: RunSettings fields that say where and how a run reports, not what it runs.
_NOT_WRITTEN = {"output", "resume", "quiet", "max_runtime", "metrics_textfile", "inputs",
                "sim", "cost", "max_num_seqs", "shuffle", "seed", "limit"}
_ALWAYS = ("device", "max_model_len", "max_num_batched_tokens")
_ALWAYS_SIM = ("instance", "architecture", "tensor_parallel_size")


def _flag(name: str) -> str:
    return "--" + OPTION_NAMES.get(name, name).replace("_", "-")


def _value(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    if isinstance(value, Choice):
        return value.cli
    return str(value)


def run_command(settings: RunSettings, *, program: str = "neuron-batch run") -> str:
    """The command line for `settings`."""
    defaults = RunSettings(inputs=settings.inputs)
    parts = [program, *(shlex.quote(i) for i in settings.inputs)]

    def add(name: str, value: Any) -> None:
        if value is None:
            return
        if value is True:
            parts.append(_flag(name))
        elif value is not False:
            parts.extend([_flag(name), shlex.quote(_value(value))])

    for name in _ALWAYS:
        add(name, getattr(settings, name))
    if settings.simulated:
        for name in _ALWAYS_SIM:
            add(name, getattr(settings.sim, name))
        sim_defaults = SimOptions()
        for f in fields(SimOptions):
            if f.name not in _ALWAYS_SIM and getattr(settings.sim, f.name) != getattr(
                    sim_defaults, f.name):
                add(f.name, getattr(settings.sim, f.name))
    add("max_num_seqs", settings.max_num_seqs)
    # Every bucket list the runtime compiles, by its own flags (resolved defaults included, so
    # the line reproduces the run whatever the defaults become).
    # (NxDI's prefix list only when given: bench and plan sweep the other three, and the
    # default is fixed by --max-model-len)
    for key, values in settings.shapes().bucket_lists().items():
        if key != PREFIX_BUCKETS_KEY or settings.prefix_buckets is not None:
            add(BUCKET_FIELDS[key], values)
    for f in fields(RunSettings):
        if (f.name in _NOT_WRITTEN or f.name in _ALWAYS
                or f.name in BUCKET_FIELDS.values()):   # (written above, resolved)
            continue
        value = getattr(settings, f.name)
        if f.name == "prefix_caching":      # as weighed (auto, the default: not written)
            if value is not None:
                parts.extend(["--prefix-caching", "on"] if value else ["--no-prefix-caching"])
        elif value is False and getattr(defaults, f.name) is True:
            parts.append("--no-" + _flag(f.name)[2:])      # (--no-prefix-caching)
        elif value != getattr(defaults, f.name):
            add(f.name, value)
    cost_defaults = CostOptions()
    for name in ("pricing", "price_per_hour"):
        if getattr(settings.cost, name) != getattr(cost_defaults, name):
            add(name, getattr(settings.cost, name))
    if settings.shuffle:
        parts.append("--shuffle")
    if settings.shuffle or settings.seed != defaults.seed:
        add("seed", settings.seed)
    add("limit", settings.limit)
    return " ".join(parts)


def shell_lines(command: str, width: int, indent: str = "  ") -> list[str]:
    """`command` as lines of at most `width` that a shell reads as the one command: broken
    between options with a trailing backslash, continuation lines indented further."""
    words = []          # an option and its value stay on one line
    for word in (shlex.quote(word) for word in shlex.split(command)):
        if words and words[-1].startswith("--") and " " not in words[-1] \
                and not word.startswith("--"):
            words[-1] += " " + word
        else:
            words.append(word)
    lines, current = [], indent
    for word in words:
        candidate = current + word if current.strip() == "" else f"{current} {word}"
        if current.strip() and len(candidate) + 2 > width:
            lines.append(current + " \\")
            current = indent + "    " + word
        else:
            current = candidate
    return lines + [current]
