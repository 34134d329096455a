"""The optimum-neuron runtime object (runtimes/runtime.py): an export's two graphs, what it refuses
and says instead, and that it stays out of the instance families' defaults. Pure Python."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.runtimes.buckets import BucketError
from neuron_batch.runtimes.runtime import (
    NXDI,
    OPTIMUM_NEURON,
    RUNTIME_NAMES,
    VLLM_NEURON,
    default_runtime,
    get_runtime,
    runtime_of,
)
from neuron_batch.settings import RunSettings, SettingsError

OPTIMUM = get_runtime(OPTIMUM_NEURON)


def test_it_is_looked_up_by_name_but_never_an_instance_familys_default():
    assert OPTIMUM_NEURON in RUNTIME_NAMES and get_runtime("optimum_neuron") is OPTIMUM
    assert runtime_of({"runtime": "optimum-neuron"}) is OPTIMUM
    for family in ("inf2", "trn1"):
        assert default_runtime(family).name == NXDI
    assert OPTIMUM.runs_on == ("inf2", "trn1")
    assert OPTIMUM.not_shipped_for("inf2.xlarge", "inf2") is None
    refusal = OPTIMUM.not_shipped_for("trn2.48xlarge", "trn2")
    assert "inf2/trn1 only" in refusal and "--runtime vllm-neuron" in refusal


def test_an_export_compiles_two_graphs_and_pads_to_them():
    shapes = OPTIMUM.shapes({}, max_num_seqs=4, max_num_batched_tokens=512,
                            max_model_len=4096)
    # no buckets: one context-encoding graph over the sequence length (its default), one
    # token-generation graph of batch_size x sequence_length
    assert shapes.prefill_buckets == (4096,) and shapes.num_graphs == 2
    assert shapes.prefill(1) == shapes.prefill(4096) == 4096
    assert shapes.decode(1, 10) == (4, 4096) and shapes.decode(4, 4095) == (4, 4096)
    assert shapes.longest_prompt == 4096
    assert shapes.bucket_lists() == {"max_context_length": [4096]}
    short = OPTIMUM.shapes({"max_context_length": [1024]}, max_num_seqs=4,
                           max_num_batched_tokens=512, max_model_len=4096)
    assert short.prefill(300) == 1024 and short.longest_prompt == 1024
    assert short.decode(2, 100) == (4, 4096) and short.num_graphs == 2


@given(seqs=st.integers(1, 64), length=st.integers(128, 32768), data=st.data())
def test_every_step_pads_to_the_exports_shape_whatever_it_holds(seqs, length, data):
    context = data.draw(st.integers(1, length))
    shapes = OPTIMUM.shapes({"max_context_length": [context]}, max_num_seqs=seqs,
                            max_num_batched_tokens=2048, max_model_len=length)
    prompt = data.draw(st.integers(1, context))
    running = data.draw(st.integers(1, seqs))
    position = data.draw(st.integers(0, length - 1))
    assert shapes.prefill(prompt) == context
    assert shapes.decode(running, position) == (seqs, length)
    assert shapes.num_graphs == 2


def test_behaviour_is_on_the_object_not_in_callers():
    assert OPTIMUM.static_kv and not OPTIMUM.chunked_prefill and not OPTIMUM.prefix_grid
    assert not OPTIMUM.prefix_caching and OPTIMUM.decode_then_prefill and OPTIMUM.fixed_export
    assert OPTIMUM.decode is None and OPTIMUM.attention is None
    assert [role for role, _ in OPTIMUM.dimensions] == ["prefill"]
    nxdi = get_runtime(NXDI)
    assert nxdi.prefix_caching and not nxdi.decode_then_prefill and not nxdi.fixed_export
    # whole prompts, and room for the longest beside every running request's decode token
    assert OPTIMUM.engine_limits(max_model_len=4096, max_num_seqs=4,
                                 max_num_batched_tokens=512) == {
        "enable_chunked_prefill": False, "max_num_batched_tokens": 4096 + 4}
    assert OPTIMUM.bucket_words([2048], None, None) == "max context length 2048"


@pytest.mark.parametrize("lists, message", [
    ({"max_context_length": [8192]}, "--max-context-length takes one length from 1 to "
                                     "max_model_len \\(4,096\\).*--max-model-len 8,192"),
    ({"max_context_length": [512, 1024]}, "takes one length.*got 512,1024"),
    ({"context_encoding_buckets": [512, 4096]},
     "--context-encoding-buckets belong.*use --max-context-length 4096"),
    ({"token_generation_buckets": [1024, 4096]},
     "drop --token-generation-buckets \\(optimum-neuron its one token-generation graph"),
    ({"num_seqs_buckets": [1, 4]}, "drop --decode-buckets"),
    ({"prefix_buckets": [512]}, "runs optimum-neuron, which has none"),
])
def test_it_refuses_bucket_lists_saying_what_would_work(lists, message):
    with pytest.raises(BucketError, match=message):
        OPTIMUM.shapes(lists, max_num_seqs=4, max_num_batched_tokens=512, max_model_len=4096,
                       family="inf2")


def test_the_other_runtimes_refuse_its_option_naming_it():
    with pytest.raises(BucketError, match="--max-context-length belong.*optimum-neuron.*"
                                          "--runtime optimum-neuron"):
        get_runtime(NXDI).shapes({"max_context_length": [1024]}, max_num_seqs=4,
                                 max_num_batched_tokens=512, max_model_len=4096, family="inf2")
    # the Beta plugin's hint never names a runtime that does not run on its instance
    with pytest.raises(BucketError, match="optimum-neuron itself does not run on trn2"):
        get_runtime(VLLM_NEURON).shapes({"max_context_length": [1024]}, max_num_seqs=4,
                                        max_num_batched_tokens=512, max_model_len=4096,
                                        family="trn2")


def test_settings_take_it_by_name_and_refuse_prefix_caching_and_other_instances():
    base = RunSettings.of(inputs=("x",), device="sim", runtime="optimum-neuron",
                       prefix_caching=False, max_model_len=4096, max_context_length=1024)
    assert base.validate().resolve_runtime() is OPTIMUM
    assert base.shapes().prefill_buckets == (1024,)
    with pytest.raises(SettingsError, match="optimum-neuron runs without prefix caching.*"
                                            "--prefix-caching off"):
        RunSettings.of(inputs=("x",), device="sim", runtime="optimum-neuron",
                    prefix_caching=True).validate()
    # auto (the default) is not refused: the run decides off (run/prefix_auto.py)
    RunSettings.of(inputs=("x",), device="sim", runtime="optimum-neuron").validate()
    with pytest.raises(SettingsError, match="does not run on trn2.48xlarge"):
        RunSettings.of(inputs=("x",), device="sim", runtime="optimum-neuron",
                    prefix_caching=False, instance="trn2.48xlarge").validate()
    with pytest.raises(SettingsError, match="--max-context-length belong"):
        RunSettings.of(inputs=("x",), device="sim", max_context_length=1024).validate()
    # bench and plan set its one value through the runtime's own option
    swept = RunSettings.of(inputs=("x",), device="sim", prefix_caching=False,
                        context_encoding_buckets=(512, 2048)).with_buckets(OPTIMUM, [1024])
    assert swept.max_context_length == 1024 and swept.context_encoding_buckets is None
    assert swept.validate().shapes().prefill_buckets == (1024,)
