"""Where a split run's parts go on --replicas (layout/placement.py): in turn or side by side.
Pure logic, no vLLM: milliseconds."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.inputs.prepare import PreparedRequest
from neuron_batch.inputs.prompt_records import PromptRecord
from neuron_batch.layout.placement import (
    AUTO,
    IN_TURN,
    SIDE_BY_SIDE,
    PartTime,
    choose,
    compile_wall_s,
    in_turn_s,
    side_by_side_s,
)
from neuron_batch.layout.split import SHORT, plan_parts
from neuron_batch.settings import RunSettings, SettingsError

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "datasets" / "azure-llm-inference-conv-2023.csv"


def linear(work: float, fixed: float = 0.0) -> PartTime:
    """A part of `work` engine-seconds that shares perfectly, compiled in `fixed` s."""
    return PartTime(fixed, lambda n: work / n)


def test_compile_wall_counts_each_instance_s_own_layouts():
    # 4 replicas, 2 per instance: K=2 puts each layout on its own instance
    assert compile_wall_s(2, 4, 2, 100.0, 300.0) == 300.0
    # K=1 or 3: one instance holds both layouts and compiles them one after the other
    assert compile_wall_s(1, 4, 2, 100.0, 300.0) == 400.0
    assert compile_wall_s(3, 4, 2, 100.0, 300.0) == 400.0
    # one instance for every replica: both layouts, always
    assert compile_wall_s(1, 2, 2, 100.0, 300.0) == 400.0


def test_in_turn_on_one_instance_side_by_side_on_two():
    short, long = linear(1000.0, 3600.0), linear(1000.0, 3600.0)
    # one instance: side by side saves no compile, so auto stays in turn (equal run time)
    one = choose(AUTO, 2, 2, short, long)
    assert one.mode == IN_TURN and one.short_replicas == 2
    # two instances of one engine each: the two compiles overlap, an hour saved
    two = choose(AUTO, 2, 1, short, long)
    assert (two.mode, two.short_replicas) == (SIDE_BY_SIDE, 1)
    assert two.in_turn_s - two.estimated_s == pytest.approx(3600.0)
    assert two.describe(2)["long_replicas"] == 1


def test_side_by_side_balances_the_parts():
    # the long part is three times the work: it gets three of four replicas
    placed = choose(SIDE_BY_SIDE, 4, 1, linear(100.0), linear(300.0))
    assert placed.short_replicas == 1
    assert placed.parts_s == (pytest.approx(100.0), pytest.approx(100.0))


def test_auto_stays_in_turn_when_side_by_side_would_leave_replicas_idle():
    # two replicas, parts 1:9 in work, compile cheap: side by side waits on the long part
    placed = choose(AUTO, 2, 1, linear(100.0, 10.0), linear(900.0, 10.0))
    assert placed.mode == IN_TURN
    assert placed.estimated_s == pytest.approx(20.0 + 1000.0 / 2)
    # asked for, it still runs side by side, at its best K
    forced = choose(SIDE_BY_SIDE, 2, 1, linear(100.0, 10.0), linear(900.0, 10.0))
    assert forced.mode == SIDE_BY_SIDE and forced.estimated_s > placed.estimated_s


def test_without_an_estimate_auto_stays_in_turn_and_side_by_side_halves():
    unknown = PartTime(0.0, None)
    assert choose(AUTO, 4, 1, unknown, unknown).mode == IN_TURN
    forced = choose(SIDE_BY_SIDE, 4, 1, unknown, unknown)
    assert (forced.mode, forced.short_replicas, forced.estimated_s) == (SIDE_BY_SIDE, 2, None)
    # one part only, or one replica: nothing to place
    assert choose(SIDE_BY_SIDE, 4, 1, linear(1.0), None).mode == IN_TURN
    assert choose(SIDE_BY_SIDE, 1, 1, linear(1.0), linear(1.0)).mode == IN_TURN
    with pytest.raises(ValueError, match="placement must be one of"):
        choose("sideways", 2, 1, linear(1.0), linear(1.0))


@settings(max_examples=200, deadline=None)
@given(replicas=st.integers(2, 24), per_instance=st.integers(1, 12),
       work=st.tuples(st.floats(1.0, 1e5), st.floats(1.0, 1e5)),
       fixed=st.tuples(st.floats(0.0, 1e4), st.floats(0.0, 1e4)),
       overhead=st.tuples(st.floats(0.0, 1e3), st.floats(0.0, 1e3)))
def test_the_choice_is_the_least_estimate_over_every_k(replicas, per_instance, work, fixed,
                                                       overhead):
    """Property: side by side takes the K of least makespan (compile wall + the slower part);
    auto takes the lesser of that and in turn; every estimate is at least the work shared by
    all replicas (parts that do not parallelise add `overhead`)."""
    short = PartTime(fixed[0], lambda n: work[0] / n + overhead[0])
    long = PartTime(fixed[1], lambda n: work[1] / n + overhead[1])
    side = choose(SIDE_BY_SIDE, replicas, per_instance, short, long)
    every = [side_by_side_s(k, replicas, per_instance, short, long) for k in range(1, replicas)]
    assert 1 <= side.short_replicas < replicas
    assert side.estimated_s == pytest.approx(min(every))
    auto = choose(AUTO, replicas, per_instance, short, long)
    turn = in_turn_s(replicas, short, long)
    assert auto.estimated_s == pytest.approx(min(turn, min(every)))
    assert auto.mode == (IN_TURN if turn <= min(every) else SIDE_BY_SIDE)
    assert auto.estimated_s >= (work[0] + work[1]) / replicas * (1 - 1e-9)
    assert side.compile_s <= fixed[0] + fixed[1] + 1e-9
    assert side.compile_s >= max(fixed) - 1e-9


def test_side_by_side_needs_a_split_and_replicas():
    with pytest.raises(SettingsError, match="needs --split-at and --replicas 2"):
        RunSettings.of(("x",), split_at=1024, replicas=1, split_placement=SIDE_BY_SIDE).validate()
    with pytest.raises(SettingsError, match="needs --split-at"):
        RunSettings.of(("x",), replicas=2, split_placement=SIDE_BY_SIDE).validate()
    with pytest.raises(SettingsError, match="--split-placement must be one of"):
        RunSettings.of(("x",), split_placement="both").validate()


def trace_requests(n: int) -> list[PreparedRequest]:
    with TRACE.open() as handle:
        rows = list(csv.DictReader(handle))[:n]
    return [PreparedRequest(PromptRecord(i, str(i), f"t:{i}"), [1] * int(row["num_prefill_tokens"]),
                            int(row["num_decode_tokens"])) for i, row in enumerate(rows)]


def sim_plan(instance: str, tp: int, replicas: int, num_instances: int, placement: str):
    """plan_parts as runner.py calls it on the simulated device (its own estimate)."""
    from neuron_batch.job.job import resolve_target
    from neuron_batch.run.runner import split_inputs

    settings = RunSettings.of(("x",), device="sim", max_model_len=8192, max_num_seqs=8,
                           replicas=replicas, split_at=2048, split_placement=placement,
                           instance=instance, tensor_parallel_size=tp,
                                          architecture="llama-3.1-8b",
                                          num_instances=num_instances).validate()
    return plan_parts(settings, trace_requests(400),
                      *split_inputs(resolve_target(settings, None), None))


@pytest.mark.skipif(not TRACE.exists(), reason="the shipped trace is missing")
def test_auto_on_the_simulated_device_weighs_instances():
    # two inf2.8xlarge, one engine each: the compiles overlap, side by side wins
    parts, placed = sim_plan("inf2.8xlarge", 2, 2, 2, AUTO)
    assert placed.mode == SIDE_BY_SIDE and placed.estimated_s < placed.in_turn_s
    assert [p.settings.replicas for p in parts] == [1, 1]
    assert parts[0].name == SHORT and parts[0].settings.max_num_seqs > 8
    # the short layout's slots are capped at its own engine's share of its requests
    assert parts[0].settings.max_num_seqs <= len(parts[0].requests)
    # one inf2.48xlarge, 12 engines of TP 2 on one instance: it compiles both anyway
    parts, placed = sim_plan("inf2.48xlarge", 2, 12, 1, AUTO)
    assert placed.mode == IN_TURN and [p.settings.replicas for p in parts] == [12, 12]
    # asked for, side by side gives each part its share of the replicas
    parts, placed = sim_plan("inf2.48xlarge", 2, 12, 1, SIDE_BY_SIDE)
    assert sum(p.settings.replicas for p in parts) == 12 and placed.mode == SIDE_BY_SIDE


@pytest.mark.skipif(not TRACE.exists(), reason="the shipped trace is missing")
def test_a_placement_that_rests_on_the_start_up_says_so():
    """(issue 29) Side by side on two instances saves a start-up: it wins on a short job whose
    layouts are compiled fresh, and the note says what wins once they are compiled before."""
    from neuron_batch.job.job import resolve_target
    from neuron_batch.layout.split import placement_note
    from neuron_batch.run.runner import split_inputs

    settings = RunSettings.of(("x",), device="sim", max_model_len=8192, max_num_seqs=8,
                           replicas=2, split_at=2048, split_placement=AUTO,
                           instance="inf2.8xlarge", tensor_parallel_size=2,
                                          architecture="llama-3.1-8b",
                                          num_instances=2).validate()
    slots, estimate = split_inputs(resolve_target(settings, None), None)
    requests = trace_requests(400)
    modes = {c: plan_parts(settings, requests, slots, estimate.assuming(c))[1].mode
             for c in (False, True)}
    placed = plan_parts(settings, requests, slots, estimate)[1]
    assert placed.mode == modes[False] == SIDE_BY_SIDE      # nothing compiled yet here
    note = placement_note(settings, requests, slots, estimate, placed)
    if modes[True] == placed.mode:
        assert note == ""
    else:
        assert note == f"; {modes[True]} if every layout is compiled before (loaded only)"


@pytest.mark.skipif(not TRACE.exists(), reason="the shipped trace is missing")
def test_the_what_if_script_weighs_more_cuts_than_one():
    import importlib.util

    from click.testing import CliRunner

    spec = importlib.util.spec_from_file_location("split_what_if",
                                                  ROOT / "scripts" / "split_what_if.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = CliRunner().invoke(module.main, ["--limit", "600", "--cuts", "", "--cuts", "2176",
                                              "--cuts", "2176,4352"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split() for line in result.output.splitlines()[2:]}
    assert set(rows) == {"single", "2176", "2176,4352"}
    assert rows["single"][3] == "1.00x"
    # a split's short layout has more slots than the single one: faster in the model
    assert float(rows["2176"][3].rstrip("x")) > 1.0


def sim_settings(**changes) -> RunSettings:
    base = dict(device="sim", max_model_len=14208, max_num_seqs=7, order="length",
                instance="inf2.8xlarge", tensor_parallel_size=2,
                               architecture="llama-3.1-8b")
    return RunSettings.of(("x",), **{**base, **changes}).validate()


@pytest.mark.skipif(not TRACE.exists(), reason="the shipped trace is missing")
def test_split_at_auto_takes_the_candidate_of_least_estimate():

    from neuron_batch.inputs.prepare import in_order
    from neuron_batch.job.job import resolve_target
    from neuron_batch.layout.split import CUT_STEP, Part, choose_cut, cut_candidates
    from neuron_batch.run.runner import split_inputs

    settings = sim_settings()
    slots, estimate = split_inputs(resolve_target(settings, None), None)
    requests = in_order(trace_requests(1500), "length")
    cut, words = choose_cut(settings, requests, slots, estimate)

    def total(at):
        if at is None:
            single = Part("single", settings, requests)
            return estimate.seconds(single) + estimate.compile_of(single)
        parts, _ = plan_parts(settings.replace(split_at=at), requests, slots, estimate)
        return sum(estimate.seconds(p) + estimate.compile_of(p) for p in parts)

    lengths = sorted(r.length for r in requests)
    every = [c for c, _ in cut_candidates(lengths, slots, settings.max_model_len, CUT_STEP)]
    assert cut in every and len(every) > 5
    assert total(cut) == pytest.approx(min(total(c) for c in every))
    assert total(cut) < total(None)
    assert words.startswith(f"--split-at auto: {cut:,} (")
    # a paged runtime (trn2, vllm-neuron) never splits: its slots do not follow max_model_len
    trn2 = sim_settings(instance="trn2.3xlarge", architecture="llama-3.1-8b",
                        max_num_seqs=32, max_num_batched_tokens=4096)
    assert choose_cut(trn2, requests, None,
                      split_inputs(resolve_target(trn2, None), None)[1])[0] is None


def test_split_at_auto_keeps_a_resumed_run_s_cut_and_needs_the_simulated_device(tmp_path):
    import json
    from types import SimpleNamespace

    from neuron_batch.errors import RunError
    from neuron_batch.run.runner import auto_split

    (tmp_path / "run.json").write_text(json.dumps({"settings": {"split_at": 2176}}))
    settings = sim_settings(split_at="auto", resume=True, output=str(tmp_path))
    assert auto_split(settings, None, None, print).split_at == 2176
    with pytest.raises(RunError, match="--split-at auto weighs cuts with the step-time model"):
        auto_split(RunSettings.of(("x",), device="cpu", split_at="auto").validate(),
                   SimpleNamespace(model=None), None, print)
    with pytest.raises(SettingsError, match="--split-at takes a number of tokens or auto"):
        RunSettings.of(("x",), split_at="half").validate()


@pytest.mark.skipif(not TRACE.exists(), reason="the shipped trace is missing")
def test_split_at_auto_on_a_neuron_host_uses_its_instance_s_model(monkeypatch):
    """On a Neuron host (no device here: --device neuron, as the runner sees it) whose instance
    is named, the estimate is the simulated device's model of that instance with the loaded
    model's shape, so auto chooses as it would on the simulated twin; unnamed, it cannot."""
    from types import SimpleNamespace

    from neuron_batch.errors import RunError
    from neuron_batch.job.job import resolve_target
    from neuron_batch.job.workload import Workload
    from neuron_batch.run.runner import auto_split

    workload = Workload(model=SimpleNamespace(path="llama-3.1-8b", name="llama"),
                        prepared=SimpleNamespace(requests=trace_requests(1500)), problems=[],
                        input_kind="trace", tokenizer=None)
    host = RunSettings.of(("x",), device="neuron", runtime="nxdi", max_model_len=14208,
                       max_num_seqs=7, order="length", split_at="auto",
                       tensor_parallel_size=2,
                       host_instance="inf2.8xlarge").validate()
    target = resolve_target(host, workload.model.path)
    assert (target.instance.name, target.tp, target.runtime.name) == ("inf2.8xlarge", 2, "nxdi")
    twin = sim_settings(split_at="auto")
    twin_workload = Workload(model=workload.model, prepared=workload.prepared, problems=[],
                             input_kind="trace", tokenizer=None)
    assert auto_split(host, workload, target, print).split_at == \
        auto_split(twin, twin_workload, resolve_target(twin, None), print).split_at
    # a host that is not an instance the hardware table knows (no --instance, no EC2 name)
    monkeypatch.setattr("neuron_batch.engine.neuron_host.host_instance", lambda settings: None)
    unnamed = RunSettings.of(("x",), device="neuron", runtime="nxdi", split_at="auto").validate()
    assert resolve_target(unnamed, workload.model.path) is None
    with pytest.raises(RunError, match="whose instance is known"):
        auto_split(unnamed, workload, resolve_target(unnamed, workload.model.path), print)


