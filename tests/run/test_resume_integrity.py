"""`--resume` checks what it resumes (issue 33): a folder's run is continued only when every
request (prompt, max_tokens, sampling, stop) and every setting that shapes outputs or figures is
unchanged. A change is refused with exit 2 before anything runs or is written, naming what
changed; `--restart` moves the old run aside and starts anew, deleting nothing.

On the simulated device: one real run makes a finished folder, each test resumes a copy of it.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("vllm")

from neuron_batch.cli import main  # noqa: E402
from neuron_batch.job.folder import RunFolder  # noqa: E402
from neuron_batch.job.resume_check import checked_settings, compare  # noqa: E402
from neuron_batch.settings import RunSettings  # noqa: E402

SIM = ["--device", "sim", "--instance", "inf2.8xlarge", "--architecture", "llama-3.1-8b",
       "--max-model-len", "2048"]
NIGHT_1 = [{"id": "a", "prompt": "Hello there", "max_tokens": 4},
           {"id": "b", "prompt": "How are you?", "max_tokens": 4}]
TRACE_1 = "ContextTokens,GeneratedTokens\n100,5\n200,6\n300,7\n"


def invoke(args):
    return CliRunner().invoke(main, ["run", *args], catch_exceptions=False)


def write_jsonl(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file of a run folder (not the lock, not vLLM's scratch), by name."""
    return {p.name: p.read_bytes() for p in folder.iterdir()
            if p.is_file() and not p.name.startswith(".")}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """Night 1 run to the end: (the input file, the folder), for tests to copy."""
    base = tmp_path_factory.mktemp("night-1")
    data = write_jsonl(base / "prompts.jsonl", NIGHT_1)
    trace = base / "trace.csv"
    trace.write_text(TRACE_1)
    out = base / "out"
    result = invoke([data, *SIM, "--output", str(out), "--resume", "-q"])
    assert result.exit_code == 0, result.output
    traced = invoke([str(trace), *SIM, "--output", str(base / "traced"), "-q"])
    assert traced.exit_code == 0, traced.output
    return base


@pytest.fixture
def night(finished, tmp_path):
    """A copy of night 1's folders and inputs, for one test to resume."""
    for name in ("out", "traced"):
        shutil.copytree(finished / name, tmp_path / name)
    shutil.copy(finished / "prompts.jsonl", tmp_path / "prompts.jsonl")
    shutil.copy(finished / "trace.csv", tmp_path / "trace.csv")
    return tmp_path


def refused(result, folder: Path, before: dict[str, bytes]) -> str:
    """A refusal as the issue asks: exit 2, the folder's files untouched; returns the message."""
    assert result.exit_code == 2, result.output
    assert "holds a run of other input" in result.output, result.output
    assert snapshot(folder) == before
    assert not any(p.name.startswith("previous-") for p in folder.iterdir())
    return result.output


def test_an_unchanged_job_resumes_as_before(night):
    out = night / "out"
    before = snapshot(out)
    again = invoke([str(night / "prompts.jsonl"), *SIM, "--output", str(out), "--resume"])
    assert again.exit_code == 0, again.output
    assert "all 2 requests already done" in again.output
    assert snapshot(out)["outputs.jsonl"] == before["outputs.jsonl"]
    assert snapshot(out)["requests.jsonl.gz"] == before["requests.jsonl.gz"]


def test_a_stopped_unchanged_job_finishes_only_what_is_left(night):
    out = night / "out"
    outputs = out / "outputs.jsonl"
    first = outputs.read_text().splitlines()[0]
    outputs.write_text(first + "\n")            # as if stopped after one request
    again = invoke([str(night / "prompts.jsonl"), *SIM, "--output", str(out), "--resume", "-q"])
    assert again.exit_code == 0, again.output
    assert again.output == ""
    rows = [json.loads(line) for line in outputs.read_text().splitlines()]
    assert outputs.read_text().startswith(first + "\n")
    assert sorted(row["id"] for row in rows) == ["a", "b"]


def test_changed_prompts_with_the_same_ids_are_refused_naming_them(night):
    """The issue's reproduction: other prompts and max_tokens under the same ids."""
    out = night / "out"
    before = snapshot(out)
    data = write_jsonl(night / "prompts.jsonl",
                       [{"id": "a", "prompt": "Goodbye", "max_tokens": 8},
                        {"id": "b", "prompt": "Who are you?", "max_tokens": 4}])
    message = refused(invoke([data, *SIM, "--output", str(out), "--resume", "-q"]), out, before)
    assert "2 of 2 requests changed (a: prompt, max_tokens 4 -> 8; b: prompt)" in message
    assert "--restart" in message and "settings changed" not in message


