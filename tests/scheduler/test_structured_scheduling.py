"""Structured outputs through the Neuron scheduler (issue 38), on vLLM's real scheduler and
its real structured-output manager (xgrammar, the built-in model's tokenizer): every step's
grammar bitmask has a row for exactly the constrained requests it schedules, the first token
(the step that finishes a prompt) included, tokens sampled from those rows are what the
grammar accepts, and the hidden-scenario invariants hold with constrained requests in the mix.
Runs on every vLLM release the matrix tests (scheduler/compat.py: where the bitmask lives)."""

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("xgrammar")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_scheduler_properties import RULES, run_scenario, scenario  # noqa: E402

from neuron_batch.scheduler import NeuronAsyncScheduler, NeuronScheduler  # noqa: E402

#: (a choice, as vLLM's front end turns `choice` into a grammar before the scheduler sees it)
CHOICE = {"regex": "(yes|no)"}
REGEX = {"regex": "[ab]{3}"}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """The built-in model's folder (its tokenizer and vocabulary), prepared once into the
    cache; the test skips where it cannot be had."""
    from neuron_batch.engine import models

    try:
        path = Path(models.resolve_model(None).path)
    except Exception as error:
        # The version matrix's light environments lack the converter's package: the model
        # prepared by the main environment into the shared cache serves (its tokenizer only).
        path = models.default_cache_dir() / models.BUILTIN_DIRNAME
        if not models.has_tokenizer_files(path):
            pytest.skip(f"the built-in model's tokenizer is not available here: {error}")
    vocab_size = json.loads((path / "config.json").read_text())["vocab_size"]
    # Its tokenizer.json under the fast tokenizer's class name, which every transformers
    # release knows (the cache names transformers 5's class, which 4.x cannot load).
    folder = tmp_path_factory.mktemp("builtin-tokenizer")
    shutil.copy(path / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((path / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {**config, "tokenizer_class": "PreTrainedTokenizerFast"}))
    from transformers import AutoTokenizer

    return str(folder), vocab_size, AutoTokenizer.from_pretrained(str(folder))


@st.composite
def constrained_scenario(draw):
    sc = draw(scenario())
    forms = draw(st.lists(st.sampled_from([None, CHOICE, REGEX]), min_size=len(sc["prompts"]),
                          max_size=len(sc["prompts"])))
    return {**sc, "forms": forms}


def run(cls, sc, tokenizer_dir, kv_reserve, overlap=False):
    path, vocab_size, _ = tokenizer_dir
    return run_scenario(cls, sc, overlap, kv_reserve, tokenizer=path, vocab_size=vocab_size)


def check_constrained(sched, order, result, checks, tokenizer):
    constrained = {r.request_id for r in order if r.structured_output_request is not None}
    requests = {r.request_id: r for r in order}
    for output, rows in zip(result.outputs, result.grammar_ids):
        scheduled = output.num_scheduled_tokens
        before = {n.req_id: n.num_computed_tokens for n in output.scheduled_new_reqs}
        before.update(zip(output.scheduled_cached_reqs.req_ids,
                          output.scheduled_cached_reqs.num_computed_tokens))
        sampling = {r for r, n in scheduled.items()
                    if before[r] + n >= requests[r].num_prompt_tokens}
        # a row for every constrained request the step samples a token for (its prompt's last
        # chunk, whose token is the first output, included), and for none it does not run
        assert sampling & constrained <= rows <= set(scheduled) & constrained
    # every request ends, in FIFO admission order; an unconstrained one at its max_tokens
    assert set(result.finished) == {r.request_id for r in order}
    assert checks.first_scheduled == [r.request_id for r in order]
    assert not sched.waiting and not sched.running and not sched.holdback_queue
    for request in order:
        tokens = list(request.output_token_ids)
        if request.request_id not in constrained:
            assert len(tokens) == request.max_tokens
            continue
        assert len(tokens) <= request.max_tokens
        text = tokenizer.decode([t for t in tokens if t != tokenizer.eos_token_id])
        form = request.sampling_params
        choices = ("yes", "no") if _is_choice(form) else None
        if tokens and tokens[-1] == tokenizer.eos_token_id:   # the grammar ended it
            assert text in choices if choices else (len(text) == 3 and set(text) <= {"a", "b"})
        else:                                                 # max_tokens cut it short
            assert any(c.startswith(text) for c in choices) if choices else set(text) <= {
                "a", "b"}


def _is_choice(params) -> bool:
    constraint = (getattr(params, "structured_outputs", None)
                  or getattr(params, "guided_decoding", None))
    return constraint.regex == CHOICE["regex"]


SETTINGS = settings(max_examples=12, deadline=None)


@pytest.mark.parametrize("kv_reserve", RULES)
@SETTINGS
@given(sc=constrained_scenario())
def test_constrained_requests_in_the_mix(sc, kv_reserve, tokenizer_dir):
    sched, order, result, checks = run(NeuronScheduler, sc, tokenizer_dir, kv_reserve)
    check_constrained(sched, order, result, checks, tokenizer_dir[2])


@SETTINGS
@given(sc=constrained_scenario())
def test_constrained_requests_under_async_scheduling(sc, tokenizer_dir):
    sched, order, result, checks = run(NeuronAsyncScheduler, sc, tokenizer_dir, "request")
    check_constrained(sched, order, result, checks, tokenizer_dir[2])


def test_a_constrained_prompts_first_token_follows_its_grammar(tokenizer_dir):
    """One request alone: the step that finishes its prompt already carries its bitmask row,
    and the token sampled from it starts one of the choices."""
    _, _, tokenizer = tokenizer_dir
    sc = {"max_model_len": 512, "max_num_batched_tokens": 128, "max_num_seqs": 2,
          "num_blocks": 200, "neuron_config": {}, "prompts": [300], "outputs": [8],
          "arrival_steps": [0], "forms": [CHOICE]}
    sched, order, result, checks = run(NeuronScheduler, sc, tokenizer_dir, "request")
    (request,) = order
    done, last_chunk = 0, None
    for i, out in enumerate(result.outputs):
        done += out.num_scheduled_tokens.get(request.request_id, 0)
        if done == 300 and last_chunk is None:
            last_chunk = i
    assert done > 300 and len(result.outputs[0].num_scheduled_tokens) == 1
    assert request.request_id in result.grammar_ids[last_chunk]
    first = tokenizer.decode([request.output_token_ids[0]])
    assert "yes".startswith(first) or "no".startswith(first)
    check_constrained(sched, order, result, checks, tokenizer)
