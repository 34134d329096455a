"""Hardware table, model shapes, step-time cost model, KV sizing and compile estimate."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.device.architectures import (
    ARCHITECTURES,
    ArchitectureError,
    from_config_json,
    get_architecture,
    resolve_architecture,
)
from neuron_batch.device.compile_time import compile_footprint
from neuron_batch.device.cost_model import (
    CapacityError,
    CostProfile,
    StepCostModel,
    kv_capacity,
    load_profile,
    save_profile,
)
from neuron_batch.device.hardware import (
    INSTANCES,
    HardwareError,
    default_tp,
    get_instance,
    valid_tp_degrees,
    validate_tp,
)


def _load_records_module():
    """neuron_batch/scheduler/records.py without its package __init__, which imports vLLM
    (8 s); the module itself is pure Python."""
    path = Path(__file__).resolve().parents[2] / "neuron_batch" / "scheduler" / "records.py"
    spec = importlib.util.spec_from_file_location("_records_for_cost_tests", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


StepRecord = _load_records_module().StepRecord

PROFILE = load_profile("inf2.48xlarge")
INF2_8X, INF2_48X = get_instance("inf2.8xlarge"), get_instance("inf2.48xlarge")
LLAMA3_8B, LLAMA2_7B = get_architecture("Llama-3-8B"), get_architecture("Llama-2-7B")
#: (instance, model, tp, weight dtype) settings the properties run on; each fits in memory.
SETTINGS = [
    ("inf2.xlarge", "TinyLlama-1.1B", 2, "bf16"),
    ("inf2.xlarge", "SmolLM2-135M", 1, "bf16"),
    ("inf2.8xlarge", "Llama-3-8B", 2, "bf16"),
    ("inf2.24xlarge", "Qwen2.5-7B", 4, "fp8"),
    ("inf2.48xlarge", "Llama-3-8B", 24, "int8"),
    ("inf2.48xlarge", "Llama-3.1-70B", 24, "bf16"),
    ("trn1.32xlarge", "Llama-2-13B", 32, "bf16"),
]
models = st.sampled_from([StepCostModel(PROFILE.replace(instance=i), get_instance(i),
                                        get_architecture(a), tp, w)
                          for i, a, tp, w in SETTINGS])
tokens = st.integers(1, 16384)
contexts = st.integers(0, 1_000_000)
fast = settings(max_examples=60, deadline=None)


# -- hardware ------------------------------------------------------------------------------------

def test_instances_are_looked_up_in_any_case_with_their_cores_and_memory():
    assert get_instance("Inf2.48xlarge").num_cores == 24
    assert get_instance("inf2.48xlarge").hbm_bytes_per_core == 16 << 30
    # trn2: logical NeuronCores at LNC=2, 4 a chip, 24 GiB each
    assert get_instance("trn2.48xlarge").hbm_bytes_per_core == 24 << 30


def test_the_default_tp_is_every_core():
    assert [default_tp(i) for i in INSTANCES.values()] == [2, 2, 12, 24, 32, 4, 64]


def test_valid_tp_degrees_of_each_instance():
    assert valid_tp_degrees(get_instance("trn2.3xlarge")) == (1, 2, 4)
    assert valid_tp_degrees(get_instance("trn2.48xlarge")) == (1, 2, 4, 8, 16, 32, 64)
    assert valid_tp_degrees(get_instance("inf2.48xlarge")) == (1, 2, 4, 8, 24)
    assert valid_tp_degrees(get_instance("inf2.24xlarge")) == (1, 2, 4, 8, 12)
    assert valid_tp_degrees(get_instance("inf2.xlarge")) == (1, 2)
    assert valid_tp_degrees(get_instance("trn1.32xlarge")) == (1, 2, 4, 8, 16, 32)


def test_an_unknown_instance_is_refused_naming_the_known_ones():
    with pytest.raises(HardwareError, match="inf2.8xlarge"):
        get_instance("inf3.big")


def test_a_tp_degree_the_instance_cannot_run_is_refused_naming_the_valid_ones():
    with pytest.raises(HardwareError, match=r"\[1, 2, 4, 8, 24\]"):
        validate_tp(INF2_48X, 12)


# -- architectures -------------------------------------------------------------------------------

@pytest.mark.parametrize("name, billions", [
    ("Llama-2-7B", 6.74), ("Llama-2-13B", 13.02), ("Llama-2-70B", 68.98), ("Llama-3-8B", 8.03),
    ("Llama-3.1-70B", 70.55), ("Mistral-7B", 7.24), ("Qwen2.5-7B", 7.62),
    ("TinyLlama-1.1B", 1.10), ("SmolLM2-135M", 0.1348)])
def test_parameter_counts_match_published_sizes(name, billions):
    assert get_architecture(name).num_params / 1e9 == pytest.approx(billions, rel=0.01)


@pytest.mark.parametrize("alias, name", [
    ("meta-llama/Meta-Llama-3-8B", "Llama-3-8B"), ("llama-3-8b", "Llama-3-8B"),
    ("meta-llama/Llama-2-7b-chat-hf", "Llama-2-7B"), ("LLAMA3.1-70B", "Llama-3.1-70B"),
    ("mistralai/Mistral-7B-v0.1", "Mistral-7B"), ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B"),
    ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", "TinyLlama-1.1B"),
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2-135M")])
def test_aliases(alias, name):
    assert get_architecture(alias).name == name


def test_unknown_model_lists_choices():
    with pytest.raises(ArchitectureError, match="Llama-3-8B"):
        get_architecture("gpt-5")


def test_config_json(tmp_path):
    config = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "vocab_size": 128256, "max_position_embeddings": 8192, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    for source in (config, tmp_path, tmp_path / "config.json"):
        arch = resolve_architecture(source) if source is not config else from_config_json(source)
        assert arch.num_params == get_architecture("Llama-3-8B").num_params
    smol = ARCHITECTURES["SmolLM2-135M"]
    assert smol.kv_bytes_per_token("bf16") == 2 * 30 * 3 * 64 * 2
    with pytest.raises(ArchitectureError, match="hidden_size"):
        from_config_json({"num_hidden_layers": 2})


# -- step-time properties ------------------------------------------------------------------------

@fast
@given(models, tokens, tokens, contexts)
def test_longer_prompt_never_prefills_faster(model, a, b, ctx):
    short, long = sorted((a, b))
    assert model.prefill_time(short, ctx) <= model.prefill_time(long, ctx)


@fast
@given(models, tokens, st.integers(1, 256), contexts, contexts)
def test_more_context_never_faster(model, padded, seqs, c1, c2):
    low, high = sorted((c1, c2))
    assert model.prefill_time(padded, low) <= model.prefill_time(padded, high)
    assert model.decode_time(seqs, low) <= model.decode_time(seqs, high)


@fast
@given(models, st.integers(1, 512), st.integers(1, 512), st.integers(0, 32768))
def test_bigger_decode_batch_slower_per_step_but_more_tokens(model, a, b, per_seq_ctx):
    small, big = sorted((a, b))
    t_small = model.decode_time(small, small * per_seq_ctx)
    t_big = model.decode_time(big, big * per_seq_ctx)
    assert t_small <= t_big
    assert small / t_small <= big / t_big * (1 + 1e-12)


def test_padding_costs_time():
    model = StepCostModel(PROFILE, INF2_8X, LLAMA3_8B, 2)
    assert model.prefill_time(256, 0) > model.prefill_time(128, 0)
    assert model.decode_time(8, 8000) > model.decode_time(4, 8000)


def test_decode_is_bandwidth_bound_at_small_batch_and_compute_bound_at_large():
    model = StepCostModel(PROFILE, INF2_8X, LLAMA3_8B, 2)
    small, large = model.breakdown("decode", 1, 1000), model.breakdown("decode", 512, 512 * 100)
    assert small["memory"] > small["compute"] and large["compute"] > large["memory"]
    assert small["total"] == pytest.approx(model.decode_time(1, 1000))


@pytest.mark.parametrize("arch, smaller, bigger", [
    ("Llama-3-70B", ("inf2.24xlarge", 12), ("inf2.48xlarge", 24)),
    ("Llama-3-70B", ("inf2.48xlarge", 24), ("trn1.32xlarge", 32)),
    ("Llama-3-8B", ("inf2.8xlarge", 2), ("inf2.24xlarge", 12)),
    ("Llama-3-8B", ("inf2.24xlarge", 12), ("inf2.48xlarge", 24))])
def test_more_chips_lower_step_time(arch, smaller, bigger):
    arch = get_architecture(arch)
    small = StepCostModel(PROFILE, get_instance(smaller[0]), arch, smaller[1], "bf16")
    big = StepCostModel(PROFILE, get_instance(bigger[0]), arch, bigger[1], "bf16")
    for seqs, ctx in ((1, 512), (8, 8 * 2048), (64, 64 * 1024)):
        assert big.decode_time(seqs, ctx) < small.decode_time(seqs, ctx)
    for padded, ctx in ((128, 0), (2048, 0), (1024, 4096)):
        assert big.prefill_time(padded, ctx) < small.prefill_time(padded, ctx)


@pytest.mark.parametrize("instance, arch, tp", [("inf2.8xlarge", "Llama-3-8B", 2),
                                                ("inf2.48xlarge", "Llama-3-70B", 24)])
def test_int8_weights_cost_what_the_profile_says(instance, arch, tp):
    """An int8 weight streams at quantized_weight_bytes: the fit puts it at bf16's 2 bytes
    (int8 is never slower than bf16); at its 1-byte storage size int8 decodes faster."""
    instance, arch = get_instance(instance), get_architecture(arch)
    for per_weight, faster in ((PROFILE.quantized_weight_bytes, False), (1.0, True)):
        profile = PROFILE.replace(quantized_weight_bytes=per_weight)
        bf16 = StepCostModel(profile, instance, arch, tp, "bf16")
        int8 = StepCostModel(profile, instance, arch, tp, "int8")
        for seqs, ctx in ((1, 1024), (16, 16 * 1024)):
            assert int8.decode_time(seqs, ctx) <= bf16.decode_time(seqs, ctx)
            if faster:
                assert int8.decode_time(seqs, ctx) < bf16.decode_time(seqs, ctx)
    assert 1.0 <= PROFILE.quantized_weight_bytes <= 2.0


def test_gqa_heads_replicate_and_query_heads_pad():
    """Llama-3-8B at TP 24: 8 KV heads give each core one (k/v projections replicated 3x),
    32 query heads run as 48 (two a core). The per-core shard is therefore bigger than 1/24
    of the model, and the KV a core reads per token is one head's."""
    arch = get_architecture("Llama-3-8B")
    assert arch.kv_heads_per_core(24) == 1 and arch.q_heads_per_core(24) == 2
    assert arch.decoder_params_per_core(24) > arch.decoder_linear_params / 24
    assert arch.decoder_params_per_core(1) == arch.decoder_linear_params
    model = StepCostModel(PROFILE, INF2_48X, arch, 24, "bf16")
    assert model.kv_bytes_per_token_core == 2 * 32 * 1 * 128 * 2


