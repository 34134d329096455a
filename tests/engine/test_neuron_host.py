"""`--device neuron` engine settings (engine/neuron_host.py): what AWS's NxDI plugin is given so
that our scheduler runs with the shapes its records say, and what is refused before anything
loads. Pure: no plugin, no device (tests/engine/test_nxdi_plugin.py runs the plugin's own code)."""

from __future__ import annotations

import pytest

from neuron_batch.device.hardware import INSTANCES
from neuron_batch.engine import engine, neuron_host
from neuron_batch.engine.neuron_host import NeuronHostError, host_setup, plugin_line
from neuron_batch.engine.nxdi_plugin import block_layout_blocks
from neuron_batch.runtimes.prefix_grid import grid_size
from neuron_batch.runtimes.runtime import RUNTIMES, VLLM_NEURON
from neuron_batch.runtimes.sampling import JobSampling
from neuron_batch.settings import RunSettings, SettingsError

NXDI = RUNTIMES["nxdi"]
#: Keys the NxDI loader derives from vLLM's own settings: never in override_neuron_config.
LOADER_OWNED = {"batch_size", "seq_len", "max_context_length", "tp_degree", "ctx_batch_size"}


def settings(**changes) -> RunSettings:
    # (caching on unless a test says otherwise: a run decides auto before any of this,
    # run/prefix_auto.py; these are the layouts it then builds)
    base = dict(inputs=("x.jsonl",), runtime="nxdi", max_num_seqs=8, max_model_len=4352,
                max_num_batched_tokens=512, prefix_caching=True)
    base.update(changes)
    return RunSettings.of(**base).validate()


#: A job whose requests sample with different temperatures.
MIXED = JobSampling(num_requests=2, mixed=True)


def setup(tmp_path, plugin="0.2.0", sampling=None, **changes):
    return host_setup(settings(**changes), NXDI, model_path=str(tmp_path / "model"),
                      plugin_version=plugin, sampling=sampling, artifacts_root=tmp_path / "art")


def test_nxdi_keeps_our_scheduler_whole_prompts_and_nxdi_bucket_keys(tmp_path):
    done = setup(tmp_path, prefix_caching=False)
    assert done.env["DISABLE_NEURON_CUSTOM_SCHEDULER"] == "1"
    assert done.kwargs["worker_cls"] == neuron_host.WORKER_CLS
    # Contiguous KV: one block of max_model_len per slot, vLLM's null block added by 0.2.0.
    assert done.kwargs["block_size"] == 4352
    assert done.kwargs["enable_prefix_caching"] is False
    assert done.kwargs["num_gpu_blocks_override"] == 8
    shapes = settings(prefix_caching=False).shapes()
    assert done.section == {
        "context_encoding_buckets": list(shapes.prefill_buckets),
        "token_generation_buckets": list(shapes.attention_buckets),
        "is_block_kv_layout": False, "is_prefix_caching": False}
    assert shapes.prefill_buckets[-2:] == (2048, 4352)   # NxDI's generate_buckets
    assert not LOADER_OWNED & set(done.section)
    assert "tensor_parallel_size" not in done.kwargs


def test_plugin_0_1_0_needs_the_null_block_added_by_us(tmp_path):
    assert setup(tmp_path, plugin="0.1.0", prefix_caching=False
                 ).kwargs["num_gpu_blocks_override"] == 9
    # block layout: 4352 / 32 blocks a slot, 8 slots; 0.2.0 adds vLLM's null block itself
    assert setup(tmp_path).kwargs["num_gpu_blocks_override"] == 136 * 8
    assert setup(tmp_path, plugin="0.1.0").kwargs["num_gpu_blocks_override"] == 136 * 8 + 1
    assert plugin_line("0.2.0").adds_null_block and not plugin_line("0.1.0").adds_null_block


def test_tensor_parallel_size_reaches_vllm(tmp_path):
    done = setup(tmp_path, tensor_parallel_size=2)
    assert done.kwargs["tensor_parallel_size"] == 2


