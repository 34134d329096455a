"""optimum-neuron's export on a Neuron host, without the plugin: reading a local export, the
run's settings checked against it, prompts longer than its context-encoding graph, what
--device neuron sets, and what doctor says. (The plugin itself: test_optimum_plugin.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.doctor.export import export_checks, export_facts, plugins_check
from neuron_batch.doctor.status import FAIL, INFO, OK, WARN
from neuron_batch.engine.neuron_host import OPTIMUM_WORKER_CLS, host_setup
from neuron_batch.engine.nxdi_plugin import NeuronHostError
from neuron_batch.engine.optimum_export import (
    FRESH,
    HUB,
    LOCAL,
    check_export,
    check_prompts,
    find_export,
    read_export,
)
from neuron_batch.inputs.prepare import PreparedRequest
from neuron_batch.inputs.prompt_records import PromptRecord
from neuron_batch.job.startup import startup_words
from neuron_batch.runtimes.runtime import OPTIMUM_NEURON, RUNTIMES
from neuron_batch.settings import RunSettings

RUNTIME = RUNTIMES[OPTIMUM_NEURON]


def settings(**given) -> RunSettings:
    tp = given.pop("tp", None)
    base = {"max_num_seqs": 4, "max_model_len": 512, "prefix_caching": False}
    return RunSettings.of(inputs=("x.jsonl",), device="neuron", runtime=OPTIMUM_NEURON,
                       tensor_parallel_size=tp, **{**base, **given}).validate()


def export_dir(tmp_path: Path, **config) -> Path:
    config = {"batch_size": 4, "sequence_length": 512, "tp_degree": 2,
              "continuous_batching": True, **config}
    (tmp_path / "neuron_config.json").write_text(json.dumps(config))
    return tmp_path


def no_hub(*args):
    return None


def test_a_local_export_is_read_with_optimums_defaults(tmp_path):
    export = read_export(export_dir(tmp_path))
    assert export.source == LOCAL and export.compiled
    assert (export.batch_size, export.sequence_length, export.tp_degree) == (4, 512, 2)
    # NxDNeuronConfig: max_context_length falls back to the sequence length.
    assert export.max_context_length == 512
    assert "batch size 4, sequence length 512, max context length 512, TP 2" in export.words()
    assert read_export(tmp_path / "elsewhere") is None


@pytest.mark.parametrize("config, words", [
    ({"batch_size": 0}, "field 'batch_size' must be a positive whole number"),
    ({"sequence_length": "512"}, "field 'sequence_length' must be a positive"),
    ({"batch_size": None}, "field 'batch_size' is missing"),
])
def test_a_bad_export_names_its_file_and_field(tmp_path, config, words):
    path = export_dir(tmp_path)
    data = {**json.loads((path / "neuron_config.json").read_text()), **config}
    data = {k: v for k, v in data.items() if v is not None}
    (path / "neuron_config.json").write_text(json.dumps(data))
    with pytest.raises(NeuronHostError, match=words) as error:
        read_export(path)
    assert "neuron_config.json" in str(error.value)
    (path / "neuron_config.json").write_text("{not json")
    with pytest.raises(NeuronHostError, match="not a JSON neuron config"):
        read_export(path)


def test_settings_that_differ_are_refused_naming_what_would_run(tmp_path):
    export = read_export(export_dir(tmp_path, max_context_length=256))
    check_export(export, settings(tp=2))                    # matches: nothing said
    check_export(export, settings())                        # TP not given: the export's
    with pytest.raises(NeuronHostError) as error:
        check_export(export, settings(max_num_seqs=8, max_model_len=1024, tp=1))
    text = str(error.value)
    assert "fixes batch size 4, sequence length 512, TP 2" in text
    assert "asks --max-num-seqs 8, --max-model-len 1024, --tensor-parallel-size 1" in text
    assert "Run it with --max-num-seqs 4 --max-model-len 512 --tensor-parallel-size 2" in text
    with pytest.raises(NeuronHostError, match="--max-context-length 256"):
        check_export(export, settings(max_context_length=128))


def test_an_export_without_continuous_batching_is_refused(tmp_path):
    export = read_export(export_dir(tmp_path, continuous_batching=False))
    with pytest.raises(NeuronHostError, match="without continuous batching"):
        check_export(export, settings())
    single = read_export(export_dir(tmp_path, batch_size=1, continuous_batching=False))
    check_export(single, settings(max_num_seqs=1))      # batch 1 needs none


def prepared(lengths: list[int]) -> list[PreparedRequest]:
    return [PreparedRequest(PromptRecord(index=i, id=str(i), source=f"in.jsonl:{i + 1}",
                                         prompt_field="prompt"), [5] * n, 1)
            for i, n in enumerate(lengths)]


@given(st.lists(st.integers(1, 600), min_size=1, max_size=20), st.integers(1, 512))
def test_prompts_longer_than_max_context_length_are_named_and_only_they(lengths, context):
    export = find_export(settings(max_context_length=context), "m", no_hub)
    too_long = [i for i, n in enumerate(lengths) if n > context]
    if not too_long:
        check_prompts(export, prepared(lengths))
        return
    with pytest.raises(NeuronHostError) as error:
        check_prompts(export, prepared(lengths))
    text = str(error.value)
    assert f"{len(too_long)} prompt(s) longer than" in text
    assert f"max context length {context:,}" in text
    assert f"in.jsonl:{too_long[0] + 1}: field 'prompt': {lengths[too_long[0]]:,}" in text


def test_the_export_is_found_where_the_plugins_loader_looks(tmp_path):
    asked = []

    def hub(model, seqs, length, tp):
        asked.append((model, seqs, length, tp))
        return [{"tp_degree": 2, "torch_dtype": "bfloat16"}]

    local = find_export(settings(), str(export_dir(tmp_path)), hub)
    assert local.source == LOCAL and not asked           # a local export comes first
    cached = find_export(settings(tp=2), "org/model", hub)
    assert cached.source == HUB and cached.compiled and asked == [("org/model", 4, 512, 2)]
    fresh = find_export(settings(), "org/model", no_hub)
    assert fresh.source == FRESH and not fresh.compiled and "compiles" in fresh.words()


def test_device_neuron_on_optimum_sets_its_block_worker_and_context_length(tmp_path):
    model = str(export_dir(tmp_path, max_context_length=256))
    setup = host_setup(settings(), RUNTIME, model_path=model, plugin_version="0.4.5",
                       hub_lookup=no_hub)
    assert setup.kwargs["block_size"] == 512 and setup.kwargs["enable_prefix_caching"] is False
    assert setup.kwargs["worker_cls"] == OPTIMUM_WORKER_CLS
    assert setup.kwargs["tensor_parallel_size"] == 2         # the export's TP
    assert setup.kwargs["model_loader_extra_config"] == "allow_non_cached_model"
    assert setup.section == {RUNTIME.prefill.key: [256]}      # where our scheduler reads it
    assert setup.env == {} and setup.artifacts is None and setup.export.source == LOCAL
    # The scheduler's shapes from that section: prompts padded to 256, decodes run 4 x 512.
    shapes = RUNTIME.shapes(setup.section, max_num_seqs=4, max_num_batched_tokens=512,
                            max_model_len=512)
    assert shapes.prefill(10) == 256 and shapes.decode(1, 20) == (4, 512)
    with pytest.raises(NeuronHostError, match="--block-size"):
        host_setup(settings(block_size=32), RUNTIME, model_path=model, plugin_version=None,
                   hub_lookup=no_hub)


def test_doctor_names_the_export_and_whether_a_run_can_start(tmp_path):
    model = str(export_dir(tmp_path))
    assert export_facts(settings(), RUNTIMES["nxdi"]) is None
    (check,) = export_checks(export_facts(settings(), RUNTIME))   # no --model
    assert check.status == INFO
    (check,) = export_checks(export_facts(settings(model=model), RUNTIME))
    assert check.status == OK and "local export" in check.value and "TP 2" in check.value
    (check,) = export_checks(export_facts(settings(model=model, max_num_seqs=8), RUNTIME))
    assert check.status == FAIL and "--max-num-seqs 4" in check.detail
    both = plugins_check({"distribution": "vllm-neuron", "others": ["optimum-neuron"]})
    assert [c.status for c in both] == [FAIL]
    assert WARN in {c.status for c in export_checks(
        {"export": find_export(settings(), "org/m", no_hub).describe(), "error": None})}


def test_the_start_up_says_where_the_graphs_came_from_and_how_long():
    assert startup_words({"measured_s": 12.34, "export": LOCAL}) == (
        "model loaded in 12.3 s (local export)")
    assert startup_words({"measured_s": 3.0}) is None and startup_words(None) is None


def test_doctor_on_an_optimum_host_names_runtime_release_and_export(tmp_path, monkeypatch):
    from neuron_batch.doctor import checks as doctor_checks
    from neuron_batch.doctor import facts as doctor

    model = str(export_dir(tmp_path))           # (a local export: the hub is not asked)
    rt = doctor.neuron_runtime_facts("0.4.5", settings(model=model, tp=2), "optimum-neuron")
    assert rt["runtime"] == OPTIMUM_NEURON and rt["kv_layout"] is None
    checks = {c.name: c for c in doctor_checks._runtime_checks(rt, plugin=True, devices=True)}
    assert checks["neuron runtime"].value == OPTIMUM_NEURON
    assert checks["export"].status == OK and "local export" in checks["export"].value
    assert "NxD Inference" not in checks and "compiled artifacts" not in checks
    plugin = {"distribution": "optimum-neuron", "version": "0.4.5", "entry_point": "x",
              "others": []}
    monkeypatch.setattr(doctor, "neuron_plugin", lambda: plugin)
    assert doctor.plugin_facts()["line"]["plugin"] == "optimum-neuron 0.4.x"
