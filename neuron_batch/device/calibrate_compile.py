"""A cost profile's `compile` section from a real run's start-up (`neuron-batch calibrate`).

A Neuron run's attempt records its start-up (job/startup.py): the seconds measured around the
engine's construction, and the phases its engine log states (device/compile_log.py). From one
that compiled (not served from the cache or the artifacts folder):
- `trace_s_per_layer` = the logged tracing / (graphs x layers);
- `graph_s` so that the model's priority graph takes the logged priority phase (the other
  graphs compile in the pool, their wall time the logged parallel phase: `prefill_ratio`
  follows when every graph in the pool is a prefill graph and they all ran at once);
- `load_gb_s` = weight bytes / the logged load (shard on load included);
and when the log states no phase, `graph_s` scaled so that the model's whole start-up is the
measured one (its tracing and load as modelled). What a run cannot show keeps the base
value. Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .architectures import Architecture
from .compile_time import (
    DEFAULT_COMPILE,
    CompileParams,
    compile_workers,
    estimate_startup,
    graph_times,
)
from .hardware import Instance


def fit_from_startup(startup: dict[str, Any], *, arch: Architecture, tp: int,
                     instance: Instance | None, prefill_graphs: int, decode_graphs: int,
                     weight_dtype: str = "bf16",
                     parallel: bool = True, base: CompileParams | None = None
                     ) -> tuple[CompileParams, str] | None:
    """(the compile section, a line saying what was read) from one attempt's `startup`
    record, or None when it holds nothing to fit (a start from the cache)."""
    base = base or DEFAULT_COMPILE
    if not startup or startup.get("compiled_before") or startup.get("from_cache"):
        return None
    phases = startup.get("phases") or {}
    graphs = prefill_graphs + decode_graphs
    changes: dict[str, float] = {}
    read: list[str] = []
    if phases.get("trace_s") and graphs:
        changes["trace_s_per_layer"] = phases["trace_s"] / (graphs * arch.num_layers)
        read.append(f"trace {phases['trace_s']:.0f} s")
    decode_s, _ = graph_times(base, arch, tp)
    if phases.get("priority_s") and decode_s > 0:
        changes["graph_s"] = base.graph_s * phases["priority_s"] / decode_s
        read.append(f"priority graph {phases['priority_s']:.0f} s")
        rest = graphs - 1
        workers = compile_workers(instance) if parallel else 1
        if (phases.get("parallel_s") and rest and decode_graphs == 1
                and rest <= workers):      # the pool held only prefill graphs, all at once
            changes["prefill_ratio"] = phases["parallel_s"] / phases["priority_s"]
            read.append(f"prefill graphs {phases['parallel_s']:.0f} s")
    load = phases.get("load_s") or phases.get("shard_s")
    if load:
        changes["load_gb_s"] = arch.weight_bytes(weight_dtype) / 1e9 / load
        read.append(f"load {load:.0f} s")
    if not changes and startup.get("measured_s"):
        model = estimate_startup(arch, tp, weight_dtype, prefill_graphs=prefill_graphs,
                                 decode_graphs=decode_graphs, instance=instance, params=base,
                                 parallel=parallel)
        graphs_s = model.priority_s + model.parallel_s
        measured = startup["measured_s"] - model.load_s - model.trace_s
        if graphs_s > 0 and measured > 0:
            changes["graph_s"] = base.graph_s * measured / graphs_s
            read.append(f"start-up {startup['measured_s']:.0f} s in all (no phase logged)")
    if not changes:
        return None
    fitted = replace(base, **{k: round(v, 4) for k, v in changes.items()},
                     source=f"from a run's start-up ({', '.join(read)}); the rest: {base.source}")
    return fitted, ", ".join(read)
