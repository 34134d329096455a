"""The simulated device under the optimum-neuron runtime (issue 40), through vLLM's real engine
and the CLI: an export's two graphs, every prefill padded to its max_context_length at batch
1, every decode running every slot over the whole sequence length, each step charged that
shape; two graphs compiled (none with --compiled); what does not match refused before
anything runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from click.testing import CliRunner  # noqa: E402

from neuron_batch.cli import main  # noqa: E402
from neuron_batch.device.target import Target  # noqa: E402
from neuron_batch.runtimes.runtime import OPTIMUM_NEURON, get_runtime  # noqa: E402
from neuron_batch.scheduler.records import DECODE, PREFILL, read_records  # noqa: E402

SEQS, LENGTH, CONTEXT = 4, 2048, 1024
PROMPTS = [200 + 61 * i for i in range(12)]          # 200 .. 871 tokens, all below CONTEXT


def _trace(tmp_path: Path, prompts=PROMPTS) -> Path:
    trace = tmp_path / "trace.csv"
    trace.write_text("ContextTokens,GeneratedTokens\n" +
                     "".join(f"{p},{6 + i % 5}\n" for i, p in enumerate(prompts)))
    return trace


def _run(tmp_path: Path, name: str, *extra: str, prompts=PROMPTS):
    args = ["run", str(_trace(tmp_path, prompts)), "--device", "sim", "--architecture",
            "tinyllama-1.1b", "--instance", "inf2.8xlarge", "--runtime", "optimum-neuron",
            "--max-model-len", str(LENGTH), "--max-num-seqs", str(SEQS),
            "--output", str(tmp_path / name), *extra]
    return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.fixture(scope="module")
def export_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("optimum")
    # No prefix-caching flag: auto decides off under this runtime without weighing anything.
    result = _run(tmp_path, "run", "--max-context-length", str(CONTEXT))
    assert result.exit_code == 0, result.output
    folder = tmp_path / "run"
    report = json.loads((folder / "report.json").read_text())
    records = read_records(next(folder.glob("records-*.jsonl")))
    return report, records, result.output


def test_the_records_pad_what_the_exports_two_graphs_pad(export_run):
    report, records, _ = export_run
    assert report["config"]["runtime"] == OPTIMUM_NEURON
    decision = report["prefix_caching"]
    assert (decision["asked"], decision["enable"]) == ("auto", False)
    assert "platform turns prefix caching off" in decision["reason"]
    prefills = [s for s in records.steps if s.kind == PREFILL]
    decodes = [s for s in records.steps if s.kind == DECODE]
    assert sorted(s.num_tokens for s in prefills) == sorted(PROMPTS)
    # every prompt at batch 1, padded to max_context_length whatever its length
    assert {(s.num_seqs, s.num_tokens_padded) for s in prefills} == {(1, CONTEXT)}
    # every decode: all batch_size slots over the whole sequence length
    assert decodes and {(s.num_seqs_padded, s.attended_len) for s in decodes} == {
        (SEQS, LENGTH)}
    assert any(s.num_seqs < SEQS for s in decodes)
    assert report["padding"]["prefill"]["by_bucket"].keys() == {str(CONTEXT)}
    assert report["config"]["compiled_graphs"] == 2


def test_a_step_decodes_the_running_requests_first_then_prefills_the_new_prompt(export_run):
    """optimum-neuron's runner: token generation for the running requests, then context
    encoding for the new one, in one engine step; each graph call its own record, the
    prefill's starting where the decode's ends."""
    report, records, _ = export_run
    steps = records.steps
    pairs = [(a, b) for a, b in zip(steps, steps[1:])
             if a.kind == DECODE and b.kind == PREFILL and b.t_start == a.t_end]
    assert len(pairs) >= len(PROMPTS) - 2       # every prompt but the first few, beside decodes
    # (a records file keeps a prefill step's request ids, not a decode step's: issue 46)
    for decode, prefill in pairs:
        assert prefill.num_seqs == 1 and len(prefill.req_ids) == 1
        assert prefill.context_tokens == 0 and decode.req_ids == []
    # no decode waits for a prefill: between a request's first and last token every engine
    # step decodes it, so the decode records' sequences are the tokens after each first one
    assert sum(s.num_seqs for s in steps if s.kind == DECODE) == sum(
        r.num_output_tokens - 1 for r in records.requests)
    # the records' time adds up to the run's (no step counted twice)
    assert sum(s.t_end - s.t_start for s in steps) == pytest.approx(
        max(s.t_end for s in steps), rel=1e-6)


def test_each_step_is_charged_the_exports_shape(export_run):
    _, records, _ = export_run
    target = Target.resolve(max_model_len=LENGTH, max_num_seqs=SEQS, arch="tinyllama-1.1b",
                            runtime=get_runtime(OPTIMUM_NEURON))
    cost = target.cost_model
    for step in records.steps:
        took = step.t_end - step.t_start
        if step.kind == PREFILL:
            assert took == pytest.approx(cost.prefill_time(CONTEXT, 0), rel=1e-9)
        elif step.kind == DECODE:
            assert took == pytest.approx(cost.decode_time(SEQS, SEQS * LENGTH), rel=1e-9)


def test_two_graphs_compile_and_none_when_the_export_is_cached(export_run, tmp_path):
    report, _, _ = export_run
    fresh = report["config"]["sim"]["compile"]
    assert not fresh["compiled"] and fresh["estimated_compile_s"] > 0
    result = _run(tmp_path, "cached", "--no-prefix-caching", "--max-context-length",
                  str(CONTEXT), "--compiled")
    assert result.exit_code == 0, result.output
    cached = json.loads((tmp_path / "cached" / "report.json").read_text())["config"]["sim"][
        "compile"]
    assert cached["compiled"]
    assert cached["estimated_compile_s"] == pytest.approx(cached["startup"]["load_s"])
    assert fresh["estimated_compile_s"] > cached["estimated_compile_s"]


@pytest.mark.parametrize("extra, message", [
    (("--prefix-caching", "on", "--max-context-length", str(CONTEXT)),
     "runs without prefix caching.*--prefix-caching off"),
    (("--no-prefix-caching", "--context-encoding-buckets", "512,2048"),
     "--context-encoding-buckets belong.*use --max-context-length 2048"),
    (("--no-prefix-caching", "--max-context-length", "4096"),
     "--max-context-length takes one length from 1 to max_model_len"),
    (("--no-prefix-caching", "--max-context-length", "512"),
     "trace.csv:2: .*871 tokens, more than the context-encoding graph takes "
     "\\(--max-context-length 512\\): give --max-context-length 871"),
])
def test_what_does_not_match_the_export_is_refused_before_anything_runs(tmp_path, extra,
                                                                       message):
    result = _run(tmp_path, "no", *extra, prompts=[871, 300])
    assert result.exit_code != 0
    assert re.search(message, result.output, re.S), result.output
    assert not (tmp_path / "no" / "outputs.jsonl").exists()


def test_resume_refuses_another_export(tmp_path):
    first = _run(tmp_path, "run", "--no-prefix-caching", "--max-context-length", "1024",
                 prompts=[300, 200])
    assert first.exit_code == 0, first.output
    again = _run(tmp_path, "run", "--no-prefix-caching", "--max-context-length", "2048",
                 "--resume", prompts=[300, 200])
    assert again.exit_code != 0 and "--max-context-length" in again.output, again.output


def test_a_static_cache_that_cannot_load_names_this_runtime():
    from neuron_batch.device.cost_model import CapacityError
    from neuron_batch.device.hardware import get_instance

    with pytest.raises(CapacityError, match="cannot load under optimum-neuron.*"
                                            "--max-num-seqs 6 at this max_model_len"):
        Target.resolve(instance=get_instance("inf2.xlarge"), arch="llama-3.1-8b",
                       max_model_len=16384, max_num_seqs=32,
                       runtime=get_runtime(OPTIMUM_NEURON))