def test_mixed_temperatures_sample_on_the_cpu_or_are_refused(tmp_path):
    assert setup(tmp_path, sampling=MIXED).section["on_device_sampling_config"] is None
    assert "on_device_sampling_config" not in setup(tmp_path).section
    with pytest.raises(NeuronHostError, match="different temperature.*CPU sampler not "
                                              "implemented"):
        setup(tmp_path, plugin="0.1.0", sampling=MIXED)


@pytest.mark.parametrize("job, words", [
    (JobSampling(num_requests=3, constrained_requests=1), "1 request.*structured outputs"),
    (JobSampling(num_requests=3, logprob_requests=2), "2 request.*logprobs"),
    (JobSampling(num_requests=3, host_only=("presence_penalty",)), "presence_penalty"),
])
def test_what_only_the_host_samples_turns_on_device_sampling_off_or_is_refused(
        tmp_path, job, words):
    assert setup(tmp_path, sampling=job).section["on_device_sampling_config"] is None
    with pytest.raises(NeuronHostError, match=f"{words}.*vllm-neuron 0.1.0 samples on the "
                                              f"device only.*0.2.0"):
        setup(tmp_path, plugin="0.1.0", sampling=job)
    # n alone never needs the host: vLLM fans it out into n sequences.
    assert "on_device_sampling_config" not in setup(
        tmp_path, sampling=JobSampling(num_requests=3, n_sampled_requests=3)).section


def test_prompt_logprobs_are_refused_under_nxdi_whatever_samples(tmp_path):
    job = JobSampling(num_requests=2, logprob_requests=1, prompt_logprob_requests=1)
    for plugin in ("0.1.0", "0.2.0"):
        with pytest.raises(NeuronHostError, match="1 request.*prompt logprobs.*--device cpu"):
            setup(tmp_path, plugin=plugin, sampling=job)


def test_the_beta_runtime_keeps_structured_outputs_on_the_device(tmp_path):
    job = JobSampling(num_requests=3, constrained_requests=3)
    beta = RUNTIMES[VLLM_NEURON]
    done = host_setup(settings(runtime=beta.name, max_model_len=4096), beta,
                      model_path=str(tmp_path / "model"), plugin_version="0.21.0.1.0.0",
                      sampling=job, artifacts_root=tmp_path / "art")
    assert "on_device_sampling_config" not in done.section
    assert beta.sampling.host_reasons(job) == []
    assert beta.sampling.device_mask_s_per_token == pytest.approx(0.4e-3)


def test_a_block_size_the_plugin_cannot_use_is_refused(tmp_path):
    with pytest.raises(NeuronHostError, match="--block-size 32 with --no-prefix-caching.*"
                                              "contiguous layout.*drop --no-prefix-caching"):
        setup(tmp_path, block_size=32, prefix_caching=False)
    assert setup(tmp_path, block_size=4352, prefix_caching=False).kwargs["block_size"] == 4352
    for block in (64, 8, 4352):     # the block layout's blocks are 32 or 16
        with pytest.raises(NeuronHostError, match=f"--block-size {block}: with prefix caching"
                                                  ".*32 tokens.*or 16.*--no-prefix-caching"):
            setup(tmp_path, block_size=block)
    assert setup(tmp_path, block_size=16).kwargs["block_size"] == 16
    with pytest.raises(NeuronHostError, match="max_model_len 4360 is not a multiple of the "
                                              "block size 32.*--max-model-len 4352 or 4384"):
        setup(tmp_path, max_model_len=4360)


def test_block_layout_block_counts_and_lengths():
    new, old = plugin_line("0.2.0"), plugin_line("0.1.0")
    assert block_layout_blocks(4096, 32, 8, new) == 128 * 8
    assert block_layout_blocks(4096, 32, 8, old) == 128 * 8 + 1
    with pytest.raises(NeuronHostError, match="not a multiple of the block size"):
        block_layout_blocks(4352 + 16, 32, 8, new)


