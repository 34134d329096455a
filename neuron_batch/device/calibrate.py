"""Fit cost-profile parameters: to published benchmark rows, or to measured step times.

Both fits are least squares on log ratios (model / measured), so every row or step counts
by its relative error (Levenberg-Marquardt, fit.py). One profile serves every instance: its
parameters are per NeuronCore-v2 (Inferentia2 and Trainium use the same core), and the
instance table supplies what differs (core count, link bandwidth).

Published rows: each contributes its log error on median TPOT, on output throughput, and,
weighted by TTFT_WEIGHT, on TTFT. Cross-validation (leave one row, one model or one
instance family out) refits without the held-out rows and predicts them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from . import fit
from .architectures import ARCHITECTURES, Architecture
from .compile_time import DEFAULT_COMPILE
from .cost_model import (
    QUANTIZED_DTYPES,
    CostProfile,
    StepCostModel,
    load_profile,
)
from .fit import MAX_EFFICIENCY, nelder_mead  # noqa: F401  (re-exported)
from .hardware import INSTANCES, Instance
from .published import (  # noqa: F401  (re-exported: the calibration API)
    DEFAULT_ATTENDED,
    PUBLISHED_INF2_CSV,
    PUBLISHED_MORE_CSV,
    PublishedRow,
    decode_groups,
    evaluate_rows,
    max_abs_errors,
    median_abs_errors,
    pow2_bucket,
    predict_row,
    read_published,
    row_errors,
    row_model,
)

#: The parameters a published fit moves, in this order. kv_bw_efficiency is tied to
#: weight_bw_efficiency (one HBM; the published rows never make KV traffic the larger side
#: of a step, so they cannot set it apart).
FIT_PARAMS = ("prefill_fixed_s", "decode_fixed_s", "weight_bw_efficiency", "compute_efficiency",
              "attention_efficiency", "collective_latency_s", "quantized_weight_bytes")
#: Held at their start value by every fit (the `compile` section is fitted apart:
#: compile_fit.py, and calibrate_compile.py for a run's engine log).
HELD_PARAMS: tuple[str, ...] = ()
#: What a fit to measured steps of one configuration moves. One TP degree and one dtype:
#: collective latency is then a constant per step (the fixed costs absorb it) and the cost of
#: a quantized weight cannot be told from the weight bandwidth, so both are held.
STEP_FIT_PARAMS = ("prefill_fixed_s", "decode_fixed_s", "weight_bw_efficiency",
                   "kv_bw_efficiency", "compute_efficiency", "attention_efficiency")
#: Weight of the TTFT error against TPOT and throughput: TTFT includes host work the model
#: does not describe, and the targets are TPOT and throughput.
TTFT_WEIGHT = 0.3
#: Held bytes per int8/fp8 weight when a fit has no quantized row to set it: the cautious
#: reading that weight-only quantization halves memory but not decode time (the weights are
#: dequantized to bf16 on the way to the TensorEngine). See CALIBRATION.md for how much the
#: Llama-3-8B rows depend on it.
QUANTIZED_WEIGHT_BYTES_PRIOR = 2.0
#: Starting points tried by every fit (overrides of its start profile). The max of
#: HBM time and engine time has kinks: started with attention too fast to show, a fit sees no
#: gradient towards it and stops on the wrong side. These starts make it visible.
STARTS: tuple[dict[str, float], ...] = (
    {},
    {"attention_efficiency": 0.1 / 128, "collective_latency_s": 3e-6},
    {"attention_efficiency": 0.25 / 128, "decode_fixed_s": 3e-3, "compute_efficiency": 0.1},
)


#: Relative cost difference below which two starting points count as fitting equally.
TIE_TOLERANCE = 1e-6


def default_profile(instance: str = "inf2.48xlarge") -> CostProfile:
    """A neutral starting point (and prior) for fits, not a calibrated profile: round numbers
    chosen before any fit (half of peak bandwidth, a third of peak FLOP/s for matmuls, half
    the one-row ceiling of 1/128 for decode attention, 10 us a collective stage)."""
    return CostProfile(instance, prefill_fixed_s=0.01, decode_fixed_s=0.001,
                       weight_bw_efficiency=0.5, kv_bw_efficiency=0.5, compute_efficiency=0.3,
                       collective_latency_s=10e-6,
                       attention_efficiency=0.5 / 128,
                       quantized_weight_bytes=QUANTIZED_WEIGHT_BYTES_PRIOR,
                       source="default starting point", compile=DEFAULT_COMPILE)


def _with(profile: CostProfile, names: Sequence[str], x: Sequence[float],
          tie_kv: bool) -> CostProfile:
    changes = {name: fit.decode(name, v) for name, v in zip(names, x)}
    if tie_kv and "weight_bw_efficiency" in changes:
        changes["kv_bw_efficiency"] = changes["weight_bw_efficiency"]
    return profile.replace(**changes)


def _least_squares(residuals: Callable[[CostProfile], list[float]], base: CostProfile,
                   names: Sequence[str], tie_kv: bool) -> CostProfile:
    """The best fit from each of STARTS (overrides of `base`). A later start must fit clearly
    better to win: where the data cannot set a parameter (all starts fit equally), it keeps
    `base`'s value rather than a start's."""
    best: tuple[CostProfile, float] | None = None
    for overrides in STARTS:
        start = base.replace(**{k: v for k, v in overrides.items() if k in names})
        x0 = [fit.encode(n, getattr(start, n)) for n in names]
        def start_residuals(x: list[float], start: CostProfile = start) -> list[float]:
            return residuals(_with(start, names, x, tie_kv))

        x, cost = fit.least_squares(start_residuals, x0)
        if best is None or cost < best[1] * (1 - TIE_TOLERANCE):
            best = (_with(start, names, x, tie_kv), cost)
    assert best is not None, "STARTS holds at least one start"
    return best[0]


# -- fitting to published figures ------------------------------------------------------------

def _select_rows(csv_path: str | Path | None, rows: Iterable[PublishedRow] | None,
                 instance: str | None,
                 select: Callable[[PublishedRow], bool] | None) -> list[PublishedRow]:
    pool = list(rows) if rows is not None else read_published(csv_path)
    return [r for r in pool if (instance is None or r.instance == instance)
            and (select is None or select(r))]


def fit_published(csv_path: str | Path | None = None, instance: str | None = None,
                  select: Callable[[PublishedRow], bool] | None = None,
                  attended: bool | str = DEFAULT_ATTENDED, start: CostProfile | None = None,
                  rows: Iterable[PublishedRow] | None = None,
                  table: str | None = None) -> CostProfile:
    """Fit FIT_PARAMS to published rows: those of `rows` (default: the CSV at csv_path, or
    the sixteen embedded rows) on `instance` (default: all) that `select` keeps. The
    returned profile is named after `instance`, else the first row's instance; its source
    names the table (`table`, else csv_path; neither: the embedded rows, AWS's)."""
    chosen = _select_rows(csv_path, rows, instance, select)
    if not chosen:
        raise ValueError(f"no published rows{f' for {instance}' if instance else ''} to fit")
    prepared = [(r, decode_groups(r, attended)) for r in chosen]
    names = [n for n in FIT_PARAMS if n != "quantized_weight_bytes"
             or any(r.weight_dtype in QUANTIZED_DTYPES for r in chosen)]

    def residuals(profile: CostProfile) -> list[float]:
        out = []
        for row, groups in prepared:
            pred = predict_row(row_model(profile, row), row, groups)
            out += [math.log(pred["tpot_s"] / row.tpot_s),
                    math.log(pred["throughput"] / row.throughput),
                    TTFT_WEIGHT * math.log(pred["ttft_s"] / row.ttft_s)]
        return out

    base = start or default_profile(instance or chosen[0].instance)
    fitted = _least_squares(residuals, base, names, tie_kv=True)
    families = sorted({r.instance for r in chosen})
    held = [] if "quantized_weight_bytes" in names else [
        f"quantized_weight_bytes held at {base.quantized_weight_bytes:g} (no int8/fp8 row)"]
    table = table or (str(csv_path) if csv_path is not None else None)
    origin = ("(AWS Neuron SDK 2.18 performance tables, transformers-neuronx, static batching)"
              if table is None else f"(the rows of {table}, static batching)")
    return fitted.replace(source=(
        f"fit to {len(chosen)} published rows on {', '.join(families)} {origin}"
        + (f"; {'; '.join(held)}" if held else "")))


def evaluate_published(profile: CostProfile, csv_path: str | Path | None = None,
                       attended: bool | str = DEFAULT_ATTENDED,
                       rows: Iterable[PublishedRow] | None = None) -> list[dict[str, Any]]:
    """Published vs modelled figures for every row (all instances: one profile serves all)."""
    pool = list(rows) if rows is not None else read_published(csv_path)
    return evaluate_rows(profile, pool, attended)


def cross_validate(key: Callable[[PublishedRow], Any], csv_path: str | Path | None = None,
                   rows: Iterable[PublishedRow] | None = None,
                   start: CostProfile | None = None,
                   attended: bool | str = DEFAULT_ATTENDED) -> list[dict[str, Any]]:
    """For each value of key(row): fit without those rows, predict them. Entries are those of
    evaluate_published plus "held_out" (the key value) and "profile" (that fold's fit)."""
    pool = list(rows) if rows is not None else read_published(csv_path)
    out = []
    for group in dict.fromkeys(key(r) for r in pool):
        train = [r for r in pool if key(r) != group]
        if not train:
            raise ValueError(f"holding out {group!r} leaves no rows to fit")
        profile = fit_published(rows=train, start=start, attended=attended)
        for entry in evaluate_rows(profile, [r for r in pool if key(r) == group], attended):
            out.append(entry | {"held_out": group, "profile": profile})
    order = {id(r): i for i, r in enumerate(pool)}
    return sorted(out, key=lambda e: order[id(e["row"])])


def leave_one_out(csv_path: str | Path | None = None,
                  rows: Iterable[PublishedRow] | None = None) -> list[dict[str, Any]]:
    """Each row predicted by a fit to all the other rows."""
    return cross_validate(lambda r: r, csv_path, rows)


def leave_one_model_out(csv_path: str | Path | None = None,
                        rows: Iterable[PublishedRow] | None = None,
                        attended: bool | str = DEFAULT_ATTENDED) -> list[dict[str, Any]]:
    """Each model's rows (on every instance) predicted by a fit to the other models' rows."""
    return cross_validate(lambda r: r.model, csv_path, rows, attended=attended)


def leave_one_instance_out(csv_path: str | Path | None = None,
                           rows: Iterable[PublishedRow] | None = None) -> list[dict[str, Any]]:
    """Each instance family's rows predicted by a fit to the other family's rows."""
    return cross_validate(lambda r: r.family, csv_path, rows)


# -- profiles for every instance -------------------------------------------------------------

def derive_profile(base: CostProfile, instance: Instance,
                   measured: Iterable[str] = ("inf2.48xlarge", "trn1.32xlarge")) -> CostProfile:
    """Another instance's profile from a fitted one. The parameters are per NeuronCore-v2
    (fractions of per-core peaks, per-step and per-stage latencies), the same core on every
    inf2 and trn1 instance; the hardware table supplies the rest."""
    if instance.name == base.instance:
        return base
    if not instance.calibrated:
        note = ("uncalibrated: no published figures for this family; the NeuronCore-v2 "
                "fractions of peak and latencies applied to its own per-core peaks, core count "
                "and links from the hardware table (a hardware-ratio estimate)")
    elif instance.name in measured:
        note = "measured: published rows of this instance are in the fit"
    else:
        note = ("no published row of this instance: same NeuronCore-v2 parameters, its own "
                "core count and links from the hardware table")
    return base.replace(instance=instance.name, source=f"{note}; base: {base.source}")


def builtin_profiles(base: CostProfile, digits: int = 4) -> dict[str, CostProfile]:
    """Profiles for every instance from `base`, rounded to `digits` significant digits (the
    fit is not better than that, and the JSON files stay readable)."""
    names = FIT_PARAMS + ("kv_bw_efficiency",)
    rounded = base.replace(**{n: float(f"{getattr(base, n):.{digits}g}") for n in names})
    return {name: derive_profile(rounded, inst) for name, inst in INSTANCES.items()}


#: Trainium2 tutorial figures (vllm-neuron docs, via ../shared/notes/neuron-runtimes.md):
#: (label, instance, TP, concurrency, input, output, published TPOT ms). The recipe's 39.0
#: tok/s at concurrency 1 is read as a TPOT of 1000 / 39.0 ms.
TRN2_POINTS = (
    ("Llama-3.1-8B TP8, 2 at once, 512/128 (EAGLE tutorial baseline)",
     INSTANCES["trn2.48xlarge"], 8, 2, 512, 128, 10.52),
    ("Llama-3.1-8B TP4 one chip, 1 at once (model recipe)", INSTANCES["trn2.3xlarge"], 4, 1,
     512, 128, 1000 / 39.0),
)
#: The model of those points.
TRN2_ARCH = ARCHITECTURES["Llama-3.1-8B"]
#: The stated tolerance of the uncalibrated trn2 profile against those points.
TRN2_TOLERANCE = 2.5


def trn2_points(base: CostProfile) -> list[tuple[str, float, float]]:
    """(label, modelled TPOT ms, published TPOT ms) of each trn2 tutorial point under the
    profile derived from `base`: one decode step of the point's concurrency holding input +
    output / 2 tokens each (the tutorials' max_model_len is not stated, so the KV a Beta-plugin
    decode would attend is unknown: the held context is the optimistic side)."""
    out = []
    for label, instance, tp, batch, inp, outp, tpot in TRN2_POINTS:
        model = StepCostModel(derive_profile(base, instance), instance, TRN2_ARCH, tp)
        out.append((label, model.decode_time(batch, batch * (inp + outp // 2)) * 1e3, tpot))
    return out


# -- fitting to measured steps ---------------------------------------------------------------

def fit_from_steps(steps: Iterable[Any], instance: Instance, arch: Architecture, tp: int,
                   weight_dtype: str = "bf16", start_profile: CostProfile | None = None,
                   kv_dtype: str = "bf16", runtime: Any = None,
                   prefix_caching: bool = False) -> CostProfile:
    """Fit STEP_FIT_PARAMS to measured step durations (t_end - t_start) of StepRecord-like
    objects from one run configuration. Each step's KV read is what the step model charges
    under `runtime` (the records' own, runtime.Runtime; None: the KV its requests held) with
    `prefix_caching` as the records ran (a grid cell's prefix bucket; the block KV a decode
    gathers first on NeuronCore-v2). A fixed cost whose kind has no steps keeps its start
    value."""
    def model_of(profile: CostProfile) -> StepCostModel:
        return StepCostModel(profile, instance, arch, tp, weight_dtype, kv_dtype,
                             runtime=runtime, prefix_caching=prefix_caching)

    reader = model_of(start_profile or _start_for(instance))
    durations: dict[tuple[str, int, int, int], list[float]] = {}
    for s in steps:
        if s.kind not in ("prefill", "decode") or s.t_end is None or s.t_end <= s.t_start:
            continue
        if s.kind == "prefill":
            padded, gathered = s.num_tokens_padded or s.num_tokens, 0
            context = reader.prefill_kv_read(s.context_tokens, getattr(s, "prefix_bucket", None))
        else:
            padded = s.num_seqs_padded or s.num_seqs
            attended = getattr(s, "attended_len", None)
            context = reader.decode_kv_tokens(padded, attended, s.context_tokens)
            gathered = reader.gathered_tokens(padded, attended)
        durations.setdefault((s.kind, padded, context, gathered), []).append(s.t_end - s.t_start)
    if not durations:
        raise ValueError("no finished prefill or decode steps to fit")
    # Identical shapes fold into one term: the log of their geometric mean, weighted by count.
    shapes = [(kind, padded, ctx, gathered, math.sqrt(len(ts)),
               sum(math.log(t) for t in ts) / len(ts))
              for (kind, padded, ctx, gathered), ts in durations.items()]
    kinds = {kind for kind, *_ in shapes}
    names = [n for n in STEP_FIT_PARAMS if not (n == "prefill_fixed_s" and "prefill" not in kinds)
             and not (n == "decode_fixed_s" and "decode" not in kinds)]
    start = start_profile or _start_for(instance)

    def residuals(profile: CostProfile) -> list[float]:
        model = model_of(profile)
        return [weight * (math.log(model.prefill_time(padded, ctx) if kind == "prefill"
                                   else model.decode_time(padded, ctx, gathered)) - log_t)
                for kind, padded, ctx, gathered, weight, log_t in shapes]

    fitted = _least_squares(residuals, start, names, tie_kv=False)
    n = sum(len(ts) for ts in durations.values())
    return fitted.replace(source=f"fit to {n} measured steps ({', '.join(sorted(kinds))}) on "
                                 f"{instance.name}, TP {tp}, {weight_dtype} weights")


def _start_for(instance: Instance) -> CostProfile:
    try:
        return load_profile(instance.name)
    except (FileNotFoundError, OSError):
        return default_profile(instance.name)
