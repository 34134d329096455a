"""Many texts' token ids at once, exactly as the tokenizer's own call gives them
(`tokenizer(texts, add_special_tokens=...).input_ids`), faster.

Why: a text job's check is its tokenizer's work (issue 48: a 10M-line text job cannot start
within seconds while every prompt is tokenized first). For a transformers fast tokenizer that
call is the Rust `encode_batch` plus, per text, a Python conversion of the whole encoding
(offsets, masks, type ids) the check never reads. The Rust `encode_batch_fast` (tokenizers
0.20 on) leaves the offsets out, and only the ids are kept. On the built-in model's tokenizer,
one thread, prompts of ~120 tokens: 100 us a prompt through the call, 82 us here; the check of
50,000 such lines 9.4 s against 6.6 s (scripts/bench_text_tokens.py).

How it stays exact: each batch first encodes its first text through the tokenizer's own
call, which also sets the Rust tokenizer as that call does (no truncation, no padding, its
handling of special tokens in the text); the rest go straight to Rust, and the first text's
ids from both ways must agree. Where they do not, or the tokenizer is not a fast one, every
batch after goes through the call itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class TextTokens:
    """`ids(texts, special)`: each text's token ids, `special` as `add_special_tokens`."""

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer
        rust = getattr(tokenizer, "_tokenizer", None) if getattr(tokenizer, "is_fast",
                                                                  False) else None
        self._fast = getattr(rust, "encode_batch_fast", None)

    @property
    def direct(self) -> bool:
        """Whether batches go straight to Rust (False: through the tokenizer's call)."""
        return self._fast is not None

    def ids(self, texts: Sequence[str], special: bool) -> list[list[int]]:
        texts = list(texts)
        if not texts:
            return []
        if self._fast is None:
            return [list(ids) for ids in
                    self._tokenizer(texts, add_special_tokens=special).input_ids]
        first = list(self._tokenizer([texts[0]], add_special_tokens=special).input_ids[0])
        encoded = self._fast(texts, add_special_tokens=special)
        if encoded[0].ids != first:         # (a tokenizer this reading does not fit)
            self._fast = None
            return self.ids(texts, special)
        return [encoding.ids for encoding in encoded]