def test_prefix_caching_is_the_block_layout_with_nxdi_s_grid(tmp_path):
    """Prefix caching on (as auto decides where it pays, or asked): NxDI's block layout,
    context-encoding and prefix bucket lists passed together (NxDI's defaults), token
    generation from 256."""
    done = setup(tmp_path, max_model_len=4096)
    assert done.kwargs["enable_prefix_caching"] is True and done.kwargs["block_size"] == 32
    assert done.kwargs["num_gpu_blocks_override"] == 128 * 8
    assert done.section == {
        "context_encoding_buckets": [512, 1024, 2048, 4096],
        "prefix_buckets": [0, 512, 1024, 2048, 4096],
        "token_generation_buckets": [256, 512, 1024, 2048, 4096],
        "is_block_kv_layout": True, "is_prefix_caching": True, "pa_block_size": 32}
    assert "pa_num_blocks" not in done.section   # the loader copies the override (0.2.0
    assert not LOADER_OWNED & set(done.section)  # refuses one that differs from it)
    given = setup(tmp_path, max_model_len=4096, prefix_buckets=(1024, 4096),
                  context_encoding_buckets=(1024, 4096), token_generation_buckets=(4096,))
    assert given.section["prefix_buckets"] == [0, 1024, 4096]
    assert given.section["context_encoding_buckets"] == [1024, 4096]
    assert given.section["token_generation_buckets"] == [4096]


def test_bad_prefix_buckets_are_refused_before_anything_loads(tmp_path):
    with pytest.raises(SettingsError, match="--prefix-buckets: 500 is not a multiple of the KV "
                                            "block size 32"):
        settings(max_model_len=4096, prefix_buckets=(500, 4096))
    with pytest.raises(SettingsError, match="must end at max_model_len = 4096"):
        settings(max_model_len=4096, prefix_buckets=(512, 2048))
    with pytest.raises(SettingsError, match="strictly ascending"):
        settings(max_model_len=4096, prefix_buckets=(1024, 512, 4096))
    with pytest.raises(SettingsError, match="--no-prefix-caching: drop --prefix-buckets"):
        setup(tmp_path, max_model_len=4096, prefix_buckets=(512, 4096), prefix_caching=False)


def test_batch_size_1_with_prefix_caching_is_refused_where_the_readme_says_it_is_wrong(
        tmp_path):
    for version in ("0.2.0", "0.2.1"):
        with pytest.raises(NeuronHostError, match=f"--max-num-seqs 1 with prefix caching: "
                                                  f"vllm-neuron {version}'s README.*known "
                                                  f"issue 3.*--max-num-seqs 2.*--no-prefix"):
            setup(tmp_path, plugin=version, max_num_seqs=1)
    # 0.1.0's README does not list it; without prefix caching nothing is refused
    assert setup(tmp_path, plugin="0.1.0", max_num_seqs=1).kwargs["enable_prefix_caching"]
    assert not setup(tmp_path, max_num_seqs=1, prefix_caching=False).kwargs[
        "enable_prefix_caching"]


def test_the_layout_words_and_graph_count():
    from neuron_batch.engine.nxdi_plugin import nxdi_kv_layout

    # ../shared/notes/neuron-runtimes.md: max_model_len 4096 -> 4 x 5 = 20 context-encoding
    # graphs, 8192 -> 5 x 6 = 30; token generation from 256
    for length, grid in ((4096, 20), (8192, 30)):
        layout = nxdi_kv_layout(settings(max_model_len=length), NXDI, plugin_line("0.2.0"))
        assert grid_size(layout.prefill_buckets, layout.prefix_buckets) == grid
        assert layout.num_graphs == grid + len(layout.tkg_buckets)
        assert f"= {layout.num_graphs} graphs" in layout.words()
        assert layout.words().startswith("prefix caching on: block layout, 32-token blocks")
    off = nxdi_kv_layout(settings(prefix_caching=False), NXDI, plugin_line("0.2.0"))
    assert off.describe()["layout"] == "contiguous" and off.num_graphs == 2 * 6
    assert off.words().startswith("prefix caching off: contiguous, one block of 4352")


