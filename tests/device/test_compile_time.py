"""The compile-time model (device/compile_time.py), its fit (compile_fit.py), a profile's
`compile` section, the engine-log reader and the simulated compile cache."""

from __future__ import annotations

import json
import logging

import pytest

from neuron_batch.device import compile_cache, compile_fit
from neuron_batch.device.architectures import get_architecture
from neuron_batch.device.compile_log import parse_startup
from neuron_batch.device.compile_time import (
    DEFAULT_COMPILE,
    CompileParams,
    compile_footprint,
    compile_workers,
    estimate_startup,
    graph_times,
    host_memory_warning,
    makespan,
)
from neuron_batch.device.cost_model import load_profile
from neuron_batch.device.hardware import get_instance
from neuron_batch.device.target import Target
from neuron_batch.runtimes.runtime import get_runtime

NXDI, BETA = get_runtime("nxdi"), get_runtime("vllm-neuron")
INF2_X, INF2_8X = get_instance("inf2.xlarge"), get_instance("inf2.8xlarge")
LLAMA, TINY = get_architecture("llama-3.1-8b"), get_architecture("tinyllama-1.1b")


def startup(**changes):
    args = dict(arch=LLAMA, tp=2, weight_dtype="bf16", prefill_graphs=8,
                decode_graphs=8, instance=INF2_8X)
    args.update(changes)
    return estimate_startup(args.pop("arch"), args.pop("tp"), args.pop("weight_dtype"), **args)


def test_shape_of_the_build_trace_in_turn_priority_alone_rest_in_parallel():
    one = startup(prefill_graphs=1, decode_graphs=1)
    sixteen = startup()
    decode, prefill = graph_times(DEFAULT_COMPILE, one_arch(), 2)
    # two graphs: the priority (decode) graph alone, then the prefill graph
    assert one.priority_s == pytest.approx(decode) and one.parallel_s == pytest.approx(prefill)
    # tracing is per graph, one after another
    assert sixteen.trace_s == pytest.approx(8 * one.trace_s)
    # 15 graphs on inf2.8xlarge's 32 vCPUs compile at once: as long as one graph
    assert compile_workers(INF2_8X) == 32
    assert sixteen.parallel_s == pytest.approx(max(decode, prefill))
    # a 4-vCPU host runs 4 at once: 15 graphs take 4 rounds
    small = startup(arch=TINY, instance=INF2_X)
    d, p = graph_times(DEFAULT_COMPILE, small_arch(), 2)
    assert compile_workers(INF2_X) == 4
    assert small.parallel_s == pytest.approx(4 * max(d, p))
    # minutes, not the 2.1 hours of 30 s per graph per GB
    assert 3 * 60 < sixteen.total_s < 15 * 60


def one_arch():
    from neuron_batch.device.architectures import resolve_architecture
    return resolve_architecture("llama-3.1-8b")


def small_arch():
    from neuron_batch.device.architectures import resolve_architecture
    return resolve_architecture("tinyllama-1.1b")


def test_makespan_takes_jobs_in_order_on_the_first_free_worker():
    assert makespan([], 4) == 0.0
    assert makespan([5.0, 1.0, 1.0, 1.0], 2) == 5.0
    assert makespan([2.0] * 5, 2) == 6.0
    assert makespan([3.0], 32) == 3.0


def test_weights_drive_the_load_not_the_compile():
    bf16, int8 = startup(), startup(weight_dtype="int8")
    assert int8.compile_s == bf16.compile_s
    assert int8.load_s < bf16.load_s
    assert bf16.load_s == pytest.approx(one_arch().weight_bytes("bf16")
                                        / (DEFAULT_COMPILE.load_gb_s * 1e9))


def test_more_layers_take_longer_and_prefill_follows_its_ratio():
    faster = CompileParams(**{**DEFAULT_COMPILE.to_dict(), "prefill_ratio": 0.5})
    decode, prefill = graph_times(faster, one_arch(), 2)
    assert prefill == pytest.approx(0.5 * decode)
    assert graph_times(DEFAULT_COMPILE, small_arch(), 2)[0] < decode   # 22 layers vs 32


