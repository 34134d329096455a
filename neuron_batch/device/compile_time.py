"""How long a Neuron engine takes to start: tracing, compiling what is not compiled yet,
sharding and loading the weights. Arithmetic only (microseconds), no vLLM.

The shape follows NxDI's build (neuronx-distributed `ModelBuilder`, 2.26-2.28; sources in
../shared/notes/neuron-runtimes.md, "Compile time"):

    start-up = trace + priority + parallel + load            (graphs compiled fresh)
             = load                                          (graphs compiled before)

    trace     every graph's HLO traced one after another: graphs x layers x trace_s_per_layer
    priority  one token-generation graph compiled alone (with weight-layout optimisation)
    parallel  every other graph submitted at once to a thread pool of min(32, vCPUs + 4)
              workers; compiles are CPU-bound, so at most vCPUs of them run at full speed:
              the makespan of the graphs over min(32, vCPUs) workers
    load      sharding (on load, the default since SDK 2.23) and loading the weights:
              weight bytes / load_gb_s. Weights are graph inputs, so they drive this, not
              the compile.

One graph's compile time scales with what the graph is:
    decode graph  = graph_s x (layers / 32) ** layer_exponent
                            x (decoder params per layer per rank / 1e8) ** shape_exponent
    prefill graph = prefill_ratio x decode graph
and not with its bucket length (the Beta plugin's docs: "compile time scales linearly with
the bucket count"). A runtime that compiles its graphs one after another (the Beta plugin,
`Runtime.parallel_compile` False) has one worker and no priority graph.

A host whose memory cannot compile the model, by the one published limit (Llama-3.1-8B, 16 GB
of bf16 weights, killed while tracing on trn1.2xlarge's 32 GiB: aws-neuron-sdk issue 1222),
gets no compile estimate but a warning; graphs compiled elsewhere still load there.

The values are fitted to the published figures in the note (device/compile_fit.py; fit and
held-out errors in CALIBRATION.md, "Compile time"); a cost profile's `compile` section
carries a user's own (`neuron-batch calibrate` reads them from a run's engine log).
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from .architectures import Architecture
from .hardware import GIB, Instance

#: Python's ThreadPoolExecutor default, which NxDI's ModelBuilder uses: min(32, cpus + 4).
POOL_CAP = 32
POOL_EXTRA = 4
#: The reference graph `graph_s` is for: 32 decoder layers, 1e8 decoder weights a layer on
#: one rank (Llama-2-7B at TP 2 holds 1.01e8).
REFERENCE_LAYERS = 32
REFERENCE_PARAMS_PER_LAYER = 1e8
#: Host memory at or below this many bytes per byte of weights cannot compile the model:
#: Llama-3.1-8B's 16.06 GB of bf16 weights were killed on trn1.2xlarge's 32 GiB
#: (aws-neuron-sdk issue 1222). The only published limit; above it nothing is known.
HOST_MEMORY_LIMIT_RATIO = 32 * GIB / 16.06e9


class CompileProfileError(ValueError):
    """A cost profile's `compile` section that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class CompileParams:
    """The compile-time model's parameters (a cost profile's `compile` section)."""

    graph_s: float              # one decode graph of the reference shape, compiled alone
    layer_exponent: float       # graph time ~ (layers / 32) ** this
    shape_exponent: float       # graph time ~ (params per layer per rank / 1e8) ** this
    prefill_ratio: float        # a prefill graph (-O1) against a decode graph (-O2)
    trace_s_per_layer: float    # tracing one graph's HLO, per decoder layer
    load_gb_s: float            # sharding on load and loading: GB of weights a second
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "compile") -> CompileParams:
        """From a profile's `compile` section; CompileProfileError naming `where.field` for a
        missing, unknown or malformed field."""
        if not isinstance(data, dict):
            raise CompileProfileError(f"{where} must be an object with "
                                      f"{', '.join(NUMBER_FIELDS)}, got {data!r}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise CompileProfileError(f"{where}: unknown field(s) {', '.join(unknown)}; "
                                      f"expected {', '.join(names)}")
        values: dict[str, Any] = {}
        for name in NUMBER_FIELDS:
            if name not in data:
                raise CompileProfileError(f"{where}.{name} is missing ({FIELD_HELP[name]})")
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise CompileProfileError(f"{where}.{name} must be a number, got {value!r}")
            if not math.isfinite(value) or (value <= 0 and not name.endswith("exponent")):
                raise CompileProfileError(f"{where}.{name} must be a positive number, got "
                                          f"{value!r}")
            values[name] = float(value)
        source = data.get("source", "")
        if not isinstance(source, str):
            raise CompileProfileError(f"{where}.source must be text, got {source!r}")
        return cls(**values, source=source)


