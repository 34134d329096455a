"""The runtime object (runtimes/runtime.py) and NxDI's static KV cache (device/static_kv.py): pure
Python, milliseconds. The engine-level behaviour is in test_sim_nxdi.py and the scheduler's in
test_scheduler_properties.py."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.device.cost_model import CapacityError
from neuron_batch.device.hardware import get_instance
from neuron_batch.device.static_kv import static_kv_capacity, static_slots
from neuron_batch.runtimes.buckets import BucketError
from neuron_batch.runtimes.choice import runtime_of_plugin
from neuron_batch.runtimes.runtime import (
    NXDI,
    VLLM_NEURON,
    RuntimeNameError,
    default_runtime,
    get_runtime,
    nxdi_default_buckets,
)
from neuron_batch.settings import RunSettings, SettingsError

GIB = 1 << 30


def test_nxdi_default_buckets_follow_nxdis_rounding():
    # NxDI's generate_buckets(128, max): powers of two up to 2**round(log2(max)), then max
    assert nxdi_default_buckets(4352) == [128, 256, 512, 1024, 2048, 4352]
    assert nxdi_default_buckets(3000) == [128, 256, 512, 1024, 2048, 3000]
    assert nxdi_default_buckets(6000) == [128, 256, 512, 1024, 2048, 4096, 6000]
    assert nxdi_default_buckets(16384) == [128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    assert nxdi_default_buckets(128) == [128]


@given(st.integers(129, 200_000))
def test_nxdi_default_buckets_are_ascending_and_end_at_the_max(maximum):
    buckets = nxdi_default_buckets(maximum)
    assert buckets == sorted(set(buckets)) and buckets[-1] == maximum
    assert all(b & (b - 1) == 0 for b in buckets[:-1])
    # no power of two closer than the rounding allows
    assert len(buckets) == 1 + round(math.log2(maximum)) - 7


def test_runtime_by_family_and_plugin():
    assert default_runtime("inf2").name == NXDI
    assert default_runtime("trn1").name == NXDI
    assert default_runtime("trn2").name == VLLM_NEURON
    assert default_runtime().name == VLLM_NEURON
    assert runtime_of_plugin("0.2.0").name == NXDI
    assert runtime_of_plugin("0.5.3").name == NXDI
    assert runtime_of_plugin("0.24.0.1.1.0").name == VLLM_NEURON
    assert runtime_of_plugin("0.29.0.1.2.0").name == VLLM_NEURON
    assert runtime_of_plugin(None) is None
    with pytest.raises(RuntimeNameError, match="nxdi, vllm-neuron"):
        get_runtime("tnx")


def test_nxdi_shapes_pad_whole_prompts_and_decode_every_slot():
    shapes = get_runtime(NXDI).shapes({}, max_num_seqs=6, max_num_batched_tokens=512,
                                      max_model_len=4096)
    assert shapes.prefill_buckets == (128, 256, 512, 1024, 2048, 4096)
    assert shapes.prefill(3000) == 4096         # whole prompt, not chunks of 512
    # decode: every slot, the smallest token-generation bucket above the longest position
    assert shapes.decode(1, 127) == (6, 128)
    assert shapes.decode(3, 128) == (6, 256)
    assert shapes.decode(6, 4095) == (6, 4096)
    assert shapes.num_graphs == 6 + 6
    assert shapes.bucket_lists() == {"context_encoding_buckets": list(shapes.prefill_buckets),
                                     "token_generation_buckets": list(shapes.attention_buckets)}


def test_vllm_neuron_shapes_are_the_seeds_plus_context_buckets():
    runtime = get_runtime(VLLM_NEURON)
    shapes = runtime.shapes({}, max_num_seqs=8, max_num_batched_tokens=512, max_model_len=4096)
    assert shapes.prefill(300) == 512 and shapes.decode(3, 100) == (4, 4096)
    assert shapes.num_graphs == 3 + 4 * 1
    with_context = runtime.shapes({"decode_context_length_buckets": [512, 1024]},
                                  max_num_seqs=8, max_num_batched_tokens=512,
                                  max_model_len=4096)
    assert with_context.decode(3, 100) == (4, 512)
    assert with_context.decode(3, 600) == (4, 1024)
    assert with_context.decode(3, 1024) == (4, 4096)      # position + 1 above every bucket
    assert with_context.num_graphs == 3 + 4 * 3


@pytest.mark.parametrize("lists, message", [
    ({"decode_context_length_buckets": [500]}, "multiple of 128"),
    ({"decode_context_length_buckets": [4096]}, "not below max_model_len"),
    ({"decode_context_length_buckets": [1024, 512]}, "ascending"),
    ({"context_encoding_buckets": [512]}, "--context-encoding-buckets belong"),
])
def test_vllm_neuron_refuses_what_its_plugin_refuses(lists, message):
    with pytest.raises(BucketError, match=message):
        get_runtime(VLLM_NEURON).shapes(lists, max_num_seqs=8, max_num_batched_tokens=512,
                                        max_model_len=4096)


def test_nxdi_refuses_the_other_runtimes_flags_naming_them():
    with pytest.raises(BucketError, match="--prefill-buckets, --decode-buckets belong.*"
                                          "--runtime vllm-neuron"):
        get_runtime(NXDI).shapes({"num_batched_tokens_buckets": [512],
                                  "num_seqs_buckets": [8]},
                                 max_num_seqs=8, max_num_batched_tokens=512, max_model_len=4096)
    with pytest.raises(BucketError, match="last bucket of --token-generation-buckets"):
        get_runtime(NXDI).shapes({"token_generation_buckets": [512, 1024]}, max_num_seqs=8,
                                 max_num_batched_tokens=512, max_model_len=4096)


def test_settings_resolve_the_runtime_once_and_refuse_what_does_not_apply():
    sim = RunSettings.of(inputs=("x",), device="sim")
    assert sim.resolve_runtime().name == NXDI             # inf2.8xlarge by default
    trn2 = RunSettings.of(inputs=("x",), device="sim", instance="trn2.48xlarge")
    assert trn2.resolve_runtime().name == VLLM_NEURON
    assert RunSettings.of(inputs=("x",), device="cpu").resolve_runtime().name == VLLM_NEURON
    with pytest.raises(SettingsError, match="--decode-buckets belong"):
        RunSettings.of(inputs=("x",), device="sim", decode_buckets=(1, 8)).validate()
    with pytest.raises(SettingsError, match="--kv-reserve does not apply under the nxdi"):
        RunSettings.of(inputs=("x",), device="sim", kv_reserve="max_model_len").validate()
    ok = RunSettings.of(inputs=("x",), device="sim", runtime="vllm-neuron", decode_buckets=(1, 8),
                     instance="trn2.48xlarge")
    assert ok.validate().buckets()[1] == [1, 8]
    # the Beta plugin ships for trn2/trn3 only: no figure for a layout inf2 cannot load
    with pytest.raises(SettingsError, match="--runtime vllm-neuron does not run on "
                                            "inf2.8xlarge: AWS ships it for trn2/trn3 only"):
        RunSettings.of(inputs=("x",), device="sim", runtime="vllm-neuron").validate()
    # NxDI runs on trn2 as well as inf2 and trn1
    RunSettings.of(inputs=("x",), device="sim", runtime="nxdi",
                instance="trn2.48xlarge").validate()
    # off the simulated device the runtime only shapes the schedule (the CPU's seed design)
    RunSettings.of(inputs=("x",), device="cpu", runtime="vllm-neuron").validate()


def test_with_buckets_sets_the_runtimes_own_fields():
    base = RunSettings.of(inputs=("x",), device="sim", prefill_buckets=(128, 2048))
    nxdi = base.with_buckets(get_runtime(NXDI), (512, 2048), None, (1024, 2048))
    assert nxdi.prefill_buckets is None and nxdi.runtime == NXDI
    assert nxdi.context_encoding_buckets == (512, 2048)
    assert nxdi.token_generation_buckets == (1024, 2048)
    assert nxdi.validate().shapes().attention_buckets == (1024, 2048)


def test_static_kv_matches_the_notes_example_and_says_what_fits():
    # Llama-3.1-8B bf16 at 16384 on one inf2 chip (TP 2): 6 slots with the reserve
    # (../shared/notes/neuron-runtimes.md), never 32.
    inf2 = get_instance("inf2.xlarge")
    assert static_slots(inf2, _arch(), 2, "bf16", 16384) == 6
    kv = static_kv_capacity(inf2, _arch(), 2, "bf16", 16384, 6, 32)
    assert kv["max_concurrent_at_max_len"] == 6 and kv["num_blocks"] == 6 * 512
    assert kv["bytes"] == 6 * 16384 * 131072
    with pytest.raises(CapacityError) as info:
        static_kv_capacity(inf2, _arch(), 2, "bf16", 16384, 32, 32)
    message = str(info.value)
    assert "64.0 GiB" in message and "--max-num-seqs 6 at this max_model_len" in message
    # flags as typed (no thousands separator), so each can be pasted back (test_hints.py)
    assert "--max-model-len 3456 at this max_num_seqs" in message
    assert "--instance inf2.24xlarge --tensor-parallel-size 8" in message


@given(seqs=st.integers(1, 64), length=st.sampled_from([1024, 2048, 4096, 8192, 16384]),
       tp=st.sampled_from([2, 4, 8, 24]))
def test_a_static_layout_loads_exactly_when_its_bytes_fit(seqs, length, tp):
    """Independent arithmetic: Llama 3 8B keeps 8 KV heads of 128 over 32 layers, K and V in
    bf16 (16 KiB a head a token); each core of the TP group holds ceil(8 / tp) of them (copies
    when TP exceeds 8). Slots x length x that, beside 16.06 GB of weights and a 10% reserve of
    the group's HBM."""
    per_token = tp * -(-8 // tp) * 32 * 2 * 128 * 2
    assert per_token == (131072 if tp <= 8 else 131072 * tp // 8)
    free = 0.9 * tp * 16 * GIB - _arch().weight_bytes("bf16")
    fits = seqs * length * per_token <= free
    try:
        static_kv_capacity(get_instance("inf2.48xlarge"), _arch(), tp, "bf16", length, seqs, 32)
        loaded = True
    except CapacityError:
        loaded = False
    assert loaded == fits


def _arch():
    from neuron_batch.device.architectures import resolve_architecture
    return resolve_architecture("llama-3.1-8b")


@given(runtime=st.sampled_from([NXDI, VLLM_NEURON]), prefill=st.integers(1, 8),
       decode=st.integers(0, 6), attention=st.integers(0, 8), prefix=st.integers(0, 7))
def test_the_graph_words_add_up_to_the_graph_count(runtime, prefill, decode, attention, prefix):
    """The summary's `Graphs N to compile (...)`: under NxDI's prefix-caching grid the
    context-encoding graphs are its cells, so the words add up to `num_graphs` (they read
    '5 context-encoding + 6 token-generation' beside 36)."""
    import re

    from neuron_batch.runtimes.hints import graph_words
    from neuron_batch.runtimes.runtime import RUNTIMES

    rt = RUNTIMES[runtime]
    if rt.static_kv:
        decode = 0
    words = graph_words(rt, prefill, decode, attention, prefix)
    count = rt.num_graphs(prefill, decode, attention, prefix)
    if rt.static_kv:
        cells = re.fullmatch(r"(\d+) context-encoding (?:\((\d+) prefill x (\d+) prefix "
                             r"buckets, NxDI's grid\) )?\+ (\d+) token-generation buckets", words)
        assert cells, words
        ctx, rows, cols, tkg = cells.groups()
        assert int(ctx) + int(tkg) == count
        assert rows is None or int(rows) * int(cols) == int(ctx)
    else:
        p, d, lengths = map(int, re.fullmatch(r"(\d+) prefill buckets \+ (\d+) decode buckets "
                                              r"x (\d+) context lengths", words).groups())
        assert p + d * lengths == count
