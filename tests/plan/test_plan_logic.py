"""`neuron-batch plan`'s pure parts: the deadline parser, the search and its pruning, the grid's
bounds and bucket choice, command lines. No engine runs here (see test_plan.py for those)."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.bench.command_line import run_command
from neuron_batch.bench.deadline import DeadlineError, format_hours, parse_deadline
from neuron_batch.cli import main
from neuron_batch.layout.bounds import ShareStats, decode_steps_bound
from neuron_batch.plan.candidates import PlanError, PlanSpec
from neuron_batch.plan.grid import build_options, check_instances, placements
from neuron_batch.plan.search import Search, bound_key, objective_key
from neuron_batch.settings import RunSettings

NOW = datetime(2026, 11, 30, 22, 15)


# -- deadline ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, hours", [("6h", 6.0), ("90m", 1.5), ("1h30m", 1.5),
                                         ("1.5h", 1.5), ("2d", 48.0), ("45s", 0.0125),
                                         ("1h 30m", 1.5), (" 8H ", 8.0)])
def test_durations(text, hours):
    deadline = parse_deadline(text, NOW)
    assert deadline.hours == pytest.approx(hours) and deadline.at is None


def test_moments():
    assert parse_deadline("2026-12-01T06:00", NOW).hours == pytest.approx(7.75)
    assert parse_deadline("2026-12-01 06:00", NOW).at == "2026-12-01T06:00"
    assert parse_deadline("06:00", NOW).hours == pytest.approx(7.75)     # the next 6 a.m.
    assert parse_deadline("23:15", NOW).hours == pytest.approx(1.0)      # later today
    aware = parse_deadline("2026-12-01T06:00+00:00", NOW.replace(tzinfo=timezone.utc))
    assert aware.hours == pytest.approx(7.75)


@pytest.mark.parametrize("text, match", [
    ("6", "neither a duration"), ("tomorrow", "neither a duration"), ("6x", "neither"),
    ("1h1h", "neither"), ("0h", "no time at all"), ("", "empty"), ("25:00", "neither"),
    ("2026-11-30T06:00", "already passed"), ("2026-13-01T06:00", "neither")])
def test_bad_deadlines_say_what_works(text, match):
    with pytest.raises(DeadlineError, match=match) as error:
        parse_deadline(text, NOW)
    assert "already passed" in str(error.value) or "6h" in str(error.value)


def test_format_hours():
    assert [format_hours(h) for h in (1.5, 0.25, 30, 2 / 3)] == ["1 h 30 min", "15 min", "30 h",
                                                                 "40 min"]


# -- the search and its pruning ----------------------------------------------------------------

class FakeOption(SimpleNamespace):
    """What Search reads of an option: bounds, cost arithmetic, a simulation key."""

    def hours_for(self, seconds):
        return (self.compile_s + seconds) / 3600

    def usd_for(self, seconds):
        return self.hours_for(seconds) * self.price * self.n

    @property
    def hours_bound(self):
        return self.hours_for(self.bound_s)

    @property
    def usd_bound(self):
        return self.usd_for(self.bound_s)


def fake_options(draw_values) -> list[FakeOption]:
    out = []
    for i, (bound_s, slack, compile_s, price, n, key) in enumerate(draw_values):
        out.append(FakeOption(name=f"o{i}", bound_s=bound_s, actual_s=bound_s * slack,
                              compile_s=compile_s, price=price, n=n, sim_key=key,
                              skip_reason=None, result=None, pruned_by=None))
    # options sharing a simulation key share its actual time
    first = {}
    for o in out:
        o.actual_s = first.setdefault(o.sim_key, o).actual_s
        o.bound_s = min(o.bound_s, o.actual_s)
    return out


def search_all(options, deadline_h, *, prune=True):
    search = Search(options, deadline_h, prune=prune)
    simulated = 0
    while (option := search.next()) is not None:
        simulated += 1
        search.done(option, {"replica_s": option.actual_s})
    return search, simulated


def search_parallel(options, deadline_h, jobs, order):
    """As a plan with `jobs` processes runs it: up to `jobs` simulations at once, finishing in
    an order drawn by hypothesis."""
    search = Search(options, deadline_h)
    running, simulated = [], 0
    while True:
        while len(running) < jobs and (option := search.next()) is not None:
            running.append(option)
            simulated += 1
        if not running:
            return search, simulated
        option = running.pop(order.draw(st.integers(0, len(running) - 1)))
        search.done(option, {"replica_s": option.actual_s})


option_values = st.tuples(st.floats(10, 50_000), st.floats(1.0, 3.0), st.sampled_from([0, 900]),
                          st.sampled_from([0.76, 1.97, 12.98]), st.integers(1, 4),
                          st.integers(0, 12))


@settings(max_examples=300, deadline=None)
@given(st.lists(option_values, min_size=1, max_size=25), st.floats(0.05, 20))
def test_pruning_never_drops_the_option_an_unpruned_search_recommends(values, deadline_h):
    pruned_search, pruned_runs = search_all(fake_options(values), deadline_h)
    full_search, full_runs = search_all(fake_options(values), deadline_h, prune=False)
    assert pruned_search.best == full_search.best
    assert pruned_runs <= full_runs


@settings(max_examples=200, deadline=None)
@given(st.lists(option_values, min_size=1, max_size=25), st.floats(0.05, 20),
       st.integers(2, 4), st.data())
def test_parallel_search_with_held_back_options_finds_the_same_best(values, deadline_h, jobs,
                                                                    order):
    parallel, _ = search_parallel(fake_options(values), deadline_h, jobs, order)
    full_search, _ = search_all(fake_options(values), deadline_h, prune=False)
    assert parallel.best == full_search.best


def test_a_second_process_waits_rather_than_run_what_the_first_will_likely_prune():
    cheap = dict(compile_s=0, price=1.0, n=1, skip_reason=None, result=None, pruned_by=None)
    best = FakeOption(name="a", bound_s=3600, actual_s=3600, sim_key=1, **cheap)
    dearer = FakeOption(name="b", bound_s=3800, actual_s=3800, sim_key=2, **cheap)
    search = Search([best, dearer], deadline_h=2)
    assert search.next() is best and search.next() is None    # b waits for a
    search.done(best, {"replica_s": 3600})
    assert search.next() is None and search.pruned == [dearer]


def test_objective_prefers_meeting_the_deadline_then_cost():
    meets_dear, meets_cheap = objective_key(5, 20, 6), objective_key(5.9, 10, 6)
    late_fast, late_slow = objective_key(6.5, 1, 6), objective_key(9, 1, 6)
    assert meets_cheap < meets_dear < late_fast < late_slow
    # the key of a lower bound is never above the key of the figures it bounds
    for hours, usd in ((5, 20), (6.5, 1), (7, 3)):
        for h_lb, u_lb in ((hours * 0.9, usd * 0.9), (hours * 0.5, usd)):
            assert bound_key(h_lb, u_lb, 6) <= objective_key(hours, usd, 6)


# -- the grid ----------------------------------------------------------------------------------

def test_unknown_instances_and_models_that_fit_nowhere_are_plan_errors():
    with pytest.raises(PlanError, match="unknown or unsimulated instance 'inf3.xlarge'"):
        check_instances(["inf2.xlarge", "inf3.xlarge"])
    with pytest.raises(PlanError, match="fits none of the candidates"):
        placements(PlanSpec(architecture="llama-3.1-70b", instances=("inf2.xlarge",)))
    with pytest.raises(PlanError, match="exceeds Llama-2-7B's context of 4096"):
        placements(PlanSpec(architecture="llama-2-7b", max_model_len=8192))
    # (compiled: inf2.xlarge's host cannot compile an 8B model; see the test below)
    found, excluded = placements(PlanSpec(architecture="llama-3.1-8b", compiled=True,
                                          instances=("inf2.xlarge", "inf2.24xlarge")))
    assert [(p.instance, p.tp, p.replicas) for p in found] == [
        ("inf2.xlarge", 2, 1), ("inf2.24xlarge", 2, 6), ("inf2.24xlarge", 4, 3),
        ("inf2.24xlarge", 8, 1), ("inf2.24xlarge", 12, 1)]
    assert any("TP 1" in reason for reason in excluded)


def test_a_host_too_small_to_compile_the_model_is_left_out_unless_compiled():
    spec = PlanSpec(architecture="llama-3.1-8b", instances=("inf2.xlarge", "inf2.8xlarge"))
    found, excluded = placements(spec)
    assert {p.instance for p in found} == {"inf2.8xlarge"}
    reason = next(r for r in excluded if r.startswith("inf2.xlarge:"))
    assert "16 GiB of host memory" in reason and "issue 1222" in reason
    assert "--compiled" in reason
    found, _ = placements(PlanSpec(**{**spec.__dict__, "compiled": True}))
    assert {p.instance for p in found} == {"inf2.xlarge", "inf2.8xlarge"}
    # a model small enough compiles there
    found, _ = placements(PlanSpec(**{**spec.__dict__, "architecture": "tinyllama-1.1b"}))
    assert "inf2.xlarge" in {p.instance for p in found}


def test_the_recommendation_names_the_hosts_left_out_for_their_memory():
    """(issue 29) A plan compiled fresh that leaves inf2.xlarge out says so beside its
    recommendation, and that --compiled weighs it (the nightly case may rent it)."""
    from neuron_batch.plan.words import _left_out_words

    spec = PlanSpec(architecture="llama-3.1-8b", instances=("inf2.xlarge", "inf2.8xlarge"))
    _, excluded = placements(spec)
    meta = {"excluded": excluded + excluded, "architecture": "llama-3.1-8b", "compiled": False}
    [words] = _left_out_words(meta)
    assert words.startswith("Not weighed: inf2.xlarge, whose host memory cannot compile "
                            "llama-3.1-8b") and "(--compiled" in words and "it is weighed" in words
    assert _left_out_words({**meta, "compiled": True}) == []
    _, excluded = placements(PlanSpec(**{**spec.__dict__, "architecture": "tinyllama-1.1b"}))
    assert _left_out_words({**meta, "excluded": excluded}) == []


def test_options_share_a_simulation_when_the_hardware_is_the_same():
    spec = PlanSpec(architecture="llama-3.1-8b", instances=("inf2.xlarge", "inf2.8xlarge"),
                    max_num_instances=2, seqs_values=(8,), max_model_len=4096,
                    max_num_batched_tokens=2048, compiled=True)
    found, _ = placements(spec)
    lens = [300 + 37 * i % 1500 for i in range(40)]
    options = build_options(spec, found, lens, [50] * 40, seed=0)
    by_name = {o.name: o for o in options}
    small, large = by_name["1x inf2.xlarge 1xTP2 S8"], by_name["1x inf2.8xlarge 1xTP2 S8"]
    assert small.sim_key == large.sim_key and small.bound_s == large.bound_s
    assert large.usd_bound > small.usd_bound
    assert by_name["2x inf2.xlarge 1xTP2 S8"].share_size == 20


def test_more_prefill_buckets_only_when_worth_their_compile_time():
    spec = PlanSpec(architecture="llama-3.1-8b", instances=("inf2.48xlarge",),
                    max_num_instances=1, seqs_values=(8,), max_model_len=8192,
                    max_num_batched_tokens=8192, max_prefill_buckets=4)
    found, _ = placements(spec)
    lens = [100 + (i * 7919) % 7000 for i in range(3000)]
    many = {o.tp: o for o in build_options(spec, found, lens, [20] * 3000, seed=0)}
    compiled = {o.tp: o for o in build_options(
        PlanSpec(**{**spec.__dict__, "compiled": True}), found, lens, [20] * 3000, seed=0)}
    for tp, option in many.items():
        assert option.prefill_buckets[-1] == 8192
        # compiled before, the start-up is the load whatever the buckets (issue 29: it was 0)
        assert len(compiled[tp].prefill_buckets) == 4
        assert 0 < compiled[tp].compile_s < 60
        assert len(option.prefill_buckets) <= 4 and option.compile_s > compiled[tp].compile_s


def test_decode_steps_bound_counts_kv_and_max_num_seqs():
    stats = ShareStats.of([1000, 2000], [101, 51], max_num_batched_tokens=4096,
                          max_model_len=4096, block_size=32)
    assert stats.decode_tokens == 150 and stats.chunks == {(1000, 0): 1, (2000, 0): 1}
    assert stats.context_sum == 100 * 1000 + 100 * 99 // 2 + 50 * 2000 + 50 * 49 // 2
    common = {"block_size": 32, "max_model_len": 4096}
    assert decode_steps_bound(stats, max_num_seqs=2, num_blocks=1000, kv_reserve="request",
                              **common) == 75
    # room for one max_model_len request: one at a time
    assert decode_steps_bound(stats, max_num_seqs=2, num_blocks=129,
                              kv_reserve="max_model_len", **common) == 150
    # the KV actually held limits every admission rule
    assert decode_steps_bound(stats, max_num_seqs=64, num_blocks=41, kv_reserve="none",
                              **common) == -(-stats.context_sum // (32 * 40))


def test_either_spelling_of_the_max_model_len_rule_gives_the_same_plan_bound():
    """Issue 32: RunSettings kept a library caller's 'max-model-len' as given while the bounds
    compared with 'max_model_len', so a plan built from those settings silently took the
    weaker bound of no admission rule."""
    def bounds(spelling):
        settings = RunSettings.of(inputs=("x",), device="sim", kv_reserve=spelling,
                               max_model_len=4096,
                               instance="trn2.3xlarge",
                                              architecture="llama-3.1-8b").validate()
        spec = PlanSpec.from_settings(settings, instances=("trn2.3xlarge",),
                                      max_num_instances=1, seqs_values=(64,),
                                      prices={"trn2.3xlarge": 3.0})
        found, _ = placements(spec)
        options = build_options(spec, found, [3000] * 200, [500] * 200, seed=0)
        return [(o.name, o.bound_steps, o.bound_s) for o in options]

    assert bounds("max-model-len") == bounds("max_model_len") != bounds("request")


def test_a_plan_takes_the_settings_fields_from_the_settings():
    settings = RunSettings.of(inputs=("x",), device="sim", max_model_len=8192,
                           max_num_batched_tokens=4096, kv_reserve="max-model-len",
                           runtime="vllm-neuron",
                           instance="trn2.3xlarge", architecture="llama-3.1-8b",
                                          weight_dtype="fp8", cost_profile="p.json",
                           pricing="reserved")
    spec = PlanSpec.from_settings(settings, instances=("trn2.3xlarge",), splits=False)
    assert (spec.architecture, spec.weight_dtype, spec.cost_profile, spec.max_model_len,
            spec.max_num_batched_tokens, spec.kv_reserve, spec.pricing, spec.runtime,
            spec.instances, spec.splits) == (
        "llama-3.1-8b", "fp8", "p.json", 8192, 4096, "max_model_len", "reserved",
        "vllm-neuron", ("trn2.3xlarge",), False)
    with pytest.raises(TypeError):      # a settings field is never given twice
        PlanSpec.from_settings(settings, max_model_len=2048)
    with pytest.raises(PlanError, match="--architecture"):
        PlanSpec.from_settings(RunSettings.of(inputs=("x",), device="sim"))


def test_a_plan_s_settings_default_as_run_s():
    """Issue 49: PlanSpec's kv_reserve defaulted to max_model_len where run's is request;
    every field of PlanSpec that is a run setting now defaults as the declaration says."""
    from neuron_batch.plan.candidates import SETTINGS_FIELDS

    spec, run = PlanSpec(architecture="llama-3.1-8b"), RunSettings()
    assert len(SETTINGS_FIELDS) == 9 and "kv_reserve" in SETTINGS_FIELDS
    assert {n: getattr(spec, n) for n in SETTINGS_FIELDS if n != "architecture"} == \
        {n: getattr(run, n) for n in SETTINGS_FIELDS if n != "architecture"}
    assert spec.kv_reserve == "request"


def test_the_default_plan_instances_are_the_calibrated_ones_their_runtime_ships_for():
    from neuron_batch.device.hardware import INSTANCES
    from neuron_batch.plan.candidates import DEFAULT_INSTANCES
    from neuron_batch.runtimes.runtime import default_runtime

    assert DEFAULT_INSTANCES == ("inf2.xlarge", "inf2.8xlarge", "inf2.24xlarge",
                                 "inf2.48xlarge", "trn1.32xlarge")
    assert PlanSpec(architecture="llama-3.1-8b").instances == DEFAULT_INSTANCES
    for name in DEFAULT_INSTANCES:
        inst = INSTANCES[name]
        assert inst.calibrated
        assert default_runtime(inst.family).not_shipped_for(name, inst.family) is None
    plan = next(c for c in main.commands.values() if c.name == "plan")
    default = next(p for p in plan.params if p.name == "instances").default
    assert tuple(default.split(",")) == DEFAULT_INSTANCES


# -- command lines -----------------------------------------------------------------------------

@pytest.mark.parametrize("buckets", [
    {"runtime": "vllm-neuron", "prefill_buckets": (512, 4096), "decode_buckets": (16,),
     "decode_context_buckets": (1024,), "instance": "trn2.48xlarge"},
    {"runtime": "nxdi", "context_encoding_buckets": (512, 8192),
     "token_generation_buckets": (2048, 8192), "instance": "inf2.24xlarge"},
])
def test_the_command_line_gives_the_same_settings_back(monkeypatch, tmp_path, buckets):
    import neuron_batch.run.runner as runner

    buckets = dict(buckets)
    instance = buckets.pop("instance")      # (each runtime on hardware AWS ships it for)
    settings = RunSettings.of(inputs=("my trace.csv",), device="sim", max_num_seqs=16,
                           max_num_batched_tokens=4096, max_model_len=8192, **buckets,
                           max_tokens=99, shuffle=True, seed=7, limit=123,
                           instance=instance, architecture="llama-3-8b",
                                          tensor_parallel_size=4, weight_dtype="int8",
                           pricing="reserved")
    line = run_command(settings)
    assert line.startswith("neuron-batch run 'my trace.csv' --device sim")
    seen = {}

    def fake_run(received):
        seen["settings"] = received
        return SimpleNamespace(exit_code=0)

    monkeypatch.setattr(runner, "run", fake_run)
    import shlex
    result = CliRunner().invoke(main, shlex.split(line)[1:] + ["-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    got = seen["settings"]
    keep = {"output": None, "quiet": False}
    # the line spells out every compiled list, defaults included
    resolved = settings.with_buckets(settings.resolve_runtime(),
                                     *_lists(settings.shapes()))
    assert got.replace(**keep) == resolved.replace(**keep)


def _lists(shapes):
    runtime = shapes.runtime
    return (shapes.prefill_buckets, None if runtime.static_kv else shapes.decode_buckets,
            shapes.attention_buckets)


def test_plan_cli_refuses_bad_input_before_reading_anything(tmp_path):
    def plan(*args):
        return CliRunner().invoke(main, ["plan", str(tmp_path / "absent.csv"),
                                         "--architecture", "llama-3.1-8b", "--deadline", "6h",
                                         "-o", str(tmp_path / "out"), *args])

    for args, message in ((["--instances", "inf2.xlarge,p4d.24xlarge"], "'p4d.24xlarge'"),
                          (["--deadline", "by dawn"], "neither a duration"),
                          (["--architecture", "llama-3.1-70b", "--instances", "inf2.8xlarge"],
                           "fits none of the candidates"),
                          (["--architecture", "gpt-5"], "gpt-5"),
                          (["--max-num-instances", "0"], "--max-num-instances"),
                          (["--price-per-hour", "3"], "instance=USD pairs"),
                          (["--instances", "inf2.xlarge", "--price-per-hour", "inf2.8xlarge=1"],
                           "not in --instances")):
        result = plan(*args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
    assert not (tmp_path / "out").exists()


def test_the_layout_line_runs_every_replica_over_the_instances(monkeypatch, tmp_path):
    import shlex

    import neuron_batch.run.runner as runner
    from neuron_batch.plan.planner import layout_settings, option_settings, plan_base

    spec = PlanSpec(architecture="llama-3.1-8b", instances=("inf2.24xlarge",),
                    max_num_instances=2, seqs_values=(16,), max_model_len=4096,
                    max_num_batched_tokens=2048)
    found, _ = placements(spec)
    options = build_options(spec, found, [1000] * 40, [50] * 40, seed=3)
    option = next(o for o in options if o.name == "2x inf2.24xlarge 6xTP2 S16")
    base, _ = plan_base(RunSettings.of(inputs=("t.csv",), max_model_len=4096,
                                    max_num_batched_tokens=2048, limit=40, seed=3,
                                    architecture="llama-3.1-8b"))
    seen = []
    monkeypatch.setattr(runner, "run", lambda s: seen.append(s) or SimpleNamespace(exit_code=0))
    for run_settings in (option_settings(base, option, None), layout_settings(base, option)):
        line = run_command(run_settings)
        result = CliRunner().invoke(main, shlex.split(line)[1:] + ["-o", str(tmp_path)])
        assert result.exit_code == 0, result.output
    one, layout = seen
    assert (one.replicas, one.num_instances, one.limit, one.shuffle) == (1, 1, 4, True)
    assert (layout.replicas, layout.num_instances, layout.limit) == (12, 2, 40)
    assert one.kv_reserve == layout.kv_reserve == "request"
    # inf2 runs nxdi: the prefill buckets are context-encoding buckets, decode runs every slot
    assert one.runtime == layout.runtime == "nxdi"
    assert (one.tensor_parallel_size, one.context_encoding_buckets) == (
        2, option.prefill_buckets)
    assert one.token_generation_buckets == option.attention_buckets
    assert one.prefill_buckets is None and one.decode_buckets is None


# -- the runtimes in the grid ------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(seqs=st.lists(st.sampled_from([4, 6, 8, 16, 32, 64]), min_size=1, max_size=3,
                     unique=True),
       length=st.sampled_from([4096, 8192, 16384]))
def test_plan_never_offers_a_layout_that_cannot_load(seqs, length):
    """Under nxdi (inf2, trn1) an option's static KV cache of max_num_seqs x max_model_len fits
    beside the weights, checked independently of the grid; a max_num_seqs that does not fit is
    left out with a reason, and the most slots that fit stand in for it."""
    from neuron_batch.device.static_kv import static_slots

    spec = PlanSpec(architecture="llama-3.1-8b", instances=("inf2.xlarge", "inf2.24xlarge"),
                    max_num_instances=1, seqs_values=tuple(seqs), max_model_len=length,
                    max_num_batched_tokens=2048, compiled=True)
    found, _ = placements(spec)
    excluded: list[str] = []
    options = build_options(spec, found, [1000] * 30, [64] * 30, seed=0, excluded=excluded)
    assert options
    for option in options:
        assert option.runtime.name == "nxdi"
        slots = static_slots(option.placement.target.instance, option.placement.target.arch,
                             option.tp, "bf16", option.max_model_len)
        assert option.max_num_seqs <= slots, option.name
    for placement in found:
        fit = static_slots(placement.target.instance, placement.target.arch, placement.tp,
                           "bf16", length)
        if any(s > fit for s in seqs):
            assert any(r.startswith(f"{placement.instance} TP {placement.tp} at max_model_len "
                                    f"{length}") and "cannot load under nxdi" in r
                       for r in excluded)
            assert any(o.placement is placement and o.max_num_seqs == fit for o in options)


def test_plan_weighs_the_tightest_max_model_len_and_trn2_needs_a_price():
    from neuron_batch.plan.grid import model_len_candidates

    spec = PlanSpec(architecture="llama-3.1-8b", max_model_len=16384)
    assert model_len_candidates(spec, [1000, 3000], [100, 1000]) == (4096, 16384)
    assert model_len_candidates(spec, [1000], [20]) == (1024, 16384)
    assert model_len_candidates(spec, [16000], [384]) == (16384,)
    trn2 = PlanSpec(architecture="llama-3.1-8b", instances=("trn2.48xlarge", "inf2.xlarge"),
                    max_model_len=4096, compiled=True)
    found, excluded = placements(trn2)
    assert {p.instance for p in found} == {"inf2.xlarge"}
    assert any(r.startswith("trn2.48xlarge:") and "--price-per-hour" in r for r in excluded)
    priced = PlanSpec(**{**trn2.__dict__, "prices": {"trn2.48xlarge": 40.0}})
    found, _ = placements(priced)
    beta = [p for p in found if p.instance == "trn2.48xlarge"]
    assert beta and all(p.runtime.name == "vllm-neuron" for p in beta)
    # forced onto every instance, the Beta plugin's runtime leaves out those AWS does not ship
    # it for (no figure for a layout that cannot load), and NxDI runs on trn2 too
    forced = PlanSpec(**{**priced.__dict__, "runtime": "vllm-neuron"})
    found, excluded = placements(forced)
    assert {p.instance for p in found} == {"trn2.48xlarge"}
    assert any(r.startswith("inf2.xlarge: --runtime vllm-neuron does not run on inf2.xlarge")
               for r in excluded)
    found, _ = placements(PlanSpec(**{**priced.__dict__, "runtime": "nxdi"}))
    assert {p.instance for p in found} == {"trn2.48xlarge", "inf2.xlarge"}


def test_split_options_weigh_every_candidate_cut_under_a_static_cache_only():
    from neuron_batch.device.architectures import resolve_architecture
    from neuron_batch.device.static_kv import static_slots
    from neuron_batch.layout.split import MAX_SHORT_SLOTS, cut_candidates, fitted_buckets
    from neuron_batch.plan.splits import split_options

    spec = PlanSpec(architecture="llama-3.1-8b", instances=("inf2.xlarge", "trn2.48xlarge"),
                    max_num_instances=1, seqs_values=(4,), max_model_len=8192,
                    prices={"trn2.48xlarge": 40.0}, compiled=True)
    found, _ = placements(spec)
    prompts = [200 + (i * 397) % 3000 for i in range(60)] + [7000]
    outputs = [20 + i % 50 for i in range(61)]
    singles = build_options(spec, found, prompts, outputs, seed=0)
    splits = split_options(spec, singles, prompts, outputs)
    assert splits and all(o.runtime.static_kv for o in splits)        # none on trn2
    assert not split_options(PlanSpec(**{**spec.__dict__, "splits": False}), singles,
                             prompts, outputs)
    arch = resolve_architecture("llama-3.1-8b")
    for single in (o for o in singles if o.runtime.static_kv):
        mine = [o for o in splits if o.name.startswith(single.name + " split")]
        share = [p + o for p, o in zip(prompts[:single.share_size], outputs)]
        inst = single.placement.target.instance
        slots = lambda n: min(static_slots(inst, arch, single.tp, "bf16", n),  # noqa: E731,B023
                              MAX_SHORT_SLOTS, max(sum(x <= n for x in share), 1))  # noqa: B023
        expected = cut_candidates(share, slots, single.max_model_len)
        assert [(o.split.cut, o.split.max_num_seqs) for o in mine] == expected
        for option in mine:
            assert option.split.requests == sum(n <= option.split.cut for n in share)
            assert option.compile_s == pytest.approx(single.compile_s + option.split.compile_s)
            # the graphs layout/split.py's fitted lists will compile, counted without solving
            short = [(p, p + o) for p, o in zip(prompts[:single.share_size], outputs)
                     if p + o <= option.split.cut]
            prefill, _, attention = fitted_buckets(single.runtime, [p for p, _ in short],
                                                   [n for _, n in short], option.split.cut)
            assert option.split.num_graphs == len(prefill) + len(attention)
            assert option.sim_key != single.sim_key and option.max_num_seqs == single.max_num_seqs


def test_a_split_layout_starts_up_on_its_own_instances_host():
    """inf2.xlarge and inf2.8xlarge share a chip, so their splits share bounds, but not a host:
    each split's compile is its own host's (4 or 32 compile workers), as when its instance is
    planned alone."""
    from neuron_batch.plan.splits import split_options

    spec = PlanSpec(architecture="tinyllama-1.1b", instances=("inf2.xlarge", "inf2.8xlarge"),
                    max_num_instances=1, seqs_values=(8,), max_model_len=2048)
    prompts = [200 + (i * 397) % 1200 for i in range(300)] + [1900]
    outputs = [20 + i % 50 for i in range(301)]

    def splits(spec):
        singles = build_options(spec, placements(spec)[0], prompts, outputs, seed=0)
        return {o.name: o for o in split_options(spec, singles, prompts, outputs)}

    both = splits(spec)
    for instance in spec.instances:
        alone = splits(PlanSpec(**{**spec.__dict__, "instances": (instance,)}))
        assert alone and all((both[name].compile_s, both[name].bound_s)
                             == (option.compile_s, option.bound_s)
                             for name, option in alone.items())
    small = {name.replace("inf2.xlarge", "inf2.8xlarge"): option
             for name, option in both.items() if "inf2.xlarge" in name}
    assert all(both[name].bound_s == option.bound_s for name, option in small.items())
    assert any(both[name].split.compile_s < option.split.compile_s
               for name, option in small.items())


def test_the_left_out_line_names_each_placement_once_and_the_max_num_seqs_left_out():
    """Two max_model_len candidates leave the same unpriced, uncompilable or too-small
    placements out: the log names each once; a placement whose larger max_num_seqs do not
    load says from which one up, not the whole layout."""
    from neuron_batch.device.static_kv import static_slots
    from neuron_batch.plan.words import left_out_line

    excluded: list[str] = []
    for length in (8192, 16384):
        spec = PlanSpec(architecture="llama-3.1-8b", max_model_len=length,
                        instances=("inf2.xlarge", "inf2.8xlarge", "trn2.48xlarge"),
                        max_num_instances=1, seqs_values=(4, 16, 32, 64))
        found, left_out = placements(spec)
        excluded += [reason for reason in left_out if reason not in excluded]
        build_options(spec, found, [1000] * 30, [64] * 30, seed=0, excluded=excluded)
    line = left_out_line(excluded)
    names = line.split(": ", 1)[1].split("; e.g. ")[0].split(", ")
    assert len(names) == len(set(names)) and line.startswith(f"  left out ({len(names)}; ")
    assert names.count("inf2.xlarge") == 1 and names.count("trn2.48xlarge") == 1
    found, _ = placements(PlanSpec(architecture="llama-3.1-8b", instances=("inf2.8xlarge",),
                                   max_model_len=8192))
    tp2 = next(p for p in found if p.tp == 2)
    fit = static_slots(tp2.target.instance, tp2.target.arch, 2, "bf16", 8192)
    first = min(s for s in (4, 16, 32, 64) if s > fit)
    assert f"inf2.8xlarge TP 2 at max_model_len 8192 (max_num_seqs {first} and up)" in names
    assert "inf2.8xlarge TP 2 at max_model_len 8192" not in names


def test_plans_own_options_are_declared_beside_the_run_settings():
    """plan's options of its own (--deadline, --instances, --max-num-seqs as a list, ...) were
    41 hand-written click options with defaults copied into PlanSpec: each is now a declaration
    (settings/plan_options.py) that its option, its range check and PlanSpec's default read."""
    from neuron_batch.plan.candidates import DEFAULT_MAX_NUM_INSTANCES, DEFAULT_SEQS
    from neuron_batch.settings.plan_options import PLAN_DECLARED, check_plan_options
    from neuron_batch.settings.run_settings import SettingsError

    plan = next(c for c in main.commands.values() if c.name == "plan")
    params = {p.name: p for p in plan.params}
    for d in PLAN_DECLARED:
        option = params[d.name]
        assert f"--{d.flag}" in option.opts and option.help == d.setting.help
        assert option.default == d.default
    assert "--max-num-seqs" in params["seqs_values"].opts
    spec = PlanSpec(architecture="llama-3.1-8b")
    assert spec.seqs_values == DEFAULT_SEQS == (8, 16, 32, 64)
    assert spec.max_num_instances == DEFAULT_MAX_NUM_INSTANCES
    assert DEFAULT_MAX_NUM_INSTANCES == params["max_num_instances"].default
    with pytest.raises(SettingsError, match="--max-prefill-buckets must be a positive"):
        check_plan_options({"max_prefill_buckets": 0})
    check_plan_options({"jobs": None})       # (None: the cores)
    result = CliRunner().invoke(main, ["plan", "x.jsonl", "--architecture", "llama-3.1-8b",
                                       "--deadline", "6h", "--jobs", "0"])
    assert result.exit_code == 2 and "--jobs must be a positive whole number" in result.output