def test_a_runtime_compiling_one_graph_after_another_adds_them_up():
    parallel = compile_footprint(8, 8, LLAMA, tp=2, instance=INF2_8X, runtime=NXDI)
    serial = compile_footprint(8, 8, LLAMA, tp=2, instance=INF2_8X, runtime=BETA)
    graph = parallel["startup"]["priority_s"]
    assert serial["startup"]["workers"] == 1
    assert serial["startup"]["parallel_s"] == pytest.approx(15 * graph)
    assert parallel["startup"]["parallel_s"] == pytest.approx(graph)


def test_compiled_graphs_cost_their_load_only():
    fresh, loaded = startup(), startup(compiled=True)
    assert loaded.compile_s == 0.0 and loaded.total_s == pytest.approx(fresh.load_s)
    assert compile_footprint(8, 8, LLAMA, tp=2, compiled=True)["estimated_compile_s"] \
        == pytest.approx(fresh.load_s)


def test_a_host_too_small_to_compile_is_warned_and_gets_no_estimate():
    warning = host_memory_warning(INF2_X, LLAMA)
    assert "16 GiB" in warning and "issue 1222" in warning and "--compiled" in warning
    too_small = startup(instance=INF2_X)
    assert too_small.host_warning == warning
    assert too_small.compile_s is None and too_small.total_s is None
    # graphs compiled elsewhere still load there
    assert startup(instance=INF2_X, compiled=True).total_s > 0
    assert host_memory_warning(INF2_8X, LLAMA) is None
    assert host_memory_warning(INF2_X, TINY) is None
    assert host_memory_warning(None, LLAMA) is None


def test_built_in_values_are_the_fit_and_the_fit_holds_its_figures():
    assert compile_fit.refit_default() == DEFAULT_COMPILE
    for profile_name in ("inf2.8xlarge", "trn1.32xlarge"):
        assert load_profile(profile_name).compile == DEFAULT_COMPILE
    fitted = compile_fit.errors(DEFAULT_COMPILE, compile_fit.FITTED)
    assert max(abs(error) for _, _, error in fitted) < 0.35
    # every held-out figure is newer and faster: the model over-states them (an upper bound)
    assert all(error > 0 for _, _, error in compile_fit.errors(DEFAULT_COMPILE,
                                                                 compile_fit.HELD_OUT))
    section = compile_fit.markdown(DEFAULT_COMPILE)
    assert "## Compile time" in section and "(held out)" in section


def test_calibration_md_has_the_current_compile_section():
    from neuron_batch.device.cost_model import PROFILES_DIR

    text = (PROFILES_DIR.parent / "CALIBRATION.md").read_text(encoding="utf-8")
    assert compile_fit.markdown(DEFAULT_COMPILE) in text


# -- a profile's compile section ---------------------------------------------------------------

def write_profile(tmp_path, change):
    data = load_profile("inf2.8xlarge").to_dict()
    change(data)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("change, words", [
    (lambda d: d["compile"].pop("graph_s"), "compile.graph_s is missing"),
    (lambda d: d["compile"].update(graph_s="fast"), "compile.graph_s must be a number"),
    (lambda d: d["compile"].update(load_gb_s=0), "compile.load_gb_s must be a positive"),
    (lambda d: d["compile"].update(minutes=3), "compile: unknown field(s) minutes"),
    (lambda d: d.update(compile=[1, 2]), "compile must be an object"),
])
def test_a_malformed_compile_section_is_named_with_the_file_and_field(tmp_path, change, words):
    path = write_profile(tmp_path, change)
    with pytest.raises(ValueError) as error:
        load_profile(path)
    assert str(path) in str(error.value) and words in str(error.value)


def test_a_profile_without_compile_section_loads_with_a_warning(tmp_path, caplog):
    def old_style(data):
        data.pop("compile")
        data["compile_s_per_graph_per_gb"] = 30.0
    path = write_profile(tmp_path, old_style)
    with caplog.at_level(logging.WARNING):
        profile = load_profile(path)
    assert profile.compile is None and profile.compile_params == DEFAULT_COMPILE
    assert str(path) in caplog.text and "`compile` section" in caplog.text
    assert "compile_s_per_graph_per_gb is no longer used" in caplog.text


