"""Calibration: the published rows, the fit to them and its held-out error, the optimisers,
and fitting to measured steps."""

from __future__ import annotations

import importlib.util
import math
import random
import sys
from pathlib import Path
from statistics import median
from types import SimpleNamespace

import pytest

from neuron_batch.device.architectures import get_architecture
from neuron_batch.device.calibrate import (
    FIT_PARAMS,
    HELD_PARAMS,
    QUANTIZED_WEIGHT_BYTES_PRIOR,
    STEP_FIT_PARAMS,
    builtin_profiles,
    cross_validate,
    default_profile,
    derive_profile,
    evaluate_published,
    fit_from_steps,
    fit_published,
    leave_one_instance_out,
    leave_one_model_out,
)
from neuron_batch.device.cost_model import StepCostModel, load_profile
from neuron_batch.device.fit import least_squares, nelder_mead, solve
from neuron_batch.device.hardware import INSTANCES, get_instance
from neuron_batch.device.published import (
    PUBLISHED_INF2_CSV,
    PUBLISHED_MORE_CSV,
    PublishedError,
    PublishedRow,
    decode_groups,
    max_abs_errors,
    median_abs_errors,
    parse_published,
    pow2_bucket,
    predict_row,
    read_published,
    row_model,
)

ROOT = Path(__file__).resolve().parents[2]
#: The shared folder beside the repository (../shared relative to its root), when present.
SHARED_CALIBRATION = Path(__file__).resolve().parents[3] / "shared" / "calibration"
#: In-sample bounds CALIBRATION.md's tables show for the built-in profile.
#: In-sample bound per row. Fitting the compiled sequence length (what TNx decode attends)
#: halved the worst held-out error but leaves one trn1 row (Llama-3-8B int8 b8 128/8064) at
#: -14% tok/s in sample (CALIBRATION.md), hence 0.15 for throughput.
MAX_ROW_ERROR = {"tpot": 0.10, "throughput": 0.15}
#: The issue's target for leave-one-model-out, per instance family.
TARGET_MEDIAN, TARGET_MAX = 0.10, 0.30
FAMILIES = ("inf2", "trn1")


def by_family(table, family):
    return [e for e in table if e["row"].family == family]


# -- the embedded rows ---------------------------------------------------------------------------

@pytest.mark.skipif(not SHARED_CALIBRATION.is_dir(), reason="../shared/calibration not present")
@pytest.mark.parametrize("name, embedded", [("inf2-published.csv", PUBLISHED_INF2_CSV),
                                            ("more-published.csv", PUBLISHED_MORE_CSV)])
def test_embedded_copies_match_the_shared_csvs(name, embedded):
    shared = SHARED_CALIBRATION / name
    if not shared.exists():
        pytest.skip(f"{shared} not present")
    assert embedded.strip() == shared.read_text().strip()
    assert parse_published(embedded) == read_published(shared)


def test_sixteen_rows_on_two_instance_families():
    rows = read_published()
    assert len(rows) == 16
    assert sorted({r.family for r in rows}) == ["inf2", "trn1"]
    assert {r.tp for r in rows if r.family == "trn1"} == {32}
    assert {r.model for r in rows} == {"Llama-3-8B", "Llama-2-7b", "Llama-2-70b", "Llama-2-13b",
                                       "Mistral-7B-Instruct-v0.2"}
    assert rows[0].arch.name == "Llama-3-8B" and rows[11].arch.name == "Mistral-7B"


def test_published_csv_errors(tmp_path):
    header = PUBLISHED_INF2_CSV.splitlines()[0]
    good = PUBLISHED_INF2_CSV.splitlines()[1]
    with pytest.raises(PublishedError, match="missing column"):
        parse_published("model,instance\nx,y\n")
    with pytest.raises(PublishedError, match="line 2.*inf3"):
        parse_published(header + "\n" + good.replace("Inf2.48xlarge", "inf3.big") + "\n")
    with pytest.raises(PublishedError, match="line 2.*gpt-5"):
        parse_published(header + "\n" + good.replace("Llama-3-8B", "gpt-5") + "\n")
    with pytest.raises(PublishedError, match="no rows"):
        parse_published(header + "\n")
    path = tmp_path / "mine.csv"
    path.write_text(header + "\n" + good + "\n")
    assert read_published(path) == parse_published(PUBLISHED_INF2_CSV)[:1]


