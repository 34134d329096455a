"""The compile-time model (compile_time.py) fitted to what is published, and how well it holds.

The published figures (../shared/notes/neuron-runtimes.md, "Compile time", with sources) are
few and none is per bucket. The fitted set is the one with a known, common setup: six dense
models in NxDI's contrib READMEs, compiled on trn1.32xlarge at batch 1, sequence 512 with
bucketing off (one context-encoding and one token-generation graph). Their times are taken
as trace + compile (the READMEs time `compile()`; shard-on-load means no sharding in it). Held
out: newer or differently set-up figures (optimum-neuron's Llama-3.1-8B on inf2.24xlarge with
neuronx-cc 2.26; Llama-3.1-405B on trn2), each predicted with the fewest graphs its setup can
have, so an over-estimate there is one for certain.

Fit: with tracing and the prefill ratio held, a graph's time is
    log(graph) = log(graph_s) + layer_exponent log(layers / 32)
                 + shape_exponent log(params per layer per rank / 1e8),
linear in the three unknowns: ordinary least squares on the logs (each point counts by its
relative error), solved exactly. Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .architectures import ARCHITECTURES, Architecture
from .compile_time import (
    DEFAULT_COMPILE,
    HOST_MEMORY_LIMIT_RATIO,
    REFERENCE_LAYERS,
    REFERENCE_PARAMS_PER_LAYER,
    CompileParams,
    estimate_startup,
)
from .fit import solve
from .hardware import INSTANCES, Instance

#: Held in the fit (no published figure sets them apart from a graph's compile time).
TRACE_S_PER_LAYER = 0.25
PREFILL_RATIO = 1.0
#: Shard-on-load + load of Llama-3.1-405B (fp8, about 405 GB) in NxDI's weights sharding
#: guide: 49 s + 187 s.
LOAD_GB_S = 405e9 / (49 + 187) / 1e9


def _shape(name: str, layers: int, hidden: int, inter: int, heads: int, kv: int, vocab: int,
           head_dim: int | None = None, bias: bool = False) -> Architecture:
    """A model's shapes, from its public config.json (only what a graph's size needs)."""
    return Architecture(name, layers, hidden, inter, heads, kv, head_dim or hidden // heads,
                        vocab, False, 4096, bias)


@dataclass(frozen=True)
class PublishedCompile:
    """One published compile time and the setup it was measured in."""

    name: str
    arch: Architecture
    tp: int
    measured_s: float
    prefill_graphs: int
    decode_graphs: int
    instance: Instance | None   # the host (for its workers), None: not in the table
    with_load: bool             # the figure includes loading the weights
    source: str


_CONTRIB = "NxDI contrib/models/*/README.md (trn1.32xlarge, batch 1, seq 512, bucketing off)"
#: The fitted set.
FITTED = (
    PublishedCompile("Llama-2-7B TP 2", ARCHITECTURES["Llama-2-7B"], 2, 362, 1, 1,
                     INSTANCES["trn1.32xlarge"], False, _CONTRIB),
    PublishedCompile("Qwen2-7B TP 2", ARCHITECTURES["Qwen2.5-7B"], 2, 426, 1, 1,
                     INSTANCES["trn1.32xlarge"], False, _CONTRIB),
    PublishedCompile("MiniCPM4-8B TP 2", _shape("MiniCPM4-8B", 32, 4096, 16384, 32, 2, 73448),
                     2, 275, 1, 1, INSTANCES["trn1.32xlarge"], False, _CONTRIB),
    PublishedCompile("OLMo-2-7B TP 8", _shape("OLMo-2-7B", 32, 4096, 11008, 32, 32, 100352),
                     8, 370, 1, 1, INSTANCES["trn1.32xlarge"], False, _CONTRIB),
    PublishedCompile("Mistral-Small-24B TP 8",
                     _shape("Mistral-Small-24B", 40, 5120, 32768, 32, 8, 131072, 128),
                     8, 385, 1, 1, INSTANCES["trn1.32xlarge"], False, _CONTRIB),
    PublishedCompile("Seed-OSS-36B TP 8",
                     _shape("Seed-OSS-36B", 64, 5120, 27648, 80, 8, 155136, 128),
                     8, 1007, 1, 1, INSTANCES["trn1.32xlarge"], False, _CONTRIB),
)
_LLAMA_405B = _shape("Llama-3.1-405B", 126, 16384, 53248, 128, 8, 128256)
#: Held out, each at the fewest graphs its setup can have (more graphs only add time).
HELD_OUT = (
    PublishedCompile("Llama-3.1-8B TP 2, first serve (2 graphs)", ARCHITECTURES["Llama-3.1-8B"],
                     2, 150, 1, 1, INSTANCES["inf2.24xlarge"], True,
                     "huggingface/optimum-neuron benchmark/vllm/llama-3.1-8b-inf2-report.md "
                     "(inf2.24xlarge, batch 4, seq 4096, neuronx-cc 2.26: 'compiled for ~2.5 "
                     "minutes')"),
    PublishedCompile("Llama-3.1-8B TP 2, first serve (NxDI's 6 + 6 lists)",
                     ARCHITECTURES["Llama-3.1-8B"], 2, 150, 6, 6, INSTANCES["inf2.24xlarge"], True,
                     "the same figure, with NxDI's default buckets for 4096"),
    PublishedCompile("Llama-3.1-405B TP 64, compile (2 graphs)", _LLAMA_405B, 64,
                     12 * 60 - (49 + 187), 1, 1, INSTANCES["trn2.48xlarge"], False,
                     "NxDI 2.23 release notes: compile + load 12 min with shard on load; "
                     "the weights sharding guide's 49 s + 187 s of it are load"),
)


def _graph_seconds(point: PublishedCompile) -> float:
    """What one graph took, by the held trace and prefill ratio (fitted points: 2 graphs)."""
    graphs = point.prefill_graphs + point.decode_graphs
    trace = graphs * point.arch.num_layers * TRACE_S_PER_LAYER
    return (point.measured_s - trace) / (point.decode_graphs + PREFILL_RATIO
                                         * point.prefill_graphs)


def _features(point: PublishedCompile) -> tuple[float, float]:
    arch = point.arch
    per_layer = arch.decoder_params_per_core(point.tp) / arch.num_layers
    return (math.log(arch.num_layers / REFERENCE_LAYERS),
            math.log(per_layer / REFERENCE_PARAMS_PER_LAYER))


def fit(points=FITTED) -> CompileParams:
    """graph_s, layer_exponent and shape_exponent by least squares on the logs of `points`;
    the rest held (TRACE_S_PER_LAYER, PREFILL_RATIO, LOAD_GB_S)."""
    rows = [(1.0, *_features(p)) for p in points]
    ys = [math.log(_graph_seconds(p)) for p in points]
    normal = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    rhs = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(3)]
    log_graph, layer_exponent, shape_exponent = solve(normal, rhs)
    return CompileParams(
        graph_s=round(math.exp(log_graph), 1), layer_exponent=round(layer_exponent, 3),
        shape_exponent=round(shape_exponent, 3), prefill_ratio=PREFILL_RATIO,
        trace_s_per_layer=TRACE_S_PER_LAYER, load_gb_s=round(LOAD_GB_S, 3),
        source=DEFAULT_COMPILE.source)


def predict(params: CompileParams, point: PublishedCompile) -> float:
    """The model's figure for what `point` measured (with the load when it includes it)."""
    startup = estimate_startup(point.arch, point.tp, "bf16", prefill_graphs=point.prefill_graphs,
                               decode_graphs=point.decode_graphs, instance=point.instance,
                               params=params)
    compile_s = startup.trace_s + startup.priority_s + startup.parallel_s
    return compile_s + (startup.load_s if point.with_load else 0.0)


