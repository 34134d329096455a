"""Integration: structured outputs and logprobs through AWS's NxDI plugin (vllm-neuron 0.2.0 on
vLLM 0.11.0) by CPU sampling, on the CPU, against the plugin's own platform, loader, worker and
runner and vLLM's real structured-output manager (xgrammar), scheduler and sampler; NxDI faked
at its import boundary (tests/engine/nxdi_fakes.py: fp32 logits, peaked on a token that depends
on the whole context, over a context-seeded spread).

The engine decides from the requests' own SamplingParams (built here as the job's mapping
would) that the model samples on the CPU, and our runner (neuron_batch/engine/nxdi_runner.py)
applies vLLM's grammar bitmask to the host logits before the plugin's sampler: constrained
outputs parse and obey their schema, unconstrained rows in the same batch get exactly the
model's tokens, logprobs come back and are the fake's log-softmax. Without the decision the
engine refuses a constrained step instead of running it unconstrained. On vLLM 0.10.2
(vllm-neuron 0.1.0, no CPU sampler) the job is refused before anything loads.

The model is a character-level tokenizer (one token per printable ASCII character, so every
grammar can be spelled) with the tiny llama's config. Self-selecting like
tests/engine/test_nxdi_plugin.py, whose fixtures it uses.
"""

from __future__ import annotations

import json
import math
import string
import sys
from pathlib import Path

import pytest
import test_nxdi_plugin as plugin_suite
from test_nxdi_plugin import PLUGIN, expected_tokens, pytestmark  # noqa: F401 (the skips)

case, plugin_dir, model_dir = plugin_suite.case, plugin_suite.plugin_dir, plugin_suite.model_dir

SPECIALS = ["<pad>", "<s>", "</s>"]          # ids 0-2, as nxdi_fakes.FIRST_TOKEN expects
CHARS = list(string.printable[:95])          # digits, letters, punctuation, space
LIMITS = {"max_num_seqs": 4, "max_model_len": 512, "max_num_batched_tokens": 64,
          "prefix_caching": False}
SCHEMA = {"type": "object", "properties": {"name": {"enum": ["ada", "bob", "cy"]},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "ok"], "additionalProperties": False}
REGEX = "[a-z]{3}-[0-9]{2}"


