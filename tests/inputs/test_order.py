"""`run --order length`: requests submitted longest (prompt + max_tokens) first, every one
once; the scheduler still admits them first come, first served."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuron_batch.config import RunSettings, SettingsError
from neuron_batch.inputs.prepare import PreparedRequest, in_order
from neuron_batch.inputs.records import PromptRecord


def request(index: int, prompt: int, max_tokens: int) -> PreparedRequest:
    return PreparedRequest(PromptRecord(index, str(index), f"t:{index}"), [1] * prompt,
                           max_tokens)


@given(st.lists(st.tuples(st.integers(1, 50), st.integers(1, 50)), max_size=40))
def test_length_order_is_a_stable_longest_first_permutation(sizes):
    requests = [request(i, p, m) for i, (p, m) in enumerate(sizes)]
    ordered = in_order(requests, "length")
    assert sorted(r.record.index for r in ordered) == list(range(len(sizes)))
    assert all(a.length >= b.length for a, b in zip(ordered, ordered[1:]))
    # ties keep their input order
    assert all(a.record.index < b.record.index
               for a, b in zip(ordered, ordered[1:]) if a.length == b.length)
    assert in_order(requests, "input") == requests


def test_an_unknown_order_is_refused():
    with pytest.raises(SettingsError, match="--order must be one of input, length"):
        RunSettings(inputs=("x.jsonl",), order="shortest").validate()


def test_a_run_in_length_order_admits_the_longest_first(tmp_path: Path):
    pytest.importorskip("vllm")
    from click.testing import CliRunner

    from neuron_batch.cli import main

    sizes = [(100, 5), (400, 9), (50, 3), (400, 12), (250, 7)]
    data = tmp_path / "trace.csv"
    data.write_text("ContextTokens,GeneratedTokens\n" + "".join(f"{p},{m}\n" for p, m in sizes))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, [
        "run", str(data), "--device", "sim", "--instance", "inf2.xlarge", "--architecture",
        "llama-3.1-8b", "--max-model-len", "1024", "--max-num-seqs", "1", "--order", "length",
        "-q", "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    # one slot: requests finish in the order they were admitted
    finished = [json.loads(line)["index"] for line in (out / "outputs.jsonl").read_text()
                .splitlines()]
    assert finished == [3, 1, 4, 0, 2]
