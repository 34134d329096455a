"""Fit cost-profile parameters: to AWS's published inf2 figures, or to measured step times.

Both fits minimise the sum of squared log ratios (model / measured), so every row or step
counts by its relative error, with a small Nelder-Mead written here (the project does not
depend on scipy). Parameters are searched in transformed space: log for times, a logit
scaled to (0, MAX_EFFICIENCY) for efficiencies, so every candidate is physical.

`collective_latency_s` is never fitted: at one model and one TP degree it is a constant per
step, indistinguishable from the fixed costs. It is held at COLLECTIVE_LATENCY_PRIOR_S (or at
the start profile's value) and the fixed costs absorb the rest.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from .architectures import get_architecture
from .cost_model import (
    DEFAULT_COMPILE_S_PER_GRAPH_PER_GB,
    CostProfile,
    StepCostModel,
    load_profile,
)
from .hardware import INSTANCES

#: The parameters a fit moves, in this order.
FIT_PARAMS = ("prefill_fixed_s", "decode_fixed_s", "weight_bw_efficiency",
              "kv_bw_efficiency", "compute_efficiency")
#: Held latency of one all-reduce stage (an assumption of order tens of microseconds per
#: NeuronLink all-reduce; at TP 24 with 32 layers it contributes 64 * 5 * 10 us = 3.2 ms a step).
COLLECTIVE_LATENCY_PRIOR_S = 10e-6
#: Upper bound on any fitted efficiency: no engine sustains its full peak.
MAX_EFFICIENCY = 0.9

#: AWS Neuron SDK 2.18 performance tables, inf2.48xlarge, transformers-neuronx (copy of
#: /work/shared/calibration/inf2-published.csv, so the package needs no outside file).
PUBLISHED_INF2_CSV = """\
model,instance,tp_degree,batch_size,max_seq_len,input_len,output_len,output_tok_per_s,ttft_p50_ms,tpot_p50_ms,weight_dtype,framework,neuron_sdk
Llama-3-8B,Inf2.48xlarge,24,1,8192,128,8064,144.98,29.47,7.41,int8,Transformers NeuronX,2.18.1
Llama-3-8B,Inf2.48xlarge,24,1,8192,4096,4096,133.63,209.37,7.47,int8,Transformers NeuronX,2.18.1
Llama-3-8B,Inf2.48xlarge,24,1,4096,128,3968,161.67,25,6.42,int8,Transformers NeuronX,2.18.1
Llama-3-8B,Inf2.48xlarge,24,1,4096,2048,2048,153.58,101.81,6.5,int8,Transformers NeuronX,2.18.1
Llama-2-7b,Inf2.48xlarge,24,1,4096,128,3968,156.1281689,27.63772011,6.46972656,bf16,Transformers NeuronX,2.18.0
Llama-2-7b,Inf2.48xlarge,24,1,8192,128,8064,145.1665497,29.20985222,7.34019279,bf16,Transformers NeuronX,2.18.0
Llama-3-8B,Inf2.48xlarge,24,8,8192,4096,4096,521.96,1992.59,15.31,int8,Transformers NeuronX,2.18.1
Llama-3-8B,Inf2.48xlarge,24,8,4096,128,3968,859.09,66.02,10.45,int8,Transformers NeuronX,2.18.1
"""

#: transformers-neuronx pads both the prompt and the decode KV window to power-of-two
#: buckets from 128 up to the compiled max_seq_len.
MIN_BUCKET = 128


@dataclass(frozen=True, slots=True)
class PublishedRow:
    model: str
    instance: str
    tp: int
    batch: int
    max_seq_len: int
    input_len: int
    output_len: int
    throughput: float       # output tokens/s
    ttft_s: float
    tpot_s: float
    weight_dtype: str

    @property
    def label(self) -> str:
        return (f"{self.model} {self.weight_dtype} b{self.batch} msl{self.max_seq_len} "
                f"{self.input_len}/{self.output_len}")


def read_published(csv_path: str | Path | None = None) -> list[PublishedRow]:
    """Rows of the published CSV (the embedded copy when csv_path is None)."""
    text = PUBLISHED_INF2_CSV if csv_path is None else Path(csv_path).read_text(encoding="utf-8")
    return [PublishedRow(r["model"], r["instance"].lower(), int(r["tp_degree"]),
                         int(r["batch_size"]), int(r["max_seq_len"]), int(r["input_len"]),
                         int(r["output_len"]), float(r["output_tok_per_s"]),
                         float(r["ttft_p50_ms"]) / 1e3, float(r["tpot_p50_ms"]) / 1e3,
                         r["weight_dtype"])
            for r in csv.DictReader(io.StringIO(text))]


def pow2_bucket(n: int, maximum: int) -> int:
    """Smallest power of two >= n (at least MIN_BUCKET), capped at maximum."""
    return min(maximum, max(MIN_BUCKET, 1 << max(0, n - 1).bit_length()))


def decode_groups(row: PublishedRow,
                  context_buckets: bool = True) -> tuple[list[tuple[int, int]], int]:
    """The row's decode steps as (KV tokens read per sequence, number of steps), and the KV
    read by the median step. Step k (k = 1 .. output_len-1) holds input_len + k tokens; with
    context_buckets the graph reads the whole power-of-two window holding them."""
    counts: dict[int, int] = {}
    for k in range(1, row.output_len):
        ctx = row.input_len + k
        key = pow2_bucket(ctx, row.max_seq_len) if context_buckets else ctx
        counts[key] = counts.get(key, 0) + 1
    groups = sorted(counts.items())
    middle, seen = (row.output_len - 2) // 2, 0     # time grows with KV: median step by KV
    for ctx, count in groups:
        seen += count
        if seen > middle:
            return groups, ctx
    return groups, groups[-1][0]


def predict_row(model: StepCostModel, row: PublishedRow,
                groups: tuple[list[tuple[int, int]], int] | None = None) -> dict[str, float]:
    """Modelled TTFT, median TPOT and output throughput of one published row (static batch:
    the batch prefilled together, then decoded together)."""
    steps, median_ctx = groups or decode_groups(row)
    b = row.batch
    prompt = pow2_bucket(row.input_len, row.max_seq_len)
    ttft = model.prefill_time(b * prompt, 0, num_seqs=b)
    decode_total = sum(count * model.decode_time(b, b * ctx) for ctx, count in steps)
    return {"ttft_s": ttft, "tpot_s": model.decode_time(b, b * median_ctx),
            "throughput": b * row.output_len / (ttft + decode_total)}


def row_errors(predicted: dict[str, float], row: PublishedRow) -> dict[str, float]:
    """Relative errors (model - published) / published."""
    return {"ttft": predicted["ttft_s"] / row.ttft_s - 1,
            "tpot": predicted["tpot_s"] / row.tpot_s - 1,
            "throughput": predicted["throughput"] / row.throughput - 1}


# -- the optimiser ---------------------------------------------------------------------------

def nelder_mead(f: Callable[[list[float]], float], x0: Sequence[float], step: float = 0.5,
                tol: float = 1e-12, max_iter: int = 4000, restarts: int = 6) -> list[float]:
    """Minimise f from x0 (standard reflect/expand/contract/shrink), restarting the simplex
    around the best point until a restart no longer improves it."""
    best = list(x0)
    best_f = f(best)
    for _ in range(restarts):
        n = len(best)
        simplex = [best] + [[v + (step if i == j else 0.0) for j, v in enumerate(best)]
                            for i in range(n)]
        values = [f(p) for p in simplex]
        for _ in range(max_iter):
            order = sorted(range(n + 1), key=values.__getitem__)
            simplex, values = [simplex[i] for i in order], [values[i] for i in order]
            if values[-1] - values[0] <= tol * (abs(values[0]) + tol):
                break
            centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
            worst = simplex[-1]
            reflect = [c + (c - w) for c, w in zip(centroid, worst)]
            fr = f(reflect)
            if fr < values[0]:
                expand = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
                fe = f(expand)
                simplex[-1], values[-1] = (expand, fe) if fe < fr else (reflect, fr)
            elif fr < values[-2]:
                simplex[-1], values[-1] = reflect, fr
            else:
                inside = fr >= values[-1]
                contract = [c + (0.5 * (w - c) if inside else 0.5 * (r - c))
                            for c, w, r in zip(centroid, worst, reflect)]
                fc = f(contract)
                if fc < min(fr, values[-1]):
                    simplex[-1], values[-1] = contract, fc
                else:                                   # shrink towards the best point
                    simplex = [simplex[0]] + [[b + 0.5 * (v - b) for b, v in zip(simplex[0], p)]
                                              for p in simplex[1:]]
                    values = [values[0]] + [f(p) for p in simplex[1:]]
        i = min(range(n + 1), key=values.__getitem__)
        improved = values[i] < best_f - tol * (abs(best_f) + tol)
        best, best_f = simplex[i], values[i]
        if not improved:
            break
        step *= 0.5
    return best


def _encode(profile: CostProfile, names: Sequence[str]) -> list[float]:
    out = []
    for name in names:
        value = getattr(profile, name)
        if name.endswith("_efficiency"):
            frac = min(max(value / MAX_EFFICIENCY, 1e-6), 1 - 1e-6)
            out.append(math.log(frac / (1 - frac)))
        else:
            out.append(math.log(max(value, 1e-9)))
    return out


def _decode(base: CostProfile, names: Sequence[str], x: Sequence[float]) -> CostProfile:
    changes = {}
    for name, v in zip(names, x):
        v = max(-40.0, min(40.0, v))
        changes[name] = (MAX_EFFICIENCY / (1 + math.exp(-v)) if name.endswith("_efficiency")
                         else math.exp(v))
    return base.replace(**changes)


def _fit(objective: Callable[[CostProfile], float], start: CostProfile,
         names: Sequence[str]) -> CostProfile:
    x = nelder_mead(lambda x: objective(_decode(start, names, x)), _encode(start, names))
    return _decode(start, names, x)


# -- fitting to the published figures --------------------------------------------------------

def _row_model(profile: CostProfile, row: PublishedRow) -> StepCostModel:
    return StepCostModel(profile, row.instance, get_architecture(row.model), row.tp,
                         row.weight_dtype)


def default_profile(instance: str = "inf2.48xlarge") -> CostProfile:
    """A neutral starting point for fits (not a calibrated profile)."""
    return CostProfile(instance, prefill_fixed_s=0.01, decode_fixed_s=0.001,
                       weight_bw_efficiency=0.5, kv_bw_efficiency=0.3, compute_efficiency=0.3,
                       collective_latency_s=COLLECTIVE_LATENCY_PRIOR_S,
                       compile_s_per_graph_per_gb=DEFAULT_COMPILE_S_PER_GRAPH_PER_GB,
                       source="default starting point")


def fit_published(csv_path: str | Path | None = None, instance: str = "inf2.48xlarge",
                  select: Callable[[PublishedRow], bool] | None = None,
                  context_buckets: bool = True, start: CostProfile | None = None) -> CostProfile:
    """Fit FIT_PARAMS to the published rows that `select` keeps (all by default): each row
    contributes its log TTFT error and its log median-TPOT error."""
    rows = [r for r in read_published(csv_path)
            if r.instance == instance and (select is None or select(r))]
    if not rows:
        raise ValueError(f"no published rows for {instance} to fit")
    prepared = [(r, decode_groups(r, context_buckets)) for r in rows]

    def objective(profile: CostProfile) -> float:
        total = 0.0
        for row, groups in prepared:
            pred = predict_row(_row_model(profile, row), row, groups)
            total += (math.log(pred["ttft_s"] / row.ttft_s) ** 2
                      + math.log(pred["tpot_s"] / row.tpot_s) ** 2)
        return total

    fitted = _fit(objective, start or default_profile(instance), FIT_PARAMS)
    used = "all rows" if select is None else f"{len(rows)} selected rows"
    return fitted.replace(source=f"fit to AWS published {instance} figures (Neuron SDK 2.18, "
                                 f"transformers-neuronx), {used}, "
                                 f"context_buckets={context_buckets}")


def evaluate_published(profile: CostProfile, csv_path: str | Path | None = None,
                       context_buckets: bool = True) -> list[dict[str, Any]]:
    """Published vs modelled figures for every row of the profile's instance."""
    table = []
    for row in read_published(csv_path):
        if row.instance != profile.instance:
            continue
        pred = predict_row(_row_model(profile, row), row, decode_groups(row, context_buckets))
        table.append({"row": row, **pred, "error": row_errors(pred, row)})
    return table