def test_collectives_grow_with_layers_and_tp():
    """Two all-reduces a layer, ceil(log2 tp) latency stages each: more layers or a larger
    TP group pay more per step; TP 24 and TP 32 both take 5 stages."""
    def collectives(instance, arch, tp):
        return StepCostModel(PROFILE, get_instance(instance), get_architecture(arch),
                             tp).breakdown("decode", 1, 0)["collectives"]
    assert collectives("inf2.48xlarge", "Llama-3-70B", 24) > collectives(
        "inf2.48xlarge", "Llama-3-8B", 24)
    steps = [collectives("inf2.48xlarge", "Llama-3-8B", tp) for tp in (1, 2, 4, 8, 24)]
    assert steps[0] == 0 and steps == sorted(steps) and len(set(steps)) == 5
    assert collectives("trn1.32xlarge", "Llama-3-8B", 32) == pytest.approx(
        collectives("inf2.48xlarge", "Llama-3-8B", 24), rel=0.05)


def test_decode_attention_scales_with_query_heads_per_core():
    """Batched long-context decode is bound by attention, one query row per head: Llama-3-8B
    at TP 24 (two padded query heads a core) pays more per cached token than at TP 32 (one)."""
    def per_token(instance, tp):
        model = StepCostModel(PROFILE, get_instance(instance), LLAMA3_8B, tp, "int8")
        return (model.decode_time(8, 8 * 8192) - model.decode_time(8, 8 * 4096)) / (8 * 4096)
    assert per_token("inf2.48xlarge", 24) > 1.5 * per_token("trn1.32xlarge", 32)


