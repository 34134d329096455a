"""`run --order length`: requests submitted longest (prompt + max_tokens) first, every one
once; the scheduler still admits them first come, first served. `--order prefix`: requests that
share a prefix of whole KV blocks together (inputs/shared_prefix.py), and the bound on what a prefix
cache can serve."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.inputs.prefix_bound import PrefixBound
from neuron_batch.inputs.prepare import PreparedRequest, PromptTokens, in_order
from neuron_batch.inputs.prompt_records import PromptRecord
from neuron_batch.inputs.shared_prefix import (
    prefix_order,
    prefix_order_alone,
    shared_prefix_tokens,
)
from neuron_batch.settings import RunSettings, SettingsError


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
    with pytest.raises(SettingsError, match="--order must be one of input, length, prefix,"):
        RunSettings.of(inputs=("x.jsonl",), order="shortest").validate()


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


# ---------------------------------------------------------------------------------------------
# --order prefix (inputs/shared_prefix.py)

def blocks_in_common(a: list[int], b: list[int], block: int) -> int:
    """Leading blocks two prompts share, a last partial block counting only when the same."""
    n = 0
    while n * block < min(len(a), len(b)):
        if a[n * block:(n + 1) * block] != b[n * block:(n + 1) * block]:
            break
        n += 1
    return n


prompt_lists = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=9), max_size=14)


@settings(deadline=None)    # (a shared machine's load, not the code, sets the time)
@given(prompt_lists, st.integers(1, 3), st.booleans(), st.data())
def test_prefix_order_keeps_every_shared_prefix_together(prompts, block, by_length, data):
    lengths = ([data.draw(st.integers(1, 30)) for _ in prompts] if by_length else None)
    order = prefix_order(prompts, block, lengths)
    assert sorted(order) == list(range(len(prompts)))            # nothing lost or repeated
    assert order == prefix_order([list(p) for p in prompts], block, lengths)  # deterministic
    # The prompts holding any block-prefix are adjacent: for i < j < k in the order, i and k
    # share no more than j shares with either (a depth-first walk of the block trie).
    seq = [prompts[i] for i in order]
    for i in range(len(seq)):
        for k in range(i + 2, len(seq)):
            outer = blocks_in_common(seq[i], seq[k], block)
            assert all(outer <= min(blocks_in_common(seq[i], seq[j], block),
                                    blocks_in_common(seq[j], seq[k], block))
                       for j in range(i + 1, k))
    # identical prompts are next to each other
    positions: dict[tuple, list[int]] = {}
    for position, prompt in enumerate(seq):
        positions.setdefault(tuple(prompt), []).append(position)
    assert all(p[-1] - p[0] == len(p) - 1 for p in positions.values())


@given(st.lists(st.integers(1, 50), max_size=20), st.booleans())
def test_prefix_order_without_sharing_is_the_input_or_the_length_order(sizes, by_length):
    requests = [PreparedRequest(PromptRecord(i, str(i), f"t:{i}"), [1000 + i] * 40, m)
                for i, m in enumerate(sizes)]
    got = in_order(requests, "prefix", block_size=32, by_length=by_length)
    assert got == in_order(requests, "length" if by_length else "input")


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 70), st.integers(1, 9)), max_size=40),
       st.sampled_from([1, 4, 16]), st.booleans())
def test_prefix_order_alone_is_the_tries_walk_where_no_first_block_is_shared(sizes, block,
                                                                           by_length):
    """Prompts that begin with blocks of their own (a token-count trace's own synthetic
    prompts), short ones (no whole block) among them, identical short ones and empty ones too:
    the order from lengths (and the short prompts' tokens) is the trie's walk, with and
    without ranking by length."""
    prompts = [[1000 + i] * p if p >= block else [5] * p for i, (p, _) in enumerate(sizes)]
    lengths = [p + m for p, m in sizes] if by_length else None
    alone = prefix_order_alone(prompts, [p for p, _ in sizes], block, lengths)
    assert list(alone) == prefix_order(prompts, block, lengths)


def test_a_streamed_trace_in_prefix_order_builds_no_trie(tmp_path, monkeypatch):
    """`--order prefix` over a token-count trace: its prompts share nothing (known from its
    arrays), so its order comes from the lengths, no prompt made, no trie built."""
    from neuron_batch.inputs import prepare
    from neuron_batch.job.workload import load_workload

    path = tmp_path / "trace.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n"
                    + "".join(f"{5 + i * 37 % 300},{1 + i % 7}\n" for i in range(400)))
    settings_ = RunSettings.of((str(path),), device="sim", quiet=True)
    requests = load_workload(settings_, lambda _: None).prepared.requests
    expected = prefix_order(list(prepare.PromptTokens(requests)), 16,
                            [r.length for r in requests])

    def no_trie(*args, **kwargs):
        raise AssertionError("the trie was built")

    monkeypatch.setattr(prepare, "prefix_order", no_trie)
    ordered = in_order(requests, "prefix", block_size=16, by_length=True)
    assert [r.record.index for r in ordered] == expected


def test_prefix_order_groups_a_shared_instruction_and_ranks_groups_by_their_longest():
    a, b = [7] * 64, [8] * 64        # two instructions of two 32-token blocks
    prompts = [a + [1], b + [2], a + [3], [9] * 40, b + [4], a + [5]]
    assert prefix_order(prompts, 32) == [0, 2, 5, 1, 4, 3]
    lengths = [10, 50, 10, 20, 10, 10]   # b's group holds the longest request: it goes first
    assert prefix_order(prompts, 32, lengths) == [1, 4, 3, 0, 2, 5]


def test_the_prefix_order_is_a_choice_of_run():
    assert "prefix" in RunSettings.of(inputs=("x.jsonl",), order="prefix").validate().order


def best_order_hits(prompts: list[list[int]], block: int) -> int:
    """The most prompt tokens an unbounded cache serves, over every order: each prompt is
    served its leading whole blocks an earlier prompt held, never its last token."""
    best = 0
    for order in itertools.permutations(range(len(prompts))):
        cached: set[tuple] = set()
        hits = 0
        for i in order:
            ids = prompts[i]
            served = 0
            while (served + 1) * block <= len(ids) - 1 and tuple(ids[:(served + 1) * block]) \
                    in cached:
                served += 1
            hits += served * block
            cached.update(tuple(ids[:n * block]) for n in range(1, len(ids) // block + 1))
        best = max(best, hits)
    return best


@settings(deadline=None)
@given(st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=8), max_size=5),
       st.integers(1, 3))
def test_the_bound_is_what_an_unbounded_cache_serves_in_the_best_order(prompts, block):
    assert shared_prefix_tokens(prompts, block) == best_order_hits(prompts, block)


def test_the_bound_on_hand_made_prompts():
    a = list(range(64))                                   # two blocks of 32
    assert shared_prefix_tokens([a + [1], a + [2], a + [3]], 32) == 2 * 64
    # a prompt of exactly two blocks is served one (its last token is always computed) ...
    assert shared_prefix_tokens([a, a], 32) == 32
    # ... unless it runs first, and a longer one reuses both blocks
    assert shared_prefix_tokens([a + [1], a], 32) == 64
    assert shared_prefix_tokens([[1] * 40, [2] * 40], 32) == 0     # nothing shared
    assert shared_prefix_tokens([a[:40], a[:50]], 32) == 32        # one whole block
    assert shared_prefix_tokens([], 32) == 0


@pytest.mark.parametrize("refused", [False, True])
def test_text_tokenized_in_batches_is_what_one_prompt_at_a_time_gives(tmp_path, monkeypatch,
                                                                      refused):
    """Plain text prompts and chats are encoded a batch at a time (a fast tokenizer's batch
    encoding runs on all cores) and kept as 4-byte ids; each request gets exactly the ids it
    would alone (a chat: its template rendered, then tokenized without special tokens), token
    counts among them keep theirs. A batch of chats the template refuses is rendered chat by
    chat, as before."""
    from neuron_batch.engine.models import ModelError, load_tokenizer, resolve_model
    from neuron_batch.inputs import prepare as prepare_module
    from neuron_batch.inputs.load import load_prompts
    from neuron_batch.inputs.prepare import prepare_requests

    try:
        info = resolve_model(None)
    except ModelError as error:
        pytest.skip(f"no built-in model here: {error}")
    tokenizer = load_tokenizer(info)
    rows = []
    for i in range(14):
        if i % 4 == 1:
            rows.append({"messages": [{"role": "user", "content": f"hello {i}"}]})
        elif i % 4 == 3:
            rows.append({"messages": [{"role": "system", "content": f"be brief {i}"},
                                      {"role": "user", "content": "hi " * i},
                                      {"role": "assistant", "content": "yes"},
                                      {"role": "user", "content": "and?"}]})
        elif i % 4 == 2:
            rows.append({"prompt_len": 5 + i})
        else:
            rows.append({"prompt": f"prompt number {i} " + "word " * i})
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = load_prompts([path], default_max_tokens=4).records
    monkeypatch.setattr(prepare_module, "TEXT_BATCH", 3)
    calls = []
    render = type(tokenizer).apply_chat_template

    def counted(self, conversation, *args, **kwargs):
        batched = bool(conversation) and isinstance(conversation[0], list)
        calls.append(batched)
        if refused and batched:
            raise ValueError("no batches here")
        return render(self, conversation, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "apply_chat_template", counted)
    prepared = prepare_requests(records, tokenizer=tokenizer, tokenizer_name=info.name,
                                vocab_size=len(tokenizer), max_model_len=512,
                                default_max_tokens=4)
    assert len(prepared.requests) == 14
    monkeypatch.setattr(type(tokenizer), "apply_chat_template", render)
    for row, request in zip(rows, prepared.requests):
        ids = request.prompt_token_ids
        assert isinstance(ids, list) and request.prompt_len == len(ids)
        if "prompt" in row:
            assert ids == tokenizer(row["prompt"]).input_ids
        elif "messages" in row:
            one = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True,
                                                tokenize=True)
            assert ids == list(one["input_ids"] if hasattr(one, "keys") else one)
        else:
            assert len(ids) == row["prompt_len"] and request.token_ids is None
    # (the chats went in batches: 7 chats, batches of 3 records; one by one where refused)
    assert calls.count(True) >= 3
    assert calls.count(False) == (7 if refused else 0)


def walk_of_a_plain_trie(prompts: list[list[int]], block: int,
                         lengths: list[int] | None) -> list[int]:
    """`prefix_order` as its docstring says it, over token tuples (no hashes, no compressed
    edges): the prompts that share `depth` blocks split by their next block (a last partial
    block is a block of its own), each branch ranked by its first prompt, or with `lengths`
    by its longest request first; the prompts that end there are one branch, longest first
    with `lengths`, ranked by that one."""
    units = [[tuple(p[s:s + block]) for s in range(0, len(p), block)] for p in prompts]

    def walk(members: list[int], depth: int) -> list[int]:
        ends = [i for i in members if len(units[i]) == depth]
        groups: dict[tuple, list[int]] = {}
        for i in members:
            if len(units[i]) > depth:
                groups.setdefault(units[i][depth], []).append(i)
        branches = []
        for group in groups.values():
            rank = (-max(lengths[i] for i in group) if lengths else 0, group[0])
            branches.append((rank, walk(group, depth + 1)))
        if ends:
            if lengths:
                ends = sorted(ends, key=lambda i: -lengths[i])
            branches.append(((-lengths[ends[0]] if lengths else 0, ends[0]), ends))
        return [i for _, branch in sorted(branches) for i in branch]

    return walk(list(range(len(prompts))), 0)


@settings(deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), max_size=9), max_size=14), st.integers(1, 3),
       st.booleans(), st.data(), st.sampled_from([1, 2, 4096]))
def test_prefix_order_is_the_walk_of_a_plain_trie(prompts, block, by_length, data, recent):
    """The hashed, compressed trie walks as the plain one does; with room for one prompt's
    hashes or two, each edge's prompt is read again from `prompts` as it parts."""
    from neuron_batch.inputs import shared_prefix

    lengths = [data.draw(st.integers(1, 30)) for _ in prompts] if by_length else None
    kept, shared_prefix.RECENT = shared_prefix.RECENT, recent
    bound = PrefixBound(block)
    try:
        assert prefix_order(prompts, block, lengths, bound) == walk_of_a_plain_trie(
            prompts, block, lengths)
    finally:
        shared_prefix.RECENT = kept
    # the bound counted on the way is the one a pass of its own counts
    assert bound.tokens() == shared_prefix_tokens(prompts, block)


def test_a_streamed_jobs_prefix_order_counts_its_bound_on_the_way(tmp_path):
    """`in_order` with somewhere to keep it: the job's bound, from the order's own pass,
    is the bound's own pass's; one there already is kept as it is."""
    from neuron_batch.inputs.prefix_bound import prefix_bound
    from neuron_batch.job.workload import load_workload

    path = tmp_path / "shared.jsonl"
    path.write_text("".join(json.dumps({"prompt_len": 40 + i % 90, "prefix_id": f"p{i % 3}",
                                        "prefix_len": 37, "max_tokens": 2}) + "\n"
                            for i in range(300)))
    requests = load_workload(RunSettings.of((str(path),), device="sim", quiet=True),
                             lambda _: None).prepared.requests
    bounds: dict = {}
    ordered = in_order(requests, "prefix", block_size=16, bounds=bounds)
    alone = prefix_bound(PromptTokens(requests), 16)
    assert bounds[16].tokens() == alone.tokens() > 0
    assert [r.record.index for r in ordered] == prefix_order(list(PromptTokens(requests)), 16)
    kept = {16: alone}
    in_order(requests, "prefix", block_size=16, bounds=kept)
    assert kept[16] is alone
