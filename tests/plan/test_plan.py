"""`neuron-batch plan` on the simulated device: small grids, real engine runs (in process)."""

from __future__ import annotations

import csv
import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")

from neuron_batch.bench.deadline import Deadline  # noqa: E402
from neuron_batch.cli import main  # noqa: E402
from neuron_batch.plan.candidates import PlanSpec  # noqa: E402
from neuron_batch.plan.planner import PlanJob, plan_base, run_plan  # noqa: E402
from neuron_batch.plan.search import objective_key  # noqa: E402
from neuron_batch.settings import RunSettings  # noqa: E402

TRACE = Path(__file__).resolve().parents[2] / "datasets" / "azure-llm-inference-conv-2023.csv"
pytestmark = pytest.mark.skipif(not TRACE.exists(), reason="the trace copy is missing")

SPEC = PlanSpec(architecture="llama-3.1-8b", instances=("inf2.xlarge", "inf2.8xlarge",
                                                         "inf2.24xlarge"),
                max_num_instances=2, seqs_values=(16,), max_prefill_buckets=2, compiled=True,
                max_model_len=4096, max_num_batched_tokens=2048, splits=False)
# Splits by length (plan/splits.py) on one placement: every candidate cut is an option.
SPLIT_SPEC = PlanSpec(architecture="llama-3.1-8b", instances=("inf2.xlarge",),
                      max_num_instances=1, seqs_values=(4,), max_prefill_buckets=2,
                      compiled=True, max_model_len=8192, max_num_batched_tokens=2048)


def plan_job(out: Path, deadline_h: float, *, prune: bool, resume: bool,
             spec: PlanSpec = SPEC, order: str = "input", limit: int = 40) -> PlanJob:
    settings = RunSettings.of(inputs=(str(TRACE),), device="sim", limit=limit,
                           max_model_len=spec.max_model_len, max_num_batched_tokens=2048,
                           quiet=True, order=order, architecture="llama-3.1-8b")
    base, kv_reserve = plan_base(settings)
    spec = PlanSpec(**{**spec.__dict__, "kv_reserve": kv_reserve})
    return PlanJob(base, spec, Deadline(f"{deadline_h}h", deadline_h, None), out, jobs=1,
                   resume=resume, log=lambda m: None, prune=prune)


