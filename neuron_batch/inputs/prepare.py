"""Prompt records -> engine requests (token ids and sampling settings), checked against the
model's limits before any model loads.

Every request enters vLLM as token ids: text is tokenized here, chat messages are rendered with
the model's chat template here, and `prompt_len` records get synthetic token ids. Doing it once,
up front, lets bad prompts (empty, too long, unknown token ids) be reported with their file and
line before minutes of model loading, and makes the simulated device count the same tokens.
"""

from __future__ import annotations

import functools
import hashlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from neuron_batch.inputs.mooncake import MAX_HASH_ID, MOONCAKE_BLOCK
from neuron_batch.inputs.prefix_bound import PrefixBound
from neuron_batch.inputs.prompt_records import InputProblem, PromptRecord
from neuron_batch.inputs.shared_prefix import DEFAULT_BLOCK, prefix_order, prefix_order_alone
from neuron_batch.inputs.text_tokens import TextTokens
from neuron_batch.inputs.tool_calls import TOOLS, takes_tools, tools_of
from neuron_batch.runtimes.buckets import round_model_len

# Synthetic prompts draw from a fixed pseudo-random pool; each request starts at its own offset,
# so no two requests share a first KV block and prefix caching does not flatter the figures:
# only what a record names as shared (SyntheticTokens.for_record) is.
_POOL_SIZE = 1 << 16
_FIRST_ORDINARY_TOKEN = 100
# Named parts (SyntheticTokens._named): Mooncake block ids and prefix ids, apart from each other
# and from the laps of plain requests' offsets (SyntheticTokens.make).
_BLOCK_NAMESPACE, _PREFIX_NAMESPACE, _LAP_NAMESPACE = 0, 1, 2
_MAX_NAME = MAX_HASH_ID


@dataclass(slots=True)
class PreparedRequest:
    """One request as the engine gets it. A `prompt_len` record's synthetic tokens are not
    held (`token_ids` None) but made again from the record each time they are asked for
    (`synthetic`): a million-line trace keeps its lengths, not a list per prompt."""

    record: PromptRecord
    token_ids: list[int] | array | None    # array: a tokenized prompt, 4 bytes a token
    max_tokens: int
    max_tokens_clamped: bool = False
    synthetic: SyntheticTokens | None = field(default=None, repr=False, compare=False)
    prompt_len: int = -1        # len(prompt_token_ids), known without making them
    # A job read again a window at a time (job_requests.py): the window that tokenizes this
    # request's text with its neighbours' when the first of them is asked for.
    window: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.prompt_len < 0:
            # (no ids: a prompt_len record, whose length is its prompt_len)
            self.prompt_len = (len(self.token_ids) if self.token_ids is not None
                               else cast(int, self.record.prompt_len))

    @property
    def prompt_token_ids(self) -> list[int]:
        if self.window is not None:
            self.window.tokenize()
        if isinstance(self.token_ids, array):
            return self.token_ids.tolist()
        if self.token_ids is not None:
            return self.token_ids
        assert self.synthetic is not None       # (no ids: prepare_requests gave the maker)
        return self.synthetic.for_record(self.record)

    @property
    def own_prompt(self) -> bool:
        """A token count's prompt of its own tokens only (no Mooncake block ids, no named
        prefix): it shares a block with no other such prompt (SyntheticTokens.make)."""
        record = self.record
        return (self.token_ids is None and record.prompt_len is not None
                and record.hash_ids is None and record.prefix_id is None)

    @property
    def length(self) -> int:
        """What the request can reach: its prompt plus every token it may generate."""
        return self.prompt_len + self.max_tokens

    def recipe(self) -> tuple | None:
        """What makes a synthetic prompt's tokens, as plain data (`tokens_of_recipe` makes
        them again: a replica does, rather than receive them); None where they are held."""
        if self.synthetic is None:
            return None
        record = self.record
        assert self.synthetic is not None       # (no ids: prepare_requests gave the maker)
        return (self.synthetic.vocab_size, record.index, record.prompt_len, record.hash_ids,
                record.prefix_id, record.prefix_len)


def tokens_of_recipe(recipe: tuple) -> list[int]:
    """A synthetic prompt's token ids from its `PreparedRequest.recipe`."""
    vocab_size, index, prompt_len, hash_ids, prefix_id, prefix_len = recipe
    return synthetic_tokens(vocab_size).for_record(PromptRecord(
        index, "", "", prompt_len=prompt_len, hash_ids=hash_ids, prefix_id=prefix_id,
        prefix_len=prefix_len))


