"""Integration: `--device neuron` on Hugging Face's optimum-neuron (0.4.5, on vLLM 0.11.0): our
engine settings and scheduler against the real code of its vLLM plugin, on the CPU.

The plugin's platform, worker, model runner and model loader, optimum-neuron's own
NeuronConfig (an export's neuron_config.json) and hub-cache selection, and vLLM's engine and
scheduler are the real ones; only the exported model and what needs the Neuron SDK are faked,
at the import boundary ../shared/vendor/README.md names (tests/engine/optimum_fakes.py). Each
case runs in a fresh interpreter (tests/engine/optimum_driver.py): the plugin's platform
patches vLLM's ModelConfig globally, and registers itself wherever it is installed, so it
never goes into an environment other tests run in.

Self-selecting: runs only where vLLM is 0.11.0, the release optimum-neuron 0.4.5 pins
(`bash scripts/vllm_matrix.sh 0.11.0`), with the wheel in ../shared/vendor (relative to the
repository root); skips saying why elsewhere. The wheel and the `optimum` it requires
(~=2.0.0, from PyPI) are installed once per environment with `pip install --no-deps
--target`, into a folder only these cases put on their path.
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
WHEEL = ROOT.parent / "shared" / "vendor" / "optimum_neuron-0.4.5-py3-none-any.whl"
DRIVER = Path(__file__).with_name("optimum_driver.py")
#: What optimum-neuron 0.4.5 requires besides its wheel on this path (its METADATA).
OPTIMUM = "optimum~=2.0.0"
CASE_TIMEOUT_S = 600


VLLM = installed_vllm_version()

pytestmark = [
    pytest.mark.skipif((VLLM or "").split("+")[0] != "0.11.0", reason=(
        f"vLLM {VLLM} here; optimum-neuron 0.4.5 pins vLLM 0.11.0: run in that environment "
        f"(scripts/vllm_matrix.sh 0.11.0)")),
    pytest.mark.skipif(not WHEEL.exists(), reason=(
        f"optimum-neuron's wheel is not here ({WHEEL}: ../shared/vendor, relative to the "
        f"repository root)")),
]


@pytest.fixture(scope="module")
def plugin_dir() -> Path:
    """optimum-neuron installed into a folder of this environment, once (reused while there)."""
    target = Path(sys.prefix) / "optimum-neuron-0.4.5"
    if (target / "optimum" / "neuron" / "vllm" / "platform.py").exists():
        return target
    staging = Path(tempfile.mkdtemp(prefix="optimum-neuron-", dir=sys.prefix))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--disable-pip-version-check", "--target", str(staging),
                           str(WHEEL), OPTIMUM], capture_output=True, text=True, timeout=600)
    if done.returncode:
        shutil.rmtree(staging, ignore_errors=True)
        pytest.fail(f"installing {WHEEL.name} and {OPTIMUM} failed: {done.stderr[-2000:]}")
    staging.rename(target)
    return target


#: The export these cases load: 4 slots of 512 tokens, TP 2, prompts up to 256 tokens.
EXPORT = {"batch_size": 4, "sequence_length": 512, "tp_degree": 2, "max_context_length": 256}
LIMITS = {"max_num_seqs": 4, "max_model_len": 512, "prefix_caching": False}


@pytest.fixture
def model_dir(tmp_path) -> Path:
    """The tiny llama's config.json, and optimum-neuron's neuron_config.json beside it."""
    sys.path.insert(0, str(Path(__file__).parent))
    from optimum_fakes import write_export

    from neuron_batch.scheduler.harness import TINY_LLAMA_CONFIG

    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    write_export(path, **EXPORT)
    return path


@pytest.fixture
def case(plugin_dir, tmp_path):
    def run(name: str, model: Path, settings: dict, **args) -> dict:
        work = tmp_path / f"work-{len(list(tmp_path.glob('work-*')))}"   # a run folder each
        work.mkdir()
        payload = {"model": str(model), "work": str(work), "settings": settings, **args}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(plugin_dir)]),
               "VLLM_LOGGING_LEVEL": "WARNING", "NEURON_BATCH_CACHE": str(tmp_path / "cache"),
               "HF_HUB_OFFLINE": "1"}
        done = subprocess.run([sys.executable, str(DRIVER), name, json.dumps(payload)],
                              capture_output=True, text=True, timeout=CASE_TIMEOUT_S,
                              env=env, cwd=str(tmp_path))
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-6000:]
        return json.loads(lines[-1][len("RESULT "):])
    return run


# -- config contract ------------------------------------------------------------------------
def test_config_contract_detected_runtime_our_scheduler_and_whole_prompts(case, model_dir):
    got = case("config", model_dir, {**LIMITS, "tensor_parallel_size": 2})
    assert got["platform"] == "optimum.neuron.vllm.platform.OptimumNeuronPlatform"
    assert got["detected_device"] == "neuron"
    assert got["runtime"] == "optimum-neuron"          # the installed plugin decided it
    assert got["scheduler_cls"] == "neuron_batch.scheduler.NeuronScheduler"
    assert got["worker_cls"] == "neuron_batch.engine.optimum_worker.WholePromptOptimumWorker"
    assert got["block_size"] == 512 and got["enable_prefix_caching"] is False
    assert got["max_num_batched_tokens"] >= 512
    assert got["chunked_prefill_as_built"] is True    # vLLM's default: our worker undoes it


# -- the data path ------------------------------------------------------------------------------
def expected_tokens(prompt: list[int], max_tokens: int, vocab: int) -> list[int]:
    sys.path.insert(0, str(Path(__file__).parent))
    from optimum_fakes import next_token

    context, out = list(prompt), []
    for _ in range(max_tokens):
        out.append(next_token(context, vocab))
        context.append(out[-1])
    return out


def requests_of(spec: list[tuple[int, int]], temperature=lambda i: 0.0) -> list[dict]:
    return [{"id": f"r{i}", "prompt": [3 + (7 * i + j) % 1000 for j in range(length)],
             "max_tokens": tokens, "temperature": temperature(i), "seed": i}
            for i, (length, tokens) in enumerate(spec)]


def check_step_by_step(got: dict, export: dict = EXPORT) -> None:
    """Every graph call the model saw is what our records say, step by step: a step's decode
    (every slot over the export's sequence length) before its new prompts (each at batch 1,
    padded to max_context_length), as the runner runs them."""
    calls = iter(got["calls"])
    context = export.get("max_context_length", export["sequence_length"])
    for step in got["steps"]:
        assert step["num_preempted"] == 0
        if step["kind"] == "empty":
            continue
        if step["kind"] == "decode":
            call = next(calls)
            assert call["phase"] == "decode", (step, call)
            # (a decode before a new prompt in the same engine step: running holds it too)
            assert step["num_seqs"] == call["batch"] <= step["num_running"]
            assert step["num_running"] <= export["batch_size"]
            assert step["num_seqs_padded"] == call["padded_batch"] == export["batch_size"]
            assert step["attended_len"] == call["attended"] == export["sequence_length"]
        else:
            assert step["kind"] == "prefill", step
            prefills = [next(calls) for _ in step["req_ids"]]
            assert all(c["phase"] == "prefill" and c["batch"] == 1 for c in prefills), (
                step, prefills)
            assert step["num_tokens"] == sum(c["num_tokens"] for c in prefills)
            assert step["num_tokens_padded"] == sum(c["padded"] for c in prefills)
            assert all(c["padded"] == context for c in prefills)
    assert next(calls, None) is None, "graph calls no step record describes"


def check_tokens(got: dict, requests: list[dict]) -> None:
    for request in requests:
        assert got["outputs"][request["id"]] == expected_tokens(
            request["prompt"], request["max_tokens"], got["vocab"]), request["id"]


def test_data_path_a_job_several_times_the_batch_size(case, model_dir):
    # 14 requests through 4 compiled slots: slots are freed and taken again, prompts of
    # 2-255 tokens, all padded to the one context-encoding graph of 256.
    spec = [(2 + 37 * i % 254, 2 + i % 6) for i in range(14)]
    requests = requests_of(spec)
    got = case("run", model_dir, {**LIMITS, "tensor_parallel_size": 2}, requests=requests)
    assert got["exit_code"] == 0, got["output"]
    assert got["captured"]["loaded"] == [str(model_dir)] and not got["captured"]["exported"]
    assert got["run_config"]["runtime"] == "optimum-neuron"
    assert got["run_config"]["prefill_buckets"] == [256]
    assert got["run_config"]["enable_prefix_caching"] is False
    check_step_by_step(got)
    assert max(s["num_running"] for s in got["steps"]) == EXPORT["batch_size"]
    # Decode first, then the new prompt, in one engine step: a decode record followed by a
    # prefill record whose request was not among the decodes (scheduler/decode_first.py).
    pairs = list(zip(got["steps"], got["steps"][1:]))
    assert any(a["kind"] == "decode" and b["kind"] == "prefill"
               and a["num_running"] == b["num_running"] for a, b in pairs)
    check_tokens(got, requests)
    # The start-up says where the graphs came from, and how long it took.
    assert f"local export at {model_dir}" in got["output"], got["output"]
    assert "model loaded in" in got["output"] and got["startup"]["export"] == "local export"
    assert got["startup"]["compiled_before"] is True


def test_data_path_greedy_and_sampled_reach_their_own_requests(case, model_dir):
    """The runner turns temperature 0 into top-k 1 and sends each request's own [top_k,
    top_p, temperature] row: greedy requests give the model's top token every time, requests
    at a very high temperature almost never do. Rows sent to the wrong request break one side."""
    spec = [(40 + 13 * i, 12) for i in range(10)]
    requests = requests_of(spec, temperature=lambda i: 0.0 if i % 2 == 0 else 1000.0)
    got = case("run", model_dir, LIMITS, requests=requests)
    assert got["exit_code"] == 0, got["output"]
    check_step_by_step(got)
    for request in requests:
        expected = expected_tokens(request["prompt"], request["max_tokens"], got["vocab"])
        same = sum(a == b for a, b in zip(got["outputs"][request["id"]], expected))
        if request["temperature"] == 0.0:
            assert got["outputs"][request["id"]] == expected, request["id"]
        else:
            assert same <= 2, (request["id"], same)


# -- refused before anything loads ----------------------------------------------------------------
def test_settings_that_differ_from_the_export_are_refused_with_the_ones_that_would_run(
        case, model_dir):
    got = case("run", model_dir, {**LIMITS, "max_num_seqs": 8, "max_model_len": 1024},
               requests=requests_of([(20, 2)]))
    assert got["exit_code"] != 0 and not got["calls"], got["output"]
    assert "batch size 4" in got["output"] and "sequence length 512" in got["output"]
    assert ("--max-num-seqs 4 --max-model-len 512 --tensor-parallel-size 2"
            in got["output"]), got["output"]
    assert not got["captured"]["loaded"]            # refused before anything loaded


def test_a_prompt_longer_than_the_export_is_refused_naming_it(case, model_dir):
    got = case("run", model_dir, LIMITS, requests=requests_of([(100, 4), (300, 4)]))
    assert got["exit_code"] != 0 and not got["captured"]["loaded"], got["output"]
    assert "x.jsonl:2" in got["output"] and "300 prompt tokens" in got["output"], got["output"]
    assert "max context length 256" in got["output"]


def test_a_model_without_an_export_takes_the_hub_cache_or_compiles_fresh(case, tmp_path):
    from neuron_batch.scheduler.harness import TINY_LLAMA_CONFIG

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    requests = requests_of([(30, 3), (50, 2), (70, 4)])
    export = {"batch_size": 2, "sequence_length": 256}
    limits = {"max_num_seqs": 2, "max_model_len": 256, "prefix_caching": False}
    fresh = case("run", plain, limits, requests=requests)
    assert fresh["exit_code"] == 0, fresh["output"]
    assert fresh["captured"]["exported"] == [str(plain)]
    assert fresh["startup"]["export"] == "compiled fresh"
    assert fresh["startup"]["compiled_before"] is False
    # The hub cache holds (batch 2, sequence 256) at TP 1 and another shape: the loader's own
    # selection finds the first, and the start-up says so.
    entries = [{"batch_size": 2, "sequence_length": 256, "tp_degree": 1,
                "torch_dtype": "float32"},       # (the tiny model's: vLLM passes it on)
               {"batch_size": 4, "sequence_length": 256, "tp_degree": 1,
                "torch_dtype": "float32"}]
    hub = case("run", plain, limits, requests=requests, hub_entries=entries)
    assert hub["exit_code"] == 0, hub["output"]
    assert hub["startup"]["export"] == "hub cache" and hub["startup"]["compiled_before"]
    assert "hub cache artifacts" in hub["output"]
    for got in (fresh, hub):
        check_step_by_step(got, export)
        check_tokens(got, requests)