def test_a_changed_max_tokens_alone_is_refused(night):
    out = night / "out"
    before = snapshot(out)
    data = write_jsonl(night / "prompts.jsonl",
                       [NIGHT_1[0], {**NIGHT_1[1], "max_tokens": 6}])
    message = refused(invoke([data, *SIM, "--output", str(out), "--resume"]), out, before)
    assert "1 of 2 requests changed (b: max_tokens 4 -> 6)" in message


@pytest.mark.parametrize("asked", [
    {"n": 2, "temperature": 0.5}, {"top_p": 0.9}, {"top_k": 5}, {"min_p": 0.1},
    {"presence_penalty": 0.5}, {"frequency_penalty": 0.5}, {"repetition_penalty": 1.2},
    {"logit_bias": {"5": 1}}, {"logprobs": 2}, {"stop_token_ids": [7]}, {"min_tokens": 2},
    {"ignore_eos": True}, {"response_format": {"type": "json_object"}},
    {"structured_outputs": {"regex": "[a-z]+"}}])
def test_every_request_field_is_part_of_the_requests_digest(night, asked):
    """(issue 38) a request that now asks for more than before is other work: refused."""
    out = night / "out"
    before = snapshot(out)
    data = write_jsonl(night / "prompts.jsonl", [NIGHT_1[0], {**NIGHT_1[1], **asked}])
    message = refused(invoke([data, *SIM, "--output", str(out), "--resume"]), out, before)
    assert "1 of 2 requests changed (b: " in message and "sampling" in message


def test_a_folder_written_before_the_sampling_digest_still_resumes(night):
    """Its digests in requests.json (one JSON document, before 2026-12-05), each row without
    the last column."""
    out = night / "out"
    with gzip.open(out / "requests.jsonl.gz", "rt") as handle:
        fields, *table = [json.loads(line) for line in handle]
    for row in table:
        assert row[-1] is None      # (nothing asked: no sampling digest)
        del row[-1]
    (out / "requests.json").write_text(json.dumps({**fields, "requests": table}))
    (out / "requests.jsonl.gz").unlink()
    again = invoke([str(night / "prompts.jsonl"), *SIM, "--output", str(out), "--resume"])
    assert again.exit_code == 0, again.output


def test_sampling_and_stop_strings_count_as_content(night):
    out = night / "out"
    before = snapshot(out)
    data = write_jsonl(night / "prompts.jsonl",
                       [{**NIGHT_1[0], "stop": ["\n"]}, {**NIGHT_1[1], "temperature": 0.5}])
    message = refused(invoke([data, *SIM, "--output", str(out), "--resume"]), out, before)
    assert "2 of 2 requests changed (a: stop; b: temperature 0.0 -> 0.5)" in message


def test_a_changed_csv_of_the_same_length_is_refused(night):
    """A trace's ids are its row numbers: the same number of rows is the same ids."""
    out = night / "traced"
    before = snapshot(out)
    (night / "trace.csv").write_text("ContextTokens,GeneratedTokens\n100,5\n250,6\n300,9\n")
    message = refused(invoke([str(night / "trace.csv"), *SIM, "--output", str(out), "--resume"]),
                      out, before)
    assert "2 of 3 requests changed (1: prompt; 2: max_tokens 7 -> 9)" in message


@pytest.mark.parametrize("change, named", [
    (["--max-model-len", "4096"], "--max-model-len 2048 -> 4096"),
    (["--order", "length"], "--order input -> length"),
    (["--instance", "inf2.48xlarge"], "--instance inf2.8xlarge -> inf2.48xlarge"),
    (["--context-encoding-buckets", "512,2048"], "--context-encoding-buckets default -> 512,2048"),
    (["--max-num-seqs", "4"], "--max-num-seqs 8 -> 4"),
], ids=["max-model-len", "order", "instance", "buckets", "max-num-seqs"])
def test_changed_settings_are_refused_naming_them(night, change, named):
    out = night / "out"
    before = snapshot(out)
    args = [str(night / "prompts.jsonl"), *SIM, *change, "--output", str(out), "--resume", "-q"]
    message = refused(invoke(args), out, before)
    assert f"settings changed: {named}" in message
    assert "requests changed" not in message


def test_a_changed_limit_is_refused_and_said_to_be_the_reason(night):
    out = night / "out"
    before = snapshot(out)
    args = [str(night / "prompts.jsonl"), *SIM, "--limit", "1", "--output", str(out), "--resume"]
    message = refused(invoke(args), out, before)
    assert "1 request left out (b), as --limit default -> 1 chose" in message


