"""The prefix bound counted as prompts stream (inputs/prefix_bound.py): exactly what the prompts'
distinct block prefixes give while it counts exactly, within its stated error once it
estimates, and in memory that stops growing with the job once it does. (tests/inputs/
test_order.py checks the same bound against every order of small jobs.)"""

from __future__ import annotations

import random
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.inputs import prefix_bound as prefix_bound_module
from neuron_batch.inputs.prefix_bound import PrefixBound, prefix_bound
from neuron_batch.report.model import PrefixCache
from neuron_batch.report.prefix_cache import summary_words


def by_sets(prompts: list[list[int]], block: int) -> int:
    """The bound from sets of the prompts' block prefixes (the formula, held whole)."""
    prefixes, ends = set(), set()
    whole = aligned = 0
    for ids in prompts:
        n = len(ids) // block
        whole += n
        prefixes.update(tuple(ids[:k * block]) for k in range(1, n + 1))
        if n and len(ids) == n * block:
            aligned += 1
            ends.add(tuple(ids))
    return (whole - len(prefixes) - (aligned - len(ends))) * block


@settings(deadline=None)
@given(st.lists(st.lists(st.integers(0, 2 ** 32 - 1), max_size=12), max_size=12)
       .flatmap(lambda heads: st.lists(
           st.tuples(st.sampled_from(heads or [[]]), st.lists(st.integers(0, 3), max_size=9)),
           max_size=30)),
       st.integers(1, 4))
def test_counted_exactly_it_is_the_distinct_prefixes_formula(parts, block):
    # prompts that share heads (any token id a vocabulary has) and part in small tails
    prompts = [head + tail for head, tail in parts]
    bound = prefix_bound(prompts, block)
    assert bound.exact and bound.error_tokens() == 0
    assert bound.tokens() == by_sets(prompts, block)


def test_a_token_id_past_32_bits_counts_too():
    a = [2 ** 40 + 1] * 8
    assert prefix_bound([a + [1], a + [2]], 4).tokens() == 8


