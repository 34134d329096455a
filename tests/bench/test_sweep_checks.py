"""A sweep fails as `run` fails: a layout that cannot load is refused (or left out) before any
configuration starts, by the check `run` makes; a sweep where nothing finished is an error; the
`neuron-batch run` lines it ends with read back as the command they print. Pure (no engine)."""

from __future__ import annotations

import shlex

import pytest

from neuron_batch.bench.command_line import shell_lines
from neuron_batch.bench.preflight import layout_check, loadable
from neuron_batch.bench.sweep import check_finished, command_block
from neuron_batch.errors import EXIT_FAILED, EXIT_USAGE, RunError
from neuron_batch.job.job import resolve_target
from neuron_batch.settings import RunSettings

# Llama-3.1-8B on inf2.8xlarge (TP 2) under nxdi: 6 static slots of 16,384 fit beside the weights.
INF2 = RunSettings.of(inputs=("trace.csv",), device="sim", max_model_len=16384,
                      instance="inf2.8xlarge", architecture="llama-3.1-8b")


def test_values_that_cannot_load_are_left_out_saying_what_fits():
    fits = loadable(INF2, [4, 8], ["request"], layout_check(INF2))
    assert fits.seqs_values == [4] and fits.kv_values == ["request"]
    [sentence] = fits.words()
    assert sentence.startswith("left out --max-num-seqs 8: it cannot load (--device sim: ")
    assert "What fits: --max-num-seqs 6 at this max_model_len" in sentence


def test_a_sweep_where_nothing_loads_is_refused_with_runs_message():
    with pytest.raises(RunError) as run_refusal:
        resolve_target(INF2.replace(max_num_seqs=8), None)
    with pytest.raises(RunError) as refused:
        loadable(INF2, [8], ["request"], layout_check(INF2))
    assert refused.value.exit_code == EXIT_USAGE
    assert str(refused.value) == str(run_refusal.value)
    with pytest.raises(RunError, match="no layout of this sweep can load; the first: "
                                       "--device sim: .* max_num_seqs 8 x") as several:
        loadable(INF2, [8, 16], ["request"], layout_check(INF2))
    assert several.value.exit_code == EXIT_USAGE


def test_layouts_that_load_are_kept_as_given():
    fits = loadable(INF2, [6, 2], ["request"], layout_check(INF2))
    assert fits.seqs_values == [6, 2] and fits.left_out == [] and fits.words() == []


def test_a_kv_rule_that_loads_nowhere_is_left_out():
    def check(settings):
        if settings.kv_reserve == "max_model_len":
            raise RunError("cache smaller than one max_model_len request")

    fits = loadable(INF2, [8, 16], ["request", "max_model_len"], check)
    assert fits.seqs_values == [8, 16] and fits.kv_values == ["request"]
    assert fits.words() == ["left out --kv-reserve max_model_len: it cannot load (cache "
                            "smaller than one max_model_len request)"]


def test_no_check_where_run_has_none_before_the_engine():
    assert layout_check(INF2.replace(device="cpu")) is None
    no_arch = INF2.replace(architecture=None)
    assert layout_check(no_arch) is None       # (needs the workload's model)


def test_a_sweep_where_nothing_finished_fails():
    failed = [{"name": "default", "status": "failed", "error": "boom\n  on two lines"},
              {"name": "P=o1,T=def", "status": "exit 3", "error": None, "report": {"x": 1}}]
    with pytest.raises(RunError) as error:
        check_finished(failed)
    assert error.value.exit_code == EXIT_FAILED
    assert str(error.value) == ("none of the 2 configurations finished; default: boom on two "
                                "lines")
    with pytest.raises(RunError, match="none of the 0 configurations"):
        check_finished([])
    check_finished(failed + [{"name": "P=o2,T=def", "status": "done", "report": {"x": 1}}])


COMMAND = ("neuron-batch run 'my prompts.csv' --device sim --max-model-len 16384 "
           "--max-num-batched-tokens 2048 --instance inf2.8xlarge --architecture llama-3.1-8b "
           "--max-num-seqs 6 --context-encoding-buckets 128,256,512,1024,2048,4096,8192,16384 "
           "--token-generation-buckets 2074,16384 --runtime nxdi --limit 200")


def test_shell_lines_fit_and_read_back_as_the_command():
    lines = shell_lines(COMMAND, 100, indent="  ")
    assert len(lines) > 1 and all(len(line) <= 100 for line in lines)
    assert all(line.endswith(" \\") for line in lines[:-1])
    for width in range(60, 101):               # an option stays with its value
        assert not any(line.removesuffix(" \\").split(" ")[-1].startswith("--")
                       for line in shell_lines(COMMAND, width)[:-1])
    assert shlex.split(" ".join(line.removesuffix("\\") for line in lines)) == \
        shlex.split(COMMAND)


def test_the_summary_ends_with_the_fastest_and_the_cheapest():
    entries = [{"name": "fast", "command": COMMAND + " --seed 1"},
               {"name": "cheap", "command": COMMAND + " --seed 2"}]
    lines = command_block(entries, {"fastest": "fast", "cheapest": "cheap"})
    text = "\n".join(lines)
    assert "To run the fastest, fast:" in text and "To run the cheapest, cheap:" in text
    assert text.index("--seed 1") < text.index("To run the cheapest") < text.index("--seed 2")
    same = "\n".join(command_block(entries, {"fastest": "fast", "cheapest": "fast"}))
    assert "To run the fastest, also the cheapest, fast:" in same and "cheap:" not in same
    assert "(as measured, on the sweep's --limit; drop it to run the whole input)" in lines
    unpriced = command_block(entries, {"fastest": "fast", "cheapest": None})
    assert unpriced[2].startswith("(no price for this instance, so no cheapest")
    assert unpriced[-1].startswith("    ")           # it ends with the command
    assert command_block([{"name": "old"}], {"fastest": "old"}) == []   # older sweep.json


def test_nxdi_decode_sets_are_token_generation_lists_ending_at_max_model_len(tmp_path):
    from click.testing import CliRunner

    from neuron_batch.cli import main

    args = ["bench", "trace.csv", "--device", "sim", "--instance", "inf2.8xlarge",
            "--architecture", "llama-3.1-8b", "--max-model-len", "8192", "--max-num-seqs", "8",
            "--sweep-buckets", "-o", str(tmp_path / "x"), "--decode-buckets-set"]
    refused = CliRunner().invoke(main, [*args, "2048,8"])
    assert refused.exit_code == 2
    assert "--decode-buckets-set 2048,8: the last bucket must be --max-model-len 8192" in \
        " ".join(refused.output.split())
