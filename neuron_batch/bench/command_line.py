"""RunSettings -> the `neuron-batch run ...` command line that gives them back, so every plan
option and sweep configuration can be reproduced by hand. Pure Python.

What is written comes from each setting's declaration (settings/declare.py `Written`): the
device, limits and max_num_seqs always (what a plan or sweep chose), the simulated target on
--device sim, every bucket list as the runtime resolved it, any other setting only where it
differs from its default, and nothing of where and how a run reports.
"""

from __future__ import annotations

import shlex
from typing import Any

from neuron_batch.choices import Choice
from neuron_batch.runtimes.prefix_grid import PREFIX_BUCKETS_KEY
from neuron_batch.settings import DECLARED, RunSettings
from neuron_batch.settings.declare import Kind, Written

#: Written first, the target's before the layout's: what a plan or sweep chose; then the rest
#: as declared.
_FIRST = (Written.ALWAYS, Written.ALWAYS_SIM)


def _value(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    if isinstance(value, Choice):
        return value.cli
    return str(value)


def run_command(settings: RunSettings, *, program: str = "neuron-batch run") -> str:
    """The command line for `settings`."""
    defaults = RunSettings.of(inputs=settings.inputs)
    parts = [program, *(shlex.quote(i) for i in settings.inputs)]
    resolved = settings.shapes().bucket_lists()
    ordered = sorted((d for d in DECLARED if d.flag is not None and "run" in d.setting.commands),
                     key=lambda d: (d.setting.written not in _FIRST, d.group != "target"))
    for d in ordered:
        flag, written, kind = f"--{d.flag}", d.setting.written, d.setting.kind
        value = getattr(settings, d.name)
        if written is Written.NEVER or (written is Written.ALWAYS_SIM and not settings.simulated):
            continue
        if written is Written.RESOLVED:
            # (NxDI's prefix list only when given: bench and plan sweep the other three, and
            # its default is fixed by --max-model-len)
            key = d.setting.plugin_key
            if key not in resolved or (key == PREFIX_BUCKETS_KEY and value is None):
                continue
            value = resolved[key][-1] if kind is Kind.INT else resolved[key]
        elif written is Written.CHANGED and value == getattr(defaults, d.name):
            continue
        if value is None or (kind in (Kind.FLAG, Kind.SWITCH) and value is False
                             and written is not Written.CHANGED):
            continue
        if kind is Kind.PREFIX_CACHING:     # (as weighed; auto, the default, is not written)
            parts.extend([flag, "on"] if value else [f"--no-{d.flag}"])
        elif kind is Kind.FLAG:
            parts.append(flag)
        elif kind is Kind.SWITCH:
            parts.append(flag if value else f"--no-{d.flag}")
        elif kind is Kind.MANY:
            for item in value:
                parts.extend([flag, shlex.quote(str(item))])
        else:
            parts.extend([flag, shlex.quote(_value(value))])
    return " ".join(parts)


def shell_lines(command: str, width: int, indent: str = "  ") -> list[str]:
    """`command` as lines of at most `width` that a shell reads as the one command: broken
    between options with a trailing backslash, continuation lines indented further."""
    words: list[str] = []   # an option and its value stay on one line
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
