"""The request rows the check makes on its way (job/rows_spool.py) are the rows a pass of their
own makes (job/resume_check.py iter_request_rows), and what the job asks beyond its tokens
is what that pass learns: for every kind of line, a limit, defaults and sampling asked."""

from __future__ import annotations

import json

import pytest

from neuron_batch.job.facts import job_facts
from neuron_batch.job.resume_check import REQUEST_FIELDS, iter_request_rows
from neuron_batch.job.workload import load_workload
from neuron_batch.settings import RunSettings


def _lines():
    out = []
    for i in range(300):
        kind = i % 5
        if kind == 0:
            out.append({"prompt": f"request {i} says hello " * (1 + i % 4), "max_tokens": 3,
                        **({"stop": ["x"], "temperature": 0.7} if i % 10 == 0 else {})})
        elif kind == 1:
            out.append({"id": f"q{i}", "prompt_len": 10 + i % 90})
        elif kind == 2:
            out.append({"prompt_token_ids": [5 + i % 50, 7, 9], "max_tokens": 1 + i % 4,
                        "seed": i})
        elif kind == 3:
            out.append({"id": f"q{i}", "prompt_len": 20, "prefix_id": f"p{i % 3}",
                        "prefix_len": 8, "temperature": 1.0})
        else:
            out.append({"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 2,
                        "top_p": 0.5, "n": 1 + i % 2, "temperature": 0.8})
    text = [json.dumps(line) for line in out]
    text[7] = "{not json"                                   # a bad line: not a row
    return "\n".join(text) + "\n"


@pytest.mark.parametrize("values", [{}, {"limit": 120}, {"temperature": 0.3, "seed": 9},
                                    {"max_tokens": 5}])
def test_the_checks_rows_are_the_rows_pass_rows(tiny_model, tmp_path, values):
    path = tmp_path / "p.jsonl"
    path.write_text(_lines())
    settings = RunSettings.of((str(path),), model=tiny_model, device="sim", quiet=True,
                              on_error="skip", **values)
    workload = load_workload(settings, lambda _: None)
    spool = workload.rows_spool
    assert spool is not None
    made = list(iter_request_rows(workload.prepared.requests, settings))
    assert list(spool) == made == list(spool)       # (read twice: the same)
    assert len(made) == len(workload.prepared.requests) > 100
    assert workload.facts(settings) == job_facts(settings, workload.prepared.requests)
    copied = tmp_path / "requests.jsonl.gz"
    spool.copy_to(copied)
    import gzip
    with gzip.open(copied, "rt") as handle:
        assert json.loads(next(handle)) == {"fields": ["id", *REQUEST_FIELDS]}
        assert [json.loads(line) for line in handle] == made


def test_a_shuffled_job_and_other_commands_make_no_rows_on_the_way(tiny_model, tmp_path):
    """--shuffle numbers the job only after the check (a row's seed is its run index), and
    bench and plan write no run folder: their checks spool nothing."""
    path = tmp_path / "p.jsonl"
    path.write_text(_lines())
    settings = RunSettings.of((str(path),), model=tiny_model, device="sim", quiet=True,
                              on_error="skip", shuffle=True)
    assert load_workload(settings, lambda _: None).rows_spool is None
    clean = tmp_path / "trace.jsonl"
    clean.write_text("".join(json.dumps({"prompt_len": 10 + i}) + "\n" for i in range(20)))
    settings = settings.replace(inputs=(str(clean),), shuffle=False)
    assert load_workload(settings, lambda _: None, command="bench").rows_spool is None
    assert load_workload(settings, lambda _: None).rows_spool is not None


@pytest.mark.parametrize("values", [{}, {"limit": 50}, {"block_size": 16}])
def test_the_checks_prefix_bound_is_the_walks(tiny_model, tmp_path, values):
    """A job whose prompts the check tokenizes (text, messages, token ids): its prefix bound is
    counted as they are made, and is what walking the job's prompts counts; a job with a
    trace's synthetic prompts, or shuffled, leaves it to a pass of its own."""
    from neuron_batch.inputs.prefix_bound import prefix_bound
    from neuron_batch.inputs.prepare import PromptTokens

    path = tmp_path / "p.jsonl"
    lines = [{"prompt": "a system prompt every request shares " * 6 + f"then {i} " * (i % 7),
              "max_tokens": 2} for i in range(120)]
    lines += [{"prompt_token_ids": [5, 6, 7] * (10 + i % 20)} for i in range(30)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    settings = RunSettings.of((str(path),), model=tiny_model, device="sim", quiet=True,
                              **values)
    workload = load_workload(settings, lambda _: None)
    [(block, bound)] = workload.prefix_bounds.items()
    walked = prefix_bound([list(p) for p in PromptTokens(workload.prepared.requests)], block)
    assert bound.tokens() == walked.tokens() > 0
    assert block == values.get("block_size", block)
    synthetic = tmp_path / "t.jsonl"
    synthetic.write_text(json.dumps({"prompt_len": 40}) + "\n" + path.read_text())
    assert not load_workload(settings.replace(inputs=(str(synthetic),)),
                             lambda _: None).prefix_bounds
    assert not load_workload(settings.replace(shuffle=True), lambda _: None).prefix_bounds