def errors(params: CompileParams, points) -> list[tuple[PublishedCompile, float, float]]:
    """(point, predicted seconds, relative error) for each point."""
    out = []
    for point in points:
        predicted = predict(params, point)
        out.append((point, predicted, predicted / point.measured_s - 1.0))
    return out


def leave_one_out(points=FITTED) -> list[tuple[PublishedCompile, float, float]]:
    """Each fitted point predicted by a fit without it."""
    out = []
    for i, point in enumerate(points):
        params = fit(points[:i] + points[i + 1:])
        predicted = predict(params, point)
        out.append((point, predicted, predicted / point.measured_s - 1.0))
    return out


def markdown(params: CompileParams | None = None) -> str:
    """CALIBRATION.md's "Compile time" section."""
    params = params or fit()
    held = {p.name: (pred, err) for p, pred, err in leave_one_out()}
    lines = [
        "## Compile time",
        "The model (`compile_time.py`): every graph traced one after another "
        f"({params.trace_s_per_layer:g} s a layer, held: no figure is published), one "
        "token-generation graph compiled alone, the others at once over min(32, vCPUs) "
        "workers (NxDI's thread pool of min(32, vCPUs + 4), CPU-bound compiles), then the "
        f"weights sharded and loaded at {params.load_gb_s:g} GB/s. A decode graph takes "
        "graph_s x (layers / 32) ^ layer_exponent x (weights a layer a rank / 1e8) ^ "
        f"shape_exponent; a prefill graph {params.prefill_ratio:g} x that (held: -O1 against "
        "-O2, no figure published); the bucket length does not enter (the Beta plugin's "
        "docs: compile time scales linearly with the bucket count). Fitted by least squares "
        "on the logs (`compile_fit.py`; `scripts/compile_fit_report.py` prints this section, "
        "`scripts/calibration_report.py --write` writes it).",
        "",
        "| parameter | value | |",
        "|---|---|---|",
        f"| `graph_s` | {params.graph_s:g} s | one decode graph of 32 layers, 1e8 weights a "
        "layer a rank (fitted) |",
        f"| `layer_exponent` | {params.layer_exponent:g} | (fitted) |",
        f"| `shape_exponent` | {params.shape_exponent:g} | (fitted): the weights one rank "
        "holds do not change a graph's time (TP 2 and TP 8 of 7-8B models take alike) |",
        f"| `prefill_ratio` | {params.prefill_ratio:g} | (held) |",
        f"| `trace_s_per_layer` | {params.trace_s_per_layer:g} s | (held) |",
        f"| `load_gb_s` | {params.load_gb_s:g} | (held): Llama-3.1-405B's 49 s of shard on "
        "load + 187 s of load for about 405 GB of fp8 weights [c] |",
        "",
        "| figure | published | model | error | refitted without it |",
        "|---|---|---|---|---|",
    ]
    for point, predicted, error in errors(params, FITTED):
        loo_pred, loo_err = held[point.name]
        lines.append(f"| {point.name} [a] (fitted) | {point.measured_s:,.0f} s | "
                     f"{predicted:,.0f} s | {error:+.0%} | {loo_pred:,.0f} s ({loo_err:+.0%}) |")
    marks = ("[b]", "[b]", "[c]")
    for mark, (point, predicted, error) in zip(marks, errors(params, HELD_OUT)):
        lines.append(f"| {point.name} {mark} (held out) | {point.measured_s:,.0f} s | "
                     f"{predicted:,.0f} s | {error:+.0%} | |")
    fifteen = [estimate_startup(ARCHITECTURES["Mistral-7B"], tp, "bf16", prefill_graphs=n,
                                decode_graphs=n, instance=INSTANCES["inf2.48xlarge"],
                                params=params)
               for tp in (2, 24) for n in (1, 8)]
    totals = [s.total_s for s in fifteen if s.total_s is not None]   # (all: compiled fresh)
    low, high = min(totals), max(totals)
    lines += [
        "",
        f"[a] {_CONTRIB}; the times taken as trace + compile, no load.",
        "[b] huggingface/optimum-neuron `benchmark/vllm/llama-3.1-8b-inf2-report.md` "
        "(2026-08; inf2.24xlarge, batch 4, seq 4096, neuronx-cc 2.26): \"compiled for ~2.5 "
        "minutes ... before the server came up\", read as start-up with the load, at the "
        "fewest graphs it can have (2) and at NxDI's default lists for 4096 (6 + 6).",
        "[c] NxDI 2.23 release notes, Llama-3.1-405B on trn2 at TP 64: compile + load 12 min "
        "with shard on load, of which the weights sharding guide's 49 s + 187 s load; the "
        "rest taken as compile, at 2 graphs.",
        "",
        f"Held out too: AWS's hedged \"around 15min\" for a 15 GB model; the model gives "
        f"{low / 60:.0f}-{high / 60:.0f} min for Mistral-7B (14.5 GB) on inf2.48xlarge with "
        "2 to 16 graphs. Not modelled: mixture-of-experts models (Mixtral-8x7B's 1,208 s; "
        "Trinity's 2x at batch 4 against batch 1).",
        "",
        "What this says: the contrib figures scatter by about 1.5x between models of one size "
        "(275 to 426 s for 7-8B at TP 2), so one estimate is good to about that; the newest "
        "figures (neuronx-cc 2.26 on inf2, SDK 2.23 on trn2) are 2.5-4.3x below the model even "
        "at their fewest graphs: on a current SDK read the estimate as an upper bound. Either "
        "way a 7-8B model starts in minutes, not the hours of the previous rule (30 s per "
        "graph per GB of weights: 2.1 h for 16 graphs of an 8B model). `neuron-batch "
        "calibrate` replaces these values with a run's own (its engine log's phases) in the "
        "profile's `compile` section. A host whose memory is at most "
        f"{HOST_MEMORY_LIMIT_RATIO:.2f}x the weights (32 GiB for Llama-3.1-8B's 16 GB: killed "
        "on trn1.2xlarge, aws-neuron-sdk issue 1222) gets a warning and no compile estimate.",
    ]
    return "\n".join(lines) + "\n"


def refit_default() -> CompileParams:
    """DEFAULT_COMPILE as the fit gives it now (tests: the built-in values are the fit's)."""
    return replace(fit(), source=DEFAULT_COMPILE.source)