NUMBER_FIELDS = ("graph_s", "layer_exponent", "shape_exponent", "prefill_ratio",
                 "trace_s_per_layer", "load_gb_s")
FIELD_HELP = {
    "graph_s": "seconds to compile one decode graph of 32 layers, 1e8 weights a layer a rank",
    "layer_exponent": "how graph time grows with layers",
    "shape_exponent": "how graph time grows with the weights one rank holds",
    "prefill_ratio": "a prefill graph's compile time over a decode graph's",
    "trace_s_per_layer": "seconds to trace one graph, per decoder layer",
    "load_gb_s": "GB of weights sharded and loaded a second",
}

#: The fit to the published figures (compile_fit.py; CALIBRATION.md, "Compile time").
DEFAULT_COMPILE = CompileParams(
    graph_s=172.5, layer_exponent=1.293, shape_exponent=-0.001, prefill_ratio=1.0,
    trace_s_per_layer=0.25, load_gb_s=1.716,
    source="fit to 6 NxDI contrib compile times (trn1.32xlarge, 2 graphs each); trace held "
           "at 0.25 s a layer (none published), prefill as a decode graph (none published), "
           "load at Llama-3.1-405B's shard-on-load + load rate (NxDI weights sharding guide)")


@dataclass(frozen=True, slots=True)
class Startup:
    """One engine's start-up, as estimated. `compile_s` / `total_s` are None where the host
    cannot compile the model (`host_warning`) and the graphs are not compiled yet."""

    graphs: int
    prefill_graphs: int
    decode_graphs: int
    workers: int                # compile jobs at full speed at once
    trace_s: float
    priority_s: float
    parallel_s: float
    load_s: float
    compiled: bool              # the graphs were compiled before: load only
    host_warning: str | None = None

    @property
    def compile_s(self) -> float | None:
        if self.compiled:
            return 0.0
        if self.host_warning is not None:
            return None
        return self.trace_s + self.priority_s + self.parallel_s

    @property
    def total_s(self) -> float | None:
        compile_s = self.compile_s
        return None if compile_s is None else compile_s + self.load_s

    def to_dict(self) -> dict[str, Any]:
        # (by hand: dataclasses.asdict costs ten times as much, and plan asks thousands)
        return {"graphs": self.graphs, "prefill_graphs": self.prefill_graphs,
                "decode_graphs": self.decode_graphs, "workers": self.workers,
                "trace_s": self.trace_s, "priority_s": self.priority_s,
                "parallel_s": self.parallel_s, "load_s": self.load_s,
                "compiled": self.compiled, "host_warning": self.host_warning,
                "compile_s": self.compile_s, "total_s": self.total_s}


def compile_workers(instance: Instance | None) -> int:
    """Compile jobs that run at full speed at once on the host: NxDI's pool has
    min(32, vCPUs + 4) threads, each running one CPU-bound neuronx-cc, so min(32, vCPUs).
    Unknown host: the pool's cap."""
    if instance is None:
        return POOL_CAP
    vcpus = instance.vcpus
    return max(1, min(POOL_CAP, vcpus + POOL_EXTRA, vcpus))


def host_memory_warning(inst: Instance | None, arch: Architecture,
                        weight_dtype: str = "bf16") -> str | None:
    """Why this host cannot compile the model (the published limit), or None."""
    if inst is None:
        return None
    weights = arch.weight_bytes(weight_dtype)
    if inst.host_memory_gib * GIB > HOST_MEMORY_LIMIT_RATIO * weights:
        return None
    return (f"{inst.name}'s {inst.host_memory_gib} GiB of host memory cannot compile "
            f"{arch.name} ({weights / 1e9:.1f} GB of {weight_dtype} weights): compiling an "
            f"8B model with 32 GiB was killed for want of host memory (aws-neuron-sdk issue "
            f"1222), and this host has at most as much per byte of weights. Compile on a "
            f"larger host and bring the artifacts (--compiled-artifacts), or count the graphs "
            f"as compiled (--compiled)")


def graph_times(params: CompileParams, arch: Architecture, tp: int) -> tuple[float, float]:
    """(decode graph, prefill graph) compile seconds for this model at TP `tp`."""
    layers = arch.num_layers
    per_layer = arch.decoder_params_per_core(tp) / layers
    decode = (params.graph_s * (layers / REFERENCE_LAYERS) ** params.layer_exponent
              * (per_layer / REFERENCE_PARAMS_PER_LAYER) ** params.shape_exponent)
    return decode, decode * params.prefill_ratio


