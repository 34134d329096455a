"""Calibration: the published-figure fit, its held-out error, and fitting to measured steps."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from neuron_batch.device.calibrate import (
    FIT_PARAMS,
    PUBLISHED_INF2_CSV,
    builtin_profiles,
    decode_groups,
    default_profile,
    derive_profile,
    evaluate_published,
    fit_from_steps,
    fit_published,
    leave_one_out,
    median_abs_errors,
    nelder_mead,
    pow2_bucket,
    read_published,
)
from neuron_batch.device.cost_model import StepCostModel, load_profile
from neuron_batch.device.hardware import INSTANCES

SHARED_CSV = Path("/work/shared/calibration/inf2-published.csv")
#: Error bounds CALIBRATION.md states for the built-in inf2.48xlarge profile.
MAX_ROW_ERROR = {"ttft": 0.20, "tpot": 0.20, "throughput": 0.15}
MAX_MEDIAN_ERROR = 0.10


@pytest.mark.skipif(not SHARED_CSV.exists(), reason="shared calibration data not present")
def test_embedded_copy_matches_shared_csv():
    assert read_published() == read_published(SHARED_CSV)
    assert PUBLISHED_INF2_CSV.strip() == SHARED_CSV.read_text().strip()


def test_buckets_and_decode_groups():
    assert ([pow2_bucket(n, 4096) for n in (1, 128, 129, 2048, 3000, 5000)]
            == [128, 128, 256, 2048, 4096, 4096])
    row = read_published()[2]                   # msl 4096, 128 in, 3968 out
    groups, median_ctx = decode_groups(row)
    assert sum(count for _, count in groups) == row.output_len - 1
    assert [ctx for ctx, _ in groups] == [256, 512, 1024, 2048, 4096] and median_ctx == 4096
    exact, median_exact = decode_groups(row, context_buckets=False)
    assert len(exact) == row.output_len - 1 and median_exact == row.input_len + row.output_len // 2


def test_builtin_profile_reproduces_published_rows():
    table = evaluate_published(load_profile("inf2.48xlarge"))
    assert len(table) == 8
    for entry in table:
        for key, bound in MAX_ROW_ERROR.items():
            assert abs(entry["error"][key]) <= bound, (entry["row"].label, key, entry["error"])
    assert max(median_abs_errors(table).values()) <= MAX_MEDIAN_ERROR


def test_builtin_profiles_are_the_current_fit():
    """The JSON files must be regenerated (calibration_report.py --write) when the model or
    the fit changes."""
    fitted = builtin_profiles(fit_published())
    for name in INSTANCES:
        stored = load_profile(name)
        for param in FIT_PARAMS + ("collective_latency_s", "compile_s_per_graph_per_gb"):
            expected = getattr(fitted[name], param)
            assert getattr(stored, param) == pytest.approx(expected, rel=0.01), (name, param)


def test_held_out_error_within_target():
    held = median_abs_errors(leave_one_out())
    assert held["tpot"] <= 0.20 and held["throughput"] <= 0.20


def test_derived_profiles():
    base = load_profile("inf2.48xlarge")
    trn1 = derive_profile(base, "trn1.32xlarge")
    assert "EXTRAPOLATION" in trn1.source and trn1.compute_efficiency == base.compute_efficiency
    assert derive_profile(base, "inf2.xlarge").instance == "inf2.xlarge"
    assert derive_profile(base, "inf2.48xlarge") is base


def test_nelder_mead_minimises_a_curved_valley():
    def rosenbrock(x):
        return (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2
    x = nelder_mead(rosenbrock, [-1.2, 1.0])
    assert x == pytest.approx([1.0, 1.0], abs=1e-4)


# -- fit_from_steps ------------------------------------------------------------------------------

TRUTH = dict(prefill_fixed_s=0.012, decode_fixed_s=0.0025, weight_bw_efficiency=0.55,
             kv_bw_efficiency=0.22, compute_efficiency=0.31)


def synthetic_steps(model: StepCostModel, n: int = 300, seed: int = 0, kinds=("prefill", "decode")):
    """Step records timed by `model`, with the shapes a real run produces (bucketed prefill
    chunks with and without prior context, decode batches from 1 to 256). Small prefill
    chunks with context are bandwidth-bound and large ones compute-bound, which is what lets
    a fit separate the weight-read time from the fixed costs."""
    rng, steps, clock = random.Random(seed), [], 0.0
    for i in range(n):
        kind = kinds[0] if len(kinds) == 1 else ("prefill" if rng.random() < 0.3 else "decode")
        if kind == "prefill":
            padded = rng.choice([128, 256, 512, 1024, 2048, 4096])
            ctx = rng.choice([0, 0, padded, 2 * padded])
            took, seqs = model.prefill_time(padded, ctx), 1
            num_tokens = rng.randint(padded // 2 + 1, padded)
        else:
            seqs = rng.choice([1, 2, 4, 8, 16, 32, 64, 128, 256])
            ctx = seqs * rng.randint(100, 4000)
            took, padded, num_tokens = model.decode_time(seqs, ctx), seqs, seqs
        steps.append(SimpleNamespace(step=i, kind=kind, num_tokens=num_tokens,
                                     num_tokens_padded=padded, num_seqs=seqs,
                                     num_seqs_padded=seqs, context_tokens=ctx,
                                     t_start=clock, t_end=clock + took))
        clock += took
    return steps


@pytest.mark.parametrize("instance, arch, tp, dtype", [
    ("inf2.8xlarge", "Llama-3-8B", 2, "bf16"),
    ("inf2.xlarge", "TinyLlama-1.1B", 2, "bf16"),
    ("inf2.24xlarge", "Llama-3-70B", 12, "int8")])
def test_fit_from_steps_recovers_known_parameters(instance, arch, tp, dtype):
    truth = default_profile(instance).replace(**TRUTH)
    true_model = StepCostModel(truth, instance, arch, tp, dtype)
    steps = synthetic_steps(true_model)
    fitted = fit_from_steps(steps, instance, arch, tp, dtype,
                            start_profile=default_profile(instance))
    for name in FIT_PARAMS:
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.03), name
    model = StepCostModel(fitted, instance, arch, tp, dtype)
    for s in steps:
        assert model.step_time(s) == pytest.approx(s.t_end - s.t_start, rel=0.01)


def test_fit_from_steps_decode_only_keeps_prefill_cost():
    instance, arch = "inf2.8xlarge", "Llama-3-8B"
    truth = default_profile(instance).replace(**TRUTH)
    steps = synthetic_steps(StepCostModel(truth, instance, arch, 2), kinds=("decode",))
    start = default_profile(instance)
    fitted = fit_from_steps(steps, instance, arch, 2, start_profile=start)
    assert fitted.prefill_fixed_s == start.prefill_fixed_s and "decode" in fitted.source
    # Every step here is bandwidth-bound, so decode_fixed_s and weight_bw_efficiency trade
    # off (only their sum of times is identified); the step times are still reproduced.
    model = StepCostModel(fitted, instance, arch, 2)
    for s in steps:
        assert model.step_time(s) == pytest.approx(s.t_end - s.t_start, rel=0.01)
    assert fitted.kv_bw_efficiency == pytest.approx(truth.kv_bw_efficiency, rel=0.03)


def test_fit_from_steps_needs_finished_steps():
    unfinished = SimpleNamespace(kind="decode", num_tokens=1, num_tokens_padded=1, num_seqs=1,
                                 num_seqs_padded=1, context_tokens=10, t_start=0.0, t_end=None)
    with pytest.raises(ValueError, match="no finished"):
        fit_from_steps([unfinished], "inf2.8xlarge", "Llama-3-8B", 2)
