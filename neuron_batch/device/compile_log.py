"""What a Neuron engine's log says about its start-up: which graphs came from the compile
cache, which were compiled, and how long each phase of NxDI's build took.

The lines are the Neuron stack's own (read in neuronx-distributed's
`trace/model_builder.py` and libneuronxla's compile cache):
- "Generated all HLOs in X seconds"                 tracing, every graph
- "Done compilation for the priority HLO in X"      the priority graph, alone
- "Finished Compilation for all HLOs in X seconds"  the other graphs, in the pool
- "Done Sharding weights in X"                      sharding the weights
- "Finished weights loading in X"                   loading them
- "Using a cached neff at PATH"                     a graph served from the compile cache
- "Call compiler with cmd: ..."                     a graph neuronx-cc compiled
A log that has none of them (another plugin line, or the artifacts folder loaded whole)
yields counts of zero and no phases. Pure text parsing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
PHASES = {
    "trace_s": re.compile(r"Generated all HLOs in " + _NUMBER),
    "priority_s": re.compile(r"Done compilation for the priority HLO in " + _NUMBER),
    "parallel_s": re.compile(r"Finished Compilation for all HLOs in " + _NUMBER),
    "shard_s": re.compile(r"Done Sharding weights in " + _NUMBER),
    "load_s": re.compile(r"Finished weights loading in " + _NUMBER),
}
CACHED_NEFF = re.compile(r"Using a cached neff at")
COMPILER_CALL = re.compile(r"Call compiler with cmd")


def read_from(path: Path, offset: int = 0) -> str:
    """The log's text after byte `offset` (this attempt's part of an appended log)."""
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            return log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def parse_startup(text: str) -> dict[str, Any]:
    """Counts of cached and compiled graphs and the phase times the log states (summed when a
    phase appears more than once: several models built in one process)."""
    phases: dict[str, float] = {}
    for name, pattern in PHASES.items():
        found = [float(m.group(1)) for m in pattern.finditer(text)]
        if found:
            phases[name] = sum(found)
    cached = len(CACHED_NEFF.findall(text))
    compiled = len(COMPILER_CALL.findall(text))
    return {"cached_graphs": cached, "compiled_graphs": compiled, "phases": phases,
            "from_cache": cached > 0 and compiled == 0}