def test_flags_of_the_other_runtime_are_refused():
    with pytest.raises(SettingsError, match="--prefill-buckets.*vllm-neuron"):
        settings(prefill_buckets=(128, 512))
    with pytest.raises(SettingsError, match="--decode-buckets"):
        settings(decode_buckets=(1, 8))


def test_compiled_artifacts_are_keyed_by_every_compiled_shape(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 64}')
    first = setup(tmp_path)
    assert first.env["NEURON_COMPILED_ARTIFACTS"] == str(first.artifacts)
    assert first.artifacts.parent == tmp_path / "art"
    assert first.artifacts.name.startswith("model-")
    assert setup(tmp_path).artifacts == first.artifacts
    changed = [setup(tmp_path, token_generation_buckets=(1024, 4352)),
               setup(tmp_path, prefix_buckets=(1024, 4352)), setup(tmp_path, block_size=16),
               setup(tmp_path, prefix_caching=False),
               setup(tmp_path, max_num_seqs=4), setup(tmp_path, plugin="0.1.0"),
               setup(tmp_path, sampling=MIXED),
               setup(tmp_path, tensor_parallel_size=2)]
    assert len({c.artifacts for c in changed} | {first.artifacts}) == len(changed) + 1
    (model / "config.json").write_text('{"hidden_size": 128}')
    assert setup(tmp_path).artifacts != first.artifacts
    given = host_setup(settings(compiled_artifacts=str(tmp_path / "mine")), NXDI,
                       model_path=str(model), plugin_version="0.2.0")
    assert given.artifacts.parent == tmp_path / "mine"


def test_engine_kwargs_on_neuron_under_nxdi(monkeypatch, tmp_path):
    monkeypatch.setattr(engine, "neuron_plugin_missing_message", lambda: None)
    run = settings(tensor_parallel_size=2, compiled_artifacts=str(tmp_path))
    kwargs = engine.engine_kwargs(run, "neuron", str(tmp_path / "m"), tmp_path / "r.jsonl",
                                  tmp_path, has_tokenizer=True)
    assert kwargs["scheduler_cls"] == "neuron_batch.scheduler.NeuronScheduler"
    assert kwargs["enable_chunked_prefill"] is False
    assert kwargs["max_num_batched_tokens"] >= run.max_model_len   # never a split prompt
    assert kwargs["tensor_parallel_size"] == 2                    # not only with --replicas
    assert kwargs["block_size"] == 32 and kwargs["enable_prefix_caching"] is True
    section = kwargs["additional_config"]["override_neuron_config"]
    assert section["context_encoding_buckets"] == [512, 1024, 2048, 4352]
    assert section["prefix_buckets"] == [0, 512, 1024, 2048, 4352]
    own = kwargs["additional_config"]["neuron_batch"]
    assert own["runtime"] == "nxdi"
    assert own["process_env"]["DISABLE_NEURON_CUSTOM_SCHEDULER"] == "1"


def test_neuron_is_told_by_the_platform_not_its_device_type():
    # The NxDI plugin's NeuronPlatform says device_type "cpu".
    assert neuron_host.is_neuron_platform("NeuronPlatform", "vllm_neuron.platform", "cpu")
    assert not neuron_host.is_neuron_platform("CpuPlatform", "vllm.platforms.cpu", "cpu")
    assert neuron_host.is_neuron_platform("X", "y", "neuron")


def test_a_host_s_instance_is_looked_up_once_and_an_unknown_one_refused():
    assert neuron_host.host_hardware(settings(host_instance="inf2.8xlarge")) is \
        INSTANCES["inf2.8xlarge"]
    with pytest.raises(NeuronHostError, match="--device neuron: .*inf9.xlarge"):
        neuron_host.host_hardware(settings(host_instance="inf9.xlarge"))