@pytest.fixture(scope="module")
def char_model(tmp_path_factory) -> Path:
    """A model folder: the tiny llama's config.json with this vocabulary, and a fast
    tokenizer of one token per character (no weights: NxDI is faked)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from neuron_batch.scheduler.harness import TINY_LLAMA_CONFIG

    path = tmp_path_factory.mktemp("char-model")
    vocab = {token: i for i, token in enumerate(SPECIALS + CHARS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>",
        "bos_token": "<s>", "eos_token": "</s>", "model_max_length": 4096}))
    (path / "config.json").write_text(json.dumps(
        {**TINY_LLAMA_CONFIG, "vocab_size": len(vocab), "pad_token_id": 0, "bos_token_id": 1,
         "eos_token_id": 2}))
    return path


def prompt(i: int, length: int) -> list[int]:
    return [3 + (11 * i + 7 * j) % len(CHARS) for j in range(length)]


def requests_mixed() -> list[dict]:
    """Constrained, logprob and plain requests in one job, more than the 4 slots hold."""
    out = []
    for i in range(10):
        spec = {"id": f"r{i}", "prompt": prompt(i, 20 + 9 * i), "max_tokens": 48,
                "temperature": 0.0}
        kind = i % 5
        if kind == 0:
            spec["structured"] = {"json": SCHEMA}
        elif kind == 1:
            spec["structured"] = {"regex": REGEX}
        elif kind == 2:
            spec["structured"] = {"choice": ["yes", "no", "maybe"]}
            spec["logprobs"] = 3
        elif kind == 3:
            spec.update(logprobs=2, ignore_eos=True, max_tokens=8)
        else:
            spec.update(ignore_eos=True, max_tokens=8)
        out.append(spec)
    return out


def log_softmax_at(token: int, context_token: int, vocab: int) -> float:
    sys.path.insert(0, str(Path(__file__).parent))
    from nxdi_fakes import logits_for

    row = logits_for(context_token, vocab)
    return float(row[token] - row.logsumexp(0))


def test_constrained_outputs_parse_and_plain_rows_are_unchanged(case, char_model):
    if PLUGIN == "0.1.0":
        pytest.skip("vllm-neuron 0.1.0 has no CPU sampler: test_0_1_0_refuses_before_loading")
    requests = requests_mixed()
    got = case("sampling", LIMITS, requests=requests, model=str(char_model))
    assert "refused" not in got and "failed" not in got, got
    # The job asked for it: the whole model samples on the CPU.
    assert got["neuron_config"]["on_device_sampling_config"] is None
    outputs, vocab = got["outputs"], got["vocab"]
    assert set(outputs) == {r["id"] for r in requests}
    for request in requests:
        out = outputs[request["id"]]
        structured = request.get("structured")
        unconstrained = expected_tokens(request["prompt"], request["max_tokens"], vocab)
        if structured is None:
            # The model's own greedy tokens, bit for bit: the mask touched no other row.
            assert out["tokens"] == unconstrained, request["id"]
            continue
        assert out["finish_reason"] == "stop", (request["id"], out)
        text = out["text"]
        if "json" in structured:
            value = json.loads(text)
            assert set(value) == {"name", "ok"} and value["name"] in ("ada", "bob", "cy")
            assert isinstance(value["ok"], bool)
        elif "regex" in structured:
            import re

            assert re.fullmatch(REGEX, text), text
        else:
            assert text in ("yes", "no", "maybe"), text
        # The bitmask did the work: the model alone says something else.
        assert out["tokens"][:len(unconstrained)] != unconstrained[:len(out["tokens"])]


def test_logprobs_come_back_as_the_model_gave_them(case, char_model):
    if PLUGIN == "0.1.0":
        pytest.skip("vllm-neuron 0.1.0 has no CPU sampler: test_0_1_0_refuses_before_loading")
    requests = [r for r in requests_mixed() if r.get("logprobs")]
    got = case("sampling", LIMITS, requests=requests, model=str(char_model))
    assert "refused" not in got and "failed" not in got, got
    vocab = got["vocab"]
    for request in requests:
        out = got["outputs"][request["id"]]
        steps = out["logprobs"]
        assert steps is not None and len(steps) == len(out["tokens"]), request["id"]
        for token, step in zip(out["tokens"], steps):
            # The sampled token and the top `logprobs` (greedy: the sampled one is the best).
            assert str(token) in step and len(step) in (request["logprobs"],
                                                         request["logprobs"] + 1)
            assert max(step, key=step.get) == str(token)
            assert math.isfinite(step[str(token)]) and step[str(token)] <= 0.0
        if request.get("structured") is None:
            # Unconstrained: the fake's own log-softmax, at the token each context peaks on.
            for token, step in zip(out["tokens"], steps):
                assert step[str(token)] == pytest.approx(
                    log_softmax_at(token, token, vocab), abs=1e-4)


def test_without_the_decision_a_constrained_step_is_refused_not_run_unconstrained(
        case, char_model):
    requests = [r for r in requests_mixed() if r.get("structured")][:2]
    got = case("sampling", LIMITS, requests=requests, model=str(char_model), decide=False)
    assert got.get("refused") is None
    assert got["neuron_config"]["on_device_sampling_config"] is not None
    assert "failed" in got and "structured outputs" in got["failed"], got
    assert not got["outputs"]


def test_0_1_0_refuses_before_loading(case, char_model):
    if PLUGIN != "0.1.0":
        pytest.skip("vllm-neuron 0.2.0 samples on the CPU (the tests above)")
    requests = [r for r in requests_mixed() if r.get("structured") or r.get("logprobs")]
    got = case("sampling", LIMITS, requests=requests, model=str(char_model))
    assert "refused" in got, got
    assert "CPU sampler not implemented" in got["refused"] and "0.2.0" in got["refused"]