def test_buckets_and_decode_groups():
    assert ([pow2_bucket(n, 4096) for n in (1, 128, 129, 2048, 3000, 5000)]
            == [128, 128, 256, 2048, 4096, 4096])
    row = read_published()[2]                   # msl 4096, 128 in, 3968 out
    groups, median_ctx = decode_groups(row, attended="pow2")
    assert sum(count for _, count in groups) == row.output_len - 1
    assert [ctx for ctx, _ in groups] == [256, 512, 1024, 2048, 4096] and median_ctx == 4096
    # the default: every step attends the compiled sequence length
    assert decode_groups(row) == ([(4096, row.output_len - 1)], 4096)
    exact, median_exact = decode_groups(row, attended="held")
    assert len(exact) == row.output_len - 1 and median_exact == row.input_len + row.output_len // 2
    odd = read_published()[14]                  # trn1 70b: msl 1152 caps the last window
    assert decode_groups(odd, attended="pow2")[0][-1][0] == 1152


# -- the built-in profile ------------------------------------------------------------------------

def test_builtin_profile_reproduces_published_rows():
    table = evaluate_published(load_profile("inf2.48xlarge"))
    assert len(table) == 16
    for entry in table:
        for key, bound in MAX_ROW_ERROR.items():
            assert abs(entry["error"][key]) <= bound, (entry["row"].label, key, entry["error"])
    for family in FAMILIES:
        med = median_abs_errors(by_family(table, family))
        # (trn1's four rows: tok/s median 5.8% since the compiled-length refit)
        assert med["tpot"] <= 0.05 and med["throughput"] <= 0.06, (family, med)


def test_builtin_profiles_are_the_current_fit():
    """The JSON files must be regenerated (calibration_report.py --write) when the model or
    the fit changes."""
    fitted = builtin_profiles(fit_published())
    for name in INSTANCES:
        stored = load_profile(name)
        for param in FIT_PARAMS + HELD_PARAMS + ("kv_bw_efficiency",):
            expected = getattr(fitted[name], param)
            assert getattr(stored, param) == pytest.approx(expected, rel=0.01), (name, param)


def test_one_profile_for_every_instance():
    profiles = {name: load_profile(name) for name in INSTANCES}
    shared = {k: v for k, v in profiles["inf2.48xlarge"].to_dict().items()
              if k not in ("instance", "source")}
    for name, profile in profiles.items():
        assert profile.instance == name
        assert {k: v for k, v in profile.to_dict().items() if k in shared} == shared
    assert "measured" in profiles["trn1.32xlarge"].source
    assert "no published row" in profiles["inf2.xlarge"].source


def test_calibration_md_shows_the_builtin_profile():
    spec = importlib.util.spec_from_file_location(
        "_calibration_report", ROOT / "scripts" / "calibration_report.py")
    report = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = report
    spec.loader.exec_module(report)
    text = (ROOT / "neuron_batch" / "device" / "CALIBRATION.md").read_text()
    for line in report.parameter_table(load_profile("inf2.48xlarge")):
        assert line in text, f"CALIBRATION.md is stale (run calibration_report.py --write): {line}"
    assert "/work/" not in text


# -- held-out error ------------------------------------------------------------------------------

def test_leave_one_model_out_meets_the_target():
    """Every row of a model predicted by a fit to the other models: median within 10% and no
    row beyond 30%, on TPOT and output tokens/s, for inf2 and trn1 alike."""
    table = leave_one_model_out()
    assert len(table) == 16 and all(e["held_out"] == e["row"].model for e in table)
    for entry in table:
        assert entry["row"].model not in entry["profile"].source     # never fitted on itself
    for family in FAMILIES:
        rows = by_family(table, family)
        med, worst = median_abs_errors(rows), max_abs_errors(rows)
        for key in ("tpot", "throughput"):
            assert med[key] <= TARGET_MEDIAN, (family, key, med)
            assert worst[key] <= TARGET_MAX, (family, key, worst)


def test_leave_one_instance_out_predicts_each_family_from_the_other():
    table = leave_one_instance_out()
    assert {e["held_out"] for e in table} == {"inf2", "trn1"}
    for family in FAMILIES:
        rows = by_family(table, family)
        assert all(e["held_out"] == family for e in rows)
        other = "trn1.32xlarge" if family == "inf2" else "inf2.48xlarge"
        assert rows[0]["profile"].source.startswith("fit to") and other in rows[0]["profile"].source
        assert median(abs(e["error"]["tpot"]) for e in rows) <= 0.10