def test_a_layout_that_does_not_load_is_refused_with_what_would(tmp_path):
    # ../shared/notes/neuron-runtimes.md: Llama-3.1-8B bf16, 32 x 16384 on one inf2 chip.
    run = settings(max_num_seqs=32, max_model_len=16384,
                   tensor_parallel_size=2, host_instance="inf2.xlarge")
    with pytest.raises(NeuronHostError, match="cannot load under nxdi.*What fits"):
        neuron_host.layout_fit(run, NXDI, "llama-3.1-8b", INSTANCES["inf2.xlarge"])
    small = settings(max_num_seqs=4, max_model_len=4096, tensor_parallel_size=2)
    fit = neuron_host.layout_fit(small, NXDI, "llama-3.1-8b", INSTANCES["inf2.xlarge"])
    assert fit["max_static_seqs"] >= 4
    assert neuron_host.layout_fit(small, NXDI, "llama-3.1-8b", None) is None
    # a paged runtime's pool is checked too; one AWS does not ship for the instance is refused
    paged = neuron_host.layout_fit(small.replace(tensor_parallel_size=4),
                                   RUNTIMES["vllm-neuron"], "llama-3.1-8b",
                                   INSTANCES["trn2.3xlarge"])
    assert paged["num_blocks"] > 0 and "max_static_seqs" not in paged
    with pytest.raises(NeuronHostError, match="does not run on inf2.xlarge"):
        neuron_host.layout_fit(small, RUNTIMES["vllm-neuron"], "llama-3.1-8b",
                               INSTANCES["inf2.xlarge"])


def test_a_split_s_short_layout_takes_the_slots_this_host_holds():
    # inf2.8xlarge TP 2, Llama-3.1-8B bf16: 52 slots of 2,176 fit beside the weights (the
    # simulated device's figure for the same layout)
    from neuron_batch.job.job import resolve_target

    def slots(run):        # what the runner gives a split's short layout on this host
        target = resolve_target(run, "llama-3.1-8b")
        return None if target is None else target.static_slots(run.max_model_len)

    run = settings(device="neuron", max_num_seqs=7, max_model_len=2176,
                   tensor_parallel_size=2,
                   host_instance="inf2.8xlarge")
    assert slots(run) == 52
    assert not resolve_target(run, "llama-3.1-8b").simulated
    too_big = settings(device="neuron", max_model_len=2176,
                       tensor_parallel_size=1,
                       host_instance="inf2.xlarge")
    assert slots(too_big) is None
    assert slots(settings(device="neuron", runtime="vllm-neuron", max_num_seqs=7,
                          max_model_len=2176, max_num_batched_tokens=2048,
                          tensor_parallel_size=4,
                          host_instance="trn2.3xlarge")) is None
    with pytest.raises(SettingsError, match="does not run on inf2.8xlarge"):
        settings(device="neuron", runtime="vllm-neuron", host_instance="inf2.8xlarge")


def test_the_host_instance_comes_from_the_option_or_the_dmi_name(tmp_path):
    dmi = tmp_path / "product_name"
    dmi.write_text("inf2.8xlarge\n")
    assert neuron_host.host_instance(settings(), dmi) == "inf2.8xlarge"
    given = settings(host_instance="inf2.48xlarge")
    assert neuron_host.host_instance(given, dmi) == "inf2.48xlarge"
    dmi.write_text("m5.large\n")
    assert neuron_host.host_instance(settings(), dmi) is None
    assert neuron_host.host_instance(settings(), tmp_path / "absent") is None