def groups(n: int, size: int, shared_blocks: int, own_blocks: int, block: int,
           seed: int = 7) -> list[list[int]]:
    """`n` prompts in groups of `size` sharing `shared_blocks`, then blocks of their own."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        head = [i // size] * (shared_blocks * block)
        out.append(head + [rng.randrange(1 << 30) for _ in range(own_blocks * block)])
    return out


def test_past_its_exact_count_it_estimates_within_its_error():
    # 60,000 prompts of 2 + 3 blocks in groups of 20: 186,000 distinct prefixes (past the
    # registers' linear-counting range), 114,000 blocks served
    prompts = groups(60_000, 20, 2, 3, 2)
    exact = prefix_bound(prompts, 2, exact_limit=10 ** 7)
    estimate = prefix_bound(prompts, 2, exact_limit=1_000)
    assert exact.exact and exact.tokens() == by_sets(prompts, 2) == 114_000 * 2
    assert not estimate.exact
    error = estimate.error_tokens()
    assert 0 < error < 0.01 * exact.tokens()      # 0.41% of 186,000 distinct blocks
    assert abs(estimate.tokens() - exact.tokens()) <= 4 * error


def test_its_memory_stops_growing_with_the_job_once_it_estimates(monkeypatch):
    # (a small buffer, so that both jobs fill it many times)
    monkeypatch.setattr(prefix_bound_module, "_BUFFER", 4096)

    def peak(n: int) -> int:
        prompts = groups(n, 10, 1, 3, 4, seed=n)
        tracemalloc.start()
        try:
            bound = PrefixBound(4, exact_limit=2_000)
            for ids in prompts:
                bound.add(ids)
            bound.tokens()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak(5_000), peak(25_000)
    # per count the registers (64 KiB) and a buffer of hashes not yet counted, whatever the
    # job's size
    assert large < 1.2 * small and small < 2 * 2 ** 20


def test_the_summary_says_an_estimated_bound_with_its_error():
    section = PrefixCache(enabled=True, prompt_tokens=1_000_000, hit_tokens=300_000,
                          hit_fraction=0.3, recomputed_tokens=0, computed_tokens=700_000)
    section.with_bound(400_000)
    assert "bound 40.0%)" in (summary_words(section) or "")
    assert "bound_error_tokens" not in section.to_dict()    # counted exactly: not written
    section.with_bound(400_000, error_tokens=3_000)
    assert "bound 40.0% +/- 0.3%" in (summary_words(section) or "")
    assert section.to_dict()["bound_error_tokens"] == 3_000


# Prompts that share nothing by construction (a token-count trace's own synthetic tokens)


def _own(indices, lengths, vocab=32_000, named=None):
    from neuron_batch.inputs.prepare import prepare_requests
    from neuron_batch.inputs.prompt_records import PromptRecord

    records = [PromptRecord(i, f"r{i}", f"t:{i}", prompt_len=n, **(named or {}).get(i, {}))
               for i, n in zip(indices, lengths)]
    return prepare_requests(records, tokenizer=None, tokenizer_name=None, vocab_size=vocab,
                            max_model_len=1 << 20, default_max_tokens=1).requests


@settings(deadline=None, max_examples=30)
@given(st.lists(st.integers(0, 3 * (1 << 16)), min_size=2, max_size=60, unique=True),
       st.sampled_from([16, 32]), st.sampled_from([32_000, 1_000, 128_256]))
def test_prompts_said_to_share_nothing_share_no_block(indices, block, vocab):
    """Where `share_nothing` says so, walking the prompts finds no shared block (the bound it
    skips is 0), across laps of the pool too; it learns that without making a prompt."""
    from neuron_batch.inputs.prepare import PromptTokens

    # (laps' first requests and their neighbours: where heads and offsets meet)
    indices = sorted(set(indices) | {0, 1, 1 << 16, (1 << 16) + 1})
    requests = _own(indices, [block + (i % 3) * 7 for i in indices], vocab)
    prompts = PromptTokens(requests)
    assert prompts.share_nothing(block)
    assert prefix_bound([list(p) for p in prompts], block).tokens() == 0
    assert by_sets([list(p) for p in prompts], block) == 0


def test_share_nothing_is_false_for_what_can_share():
    """Text or token ids, Mooncake block ids, a named prefix: the walk decides, not this."""
    from neuron_batch.inputs.prepare import PromptTokens, synthetic_tokens

    assert PromptTokens(_own(range(10), [40] * 10)).share_nothing(16)
    assert not PromptTokens(_own(range(10), [40] * 10, named={
        3: {"prefix_id": "sys", "prefix_len": 20}})).share_nothing(16)
    assert not PromptTokens(_own(range(10), [40] * 10, named={
        5: {"hash_ids": [1, 2]}})).share_nothing(16)
    assert not PromptTokens(_own(range(10), [40] * 10)).share_nothing(1)   # too short to tell
    tokens = synthetic_tokens(32_000)
    # (a block no longer than a lap's head, where there are laps past the first)
    assert not tokens.own_blocks_distinct(4, 3 << 16)
    assert tokens.own_blocks_distinct(4, 100)


def test_a_pool_that_repeats_or_spells_a_laps_head_is_not_said_to_share_nothing():
    """The property is checked on the pool, not assumed: a window that repeats, or a first-lap
    prompt that begins with a later lap's head, and it says False."""
    from neuron_batch.inputs.prepare import _POOL_SIZE, SyntheticTokens

    repeats = SyntheticTokens(32_000)
    repeats._pool[500:508] = repeats._pool[900:908]
    assert not repeats.own_blocks_distinct(16, 10)
    spells = SyntheticTokens(32_000)
    head = spells._head(2, 1)       # (the lap namespace: lap 1's prompts begin with it)
    spells._pool[700:700 + len(head)] = head
    assert spells.own_blocks_distinct(16, _POOL_SIZE - 1)      # (one lap: no heads)
    assert not spells.own_blocks_distinct(16, _POOL_SIZE + 5)


@settings(deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), max_size=40), max_size=20),
       st.integers(1, 9), st.booleans(), st.integers(1, 64))
def test_prompts_hashed_together_are_hashed_as_one_at_a_time(prompts, block, wide,
                                                             batch_tokens):
    # a batch's hashes are every prompt's own, in order; a bound fed in batches of any size
    # counts what one fed a prompt at a time does (and ids past 32 bits take the wide path)
    from neuron_batch.inputs.block_hashes import BlockHashes

    if wide and prompts and prompts[0]:
        prompts[0][0] += 2 ** 40
    hashes = BlockHashes(block)
    together, counts = hashes.whole_of(prompts)
    alone = [hashes.whole(ids) for ids in prompts]
    assert [int(n) for n in counts] == [len(h) for h in alone]
    assert together.tolist() == [int(h) for each in alone for h in each]
    one_by_one = PrefixBound(block)
    for ids in prompts:
        one_by_one.add(ids)
    batched = PrefixBound(block)
    prefix_bound_module.BATCH_TOKENS, saved = batch_tokens, prefix_bound_module.BATCH_TOKENS
    try:
        batched.add_all(prompts)
    finally:
        prefix_bound_module.BATCH_TOKENS = saved
    assert (batched.tokens(), batched.whole_blocks, batched.aligned) == (
        one_by_one.tokens(), one_by_one.whole_blocks, one_by_one.aligned)