def test_profiles_without_the_newer_fields_still_load(tmp_path):
    old = {k: v for k, v in PROFILE.to_dict().items()
           if k not in ("attention_efficiency", "quantized_weight_bytes")}
    (tmp_path / "old.json").write_text(json.dumps(old))
    loaded = load_profile(tmp_path / "old.json")
    assert loaded.weight_bw_efficiency == PROFILE.weight_bw_efficiency
    assert StepCostModel(loaded, INF2_48X, LLAMA3_8B, 24).decode_time(4, 4000) > 0


def test_step_time_reads_step_records():
    model = StepCostModel(PROFILE, INF2_48X, LLAMA3_8B, 24, "int8")
    common = dict(state="ACTIVE_DECODE", req_ids=["a"], blocked=None, num_waiting=0,
                  num_running=1, kv_usage=0.1, t_start=0.0)
    prefill = StepRecord(step=0, kind="prefill", num_tokens=300, num_tokens_padded=512,
                         num_seqs=1, num_seqs_padded=1, bucket=512, context_tokens=1024, **common)
    decode = StepRecord(step=1, kind="decode", num_tokens=3, num_tokens_padded=3, num_seqs=3,
                        num_seqs_padded=4, bucket=4, context_tokens=5000, **common)
    empty = StepRecord(step=2, kind="empty", num_tokens=0, num_tokens_padded=0, num_seqs=0,
                       num_seqs_padded=0, bucket=None, context_tokens=0, **common)
    assert model.step_time(prefill) == model.prefill_time(512, 1024)
    assert model.step_time(decode) == model.decode_time(4, 5000)
    assert model.step_time(empty) == 0.0