def test_a_run_is_refused_before_anything_loads(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from neuron_batch.errors import RunError
    from neuron_batch.run import runner

    monkeypatch.setattr("neuron_batch.versions.neuron_plugin",
                        lambda: {"version": "0.1.0", "entry_point": "vllm_neuron:register"})
    from neuron_batch.inputs.prompt_records import PromptRecord

    record = lambda t: SimpleNamespace(  # noqa: E731  (a prepared request)
        record=PromptRecord(0, "a", "x.jsonl:1", prompt="Hi", temperature=t), max_tokens=8)
    workload = SimpleNamespace(model=SimpleNamespace(path=str(tmp_path)),
                               prepared=SimpleNamespace(requests=[record(None), record(0.7)]))
    with pytest.raises(RunError, match="different temperatures"):
        runner.check_neuron_host(settings(device="neuron"), workload)
    with pytest.raises(RunError, match="--block-size"):
        runner.check_neuron_host(settings(device="neuron", block_size=64), workload)
    monkeypatch.setattr("neuron_batch.versions.neuron_plugin",
                        lambda: {"version": "0.2.0", "entry_point": "vllm_neuron:register"})
    with pytest.raises(RunError, match="--max-num-seqs 1 with prefix caching"):
        runner.check_neuron_host(settings(device="neuron", max_num_seqs=1), workload)


def test_min_tokens_holds_back_an_early_eos():
    """As the plugin's own scheduler does: EOS before min_tokens does not end a request (a
    sampler on the device does not mask it the way vLLM's does)."""
    from vllm.sampling_params import SamplingParams

    from neuron_batch.scheduler import NeuronScheduler, compat
    from neuron_batch.scheduler.harness import EOS_TOKEN_ID, fake_model_output, make_scheduler

    scheduler = make_scheduler(NeuronScheduler, max_num_seqs=2, max_model_len=256,
                               max_num_batched_tokens=256, num_blocks=64)
    finished = {}
    requests = {}
    for name, min_tokens in (("plain", 0), ("held", 5)):
        params = SamplingParams(max_tokens=20, min_tokens=min_tokens)
        params.update_from_generation_config({}, EOS_TOKEN_ID)
        requests[name] = compat.make_request(name, [7] * 10, params, EOS_TOKEN_ID, 32)
        scheduler.add_request(requests[name])
    for _ in range(40):
        if not scheduler.has_requests():
            break
        output = scheduler.schedule()
        model_output = fake_model_output(output, requests, token_id=EOS_TOKEN_ID)
        for outs in scheduler.update_from_output(output, model_output).values():
            for out in outs.outputs:
                if out.finish_reason is not None:
                    finished[out.request_id] = requests[out.request_id].num_output_tokens
    assert finished == {"plain": 1, "held": 5}


def test_engine_sets_the_plugins_switches_before_vllm_starts(monkeypatch):
    """Engine (the single-engine path and every Ray replica) puts the plugin's switches in its
    process's environment before vLLM builds its config."""
    import os

    import vllm

    seen = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            seen.update(os.environ)
            self.llm_engine = None

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    monkeypatch.delenv("DISABLE_NEURON_CUSTOM_SCHEDULER", raising=False)
    monkeypatch.delenv("NEURON_COMPILED_ARTIFACTS", raising=False)
    env = {"DISABLE_NEURON_CUSTOM_SCHEDULER": "1", "NEURON_COMPILED_ARTIFACTS": "/c/x"}
    try:
        engine.Engine({"model": "x", "additional_config": {"neuron_batch": {"process_env": env}}},
                      quiet=True)
        assert {k: seen.get(k) for k in env} == env
    finally:
        for key in env:
            os.environ.pop(key, None)


def test_min_tokens_hold_is_installed_only_once_a_request_needs_it():
    """vLLM calls the per-request update for every running request every step: the hold goes in
    front of it only when some request has min_tokens > 1 (a first token may always stop)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler

    from neuron_batch.scheduler import NeuronScheduler, compat
    from neuron_batch.scheduler.harness import EOS_TOKEN_ID, make_scheduler

    assert "_update_request_with_output" not in vars(NeuronScheduler)
    scheduler = make_scheduler(NeuronScheduler, max_num_seqs=4, max_model_len=256,
                               max_num_batched_tokens=256, num_blocks=64)
    for name, min_tokens in (("zero", 0), ("one", 1), ("held", 3)):
        assert not scheduler.holds_min_tokens
        params = SamplingParams(max_tokens=20, min_tokens=min_tokens)
        params.update_from_generation_config({}, EOS_TOKEN_ID)
        scheduler.add_request(compat.make_request(name, [7] * 10, params, EOS_TOKEN_ID, 32))
    assert scheduler.holds_min_tokens
    update = scheduler._update_request_with_output
    assert update.__func__ is not Scheduler._update_request_with_output