def test_cross_validate_holds_out_exactly_the_group():
    rows = read_published()[:6]                 # Llama-3-8B and Llama-2-7b on inf2
    table = cross_validate(lambda r: r.model, rows=rows)
    assert [e["row"] for e in table] == rows
    sources = {e["held_out"]: e["profile"].source for e in table}
    assert "fit to 2 published rows" in sources["Llama-3-8B"]
    assert "fit to 4 published rows" in sources["Llama-2-7b"]


def test_fit_without_quantized_rows_keeps_the_prior():
    bf16 = [r for r in read_published() if r.weight_dtype == "bf16"]
    profile = fit_published(rows=bf16)
    assert profile.quantized_weight_bytes == QUANTIZED_WEIGHT_BYTES_PRIOR
    assert "held at" in profile.source


def test_fit_recovers_a_known_profile_from_rows_it_generated():
    """Rows whose figures a known profile produced (the published shapes on both instances)
    are fitted back to within 1% of those figures."""
    truth = default_profile().replace(
        prefill_fixed_s=0.02, decode_fixed_s=0.002, weight_bw_efficiency=0.45,
        kv_bw_efficiency=0.45, compute_efficiency=0.2, attention_efficiency=0.0025,
        collective_latency_s=8e-6, quantized_weight_bytes=1.5)
    synthetic = []
    for row in read_published():
        pred = predict_row(row_model(truth, row), row)
        synthetic.append(PublishedRow(row.model, row.instance, row.tp, row.batch,
                                      row.max_seq_len, row.input_len, row.output_len,
                                      pred["throughput"], pred["ttft_s"], pred["tpot_s"],
                                      row.weight_dtype))
    fitted = fit_published(rows=synthetic)
    worst = max_abs_errors(evaluate_published(fitted, rows=synthetic))
    assert worst["tpot"] < 0.01 and worst["throughput"] < 0.01 and worst["ttft"] < 0.01
    for name in ("weight_bw_efficiency", "collective_latency_s", "quantized_weight_bytes"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.05), name


def test_derived_profiles():
    base = load_profile("inf2.48xlarge")
    trn1 = derive_profile(base, get_instance("trn1.32xlarge"))
    assert "measured" in trn1.source and trn1.compute_efficiency == base.compute_efficiency
    assert "no published row" in derive_profile(base, get_instance("inf2.xlarge")).source
    assert derive_profile(base, get_instance("inf2.48xlarge")) is base


# -- the optimisers ------------------------------------------------------------------------------

def test_nelder_mead_minimises_a_curved_valley():
    def rosenbrock(x):
        return (1 - x[0]) ** 2 + 100 * (x[1] - x[0] ** 2) ** 2
    x = nelder_mead(rosenbrock, [-1.2, 1.0])
    assert x == pytest.approx([1.0, 1.0], abs=1e-4)


def test_least_squares_fits_a_decay_and_keeps_unseen_coordinates():
    ts = [0.5 * i for i in range(12)]
    ys = [3.0 * math.exp(-0.7 * t) + 0.5 for t in ts]

    def residuals(x):          # x[3] appears in no residual: it must stay where it started
        return [x[0] * math.exp(-x[1] * t) + x[2] - y for t, y in zip(ts, ys)]
    x, cost = least_squares(residuals, [1.0, 0.1, 0.0, 7.0])
    assert x[:3] == pytest.approx([3.0, 0.7, 0.5], rel=1e-4) and cost < 1e-6
    assert x[3] == pytest.approx(7.0)


def test_solve_small_systems():
    assert solve([[0.0, 2.0], [3.0, 1.0]], [4.0, 5.0]) == pytest.approx([1.0, 2.0])
    with pytest.raises(ZeroDivisionError):
        solve([[1.0, 2.0], [2.0, 4.0]], [1.0, 2.0])


# -- fit_from_steps ------------------------------------------------------------------------------

