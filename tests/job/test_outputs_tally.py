"""The sums over outputs.jsonl kept as it is written (job/outputs_tally.py): what batch.json
and the report take from them is what reading every line gives, after a save, after lines a
killed attempt wrote past it, and where the saved sums no longer describe the file."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.job import outputs_tally
from neuron_batch.job.folder import OUTPUTS, RunFolder
from neuron_batch.job.outputs_tally import OUTPUTS_TALLY, OutputsTally, load_tally


def _recount(path) -> OutputsTally:
    """Every whole line read, as the report did before the tally."""
    tally = OutputsTally()
    with open(path, "rb") as handle:
        for line in handle:
            if line.endswith(b"\n") and line.strip():
                tally.add(json.loads(line), len(line))
    return tally


_ROWS = st.one_of(
    st.builds(lambda i, p, c, text: {"id": str(i), "output": text, "num_prompt_tokens": p,
                                     "num_output_tokens": c},
              st.integers(0, 10**6), st.integers(0, 9000), st.integers(0, 600),
              st.sampled_from(["", " ", "hello", "done."])),
    st.builds(lambda i, p, c, cached, text: {
        "id": f"batch_req_{i}", "custom_id": f"c{i}", "response": {"status_code": 200, "body": {
            "choices": [{"message": {"content": text}}],
            "usage": {"prompt_tokens": p, "completion_tokens": c,
                      "prompt_tokens_details": {"cached_tokens": cached}}}}},
        st.integers(0, 10**6), st.integers(0, 9000), st.integers(0, 600), st.integers(0, 64),
        st.sampled_from(["", "ok", " \n"])))


def _sums(tally: OutputsTally):
    return (tally.completed, tally.prompt_tokens, tally.completion_tokens, tally.cached_tokens,
            tally.empty)


@settings(deadline=None, max_examples=40)
@given(st.lists(_ROWS, max_size=40), st.lists(_ROWS, max_size=10), st.integers(1, 7),
       st.booleans())
def test_the_tally_is_what_reading_every_line_gives(tmp_path_factory, written, after_kill,
                                                    every, torn):
    """Lines written through the folder (saved every `every` lines and at the close), then
    lines a killed attempt wrote past the last save and perhaps a torn line: the sums loaded
    are the sums of every whole line."""
    folder_path = tmp_path_factory.mktemp("run")
    saved_every = outputs_tally.SAVE_EVERY
    try:
        outputs_tally.SAVE_EVERY = every
        from neuron_batch.job import folder as folder_module
        folder_module.SAVE_EVERY = every
        folder = RunFolder(folder_path)
        folder.load_done()
        folder.open_outputs()
        for row in written:
            folder.append_output(row)
        folder.close_outputs()
    finally:
        outputs_tally.SAVE_EVERY = saved_every
        folder_module.SAVE_EVERY = saved_every
    path = folder_path / OUTPUTS
    with open(path, "ab") as handle:       # (a killed attempt: lines, no save)
        for row in after_kill:
            handle.write((json.dumps(row) + "\n").encode())
        if torn:
            handle.write(b'{"id": "x", "out')
    assert _sums(load_tally(folder_path)) == _sums(_recount(path))
    assert load_tally(folder_path).end == sum(
        len(line) for line in path.read_bytes().splitlines(keepends=True)
        if line.endswith(b"\n"))


def test_saved_sums_that_no_longer_describe_the_file_are_not_taken(tmp_path):
    """Outputs moved aside (--restart) or rewritten under the same size: the lines decide."""
    folder = RunFolder(tmp_path)
    folder.load_done()
    folder.open_outputs()
    for i in range(5):
        folder.append_output({"id": str(i), "output": "x", "num_prompt_tokens": 10,
                              "num_output_tokens": 2})
    folder.close_outputs()
    assert (tmp_path / OUTPUTS_TALLY).exists()
    assert load_tally(tmp_path).prompt_tokens == 50
    text = (tmp_path / OUTPUTS).read_text()
    (tmp_path / OUTPUTS).write_text(text.replace('"num_prompt_tokens": 10',
                                                 '"num_prompt_tokens": 20'))  # (same size)
    assert load_tally(tmp_path).prompt_tokens == 100
    (tmp_path / OUTPUTS).unlink()
    assert load_tally(tmp_path).completed == 0
    (tmp_path / OUTPUTS).write_text(text[:text.index("\n") + 1])
    assert load_tally(tmp_path).completed == 1     # (the saved end past the file's)


def test_a_report_and_a_resume_read_no_output_line_the_tally_holds(tiny_model, tmp_path,
                                                                   monkeypatch):
    """A finished run resumed (nothing left): batch.json's counts and the report's tokens come
    from the saved sums, no output line read again, and are what the lines give."""
    from click.testing import CliRunner

    from neuron_batch.cli import main

    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"say {i} " * (1 + i % 4), "max_tokens": 3})
                            + "\n" for i in range(30)))
    out = tmp_path / "run"
    argv = ["run", str(path), "--model", tiny_model, "--device", "sim", "-q", "-o", str(out)]
    assert CliRunner().invoke(main, argv).exit_code == 0
    first = json.loads((out / "report.json").read_text())["tokens"]
    added = []
    real_add = OutputsTally.add
    monkeypatch.setattr(OutputsTally, "add", lambda self, row, size: added.append(row)
                        or real_add(self, row, size))
    result = CliRunner().invoke(main, [*argv, "--resume"])
    assert result.exit_code == 0, result.output
    assert added == []
    recount = _recount(out / OUTPUTS)
    again = json.loads((out / "report.json").read_text())["tokens"]
    assert again == first == {"input": recount.prompt_tokens, "output": recount.completion_tokens,
                              "total": recount.prompt_tokens + recount.completion_tokens}
    batch = json.loads((out / "batch.json").read_text())
    assert batch["request_counts"]["completed"] == 30 == recount.completed
    assert batch["usage"]["input_tokens"] == recount.prompt_tokens
