"""Texts' token ids straight from Rust (inputs/text_tokens.py) are the tokenizer's own call's,
for any text, with special tokens or without, on the built-in model's tokenizer and on one whose
tokenizer.json asks for truncation and padding (which the call turns off)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuron_batch.inputs.text_tokens import TextTokens

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "[UNK]", "\n\n",
            "  ", "\t", "é", "✓", "日本語", "🙂", "user", "hello world"]
texts = st.lists(st.lists(st.one_of(st.text(max_size=30), st.sampled_from(SPECIALS)),
                          max_size=6).map("".join), min_size=1, max_size=12)


@pytest.fixture(scope="module")
def builtin_tokenizer():
    from neuron_batch.engine.models import ModelError, load_tokenizer, resolve_model

    try:
        return load_tokenizer(resolve_model(None))
    except ModelError as error:
        pytest.skip(f"no built-in model here: {error}")


@pytest.fixture(scope="module")
def truncating_tokenizer(tmp_path_factory):
    """A word-level tokenizer whose tokenizer.json truncates to 3 tokens and pads to 8: the
    tokenizer's call turns both off, and so must the direct path."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "[PAD]", "<s>", "</s>", *"the sky is blue hello world user".split()]
    rust = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    rust.pre_tokenizer = pre_tokenizers.Whitespace()
    rust.post_processor = processors.TemplateProcessing(single="<s> $A </s>",
                                                        special_tokens=[("<s>", 2), ("</s>", 3)])
    rust.enable_truncation(3)
    rust.enable_padding(length=8, pad_id=1, pad_token="[PAD]")
    path = tmp_path_factory.mktemp("trunc")
    rust.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]",
        "pad_token": "[PAD]", "bos_token": "<s>", "eos_token": "</s>"}))
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    assert tokenizer._tokenizer.truncation is not None      # (as saved)
    return tokenizer


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=texts, special=st.booleans())
def test_the_ids_are_the_tokenizers_own(builtin_tokenizer, truncating_tokenizer, batch,
                                        special):
    for tokenizer in (builtin_tokenizer, truncating_tokenizer):
        tokens = TextTokens(tokenizer)
        assert tokens.direct
        got = tokens.ids(batch, special)
        assert tokens.direct        # (the first text agreed: no fallback)
        want = [list(ids) for ids in tokenizer(batch, add_special_tokens=special).input_ids]
        assert got == want


def test_a_tokenizer_the_reading_does_not_fit_goes_through_its_call(builtin_tokenizer):
    """Where the first text's ids differ (here a tokenizer whose call adds a token the Rust
    tokenizer does not), every batch from then on goes through the call."""

    class Odd:
        is_fast = True
        _tokenizer = builtin_tokenizer._tokenizer

        def __call__(self, texts, add_special_tokens=True):
            class Out:
                input_ids = [[7, *builtin_tokenizer(t).input_ids] for t in texts]
            return Out()

    tokens = TextTokens(Odd())
    assert tokens.ids(["hello", "world"], True)[1][0] == 7
    assert not tokens.direct