def median_abs_errors(table: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Median |relative error| of TTFT, TPOT and throughput over evaluated rows."""
    table = list(table)
    return {k: median(abs(entry["error"][k]) for entry in table)
            for k in ("ttft", "tpot", "throughput")}


def holdout(select_fit: Callable[[PublishedRow], bool], csv_path: str | Path | None = None,
            instance: str = "inf2.48xlarge") -> tuple[CostProfile, list[dict[str, Any]]]:
    """Fit on the rows `select_fit` keeps; return the fit and the evaluation of the others."""
    profile = fit_published(csv_path, instance, select=select_fit)
    held = [e for e in evaluate_published(profile, csv_path) if not select_fit(e["row"])]
    return profile, held


def leave_one_out(csv_path: str | Path | None = None,
                  instance: str = "inf2.48xlarge") -> list[dict[str, Any]]:
    """Each row predicted by a fit to all the other rows."""
    out = []
    for left_out in read_published(csv_path):
        if left_out.instance == instance:
            out += holdout(lambda r, x=left_out: r != x, csv_path, instance)[1]
    return out


def derive_profile(base: CostProfile, instance: str) -> CostProfile:
    """Another instance's profile from a fitted one. The parameters are per NeuronCore
    (fractions of per-core peaks, per-step latencies), so they carry over to any instance
    built from the same NeuronCore-v2; the hardware table supplies the rest."""
    if instance == base.instance:
        return base
    note = ("same Inferentia2 chip and NeuronCore-v2" if instance.startswith("inf2")
            else "EXTRAPOLATION: Trainium's NeuronCore-v2 assumed to reach the efficiencies "
                 "fitted on Inferentia2; no trn1 measurement was used")
    return base.replace(instance=instance, source=f"derived from {base.instance} ({note}); "
                                                 f"base: {base.source}")


def builtin_profiles(base: CostProfile, digits: int = 4) -> dict[str, CostProfile]:
    """Profiles for every instance from `base`, rounded to `digits` significant digits (the
    fit is not better than that, and the JSON files stay readable)."""
    rounded = base.replace(**{n: float(f"{getattr(base, n):.{digits}g}") for n in FIT_PARAMS})
    return {name: derive_profile(rounded, name) for name in INSTANCES}


# -- fitting to measured steps ---------------------------------------------------------------

def fit_from_steps(steps: Iterable[Any], instance: str, arch: Any, tp: int,
                   weight_dtype: str = "bf16", start_profile: CostProfile | None = None,
                   kv_dtype: str = "bf16") -> CostProfile:
    """Fit FIT_PARAMS to measured step durations (t_end - t_start) of StepRecord-like objects
    from one run configuration. A fixed cost whose kind has no steps keeps its start value."""
    durations: dict[tuple[str, int, int], list[float]] = {}
    for s in steps:
        if s.kind not in ("prefill", "decode") or s.t_end is None or s.t_end <= s.t_start:
            continue
        if s.kind == "prefill":
            padded = s.num_tokens_padded or s.num_tokens
        else:
            padded = s.num_seqs_padded or s.num_seqs
        durations.setdefault((s.kind, padded, s.context_tokens), []).append(s.t_end - s.t_start)
    if not durations:
        raise ValueError("no finished prefill or decode steps to fit")
    # Identical shapes fold into one term: the log of their geometric mean, weighted by count.
    shapes = [(kind, padded, ctx, len(ts), sum(math.log(t) for t in ts) / len(ts))
              for (kind, padded, ctx), ts in durations.items()]
    kinds = {kind for kind, *_ in shapes}
    names = [n for n in FIT_PARAMS if not (n == "prefill_fixed_s" and "prefill" not in kinds)
             and not (n == "decode_fixed_s" and "decode" not in kinds)]
    start = start_profile or _start_for(instance)

    def objective(profile: CostProfile) -> float:
        model = StepCostModel(profile, instance, arch, tp, weight_dtype, kv_dtype)
        total = 0.0
        for kind, padded, ctx, count, log_t in shapes:
            if kind == "prefill":
                t = model.prefill_time(padded, ctx)
            else:
                t = model.decode_time(padded, ctx)
            total += count * (math.log(t) - log_t) ** 2
        return total

    fitted = _fit(objective, start, names)
    n = sum(count for *_, count, _ in shapes)
    return fitted.replace(source=f"fit to {n} measured steps ({', '.join(sorted(kinds))}) on "
                                 f"{instance}, TP {tp}, {weight_dtype} weights")


def _start_for(instance: str) -> CostProfile:
    try:
        return load_profile(instance)
    except (FileNotFoundError, OSError):
        return default_profile(instance)