@pytest.mark.skipif(not TRACE.exists(), reason="the shipped trace is missing")
def test_split_at_auto_on_a_neuron_host_counts_a_layout_in_its_artifacts_folder_as_compiled(
        tmp_path, monkeypatch):
    """(issue 29) On a Neuron host a layout whose artifacts folder (the one its run would use,
    engine/neuron_host.py) holds graphs starts with a load only; every other one compiles."""

    from neuron_batch.job.job import resolve_target
    from neuron_batch.job.startup import host_artifacts
    from neuron_batch.layout.split import Part
    from neuron_batch.run.runner import split_inputs

    monkeypatch.setattr("neuron_batch.versions.neuron_plugin",
                        lambda: {"version": "0.2.0", "line": "0.2"})
    host = RunSettings.of(("x",), device="neuron", runtime="nxdi", max_model_len=14208,
                       max_num_seqs=7, order="length", compiled_artifacts=str(tmp_path),
                       tensor_parallel_size=2,
                       host_instance="inf2.8xlarge").validate()
    target = resolve_target(host, "llama-3.1-8b")
    requests = trace_requests(300)
    _, estimate = split_inputs(target, "llama-3.1-8b")
    single = Part("single", host, requests)
    other = Part("single", host.replace(max_num_seqs=4), requests)
    fresh, loaded = estimate.assuming(False), estimate.assuming(True)
    assert estimate.compile_of(single) == fresh.compile_of(single) > loaded.compile_of(single)
    folder = host_artifacts(host, target.runtime, "llama-3.1-8b", requests)
    assert folder.parent == tmp_path
    folder.mkdir()
    assert estimate.compile_of(single) == fresh.compile_of(single)     # made, holds nothing
    (folder / "model.pt").write_bytes(b"graphs")
    assert estimate.compile_of(single) == loaded.compile_of(single)
    assert estimate.compile_of(other) == fresh.compile_of(other)       # another layout