def test_invalid_settings():
    with pytest.raises(ValueError, match="weight_dtype"):
        StepCostModel(PROFILE, INF2_48X, LLAMA3_8B, 24, "fp4")
    with pytest.raises(HardwareError):
        StepCostModel(PROFILE, get_instance("inf2.xlarge"), LLAMA3_8B, 4)


# -- KV capacity ---------------------------------------------------------------------------------

def test_kv_capacity_llama3_8b_on_inf2_8xlarge():
    cap = kv_capacity(INF2_8X, LLAMA3_8B, 2, "bf16", max_model_len=4096)
    assert cap["num_blocks"] > 0 and cap["tokens"] == cap["num_blocks"] * 32
    assert cap["limited_by"] == "cap_fraction" and cap["bytes"] <= cap["cap_bytes"]
    assert cap["max_concurrent_at_max_len"] == cap["num_blocks"] // (4096 // 32)
    # int8 weights leave more memory, but the cap fraction still binds; a larger cap gives more.
    bigger = kv_capacity(INF2_8X, LLAMA3_8B, 2, "bf16", 4096, cap_fraction=0.4)
    assert bigger["num_blocks"] > cap["num_blocks"]
    limited = kv_capacity(INF2_8X, LLAMA3_8B, 2, "bf16", 4096, max_num_seqs=4)
    assert limited["num_blocks"] == 4 * 128 and limited["limited_by"] == "max_num_seqs"