@pytest.fixture(scope="module")
def unpruned(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "grid"
    assert run_plan(plan_job(out, 1.0, prune=False, resume=False)) == 0
    return out, json.loads((out / "plan.json").read_text())


@pytest.fixture(scope="module")
def unpruned_splits(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "splits"
    assert run_plan(plan_job(out, 1.0, prune=False, resume=False, spec=SPLIT_SPEC,
                             order="length", limit=16)) == 0
    return out, json.loads((out / "plan.json").read_text())


def test_split_bounds_hold_and_pruning_keeps_the_optimum(unpruned_splits):
    out, data = unpruned_splits
    splits = [o for o in data["options"] if o["split"]]
    assert len(splits) >= 3 and any(not o["split"] for o in data["options"])
    for option in data["options"]:
        assert option["hours_at_least"] <= option["hours"] * (1 + 1e-9), option["name"]
        # what plan.json says of the short layout is what `run --split-at` built
        if option["split"]:
            report = json.loads((Path(option["run_dir"]) / "report.json").read_text())
            short = report["split"]["parts"][0]
            assert (short["part"], short["max_model_len"], short["max_num_seqs"],
                    short["requests"]) == ("short", option["split"]["split_at"],
                                           option["split"]["max_num_seqs"],
                                           option["split"]["requests"])
            assert option["split"]["buckets"] == short["buckets"]
            assert option["split"]["graphs"] == sum(len(v) for v in short["buckets"].values())
            assert "--split-at" in option["command"] and "--order length" in option["command"]
    hours = sorted(o["hours"] for o in data["options"])
    for deadline_h in (hours[0] / 2, hours[len(hours) // 2], hours[-1] * 2):
        truth = min(data["options"], key=lambda o: (objective_key(o["hours"], o["usd"],
                                                                  deadline_h), o["name"]))
        assert run_plan(plan_job(out, deadline_h, prune=True, resume=True, spec=SPLIT_SPEC,
                                 order="length", limit=16)) == 0
        pruned = json.loads((out / "plan.json").read_text())
        assert pruned["recommendation"]["name"] == truth["name"], deadline_h


def test_the_table_legend_reads_a_split_s_s_and_l_from_the_table(unpruned_splits):
    from neuron_batch.plan.report import format_plan

    _, data = unpruned_splits
    text = format_plan(data)
    rows = [line.split() for line in text.splitlines() if line[:4].strip().isdigit()]
    row = next(cells for cells in rows if "+" in cells[4])     # the table's first split
    assert f"  S and L as {row[4]} and {row[5]}: a job split by length" in text


def test_bounds_never_exceed_the_simulated_figures(unpruned):
    _, data = unpruned
    assert data["meta"]["num_pruned"] == 0 and len(data["options"]) >= 10
    for option in data["options"]:
        assert option["hours_at_least"] <= option["hours"] * (1 + 1e-9), option["name"]
        assert option["usd_at_least"] <= option["usd"] * (1 + 1e-9), option["name"]


def test_static_kv_bounds_are_the_simulated_figures(unpruned):
    """Under nxdi (inf2) a single layout's bound is its simulated time: prefill exactly, and
    decode the first-come-first-served schedule step by step (layout/bounds.py)."""
    _, data = unpruned
    for option in data["options"]:
        assert option["runtime"] == "nxdi" and not option["split"]
        assert option["hours_at_least"] == pytest.approx(option["hours"], rel=1e-9)


def test_pruning_never_drops_the_true_optimum(unpruned):
    """For deadlines that split the options differently, the pruned plan (reusing the same
    simulations) recommends what the ranking of every option says, having pruned some."""
    out, data = unpruned
    hours = sorted(o["hours"] for o in data["options"])
    pruned_any = False
    for deadline_h in (hours[0] / 2, hours[len(hours) // 3], hours[len(hours) // 2],
                       hours[-1] * 2):
        truth = min(data["options"], key=lambda o: (objective_key(o["hours"], o["usd"],
                                                                  deadline_h), o["name"]))
        assert run_plan(plan_job(out, deadline_h, prune=True, resume=True)) == 0
        pruned = json.loads((out / "plan.json").read_text())
        assert pruned["recommendation"]["name"] == truth["name"], deadline_h
        pruned_any = pruned_any or pruned["meta"]["num_pruned"] > 0
    assert pruned_any


def test_plan_cli_writes_its_files_and_the_recommendation_reproduces(tmp_path):
    out = tmp_path / "plan"
    result = CliRunner().invoke(main, [
        "plan", str(TRACE), "--architecture", "llama-3.1-8b", "--deadline", "90m",
        "--instances", "inf2.xlarge,inf2.24xlarge", "--max-num-instances", "2",
        "--max-num-seqs", "8", "--max-prefill-buckets", "2", "--limit", "60",
        "--max-model-len", "4096", "--max-num-batched-tokens", "2048", "--jobs", "1",
        "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "Recommendation: " in result.output and "neuron-batch run " in result.output
    data = json.loads((out / "plan.json").read_text())
    best = data["recommendation"]
    required = {"instance", "num_instances", "replicas", "tensor_parallel_size", "max_num_seqs",
                "prefill_buckets", "decode_buckets", "kv_reserve", "hours", "compile_hours",
                "price_per_hour_usd", "usd", "output_tokens_per_s", "meets_deadline"}
    assert all(required <= set(option) for option in data["options"])
    assert best == data["options"][0] and best["meets_deadline"]
    assert best["hours"] == pytest.approx(
        best["compile_hours"] + best["run_hours"]) and best["compile_hours"] > 0
    assert best["usd"] == pytest.approx(best["hours"] * best["price_per_hour_usd"]
                                        * best["num_instances"])
    with (out / "plan.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == data["meta"]["num_options"] and rows[0]["name"] == best["name"]
    assert (out / "plan_cost_vs_time.png").stat().st_size > 10_000
    shown = CliRunner().invoke(main, ["report", str(out)])
    assert shown.exit_code == 0 and best["command"] in shown.output

    # the printed command for one replica's share gives the planned throughput (within 10%)
    assert best["command"] in result.output
    rerun = CliRunner().invoke(main, shlex.split(best["command"])[1:] + [
        "-q", "-o", str(tmp_path / "again")], catch_exceptions=False)
    assert rerun.exit_code == 0, rerun.output
    report = json.loads((tmp_path / "again" / "report.json").read_text())
    measured = report["throughput"]["output_tokens_per_s"]
    assert measured == pytest.approx(best["replica_output_tokens_per_s"], rel=0.10)
    assert report["requests"]["completed"] == best["share_requests"]
    assert report["cost"]["instance"] == best["instance"]
