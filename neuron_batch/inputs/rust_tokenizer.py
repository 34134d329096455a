"""A part of a split check tokenizes plain text with the model's tokenizer.json in Rust alone,
without importing transformers (job/check_parts.py).

Why: loading a transformers tokenizer imports transformers and torch, ~5 s and ~450 MB of RSS
in each process of the check's pool (2,933 modules; measured on the built-in model), which
each paid before its first text part. The Rust `tokenizers` package, which transformers' fast
tokenizers run on, reads tokenizer.json in ~0.1 s.

How it stays exact: a transformers fast tokenizer may set its Rust tokenizer up beyond the file
(special tokens from tokenizer_config.json, a post-processor that adds a BOS), so the ids made
here are checked as the direct path of inputs/text_tokens.py checks them: each batch's first
text is kept (`samples`) and the check's parent, which loads the transformers tokenizer for the
run anyway, compares each with that tokenizer's own call (`disagree`). Where one differs, the
parts' lengths are not the run's and the job is checked again in one pass.

A tokenizer_config.json that names a token tokenizer.json does not hold (transformers adds it
to the Rust tokenizer: a text that holds it is one token there, pieces here) is not read this
way, as a sample would show the difference only where a sampled text holds that token.

Anything else a record asks of the tokenizer (a chat template, tools) loads the transformers
tokenizer in the part, as before, and is done by it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Samples a part keeps at most (each batch's first text: a 50,000-line part has ~100 batches):
#: the parent tokenizes each again, serially, once every part is in.
SAMPLES = 32


@dataclass
class _Encoded:
    input_ids: list


class RustTokenizer:
    """The transformers tokenizer's face for plain text (`is_fast`, its call, `_tokenizer`:
    what inputs/text_tokens.py and inputs/prepare.py use), from tokenizer.json; any other
    attribute asked loads the transformers tokenizer (`load`) and answers from it."""

    is_fast = True

    def __init__(self, rust: Any, load: Callable[[], Any]):
        rust.no_truncation()
        rust.no_padding()
        self._tokenizer = rust
        self._load = load
        self._full: Any = None
        self.samples: list[tuple[str, bool, list[int]]] = []

    @classmethod
    def of(cls, directory: str | Path, load: Callable[[], Any]) -> RustTokenizer | None:
        """The model directory's tokenizer.json in Rust; None where it has none or the
        `tokenizers` package cannot read it (the transformers tokenizer is loaded instead)."""
        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            return None
        try:
            from tokenizers import Tokenizer

            rust = Tokenizer.from_file(str(path))
            config = json.loads((Path(directory) / "tokenizer_config.json").read_text())
        except FileNotFoundError:
            config = {}
        except Exception:   # (a file this tokenizers release cannot read: the slow way)
            return None
        held = {token.content for token in rust.get_added_tokens_decoder().values()}
        if not _named_tokens(config) <= held:
            return None     # (transformers adds them: text that holds one splits otherwise)
        return cls(rust, load)

    def __call__(self, texts: str | Sequence[str], add_special_tokens: bool = True) -> _Encoded:
        """As the transformers call, for the ids: one text or a list of them."""
        one = isinstance(texts, str)
        batch: list[str] = [texts] if isinstance(texts, str) else list(texts)
        ids = [encoding.ids for encoding in
               self._tokenizer.encode_batch_fast(batch, add_special_tokens=add_special_tokens)]
        if batch and len(self.samples) < SAMPLES:   # (for the parent: `disagree`)
            self.samples.append((batch[0], add_special_tokens, ids[0]))
        return _Encoded(ids[0] if one else ids)

    def taken_samples(self) -> list[tuple[str, bool, list[int]]]:
        """The samples kept since the last call (a part's)."""
        samples, self.samples = self.samples, []
        return samples

    def full(self) -> Any:
        if self._full is None:
            self._full = self._load()
        return self._full

    def __getattr__(self, name: str) -> Any:
        # (only names this class lacks come here: a chat template, tools, decoding)
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.full(), name)


#: tokenizer_config.json's keys that name a special token (a string, or {"content": ...})
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token")


def _named_tokens(config: dict[str, Any]) -> set[str]:
    """The tokens tokenizer_config.json names, which transformers adds to the Rust tokenizer
    where tokenizer.json lacks them (a text that holds one is then one token, not split)."""
    def content(value: Any) -> str | None:
        value = value.get("content") if isinstance(value, dict) else value
        return value if isinstance(value, str) else None

    named = [config.get(key) for key in _SPECIAL_KEYS]
    named += list(config.get("additional_special_tokens") or [])
    named += list((config.get("added_tokens_decoder") or {}).values())
    return {text for value in named if (text := content(value))}


def disagree(tokenizer: Any, samples: Sequence[tuple[str, bool, list[int]]]) -> str | None:
    """The first sample whose ids `tokenizer`'s own call does not give (its text, shortened),
    None where every one agrees."""
    for text, special, ids in samples:
        if list(tokenizer([text], add_special_tokens=special).input_ids[0]) != ids:
            return text[:60]
    return None