@functools.lru_cache(maxsize=4)
def synthetic_tokens(vocab_size: int) -> SyntheticTokens:
    """The one SyntheticTokens of a vocabulary size in this process (its pool takes ~30 ms)."""
    return SyntheticTokens(vocab_size)


class PromptTokens(Sequence[list[int]]):
    """Every request's prompt token ids, made as each is read: the job's synthetic prompts are
    not all held at once by a reader that walks them (the prefix bound, auto's decision)."""

    def __init__(self, requests: Sequence[PreparedRequest]):
        self._requests = requests

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self):
        # (in order, as the requests iterate: a streamed job's a window at a time)
        return (request.prompt_token_ids for request in self._requests)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return PromptTokens(self._requests[i])
        return self._requests[i].prompt_token_ids

    def lengths(self) -> Sequence[int]:
        """Every prompt's length, without making its tokens (a streamed job's from its arrays:
        nothing read again, no text tokenized)."""
        streamed = getattr(self._requests, "prompt_lengths", None)     # (a JobRequests)
        if streamed is not None:
            return streamed()
        return [r.prompt_len for r in self._requests]


    def share_nothing(self, block: int) -> bool:
        """True where no whole block of `block` tokens of one prompt can be another's: every
        prompt a token count's own synthetic tokens (`PreparedRequest.own_prompt`) and their
        pool's windows distinct (`SyntheticTokens.own_blocks_distinct`). Learnt without
        making a prompt (a streamed job's from its arrays): a 10M-line token-count trace's
        prefix bound is 0 without the walk that took minutes."""
        streamed = getattr(self._requests, "own_prompts", None)    # (a JobRequests)
        if streamed is not None:
            own = streamed()
        else:
            requests = self._requests
            own = None
            if all(r.own_prompt for r in requests):
                makers = {r.synthetic for r in requests}
                maker = makers.pop() if len(makers) == 1 else None
                if maker is not None:
                    own = (maker, max(r.record.index for r in requests))
        return own is not None and own[0].own_blocks_distinct(block, own[1])


def prompt_lengths(prompts: Sequence[Sequence[int]]) -> Sequence[int]:
    """The lengths of `prompts`: a `PromptTokens`' without making them."""
    if isinstance(prompts, PromptTokens):
        return prompts.lengths()
    return [len(p) for p in prompts]


def in_order(requests: Sequence[PreparedRequest], order: str, *,
             block_size: int = DEFAULT_BLOCK, by_length: bool = False,
             bounds: dict[int, Any] | None = None) -> Sequence[PreparedRequest]:
    """`requests` as `run --order` submits them: as read ("input"), longest first ("length":
    prompt + max_tokens, ties in input order), or grouped by the prefixes they share
    ("prefix": inputs/shared_prefix.py `prefix_order` over KV blocks of `block_size` tokens, its
    branches longest first when `by_length`). Under NxDI every decode step attends the bucket of
    the longest running request, so running requests of like lengths together cuts the
    attention padding; longest first also leaves short requests, not a long one, to drain at
    the end. Requests sharing a prefix run together while its blocks are still cached.
    `bounds`: where the prefix order keeps the prefix bound it counts on its way, by block
    (Workload.prefix_bounds: `requests` are the whole job), unless it holds one already."""
    streamed = hasattr(requests, "longest_first")   # a JobRequests: views, nothing read
    if order == "length":
        return (requests.longest_first() if streamed       # type: ignore[attr-defined]
                else sorted(requests, key=lambda r: -r.length))
    if order == "prefix":
        lengths = None
        if by_length:       # (a streamed job's from its arrays: nothing read again)
            lengths = (requests.request_lengths() if streamed  # type: ignore[attr-defined]
                       else [r.length for r in requests])
        tokens = PromptTokens(requests)
        if tokens.share_nothing(block_size):
            order_of = prefix_order_alone(tokens, tokens.lengths(), block_size, lengths)
        else:
            counts = bounds is not None and block_size not in bounds
            bound = PrefixBound(block_size) if counts else None
            order_of = prefix_order(tokens, block_size, lengths, bound)
            if bounds is not None and bound is not None:
                bounds[block_size] = bound
        return (requests.reordered(order_of) if streamed    # type: ignore[attr-defined]
                else [requests[i] for i in order_of])
    return requests if streamed else list(requests)