def makespan(times: list[float], workers: int) -> float:
    """Wall time of independent jobs on `workers` workers, each job to the first free one
    (submission order, as a thread pool takes them)."""
    if not times:
        return 0.0
    free = [0.0] * min(max(workers, 1), len(times))
    for job in times:
        heapq.heapreplace(free, free[0] + job)
    return max(free)


def estimate_startup(arch: Architecture, tp: int, weight_dtype: str, *,
                     prefill_graphs: int, decode_graphs: int,
                     instance: Instance | None = None,
                     params: CompileParams | None = None, parallel: bool = True,
                     compiled: bool = False) -> Startup:
    """The start-up of one engine compiling `prefill_graphs` + `decode_graphs` graphs on
    `instance`'s host (None: a host with the pool's 32 workers and no memory limit).
    `parallel`: the runtime compiles in a pool (NxDI) or one graph after another. `compiled`:
    the graphs are compiled already (the artifacts folder or compile cache holds them)."""
    return _estimate(arch, tp, weight_dtype, prefill_graphs, decode_graphs, instance,
                     params or DEFAULT_COMPILE, parallel, compiled)


@functools.lru_cache(maxsize=8192)
def _estimate(arch: Architecture, tp: int, weight_dtype: str, prefill_graphs: int,
              decode_graphs: int, instance: Instance | None, params: CompileParams, parallel: bool,
              compiled: bool) -> Startup:
    """estimate_startup, remembered (a plan asks the same few shapes thousands of times)."""
    load = arch.weight_bytes(weight_dtype) / (params.load_gb_s * 1e9)
    workers = compile_workers(instance) if parallel else 1
    graphs = prefill_graphs + decode_graphs
    if compiled:
        return Startup(graphs, prefill_graphs, decode_graphs, workers, 0.0, 0.0, 0.0, load,
                       True)
    decode_s, prefill_s = graph_times(params, arch, tp)
    trace = graphs * arch.num_layers * params.trace_s_per_layer
    # the priority graph is a token-generation one (the first decode graph)
    jobs = [prefill_s] * prefill_graphs + [decode_s] * decode_graphs
    if decode_graphs:
        jobs.remove(decode_s)
        priority = decode_s
    else:
        priority = jobs.pop(0) if jobs else 0.0
    rest = makespan(jobs, workers)
    return Startup(graphs, prefill_graphs, decode_graphs, workers, trace, priority, rest,
                   load, False, host_memory_warning(instance, arch, weight_dtype))


def compile_footprint(num_prefill_buckets: int, num_decode_buckets: int,
                      arch: Architecture, weight_dtype: str = "bf16", tp: int | None = None,
                      profile: Any = None,  # a cost_model.CostProfile (its compile_params)
                      num_graphs: int | None = None, *, instance: Instance | None = None,
                      runtime: Any = None, compiled: bool = False) -> dict[str, Any]:
    """Graphs to compile and the estimated start-up (compile_time.py): tracing every graph,
    compiling what is not compiled yet (`compiled`: none), sharding and loading the weights.
    `estimated_compile_s` is that start-up (None where the host's memory cannot compile the
    model: `host_warning`), `startup` its parts. `num_graphs`: the runtime's own count
    (runtime.Shapes.num_graphs), the graphs past the prefill buckets decode graphs;
    `instance`: the host, for its compile workers and memory (None: 32 workers); `runtime`:
    Runtime.parallel_compile (None: in parallel, as NxDI)."""
    graphs = num_graphs if num_graphs is not None else num_prefill_buckets + num_decode_buckets
    prefill = min(num_prefill_buckets, graphs)
    params = profile.compile_params if profile is not None else DEFAULT_COMPILE
    startup = estimate_startup(arch, tp or 1, weight_dtype, prefill_graphs=prefill,
                               decode_graphs=graphs - prefill, instance=instance, params=params,
                               parallel=True if runtime is None else runtime.parallel_compile,
                               compiled=compiled)
    per_graph = None if graphs == 0 or startup.compile_s is None else startup.compile_s / graphs
    return {"graphs": graphs, "per_graph_s": per_graph,
            "estimated_compile_s": startup.total_s, "tp": tp, "compiled": compiled,
            "startup": startup.to_dict(), "host_warning": startup.host_warning}