def test_a_profile_carries_its_own_compile_figures(tmp_path):
    path = write_profile(tmp_path, lambda d: d["compile"].update(graph_s=60.0))
    mine = load_profile(path)
    assert mine.compile.graph_s == 60.0
    ours = compile_footprint(1, 1, LLAMA, tp=2)["startup"]["priority_s"]
    theirs = compile_footprint(1, 1, LLAMA, tp=2, profile=mine)["startup"]["priority_s"]
    assert theirs == pytest.approx(ours * 60.0 / DEFAULT_COMPILE.graph_s)


# -- what the engine log says, and the simulated cache -------------------------------------------

WRAPPER = "2026-12-01 02:00:05.000001:  11  INFO ||NEURON_CC_WRAPPER||: "
ENGINE_LOG = "\n".join([
    "INFO:Neuron:Generating HLOs for the following models: ['context_encoding_model', ...]",
    "INFO:Neuron:Generated all HLOs in 13.5 seconds",
    "INFO:Neuron:Starting compilation for the priority HLO",
    WRAPPER + "Call compiler with cmd: neuronx-cc compile --framework=XLA a.pb -O2",
    "INFO:Neuron:Done compilation for the priority HLO in 45.2 seconds",
    WRAPPER + "Using a cached neff at /var/tmp/neuron-compile-cache/MODULE_1+2/model.neff",
    "INFO:Neuron:Finished Compilation for all HLOs in 49.7 seconds",
    "INFO:Neuron:Done Sharding weights in 20.5",
    "INFO:Neuron:Finished weights loading in 31.0", ""])


def test_the_engine_log_says_which_graphs_came_from_the_cache_and_how_long_each_phase_took():
    found = parse_startup(ENGINE_LOG)
    assert found["cached_graphs"] == 1 and found["compiled_graphs"] == 1
    assert not found["from_cache"]
    assert found["phases"] == {"trace_s": 13.5, "priority_s": 45.2, "parallel_s": 49.7,
                               "shard_s": 20.5, "load_s": 31.0}
    cached = parse_startup("Using a cached neff at /x/model.neff\n" * 3)
    assert cached["from_cache"] and cached["cached_graphs"] == 3
    assert parse_startup("nothing of Neuron here") == {
        "cached_graphs": 0, "compiled_graphs": 0, "phases": {}, "from_cache": False}


def test_the_simulated_cache_holds_a_configuration_once_recorded(tmp_path):
    target = Target.resolve(instance=INF2_8X, arch="tinyllama-1.1b", tp=2,
                            runtime=NXDI, max_model_len=2048, max_num_seqs=8)
    shapes = NXDI.shapes({}, max_num_seqs=8, max_num_batched_tokens=2048, max_model_len=2048)
    other = NXDI.shapes({"context_encoding_buckets": [512, 2048]}, max_num_seqs=8,
                        max_num_batched_tokens=2048, max_model_len=2048)
    assert not compile_cache.holds(tmp_path, target, shapes)
    assert not compile_cache.holds(None, target, shapes)
    compile_cache.record(tmp_path, target, shapes)
    assert compile_cache.holds(tmp_path, target, shapes)
    assert not compile_cache.holds(tmp_path, target, other)      # other buckets: other graphs
    described = target.describe(num_prefill_buckets=len(shapes.prefill_buckets),
                                num_decode_buckets=len(shapes.attention_buckets),
                                num_graphs=shapes.num_graphs, compiled=True)["compile"]
    assert described["compiled"] and described["startup"]["compile_s"] == 0.0


# -- calibrate: a run's start-up -----------------------------------------------------------------

