"""Integration: our engine settings and scheduler against the real code of AWS's vLLM plugin
for NxD Inference (vllm-neuron 0.1.0 on vLLM 0.10.2, 0.2.0 on vLLM 0.11.0), on the CPU.

The plugin's platform, model loader, worker and model runner and vLLM's engine and scheduler
are the real ones; only NxDI is faked, at its import boundary (tests/engine/nxdi_fakes.py), and the
plugin is told Neuron devices exist. Each case runs in a fresh interpreter
(tests/engine/nxdi_driver.py): the plugin's platform patches vLLM's ModelConfig globally.

Self-selecting: runs only in an environment whose vLLM is one a vendored plugin release pins
(`bash scripts/vllm_matrix.sh 0.10.2 0.11.0` builds them in
~/.cache/neuron-batch/vllm-matrix/), with the plugin's source archive in ../shared/vendor
(relative to the repository root); skips saying why elsewhere. The plugin is installed once
per environment with `pip install --no-deps --target`, its stray top-level `test` package
removed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from neuron_batch.versions import installed_vllm_version

ROOT = Path(__file__).resolve().parents[2]
VENDOR = ROOT.parent / "shared" / "vendor"
DRIVER = Path(__file__).with_name("nxdi_driver.py")
#: vLLM release -> the vendored plugin release that pins it.
PLUGIN_FOR_VLLM = {"0.10.2": "0.1.0", "0.11.0": "0.2.0"}
CASE_TIMEOUT_S = 600

#: Keys of NxDI's NeuronConfig (aws-neuron/neuronx-distributed-inference,
#: src/neuronx_distributed_inference/models/config.py, `NeuronConfig.__init__` kwargs.pop):
#: the ones the plugin's loader and we may pass. NxDI only warns about others and ignores them.
NXDI_NEURON_CONFIG_KEYS = frozenset({
    "batch_size", "padding_side", "seq_len", "n_active_tokens", "n_positions", "on_cpu",
    "torch_dtype", "max_context_length", "max_new_tokens", "max_length", "ctx_batch_size",
    "tkg_batch_size", "max_batch_size", "is_continuous_batching", "kv_cache_batch_size",
    "on_device_sampling_config", "async_mode", "enable_bucketing", "buckets",
    "context_encoding_buckets", "prefix_buckets", "token_generation_buckets", "quantized",
    "quantized_checkpoints_path", "quantization_type", "quantization_dtype",
    "speculation_length", "enable_fused_speculation", "enable_eagle_speculation",
    "is_block_kv_layout", "pa_num_blocks", "pa_block_size", "is_prefix_caching",
    "chunked_prefill_config", "lora_config", "tp_degree", "cp_degree", "pp_degree",
    "ep_degree", "world_size", "flash_decoding_enabled", "attn_kernel_enabled",
    "attn_tkg_nki_kernel_enabled", "attn_block_tkg_nki_kernel_enabled", "skip_warmup",
})


VLLM = installed_vllm_version()
PLUGIN = PLUGIN_FOR_VLLM.get((VLLM or "").split("+")[0])
ARCHIVE = VENDOR / f"vllm-neuron-{PLUGIN}.tar.gz" if PLUGIN else None

pytestmark = [
    pytest.mark.skipif(PLUGIN is None, reason=(
        f"vLLM {VLLM} here; the vendored NxDI plugin releases pin vLLM 0.10.2 (vllm-neuron "
        f"0.1.0) and 0.11.0 (0.2.0): run in those environments (scripts/vllm_matrix.sh "
        f"0.10.2 0.11.0)")),
    pytest.mark.skipif(ARCHIVE is not None and not ARCHIVE.exists(), reason=(
        f"the plugin's source archive is not here ({ARCHIVE}: ../shared/vendor, relative to "
        f"the repository root)")),
]


@pytest.fixture(scope="module")
def plugin_dir() -> Path:
    """The plugin installed into a folder of this environment, once (reused while there)."""
    target = Path(sys.prefix) / f"vllm-neuron-{PLUGIN}"
    if (target / "vllm_neuron" / "platform.py").exists():
        return target
    staging = Path(tempfile.mkdtemp(prefix="vllm-neuron-", dir=sys.prefix))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--disable-pip-version-check", "--target", str(staging),
                           str(ARCHIVE)], capture_output=True, text=True, timeout=600)
    if done.returncode:
        shutil.rmtree(staging, ignore_errors=True)
        pytest.fail(f"installing {ARCHIVE.name} failed: {done.stderr[-2000:]}")
    shutil.rmtree(staging / "test", ignore_errors=True)   # the wheel's stray test package
    staging.rename(target)
    return target


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from neuron_batch.scheduler.harness import TINY_LLAMA_CONFIG

    path = tmp_path_factory.mktemp("model")
    (path / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    return path


@pytest.fixture
def case(plugin_dir, model_dir, tmp_path):
    def run(name: str, settings: dict, **args) -> dict:
        work = Path(args.pop("work", tmp_path / "work"))
        work.mkdir(parents=True, exist_ok=True)
        payload = {"model": str(model_dir), "work": str(work), "settings":
                   {"compiled_artifacts": str(tmp_path / "artifacts"), **settings}, **args}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(plugin_dir)]),
               "VLLM_LOGGING_LEVEL": "WARNING", "NEURON_BATCH_CACHE": str(tmp_path / "cache")}
        for name_ in ("DISABLE_NEURON_CUSTOM_SCHEDULER", "NEURON_COMPILED_ARTIFACTS"):
            env.pop(name_, None)
        done = subprocess.run([sys.executable, str(DRIVER), name, json.dumps(payload)],
                              capture_output=True, text=True, timeout=CASE_TIMEOUT_S,
                              env=env, cwd=str(tmp_path))
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-6000:]
        return json.loads(lines[-1][len("RESULT "):])
    return run


#: The contiguous layout (prefix caching off); tests/engine/test_nxdi_prefix_plugin.py runs it on.
LIMITS = {"max_num_seqs": 4, "max_model_len": 512, "max_num_batched_tokens": 64,
          "prefix_caching": False}


# -- config contract ------------------------------------------------------------------------
def test_config_contract_our_scheduler_budget_block_size_and_chunking_survive(case):
    got = case("config", {**LIMITS, "tensor_parallel_size": 2})
    assert got["platform"] == "vllm_neuron.platform.NeuronPlatform"
    assert got["device_type"] == "cpu"   # why Neuron is told by the platform's class
    assert got["detected_device"] == "neuron"
    assert got["tensor_parallel_size"] == 2
    assert got["scheduler_cls"] == "neuron_batch.scheduler.NeuronScheduler"
    assert got["worker_cls"] == "neuron_batch.engine.neuron_worker.WholePromptNeuronWorker"
    # Whole prompts: our budget (>= max_model_len), not the plugin's 131072; chunking off
    # once our worker has run (vLLM 0.11 builds it on whatever we pass).
    assert got["max_num_batched_tokens"] == 512
    assert got["chunked_prefill_as_built"] is True    # vLLM's defaults, whatever we pass
    assert got["chunked_prefill_enabled"] is False
    # NxDI's contiguous layout; vLLM's pool: one block per slot plus its null block, on both
    # plugin lines (0.2.0 adds the null block itself, 0.1.0 gets it from us).
    assert got["block_size"] == 512 and got["enable_prefix_caching"] is False
    assert got["num_gpu_blocks_override"] == LIMITS["max_num_seqs"] + 1
    assert got["section"]["context_encoding_buckets"] == [128, 256, 512]


def test_config_contract_control_without_our_switch_the_plugin_takes_over(case):
    """The same settings without DISABLE_NEURON_CUSTOM_SCHEDULER: the platform swaps in its
    own scheduler and budget (what `neuron-batch run` did before issue 20)."""
    got = case("config", LIMITS, without_env=True, without_worker=True)
    assert got["scheduler_cls"].endswith("ContinuousBatchingNeuronScheduler")
    assert got["max_num_batched_tokens"] == 131072


# -- loader contract ------------------------------------------------------------------------
def test_loader_contract_keys_buckets_and_block_count(case, tmp_path):
    got = case("loader", {**LIMITS, "token_generation_buckets": [256, 512],
                          "tensor_parallel_size": 2})
    config = got["neuron_config"]
    assert config["tp_degree"] == 2
    assert set(config) <= NXDI_NEURON_CONFIG_KEYS, set(config) - NXDI_NEURON_CONFIG_KEYS
    assert config["context_encoding_buckets"] == got["prefill_buckets"] == [128, 256, 512]
    assert config["token_generation_buckets"] == got["attention_buckets"] == [256, 512]
    assert config["batch_size"] == LIMITS["max_num_seqs"] and config["ctx_batch_size"] == 1
    assert config["seq_len"] == config["max_context_length"] == 512
    assert config["is_block_kv_layout"] is False and config["is_prefix_caching"] is False
    assert config["pa_num_blocks"] == got["vllm_num_blocks"]
    assert got["compiled"] == [got["artifacts"]] == got["loaded"]
    assert Path(got["artifacts"]).parent == tmp_path / "artifacts"
    # A second start with the same shapes loads what the first compiled; a changed shape
    # compiles into a folder of its own.
    again = case("loader", {**LIMITS, "token_generation_buckets": [256, 512],
                            "tensor_parallel_size": 2})
    assert again["compiled"] == [] and again["loaded"] == [got["artifacts"]]
    other = case("loader", LIMITS)
    assert other["compiled"] == [other["artifacts"]] != [got["artifacts"]]


# -- data path --------------------------------------------------------------------------------
def expected_tokens(prompt: list[int], max_tokens: int, vocab: int) -> list[int]:
    sys.path.insert(0, str(Path(__file__).parent))
    from nxdi_fakes import next_token

    context, out = list(prompt), []
    for _ in range(max_tokens):
        out.append(next_token(context, vocab))
        context.append(out[-1])
    return out


def check_step_by_step(got: dict, max_num_seqs: int) -> None:
    """Every model call the device saw is the step our records describe, in order."""
    steps = [s for s in got["steps"] if s["kind"] != "empty"]
    calls = got["calls"]
    assert len(steps) == len(calls), (len(steps), len(calls))
    for step, call in zip(steps, calls):
        assert step["kind"] == call["phase"], (step, call)
        assert step["num_preempted"] == 0
        if call["phase"] == "prefill":     # one whole prompt, padded to its bucket
            assert len(step["req_ids"]) == 1
            assert step["num_tokens"] == call["num_tokens"]
            assert step["num_tokens_padded"] == call["padded"]
        else:                              # every slot, attending one bucket
            assert step["num_seqs"] == call["batch"] == step["num_running"]
            assert step["num_seqs_padded"] == call["padded_batch"] == max_num_seqs
            assert step["attended_len"] == call["attended"]


def requests_of(spec: list[tuple[int, int]], temperature=lambda i: 0.0) -> list[dict]:
    return [{"id": f"r{i}", "prompt": [3 + (7 * i + j) % 1000 for j in range(length)],
             "max_tokens": tokens, "temperature": temperature(i), "seed": i}
            for i, (length, tokens) in enumerate(spec)]


def test_data_path_long_prompts_held_back_decodes_and_a_job_larger_than_the_kv(case):
    # Prompts up to 6x max_num_batched_tokens; 12 requests through 4 compiled slots, so
    # slots are reused and decodes wait behind each new prompt.
    spec = [(100 + 29 * i % 300, 3 + i % 5) for i in range(12)]
    requests = requests_of(spec)
    got = case("run", LIMITS, requests=requests)
    check_step_by_step(got, LIMITS["max_num_seqs"])
    assert max(c["num_tokens"] for c in got["calls"] if c["phase"] == "prefill") > 64
    for request in requests:
        assert got["outputs"][request["id"]] == expected_tokens(
            request["prompt"], request["max_tokens"], got["vocab"]), request["id"]


def test_data_path_hundreds_of_requests(case):
    limits = {"max_num_seqs": 8, "max_model_len": 256, "max_num_batched_tokens": 256,
              "prefix_caching": False}
    spec = [(16 + (37 * i) % 150, 1 + (i % 7)) for i in range(240)]
    requests = requests_of(spec)
    got = case("run", limits, requests=requests)
    check_step_by_step(got, limits["max_num_seqs"])
    assert len(got["outputs"]) == 240
    wrong = [r["id"] for r in requests if got["outputs"][r["id"]] != expected_tokens(
        r["prompt"], r["max_tokens"], got["vocab"])]
    assert not wrong


def test_data_path_mixed_temperatures_reach_their_own_requests(case):
    """Greedy requests must give the model's top token every time; requests at a very high
    temperature almost never do. Parameters sent to the wrong request break either side."""
    if PLUGIN == "0.1.0":
        pytest.skip("vllm-neuron 0.1.0 has no CPU sampler (worker/"
                    "neuronx_distributed_model_loader.py, NeuronCausalLM.sample raises "
                    "'CPU sampler not implemented' without on_device_sampling_config): "
                    "neuron-batch refuses mixed temperatures there "
                    "(tests/engine/test_neuron_host.py)")
    spec = [(40 + 13 * i, 12) for i in range(10)]
    requests = requests_of(spec, temperature=lambda i: 0.0 if i % 2 == 0 else 1000.0)
    got = case("run", LIMITS, requests=requests, mixed=True)
    check_step_by_step(got, LIMITS["max_num_seqs"])
    assert got["neuron_config"]["on_device_sampling_config"] is None
    for request in requests:
        expected = expected_tokens(request["prompt"], request["max_tokens"], got["vocab"])
        same = sum(a == b for a, b in zip(got["outputs"][request["id"]], expected))
        if request["temperature"] == 0.0:
            assert got["outputs"][request["id"]] == expected, request["id"]
        else:
            assert same <= 2, (request["id"], same)