TRUTH = dict(prefill_fixed_s=0.012, decode_fixed_s=0.0025, weight_bw_efficiency=0.55,
             kv_bw_efficiency=0.22, compute_efficiency=0.31, attention_efficiency=0.0015)


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
    start = default_profile(instance)
    instance, arch = get_instance(instance), get_architecture(arch)
    true_model = StepCostModel(truth, instance, arch, tp, dtype)
    steps = synthetic_steps(true_model)
    fitted = fit_from_steps(steps, instance, arch, tp, dtype, start_profile=start)
    for name in ("prefill_fixed_s", "decode_fixed_s", "weight_bw_efficiency",
                 "compute_efficiency"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.03), name
    model = StepCostModel(fitted, instance, arch, tp, dtype)
    for s in steps:
        assert model.step_time(s) == pytest.approx(s.t_end - s.t_start, rel=0.01)
    assert set(STEP_FIT_PARAMS) <= set(FIT_PARAMS) | {"kv_bw_efficiency"}


def test_fit_from_steps_decode_only_keeps_prefill_cost():
    instance, arch = get_instance("inf2.8xlarge"), get_architecture("Llama-3-8B")
    truth = default_profile(instance.name).replace(**TRUTH)
    steps = synthetic_steps(StepCostModel(truth, instance, arch, 2), kinds=("decode",))
    start = default_profile(instance.name)
    fitted = fit_from_steps(steps, instance, arch, 2, start_profile=start)
    assert fitted.prefill_fixed_s == start.prefill_fixed_s and "decode" in fitted.source
    model = StepCostModel(fitted, instance, arch, 2)
    for s in steps:
        assert model.step_time(s) == pytest.approx(s.t_end - s.t_start, rel=0.01)


def test_fit_from_steps_needs_finished_steps():
    unfinished = SimpleNamespace(kind="decode", num_tokens=1, num_tokens_padded=1, num_seqs=1,
                                 num_seqs_padded=1, context_tokens=10, t_start=0.0, t_end=None)
    with pytest.raises(ValueError, match="no finished"):
        fit_from_steps([unfinished], get_instance("inf2.8xlarge"),
                       get_architecture("Llama-3-8B"), 2)


# -- `neuron-batch calibrate --published` --------------------------------------------------------

def test_calibrate_cli_fits_a_published_table(tmp_path):
    from click.testing import CliRunner

    from neuron_batch.cli import main

    table = tmp_path / "mine.csv"
    table.write_text(PUBLISHED_MORE_CSV)
    out = tmp_path / "profile.json"
    result = CliRunner().invoke(main, ["calibrate", "--published", str(table), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "fitted 8 published row(s)" in result.output and str(out) in result.output
    profile = load_profile(out)
    assert profile.instance == "inf2.48xlarge" and "fit to 8 published rows" in profile.source
    # a user's table is named as theirs, not as AWS's figures (issue 49)
    assert str(table) in profile.source and "AWS" not in profile.source
    worst = max_abs_errors(evaluate_published(profile, rows=read_published(table)))
    assert worst["tpot"] < 0.15 and worst["throughput"] < 0.15

    only = CliRunner().invoke(main, ["calibrate", "--published", str(table), "--instance",
                                     "trn1.32xlarge", "-o", str(tmp_path / "trn1.json")])
    assert only.exit_code == 0, only.output
    assert "fitted 4 published row(s)" in only.output
    assert load_profile(tmp_path / "trn1.json").instance == "trn1.32xlarge"


def test_calibrate_cli_usage_errors(tmp_path):
    from click.testing import CliRunner

    from neuron_batch.cli import main

    bad = tmp_path / "bad.csv"
    bad.write_text("model,instance\nx,y\n")
    result = CliRunner().invoke(main, ["calibrate", "--published", str(bad), "-o",
                                       str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "missing column" in result.output
    result = CliRunner().invoke(main, ["calibrate", "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "--published" in result.output
    result = CliRunner().invoke(main, ["calibrate", str(tmp_path), "-o", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and "--instance and --architecture" in result.output


def test_uncalibrated_trn2_profile_is_within_its_stated_tolerance_of_the_tutorials():
    """trn2 has no published table: its hardware-ratio profile must stay within the stated
    factor of AWS's tutorial TPOTs (CALIBRATION.md), and be marked uncalibrated."""
    from neuron_batch.device.calibrate import TRN2_TOLERANCE, trn2_points
    from neuron_batch.device.hardware import get_instance

    points = trn2_points(load_profile("inf2.48xlarge"))
    assert len(points) == 2
    for label, modelled, published in points:
        assert 1 / TRN2_TOLERANCE <= modelled / published <= TRN2_TOLERANCE, label
    for name in ("trn2.3xlarge", "trn2.48xlarge"):
        assert not get_instance(name).calibrated
        assert load_profile(name).source.startswith("uncalibrated")