@dataclass
class Prepared:
    requests: Sequence[PreparedRequest]     # a list, or a streamed job (job_requests.py)
    problems: list[InputProblem]
    tokenizer_name: str | None
    #: The longest request (prompt + max_tokens) and the longest prompt of every record whose
    #: prompt became tokens, too-long ones included: what `max_model_len_fix` works from.
    longest_request: int = 0
    longest_prompt: int = 0


class SyntheticTokens:
    """Deterministic token ids for `prompt_len` prompts: distinct per request, except the parts
    a record shares by name (a Mooncake trace's block ids, a `prefix_id`), which are the same
    tokens wherever the same name appears."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        high = max(_FIRST_ORDINARY_TOKEN + 1, min(vocab_size, 32_000))
        span = high - _FIRST_ORDINARY_TOKEN
        state = 0x2545F491
        pool = []
        for _ in range(_POOL_SIZE):
            state = (state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
            pool.append(_FIRST_ORDINARY_TOKEN + (state >> 33) % span)
        self._pool = pool + pool  # doubled so any window up to _POOL_SIZE is one slice
        # A named part starts with its namespace and its id written in base `span`, so two
        # names never give the same tokens, whatever pool window follows them.
        self._base = max(span, 2)
        self._digits = 1
        while self._base ** self._digits <= _MAX_NAME:
            self._digits += 1
        self._distinct: dict[tuple[int, int], bool] = {}

    def make(self, index: int, length: int) -> list[int]:
        """Request `index`'s own tokens: a pool window at an offset of its own. The offsets
        repeat every _POOL_SIZE requests, so past the first lap a request's tokens start with
        its lap's number (as a named part's do): request i + 65,536 shares no block with i."""
        window = self._window((index * 7919) % _POOL_SIZE, length)
        lap = index // _POOL_SIZE
        if not lap:
            return window
        return (self._head(_LAP_NAMESPACE, lap) + window)[:length]

    def blocks(self, hash_ids: Sequence[int], length: int,
               block: int = MOONCAKE_BLOCK) -> list[int]:
        """A Mooncake prompt: the `block` tokens of each hash id in turn, cut to `length`
        (the last id covers the remainder, as a prefix of its block)."""
        out: list[int] = []
        for block_id in hash_ids:
            out.extend(self._named(_BLOCK_NAMESPACE, block_id, min(block, length - len(out))))
        return out

    def with_prefix(self, prefix_id: str, prefix_len: int, index: int,
                    length: int) -> list[int]:
        """The first `prefix_len` tokens of the prefix `prefix_id`, then request `index`'s own
        tokens up to `length`."""
        name = int.from_bytes(hashlib.blake2b(prefix_id.encode("utf-8", "surrogatepass"),
                                              digest_size=8).digest(), "little") >> 1
        return (self._named(_PREFIX_NAMESPACE, name, prefix_len)
                + self.make(index, length - prefix_len))

    def for_record(self, record: PromptRecord) -> list[int]:
        """The tokens of a `prompt_len` record, by what it shares."""
        assert record.prompt_len is not None    # (only prompt_len records have made tokens)
        if record.hash_ids is not None:
            return self.blocks(record.hash_ids, record.prompt_len)
        if record.prefix_id is not None:
            assert record.prefix_len is not None    # (set_prefix: never one without the other)
            return self.with_prefix(record.prefix_id, record.prefix_len, record.index,
                                    record.prompt_len)
        return self.make(record.index, record.prompt_len)

    def own_blocks_distinct(self, block: int, last_index: int) -> bool:
        """Whether the own tokens (`make`) of requests 0..`last_index` never begin with the same
        `block` tokens: then no whole KV block of one such prompt is ever another's, and a
        job of only such prompts shares nothing (its prefix bound is 0, exactly). Checked on
        the pool itself, not assumed: a lap's prompts are the pool's windows at distinct
        offsets (7919 is odd: a bijection modulo the pool's size) after the lap's head, so it
        takes (1) windows that never repeat and (2) no lap-0 window that spells a later lap's
        head. False, conservatively, where either fails or the block is too short to tell."""
        key = (block, last_index // _POOL_SIZE)
        if key not in self._distinct:
            self._distinct[key] = self._own_distinct(block, key[1] + 1)
        return self._distinct[key]

    def _own_distinct(self, block: int, laps: int) -> bool:
        head = 1 + self._digits
        if laps > 1 and block <= head:
            return False    # (a lap's prompts all begin with its head)
        width = min(block - head if laps > 1 else block, 8)     # (distinct at 8: at any more)
        if width < 1:
            return False
        pool = self._pool
        if len({tuple(pool[o:o + width]) for o in range(_POOL_SIZE)}) < _POOL_SIZE:
            return False
        lap_token = _FIRST_ORDINARY_TOKEN + _LAP_NAMESPACE
        for o in range(_POOL_SIZE if laps > 1 else 0):
            if pool[o] == lap_token:
                digits = [t - _FIRST_ORDINARY_TOKEN for t in pool[o + 1:o + head]]
                name = sum(d * self._base ** i for i, d in enumerate(digits))
                if 1 <= name < laps:
                    return False    # (a lap-0 prompt that begins with a later lap's head)
        return True

    def _head(self, namespace: int, name: int) -> list[int]:
        head = [_FIRST_ORDINARY_TOKEN + namespace]
        rest = name
        for _ in range(self._digits):
            rest, digit = divmod(rest, self._base)
            head.append(_FIRST_ORDINARY_TOKEN + digit)
        return head

    def _named(self, namespace: int, name: int, length: int) -> list[int]:
        offset = ((name * 0x9E3779B97F4A7C15 + namespace) >> 16) % _POOL_SIZE
        head = self._head(namespace, name)
        if length <= len(head):
            return head[:length]
        return head + self._window(offset, length - len(head))

    def _window(self, start: int, length: int) -> list[int]:
        out: list[int] = []
        while length > 0:
            take = min(length, _POOL_SIZE)
            out.extend(self._pool[start:start + take])
            length -= take
        return out


def prepare_requests(records: Sequence[PromptRecord], *, tokenizer: Any, tokenizer_name: str | None,
                     vocab_size: int, max_model_len: int, default_max_tokens: int,
                     clamp_max_tokens: bool = True,
                     longest_prompt_graph: tuple[int, str] | None = None) -> Prepared:
    """Turn records into requests; records that cannot run become problems naming their line.

    A prompt needs at least one free position for output: prompts of max_model_len tokens or
    more are problems. max_tokens past the end of the context is clamped (vLLM would stop the
    request there anyway) and counted. `longest_prompt_graph`: (the longest prompt a graph
    takes, the option that sets it), where it is below max_model_len (optimum-neuron's
    max_context_length): a longer prompt is a problem naming the value that would take it.
    """
    synthetic: SyntheticTokens | None = None
    requests: list[PreparedRequest] = []
    problems: list[InputProblem] = []
    longest_request = longest_prompt = 0
    texts = _TextBatches(records, tokenizer)
    for record in records:
        field = _prompt_field(record)
        try:
            ids = texts.ids(record)
            if ids is None:
                ids = _token_ids(record, tokenizer, tokenizer_name)
        except _NeedsTokenizer as error:
            field = error.field if error.exact else record.prompt_field or error.field
            problems.append(InputProblem(record.source, field, str(error), record.read_order,
                                         code="unsupported_field" if error.exact else None))
            continue
        lazy = ids is None          # prompt_len: its tokens are made when asked for
        if ids is None:
            synthetic = synthetic or synthetic_tokens(vocab_size)
            assert record.prompt_len is not None    # (_token_ids: no ids only for prompt_len)
            count = record.prompt_len
        else:
            count = len(ids)
        if not count:
            problems.append(InputProblem(record.source, field, "the prompt is empty after "
                                         "tokenization", record.read_order))
            continue
        max_tokens = record.max_tokens or (max(max_model_len - count, 1)   # up to the context
                                           if record.openai is not None else default_max_tokens)
        longest_prompt = max(longest_prompt, count)
        longest_request = max(longest_request, count + max_tokens)
        if count >= max_model_len:
            # The fix (one --max-model-len for them all) is said once, after the list.
            problems.append(InputProblem(
                record.source, field, f"the prompt has {count:,} tokens, more than fit in "
                f"max_model_len = {max_model_len:,} with room for output", record.read_order,
                too_long=True))
            continue
        if longest_prompt_graph is not None and count > longest_prompt_graph[0]:
            graph, flag = longest_prompt_graph
            problems.append(InputProblem(
                record.source, field, f"the prompt has {count:,} tokens, more than the "
                f"context-encoding graph takes ({flag} {graph}): give {flag} {count} or "
                f"more, up to --max-model-len {max_model_len}", record.read_order))
            continue
        if record.prompt_token_ids is not None and ids is not None:   # (given ids: not lazy)
            bad = next((t for t in ids if t >= vocab_size), None)
            if bad is not None:
                problems.append(InputProblem(record.source, field,
                                             f"token id {bad} is outside the model's vocabulary "
                                             f"of {vocab_size:,}", record.read_order))
                continue
        room = max_model_len - count
        clamped = clamp_max_tokens and max_tokens > room
        held: list[int] | array | None = ids
        if record.prompt_token_ids is None and ids is not None:     # (not lazy)
            held = array("I", ids)  # (what a tokenizer made, kept compact; given ids are shared)
        requests.append(PreparedRequest(record, None if lazy else held,
                                        room if clamped else max_tokens, clamped,
                                        synthetic if lazy else None, count))
    return Prepared(requests, problems, tokenizer_name, longest_request, longest_prompt)


def max_model_len_fix(problems: Sequence[InputProblem], prepared: Prepared, *,
                      context: int | None, context_name: str = "the model",
                      layout: Callable[[int], str | None] | None = None) -> str | None:
    """The one --max-model-len that fixes every too-long prompt among `problems`, in words
    (None when none is too long): the tightest that holds every request's prompt + max_tokens,
    rounded as `plan` rounds its own candidate, capped at the model's `context` (max_tokens
    past it are clamped); or why no value can, when a prompt alone is longer than the context.
    Under a static KV cache `layout` gives, for a max_model_len, the other flags its slots
    need to fit beside the weights ("" none, None: no layout holds one), so that the hint names
    a whole combination the next run loads (device/static_kv.py layout_that_fits)."""
    too_long = [p for p in problems if p.too_long]
    if not too_long:
        return None
    fitting = round_model_len(prepared.longest_request)
    if context is not None and fitting > context:
        if prepared.longest_prompt >= context:
            return (f"no --max-model-len fits every prompt: the longest has "
                    f"{prepared.longest_prompt:,} tokens and {context_name}'s context is "
                    f"{context:,}")
        fitting = context
    what = ("fits every request (prompt + max_tokens)" if fitting >= prepared.longest_request
            else f"fits every prompt ({context_name}'s context; longer max_tokens are cut "
                 f"short)")
    flags = f"--max-model-len {fitting}"
    extra = layout(fitting) if layout is not None else ""
    if extra is None:
        return (f"no --max-model-len fits every request: at {flags}, which holds them, no "
                f"static KV slot of {fitting:,} tokens fits beside the weights on any layout")
    if extra:
        flags += f" {extra}"
        what += " with its static KV cache beside the weights"
    if len(too_long) < len(problems):
        what += f"; it fixes the {len(too_long)} prompt(s) too long, not the other problems"
    return f"{flags} {what}"


#: Text prompts tokenized at once: a fast tokenizer encodes a batch on every core (Rust threads).
TEXT_BATCH = 512


class _TextBatches:
    """The token ids of `records`' plain text prompts and chats (messages without tools),
    encoded TEXT_BATCH at a time as the records are walked in order (a fast tokenizer's batch
    encoding runs on all cores; one prompt at a time runs on one, and a chat at a time paid
    the tokenizer's own overhead for each: ~200 us a line of an OpenAI chat batch file), each
    batch dropped once passed. `ids` answers None for a record it does not tokenize (token
    ids, prompt_len, a chat with tools or whose batch the template refused; or no fast
    tokenizer): `_token_ids` does those one by one."""

    def __init__(self, records: Sequence[PromptRecord], tokenizer: Any):
        self._records = records
        # (asked only where a chat is: a part's Rust tokenizer loads transformers to answer,
        # inputs/rust_tokenizer.py)
        self._chats = (any(_plain_chat(r) for r in records)
                       and bool(getattr(tokenizer, "chat_template", None)))
        self._on = bool(getattr(tokenizer, "is_fast", False)) and any(
            self._batched(r) for r in records)
        self._tokenizer = tokenizer
        self._tokens = TextTokens(tokenizer) if self._on else None
        self._next = 0                  # the first record not batched yet
        self._batch: dict[int, list[int]] = {}     # id(record) -> its ids

    def _batched(self, record: PromptRecord) -> bool:
        return _plain_text(record) or (self._chats and _plain_chat(record))

    def ids(self, record: PromptRecord) -> list[int] | None:
        if not self._on or not self._batched(record):
            return None
        got = self._batch.pop(id(record), None)
        while got is None and self._next < len(self._records):
            self._encode_next()
            got = self._batch.pop(id(record), None)
        return got

    def _encode_next(self) -> None:
        chunk = self._records[self._next:self._next + TEXT_BATCH]
        self._next += TEXT_BATCH
        assert self._tokens is not None     # (`ids` batches nothing while off)
        texts = [r for r in chunk if _plain_text(r)]
        if texts:
            encoded = self._tokens.ids([cast(str, r.prompt) for r in texts], special=True)
            self._batch.update((id(r), ids) for r, ids in zip(texts, encoded))
        chats = [r for r in chunk if self._chats and _plain_chat(r)]
        if chats:
            # (as `_token_ids` renders one, and as the template's own tokenize=True does:
            # each conversation rendered alone, then the texts tokenized without special
            # tokens, at once)
            try:
                rendered = self._tokenizer.apply_chat_template(
                    [r.messages for r in chats], add_generation_prompt=True, tokenize=False)
            except Exception:   # (a template that refuses one: each is tried on its own)
                return
            encoded = self._tokens.ids(rendered, special=False)
            self._batch.update((id(r), ids) for r, ids in zip(chats, encoded))


def batch_token_ids(records: Sequence[PromptRecord], tokenizer: Any,
                    tokenizer_name: str | None) -> list[list[int]]:
    """The token ids of text and messages records, plain texts encoded in one batch."""
    texts = _TextBatches(records, tokenizer)
    out = []
    for record in records:
        ids = texts.ids(record)
        out.append(ids if ids is not None else _token_ids(record, tokenizer, tokenizer_name)
                   or [])
    return out


def _plain_text(record: PromptRecord) -> bool:
    return (record.prompt is not None and record.messages is None
            and record.prompt_token_ids is None and record.prompt_len is None)


def _plain_chat(record: PromptRecord) -> bool:
    return record.messages is not None and tools_of(record) is None


class _NeedsTokenizer(Exception):
    def __init__(self, field: str, message: str, exact: bool = False):
        super().__init__(message)
        self.field = field
        self.exact = exact      # the field is the one to name (not the prompt's)


def _prompt_field(record: PromptRecord) -> str:
    """The field or column the prompt came from, as the input names it (a trace's
    `num_prefill_tokens`, not `prompt_len`)."""
    if record.prompt_field is not None:
        return record.prompt_field
    for name in ("prompt", "messages", "prompt_token_ids", "prompt_len"):
        if getattr(record, name) is not None:
            return name
    return "prompt"


def _token_ids(record: PromptRecord, tokenizer: Any,
               tokenizer_name: str | None) -> list[int] | None:
    if record.prompt_token_ids is not None:
        return record.prompt_token_ids
    if record.prompt_len is not None:
        return None
    if tokenizer is None:
        field = "messages" if record.messages is not None else "prompt"
        raise _NeedsTokenizer(field, "text prompts need a tokenizer and this model has none; "
                                     "give prompt_token_ids or prompt_len, or a model with one")
    if record.messages is not None:
        template = getattr(tokenizer, "chat_template", None)
        if not template:
            raise _NeedsTokenizer("messages", f"the tokenizer of {tokenizer_name} has no chat "
                                              f"template; give a text prompt instead")
        tools = tools_of(record)
        if tools is not None and not takes_tools(template):
            where = (record.sampling_fields or {}).get(TOOLS, "body.tools")
            raise _NeedsTokenizer(where, f"the chat template of {tokenizer_name} takes no "
                                         f"tools, so the model would never see them; give a "
                                         f"model whose template does, or pass --ignore-field "
                                         f"{where} to run the line without tools", exact=True)
        rendered = tokenizer.apply_chat_template(
            record.messages, add_generation_prompt=True, tokenize=True,
            **({"tools": tools["tools"]} if tools is not None else {}))
        if isinstance(rendered, dict) or hasattr(rendered, "input_ids"):
            rendered = rendered["input_ids"]
        return list(rendered)
    return list(tokenizer(record.prompt).input_ids)