def test_without_resume_a_changed_run_is_named_not_sent_to_resume(night):
    out = night / "out"
    before = snapshot(out)
    data = write_jsonl(night / "prompts.jsonl", [NIGHT_1[0], {**NIGHT_1[1], "prompt": "Hm?"}])
    message = refused(invoke([data, *SIM, "--output", str(out)]), out, before)
    assert "1 of 2 requests changed (b: prompt)" in message


def test_restart_moves_the_old_run_aside_and_runs_the_new_input(night):
    out = night / "out"
    before = snapshot(out)
    data = write_jsonl(night / "prompts.jsonl",
                       [{"id": "a", "prompt": "Goodbye", "max_tokens": 3}, NIGHT_1[1]])
    result = invoke([data, *SIM, "--output", str(out), "--resume", "--restart"])
    assert result.exit_code == 0, result.output
    assert "--restart: the previous run is now in" in result.output
    assert "(1 of 2 requests changed (a: prompt, max_tokens 4 -> 3))" in result.output
    [aside] = [p for p in out.iterdir() if p.name.startswith("previous-")]
    assert snapshot(aside) == before                    # nothing lost
    rows = {r["id"]: r for r in map(json.loads, (out / "outputs.jsonl").read_text().splitlines())}
    assert rows["a"]["prompt"] == "Goodbye" and rows["a"]["num_output_tokens"] == 3
    assert json.loads((out / "report.json").read_text())["requests"]["completed"] == 2


def test_restart_with_resume_leaves_an_unchanged_run_to_resume(night):
    out = night / "out"
    result = invoke([str(night / "prompts.jsonl"), *SIM, "--output", str(out), "--resume",
                     "--restart", "-q"])
    assert result.exit_code == 0 and result.output == ""
    assert not any(p.name.startswith("previous-") for p in out.iterdir())


def test_a_folder_from_before_request_digests_resumes_with_one_warning(night):
    """run.json written by an older version: no request digests, no checked_settings. Its ids
    are still checked (a changed one refused); otherwise it resumes, saying once what it could
    not check, and never claims the digests of content it did not see."""
    out = night / "out"
    (out / "requests.jsonl.gz").unlink()
    manifest = json.loads((out / "run.json").read_text())
    del manifest["checked_settings"]
    (out / "run.json").write_text(json.dumps(manifest))
    again = invoke([str(night / "prompts.jsonl"), *SIM, "--output", str(out), "--resume"])
    assert again.exit_code == 0, again.output
    assert again.output.count("was written by an older neuron-batch") == 1
    assert "all 2 requests already done" in again.output
    assert not (out / "requests.jsonl.gz").exists()
    before = snapshot(out)
    other = write_jsonl(night / "other.jsonl", [NIGHT_1[0], {**NIGHT_1[1], "id": "c"}])
    message = refused(invoke([other, *SIM, "--output", str(out), "--resume"]), out, before)
    assert "other request ids or order" in message
    settings = invoke([str(night / "prompts.jsonl"), *SIM, "--max-model-len", "4096",
                       "--output", str(out), "--resume"])
    assert "settings changed: --max-model-len 2048 -> 4096" in refused(settings, out, before)


def test_how_a_run_is_spread_watched_or_priced_is_not_a_change(night):
    """What may differ on a resume: fewer --replicas after a lost node (README), another
    price, --quiet, --max-runtime; and what may not, to show the check is on."""
    out = night / "out"
    folder = RunFolder(out)
    manifest = folder.read_manifest()
    stored = list(folder.iter_requests() or ())
    sim = dict(instance="inf2.8xlarge", architecture="llama-3.1-8b")
    # (prefix caching as the folder decided it: a resumed auto run takes that decision before
    # the check, run/prefix_auto.py)
    base = dict(inputs=(str(night / "prompts.jsonl"),), device="sim", max_model_len=2048,
                **sim, output=str(out),
                prefix_caching=manifest["settings"]["prefix_caching"])
    same = RunSettings.of(**base, replicas=3, ray="local", quiet=True, max_runtime=60.0,
                       resume=True, restart=True, metrics_textfile="m.prom",
                       split_placement="in-turn", compiled_artifacts="/tmp/graphs")
    runtime = manifest["checked_settings"]["runtime"]
    def rows():
        return ([*row] for row in stored)

    assert not compare(folder, manifest, rows, same, runtime)[0]
    other = RunSettings.of(**base, ignore_eos=True)
    changes, checked = compare(folder, manifest, rows, other, runtime)
    assert checked and changes.settings == ["--ignore-eos off -> on"]
    assert checked_settings(other.to_dict(), runtime)["sim.instance"] == "inf2.8xlarge"