def test_a_runs_logged_phases_become_its_compile_section():
    from neuron_batch.device.calibrate_compile import fit_from_startup

    arch = one_arch()
    logged = {"compiled_before": False, "measured_s": 400.0,
              "phases": {"trace_s": 64.0, "priority_s": 100.0, "parallel_s": 80.0,
                         "load_s": 20.0}}
    fitted, words = fit_from_startup(logged, arch=arch, tp=2, instance=INF2_8X,
                                     prefill_graphs=7, decode_graphs=1)
    assert fitted.trace_s_per_layer == pytest.approx(64.0 / (8 * 32))
    assert graph_times(fitted, arch, 2)[0] == pytest.approx(100.0, rel=1e-3)
    assert fitted.prefill_ratio == pytest.approx(0.8)          # 7 prefill graphs at once
    assert fitted.load_gb_s == pytest.approx(arch.weight_bytes() / 1e9 / 20.0, rel=1e-3)
    assert "priority graph 100 s" in words
    again = estimate_startup(arch, 2, "bf16", prefill_graphs=7, decode_graphs=1,
                             instance=INF2_8X, params=fitted)
    assert again.total_s == pytest.approx(64 + 100 + 80 + 20, rel=1e-3)
    # no phase logged: the measured start-up scales the graph time
    whole, words = fit_from_startup({"compiled_before": False, "measured_s": 600.0},
                                    arch=arch, tp=2, instance=INF2_8X,
                                    prefill_graphs=8, decode_graphs=8)
    assert estimate_startup(arch, 2, "bf16", prefill_graphs=8, decode_graphs=8,
                            instance=INF2_8X, params=whole).total_s \
        == pytest.approx(600.0, rel=0.02)
    # a start from the cache shows no compile
    assert fit_from_startup({"compiled_before": True, "measured_s": 30.0}, arch=arch, tp=2,
                            instance=None, prefill_graphs=1, decode_graphs=1) is None
    assert fit_from_startup({"from_cache": True, "phases": {"load_s": 9.0}}, arch=arch, tp=2,
                            instance=None, prefill_graphs=1, decode_graphs=1) is None


def test_calibrate_reads_the_start_up_of_a_run_folder(tmp_path):
    from neuron_batch.cli.tools import _compile_from_startup

    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps({"config": {
        "prefill_buckets": [512, 2048], "compiled_graphs": 4}}))
    (run / "attempts.json").write_text(json.dumps([
        {"attempt": 1, "startup": {"compiled_before": False, "measured_s": 300.0,
                                   "phases": {"priority_s": 90.0}}},
        {"attempt": 2, "startup": {"compiled_before": True, "measured_s": 25.0}}]))
    fitted, words = _compile_from_startup([str(run)], INF2_8X, LLAMA, 2, "bf16", NXDI)
    assert "attempt 1" in words and graph_times(fitted, one_arch(), 2)[0] == pytest.approx(90.0)
    assert _compile_from_startup([str(tmp_path)], INF2_8X, LLAMA, 2, "bf16", NXDI) is None


def test_compiled_applies_to_the_simulated_device_only():
    from neuron_batch.settings import RunSettings, SettingsError

    RunSettings.of(("x",), device="sim", compiled=True).validate()
    with pytest.raises(SettingsError, match="--compiled is for --device sim"):
        RunSettings.of(("x",), device="cpu", compiled=True).validate()


def test_the_summary_says_what_the_start_up_was():
    from neuron_batch.report.summary import format_summary

    def row(report):
        """The summary's Start-up row, its continuation lines joined."""
        lines = format_summary(report).splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("Start-up"))
        rest = [line.strip() for line in lines[at + 1:]]
        more = rest[:next((i for i, line in enumerate(lines[at + 1:])
                           if not line.startswith(" " * 12)), len(rest))]
        return " ".join([lines[at].removeprefix("Start-up").strip(), *more])

    fresh = compile_footprint(8, 8, LLAMA, tp=2, instance=INF2_8X)
    report = {"config": {"sim": {"compile": fresh}}}
    assert "compiled fresh" in row(report)
    loaded = compile_footprint(8, 8, LLAMA, tp=2, compiled=True)
    assert "loaded only" in row({"config": {"sim": {"compile": loaded}}})
    small = compile_footprint(8, 8, LLAMA, tp=2, instance=INF2_X)
    assert row({"config": {"sim": {"compile": small}}}).startswith(
        "no estimate: inf2.xlarge's 16 GiB")
    host = {"attempts": [{"startup": {"measured_s": 312.4, "cached_graphs": 14,
                                      "compiled_graphs": 2, "artifacts_reused": False}}]}
    assert row(host) == "312 s measured   14 graph(s) from the compile cache, 2 compiled"