def test_kv_capacity_when_weights_nearly_fill_memory():
    cap = kv_capacity(INF2_8X, LLAMA3_8B, 2, "bf16", 4096, cap_fraction=0.9)
    assert cap["limited_by"] == "free_memory" and 0 < cap["bytes"] <= cap["free_bytes"]


def test_kv_capacity_gqa_replication():
    # 8 KV heads on 24 cores: each core keeps one head, so a token takes 3x its logical size.
    cap = kv_capacity(INF2_48X, LLAMA3_8B, 24, "bf16", 4096)
    assert cap["bytes_per_token"] == 3 * get_architecture("Llama-3-8B").kv_bytes_per_token()


def test_kv_capacity_70b_on_inf2_xlarge_says_what_fits():
    with pytest.raises(CapacityError,
                       match=r"do not fit in TP 2 on inf2.xlarge.*"
                             r"--instance inf2.24xlarge --tensor-parallel-size 12"):
        kv_capacity(get_instance("inf2.xlarge"), get_architecture("Llama-3-70B"), 2, "bf16",
                    4096)
    with pytest.raises(CapacityError, match="It fits with --tensor-parallel-size 24"):
        kv_capacity(INF2_48X, get_architecture("Llama-3-70B"), 4, "bf16", 4096)


# -- compile estimate and profiles ----------------------------------------------------------------

def test_compile_footprint_follows_the_compile_time_model():
    # (Changed with issue 29: it was 30 s per graph per GB of weights, 15 min for these 2
    # graphs and 5x that for 10. Now NxDI's build: the graphs past the first compile at once,
    # and weights only drive the load; tests/test_compile_time.py covers the model itself.)
    est = compile_footprint(1, 1, LLAMA2_7B, "bf16", 24, instance=INF2_48X)
    # the contrib figure it is fitted to: 362 s for these 2 graphs at TP 2 (+ ~8 s of load)
    assert est["graphs"] == 2 and 330 < est["estimated_compile_s"] < 400
    more = compile_footprint(6, 4, LLAMA2_7B, "bf16", 24, instance=INF2_48X)
    assert more["graphs"] == 10
    # 8 more graphs add their tracing, not their compile (32 workers)
    extra = more["estimated_compile_s"] - est["estimated_compile_s"]
    assert extra == pytest.approx(8 * 32 * more["startup"]["trace_s"] / (10 * 32))
    int8 = compile_footprint(1, 1, LLAMA2_7B, "int8", 24, instance=INF2_48X)
    assert int8["startup"]["compile_s"] == est["startup"]["compile_s"]   # weights are inputs
    assert int8["startup"]["load_s"] < est["startup"]["load_s"]


@pytest.mark.parametrize("name", list(INSTANCES))
def test_builtin_profiles_load_and_round_trip(name, tmp_path):
    profile = load_profile(name)
    assert profile.instance == name
    assert 0 < profile.compute_efficiency <= 1 and profile.decode_fixed_s > 0
    path = save_profile(profile, tmp_path / "p.json")
    assert load_profile(path) == profile
    assert CostProfile.from_dict(json.loads(path.read_text())) == profile


def test_profile_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="inf2.48xlarge"):
        load_profile("p5.48xlarge")
    (tmp_path / "bad.json").write_text(json.dumps(PROFILE.to_dict() | {"typo_s": 1}))
    with pytest.raises(ValueError, match="typo_s"):
        load_profile(tmp_path / "bad.json")


def test_model_is_deterministic():
    a = StepCostModel(PROFILE, INF2_48X, LLAMA3_8B, 24, "int8")
    b = StepCostModel(load_profile("inf2.48xlarge"), INF2_48X, get_architecture("llama-3-8b"),
                      24, "int8")
    assert a.prefill_time(1000, 77) == b.prefill_time(1000, 77)
    assert a.decode_time(7, 7777) == b.decode_time(7, 7777)
