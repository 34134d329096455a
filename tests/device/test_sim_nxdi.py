"""The simulated device under the nxdi runtime (NxDI, what inf2 and trn1 hosts run), through
vLLM's real engine: whole prompts padded to context-encoding buckets, decode over every slot
attending a token-generation bucket, a static KV cache that is refused when it cannot load and
never limits admission, and every step charged its compiled shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vllm import LLM, SamplingParams  # noqa: E402

from neuron_batch.device.cost_model import CapacityError  # noqa: E402
from neuron_batch.device.executor import engine_core, shutdown_llm, sim_executor  # noqa: E402
from neuron_batch.device.hardware import get_instance  # noqa: E402
from neuron_batch.device.target import sim_engine_kwargs  # noqa: E402
from neuron_batch.runtimes.buckets import nxdi_default_buckets  # noqa: E402
from neuron_batch.scheduler.records import DECODE, PREFILL  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MAX_MODEL_LEN = 4096
SEQS = 4
# (prompt_len, max_tokens): prompts longer than max_num_batched_tokens (512) included.
WORKLOAD = [(100, 12), (700, 30), (1500, 5), (128, 40), (129, 3), (3000, 9), (40, 20),
            (2048, 14), (513, 8), (90, 160)]


@pytest.fixture(scope="module")
def nxdi_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("nxdi")
    device = dict(instance=get_instance("inf2.8xlarge"), arch="llama-3-8b")   # nxdi by default
    kwargs = sim_engine_kwargs(**device, max_model_len=MAX_MODEL_LEN, max_num_seqs=SEQS,
                               max_num_batched_tokens=512, workdir=workdir)
    llm = LLM(**kwargs)
    try:
        prompts = [{"prompt_token_ids": [1000 + (i * 31 + j) % 20000 for j in range(p)]}
                   for i, (p, _) in enumerate(WORKLOAD)]
        outputs = llm.generate(prompts, [SamplingParams(max_tokens=m, ignore_eos=True,
                                                        detokenize=False)
                                         for _, m in WORKLOAD], use_tqdm=False)
        core = engine_core(llm)
        scheduler, executor = core.scheduler, sim_executor(llm)
        blocks = core.vllm_config.cache_config.num_gpu_blocks
    finally:
        shutdown_llm(llm)
    return outputs, scheduler.recorder, executor, blocks


def test_every_request_finishes_with_its_tokens(nxdi_run):
    outputs, recorder, _, _ = nxdi_run
    assert [len(o.outputs[0].token_ids) for o in outputs] == [m for _, m in WORKLOAD]
    assert recorder.config.runtime == "nxdi"


def test_the_static_cache_holds_every_slot_and_never_blocks_admission(nxdi_run):
    _, recorder, _, blocks = nxdi_run
    assert blocks == SEQS * (MAX_MODEL_LEN // 32) + 1          # slots + vLLM's null block
    assert recorder.config.max_kv_concurrent == SEQS
    assert recorder.blocked_counts["kv_saturated"] == 0
    assert max(s.num_running for s in recorder.steps) == SEQS


def test_prefills_are_whole_prompts_padded_to_context_encoding_buckets(nxdi_run):
    _, recorder, _, _ = nxdi_run
    ceb = nxdi_default_buckets(MAX_MODEL_LEN)
    prefills = [s for s in recorder.steps if s.kind == PREFILL]
    assert sorted(s.num_tokens for s in prefills) == sorted(p for p, _ in WORKLOAD)
    for step in prefills:
        assert step.num_seqs == 1 and step.context_tokens == 0
        assert step.num_tokens_padded == min(b for b in ceb if b >= step.num_tokens)


def test_decode_runs_every_slot_and_attends_a_token_generation_bucket(nxdi_run):
    _, recorder, executor, _ = nxdi_run
    tkb = nxdi_default_buckets(MAX_MODEL_LEN)
    decodes = [s for s in recorder.steps if s.kind == DECODE]
    assert decodes and all(s.num_seqs_padded == SEQS for s in decodes)
    assert any(s.num_seqs < SEQS for s in decodes)     # idle slots are padding
    for step in decodes:
        assert step.attended_len == min(b for b in tkb if b >= step.longest_len)
        # the longest request holds at least its share of the context, at most all of it
        assert step.longest_len - 1 <= step.context_tokens
        # the step is charged its compiled shape: every slot reads the attended length
        cost = executor.cost_model
        assert step.t_end - step.t_start == pytest.approx(
            cost.decode_time(SEQS, SEQS * step.attended_len), rel=1e-9)
        assert step.t_end - step.t_start > cost.decode_time(step.num_seqs, step.context_tokens)


def test_a_layout_that_cannot_load_is_refused_with_what_fits(tmp_path):
    with pytest.raises(CapacityError, match=r"--max-num-seqs 6 at this max_model_len"):
        sim_engine_kwargs(instance=get_instance("inf2.xlarge"), arch="llama-3.1-8b",
                          max_model_len=16384, max_num_seqs=32, max_num_batched_tokens=8192,
                          workdir=tmp_path)


def test_the_cli_refuses_it_before_anything_loads_and_reports_the_runtime(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("ContextTokens,GeneratedTokens\n" +
                     "".join(f"{200 + 37 * i},{8 + i % 5}\n" for i in range(12)))
    base = [sys.executable, "-m", "neuron_batch.cli", "run", str(trace), "--device", "sim",
            "--architecture", "llama-3.1-8b", "--instance", "inf2.xlarge"]
    refused = subprocess.run(base + ["--max-model-len", "16384", "--max-num-seqs", "32",
                                     "--output", str(tmp_path / "no")],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert refused.returncode == 2, refused.stderr
    assert "cannot load under nxdi" in refused.stderr and "64.0 GiB" in refused.stderr
    assert not (tmp_path / "no" / "outputs.jsonl").exists()
    # the same job at a layout that loads runs, and its report says what was compiled
    done = subprocess.run(base + ["--max-model-len", "2048", "--max-num-seqs", "6",
                                  "--output", str(tmp_path / "yes")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "runtime=nxdi" in done.stdout and "token-generation" in done.stdout
    report = json.loads((tmp_path / "yes" / "report.json").read_text())
    assert report["config"]["runtime"] == "nxdi"
    # the trace shares no prefix: auto leaves caching off, NxDI's contiguous slots and its
    # default context-encoding and token-generation lists (the grid: test_prefix_sim.py)
    assert report["prefix_caching"]["enable"] is False
    assert report["config"]["sim"]["kv_cache"]["layout"] == "static"
    attention = report["padding"]["attention"]
    assert attention["kv_attended_tokens"] >= attention["kv_held_tokens"] > 0
    assert report["padding"]["decode"]["by_bucket"].keys() == {"6"}
    assert report["config"]["compiled_graphs"] == 2 * len(nxdi_default_buckets(2048))



def test_the_first_night_compiles_and_the_next_loads_from_the_artifacts_folder(tmp_path):
    """--compiled-artifacts on the simulated device (issue 29): a run records its shapes there,
    the next run of the same configuration counts only the load; a host too small to compile
    the model is warned and gets no compile estimate unless --compiled."""
    from click.testing import CliRunner

    from neuron_batch.cli import main

    trace = tmp_path / "trace.csv"
    trace.write_text("ContextTokens,GeneratedTokens\n" +
                     "".join(f"{200 + 37 * i},{8 + i % 5}\n" for i in range(12)))
    base = ["run", str(trace), "--device", "sim", "--architecture", "tinyllama-1.1b",
            "--instance", "inf2.8xlarge", "--max-model-len", "2048", "--max-num-seqs", "4",
            "--compiled-artifacts", str(tmp_path / "artifacts")]

    def report(name, *extra):
        result = CliRunner().invoke(main, [*base, *extra, "--output", str(tmp_path / name)],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return json.loads((tmp_path / name / "report.json").read_text()), result.output

    first, _ = report("night1")
    second, _ = report("night2")
    one, two = first["config"]["sim"]["compile"], second["config"]["sim"]["compile"]
    assert not one["compiled"] and two["compiled"]
    assert first["attempts"][0]["startup"]["compiled_before"] is False
    assert second["attempts"][0]["startup"]["compiled_before"] is True
    assert two["estimated_compile_s"] == pytest.approx(one["startup"]["load_s"])
    assert one["estimated_compile_s"] > 10 * two["estimated_compile_s"]
    assert len(list((tmp_path / "artifacts").glob("sim-tinyllama-1.1b-*/shapes.json"))) == 1
    # other buckets are other graphs: compiled fresh
    third, _ = report("other", "--context-encoding-buckets", "512,2048")
    assert not third["config"]["sim"]["compile"]["compiled"]

    small = ["run", str(trace), "--device", "sim", "--architecture", "llama-3.1-8b",
             "--instance", "inf2.xlarge", "--max-model-len", "2048", "--max-num-seqs", "4"]
    result = CliRunner().invoke(main, [*small, "--output", str(tmp_path / "small")],
                                catch_exceptions=False)
    assert result.exit_code == 0 and "cannot compile Llama-3.1-8B" in result.output
    compile_ = json.loads((tmp_path / "small" / "report.json").read_text())["config"]["sim"][
        "compile"]
    assert compile_["estimated_compile_s"] is None and "issue 1222" in compile_["host_warning"]
    result = CliRunner().invoke(main, [*small, "--compiled", "--output", str(tmp_path / "c")],
                                catch_exceptions=False)
    assert result.exit_code == 0 and "cannot compile" not in result.output
