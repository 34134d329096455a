"""SweepSpec: every rule between bench's options, checked where the spec is built, with the
messages the CLI shows (tests/bench/test_bench.py and tests/run/test_split.py check a few of
them through click). Pure: no click, no engine, no vLLM."""

from __future__ import annotations

import subprocess
import sys

import pytest

from neuron_batch.bench.sweep_spec import BenchMode, SweepSpec, default_jobs, parse_orders
from neuron_batch.settings import RunSettings, SettingsError

SIM = dict(inputs=("trace.csv",), device="sim", max_num_seqs=8, max_model_len=8192,
           max_num_batched_tokens=2048)
# nxdi (static KV, whole prompts): decode sets are token-generation lists to max_model_len.
NXDI = RunSettings.of(**SIM, instance="inf2.8xlarge", architecture="llama-3.1-8b").validate()
# the Beta plugin (paged KV): decode sets are batch sizes ending at a max_num_seqs.
PAGED = RunSettings.of(**SIM, runtime="vllm-neuron", instance="trn2.3xlarge",
                      architecture="llama-3.1-8b").validate()


def refused(**options) -> str:
    with pytest.raises(SettingsError) as error:
        SweepSpec.build(options.pop("base", NXDI), **options)
    return str(error.value)


def test_a_plain_bench_repeats_the_base_once_without_warm_up():
    spec = SweepSpec.build(NXDI, jobs=3)
    assert spec.mode is BenchMode.REPEATS
    assert (spec.repeats, spec.warmup_runs) == (1, 0)
    assert spec.seqs_values == (8,) and spec.kv_values == (NXDI.kv_reserve,)
    assert spec.workers == 3
    repeated = SweepSpec.build(NXDI, repeat=5, warmup=2)
    assert (repeated.repeats, repeated.warmup_runs) == (5, 2)


def test_the_mode_is_the_spec_s():
    assert SweepSpec.build(NXDI, sweep_buckets=True).mode is BenchMode.SWEEP
    assert SweepSpec.build(NXDI, cuts=[1024]).mode is BenchMode.SPLIT_COMPARE


def test_jobs_default_to_the_cores_and_a_real_device_runs_one_at_a_time():
    assert SweepSpec.build(NXDI).jobs == default_jobs() >= 1
    cpu = RunSettings.of(("trace.csv",), device="cpu").validate()
    assert SweepSpec(cpu, jobs=8).workers == 1


def test_the_default_folder_is_named_for_the_first_input():
    assert SweepSpec(NXDI).folder_name == "bench-trace"
    on_hub = NXDI.replace(inputs=("hf:org/data",)).validate()
    assert SweepSpec(on_hub).folder_name == "bench-hf"


def test_several_values_need_a_sweep():
    assert refused(seqs_values=[8, 16]) == "several --max-num-seqs values need --sweep-buckets"
    assert refused(kv_values=["request", "max_model_len"]).startswith(
        "several --kv-reserve rules need --sweep-buckets (add --max-prefill-buckets 0")
    swept = SweepSpec.build(PAGED, seqs_values=[8, 16], kv_values=["request", "max_model_len"],
                            sweep_buckets=True)
    assert swept.seqs_values == (8, 16) and len(swept.kv_values) == 2


def test_prefix_caching_and_order_sweeps_need_a_sweep():
    message = ("--sweep-prefix-caching and --sweep-order need --sweep-buckets (add "
               "--max-prefill-buckets 0 --max-decode-buckets 0 to compare only these)")
    assert refused(sweep_prefix_caching=True) == message
    assert refused(sweep_order="input,prefix") == message
    spec = SweepSpec.build(NXDI, sweep_buckets=True, sweep_prefix_caching=True,
                           sweep_order="prefix, input,prefix")
    assert spec.caching_values == (True, False) and spec.order_values == ("prefix", "input")
    assert SweepSpec.build(NXDI, sweep_buckets=True).caching_values is None


def test_orders_are_named_or_refused():
    assert parse_orders(None) is None
    assert parse_orders("length,input,length") == ("length", "input")
    with pytest.raises(SettingsError, match="--sweep-order: no order in ' , '; use input"):
        parse_orders(" , ")
    with pytest.raises(SettingsError, match="--sweep-order: 'random' is not an order; use "
                                            "input, length, prefix"):
        parse_orders("input,random")


@pytest.mark.parametrize("combined", [dict(sweep_buckets=True), dict(repeat=3),
                                      dict(seqs_values=[8, 16]),
                                      dict(kv_values=["request", "max_model_len"])])
def test_split_at_compares_one_layout_alone(combined):
    assert refused(cuts=[1024], **combined).startswith(
        "--split-at compares one layout with its splits; it does not combine with "
        "--sweep-buckets, --repeat or several --max-num-seqs / --kv-reserve values")


def test_each_cut_is_checked_as_run_checks_it():
    assert "must be below --max-model-len" in refused(cuts=[1024, 8192])
    assert SweepSpec.build(NXDI, cuts=[1024, 2048]).cuts == (1024, 2048)


def test_decode_sets_end_where_the_runtime_s_decode_list_ends():
    # nxdi: a token-generation set ends at max_model_len, whatever max_num_seqs is
    assert refused(sweep_buckets=True, decode_sets=["1024,4096"]) == (
        "--decode-buckets-set 1024,4096: the last bucket must be --max-model-len 8192")
    assert SweepSpec.build(NXDI, sweep_buckets=True, decode_sets=["2048,8192"]
                           ).user_decode == ((2048, 8192),)
    # the Beta plugin: a batch-size set ends at one of the swept max_num_seqs values
    assert refused(base=PAGED, sweep_buckets=True, seqs_values=[8, 16],
                   decode_sets=["4,12"]) == (
        "--decode-buckets-set 4,12: the last bucket must be one of --max-num-seqs 8,16")
    spec = SweepSpec.build(PAGED, sweep_buckets=True, seqs_values=[8, 16],
                           decode_sets=["4,16", "2,8"])
    assert spec.user_decode == ((4, 16), (2, 8))


def test_prefill_sets_are_parsed_and_checked_under_the_runtime():
    # nxdi's context-encoding buckets end at max_model_len; `run` would refuse the set
    assert "the last bucket of --context-encoding-buckets must equal max_model_len" in \
        refused(sweep_buckets=True, prefill_sets=["512,2048"])
    assert "--prefill-buckets-set" in refused(sweep_buckets=True, prefill_sets=["512,x"])
    spec = SweepSpec.build(NXDI, sweep_buckets=True, prefill_sets=["512,8192", "8192"])
    assert spec.user_prefill == ((512, 8192), (8192,))


def test_a_spec_made_directly_is_checked_too():
    with pytest.raises(SettingsError, match="several --max-num-seqs values"):
        SweepSpec(NXDI, seqs_values=(8, 16))
    with pytest.raises(SettingsError, match="--rank-by must be one of throughput, cost"):
        SweepSpec(NXDI, rank_by="latency")
    spec = SweepSpec(NXDI, user_prefill=[[512, 8192]], cuts=[1024])
    assert spec.user_prefill == ((512, 8192),) and spec.cuts == (1024,)
    hash(spec)      # frozen, tuples throughout


def test_the_spec_imports_neither_click_nor_vllm():
    code = ("import sys, neuron_batch.bench.sweep_spec; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'click', 'vllm', 'torch'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
