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

A batch of plain chats (messages without tools) is rendered by transformers' own
`render_jinja_template` (importable without torch: ~1 s), which `apply_chat_template` calls, with
the chat template and the named special tokens read from the model's files (`chat`). The parent
compares those two with its transformers tokenizer's (`get_chat_template`,
`special_tokens_map`): equal, every chat renders as that tokenizer renders it; else one pass.

Anything else a record asks of the tokenizer (tools, a template that refuses a batch) loads the
transformers tokenizer in the part, as before, and is done by it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

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
        self._chat: tuple[str, dict[str, str]] | None = None
        self.chat_used: tuple[str, dict[str, str]] | None = None    # (what rendered chats)

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
        if not hasattr(rust, "encode_batch_fast"):     # (tokenizers before 0.20)
            return None
        held = {token.content for token in rust.get_added_tokens_decoder().values()}
        if not _named_tokens(config) <= held:
            return None     # (transformers adds them: text that holds one splits otherwise)
        tokenizer = cls(rust, load)
        tokenizer._chat = _chat_of(Path(directory), config)
        return tokenizer

    def __call__(self, texts: str | Sequence[str], add_special_tokens: bool = True) -> _Encoded:
        """As the transformers call, for the ids: one text or a list of them."""
        one = isinstance(texts, str)
        batch: list[str] = [texts] if isinstance(texts, str) else list(texts)
        ids = [encoding.ids for encoding in
               self._tokenizer.encode_batch_fast(batch, add_special_tokens=add_special_tokens)]
        if batch and len(self.samples) < SAMPLES:   # (for the parent: `disagree`)
            self.samples.append((batch[0], add_special_tokens, ids[0]))
        return _Encoded(ids[0] if one else ids)

    @property
    def chat_template(self) -> Any:
        if self._chat is not None:
            return self._chat[0]
        return self.full().chat_template

    def apply_chat_template(self, conversation: Any, add_generation_prompt: bool = False,
                            tokenize: bool = True, **kwargs: Any) -> Any:
        """A batch of conversations rendered to text as transformers' own call renders them
        (its `render_jinja_template`, the model's template and named special tokens); any
        other call (one conversation, tokens asked, tools) made by the transformers
        tokenizer."""
        batch = (isinstance(conversation, list) and conversation
                 and all(isinstance(c, list) and c for c in conversation))
        render = _renderer() if self._chat is not None and batch else None
        if render is None or tokenize or kwargs:
            return self.full().apply_chat_template(
                conversation, add_generation_prompt=add_generation_prompt, tokenize=tokenize,
                **kwargs)
        assert self._chat is not None
        template, special = self._chat
        rendered, _ = render(conversations=conversation, tools=None, documents=None,
                             chat_template=template, return_assistant_tokens_mask=False,
                             continue_final_message=False,
                             add_generation_prompt=add_generation_prompt, **special)
        self.chat_used = self._chat
        return rendered

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


def _content(value: Any) -> str | None:
    """A token as tokenizer_config.json names it: a string, or {"content": ...}."""
    value = value.get("content") if isinstance(value, dict) else value
    return value if isinstance(value, str) else None


def _named_tokens(config: dict[str, Any]) -> set[str]:
    """The tokens tokenizer_config.json names, which transformers adds to the Rust tokenizer
    where tokenizer.json lacks them (a text that holds one is then one token, not split)."""
    named = [config.get(key) for key in _SPECIAL_KEYS]
    named += list(config.get("additional_special_tokens") or [])
    named += list((config.get("added_tokens_decoder") or {}).values())
    return {text for value in named if (text := _content(value))}


def _chat_of(directory: Path, config: dict[str, Any]) -> tuple[str, dict[str, str]] | None:
    """(the chat template, the named special tokens by attribute) as transformers reads them
    for `apply_chat_template`, from the model's files; None where it has no single template."""
    template: Any = None
    path = directory / "chat_template.jinja"
    if path.is_file():
        template = path.read_text(encoding="utf-8")
    elif isinstance(config.get("chat_template"), str):
        template = config["chat_template"]
    if not isinstance(template, str):
        return None
    special = {key: text for key in _SPECIAL_KEYS
               if (text := _content(config.get(key))) is not None}
    return template, special


def _renderer() -> Callable[..., Any] | None:
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:     # (another transformers: its tokenizer renders, as before)
        return None
    return cast(Callable[..., Any], render_jinja_template)


def chat_disagrees(tokenizer: Any, used: tuple[str, dict[str, str]]) -> bool:
    """Whether `tokenizer` (transformers) renders chats from another template or other
    named special tokens than `used` did."""
    try:
        template = tokenizer.get_chat_template()
    except Exception:
        return True
    return (template, dict(tokenizer.special_tokens_map)) != used


def disagree(tokenizer: Any, samples: Sequence[tuple[str, bool, list[int]]]) -> str | None:
    """The first sample whose ids `tokenizer`'s own call does not give (its text, shortened),
    None where every one agrees."""
    for text, special, ids in samples:
        if list(tokenizer([text], add_special_tokens=special).input_ids[0]) != ids:
            return text[:60]
    return None
