"""`--prefix-caching auto` (layout/prefix_decision.py) and the step estimate it weighs
(layout/step_estimate.py), on the real step model and Target; no engine. The decision against
the simulated device itself is in tests/run/test_prefix_auto.py."""

from __future__ import annotations

import random
import tracemalloc
from array import array
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from neuron_batch.device.hardware import get_instance
from neuron_batch.device.target import Target
from neuron_batch.inputs.shared_prefix import shared_prefix_tokens
from neuron_batch.layout.prefix_decision import decide, forced
from neuron_batch.layout.step_estimate import block_chains, cache_hits
from neuron_batch.settings import RunSettings

BLOCK = 32


def sim_settings(instance="inf2.48xlarge", max_model_len=4096, max_num_seqs=8, **more):
    return RunSettings.of(inputs=("x",), device="sim", max_model_len=max_model_len,
                       max_num_seqs=max_num_seqs, instance=instance,
                                                                 architecture="llama-3.1-8b",
                       **more).validate()


def targets(settings):
    return tuple(Target.resolve(instance=get_instance(settings.instance),
                                arch="llama-3.1-8b", runtime=settings.resolve_runtime(),
                                max_model_len=settings.max_model_len,
                                max_num_seqs=settings.max_num_seqs, prefix_caching=caching)
                 for caching in (False, True))


def own(n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 30000) for _ in range(length)] for _ in range(n)]


def shared_instruction(n: int, shared: int, length: int) -> list[list[int]]:
    head = own(1, shared, seed=99)[0]
    return [head + tail for tail in own(n, length, seed=1)]


def test_a_job_that_shares_nothing_runs_without_the_cache_everywhere():
    s = sim_settings()
    prompts = own(20, 700)
    for where in ({"targets": targets(s)}, {"targets": None}, {"targets": None, "neuron": True}):
        decision = decide(s, prompts, [64] * 20, block=BLOCK, **where)
        assert decision.enable is False and decision.asked == "auto"
        assert "share no KV block" in decision.reason
        assert decision.figures["bound_tokens"] == 0


def test_an_estimated_bound_within_its_error_of_none_is_none_and_not_weighed(monkeypatch):
    """Past its exact count the bound is estimated (inputs/prefix_bound.py): a job that shares
    nothing reads as a little (50k text prompts: 222,656 +- 160,547 tokens), and weighing it
    walked every prompt again. Within two standard errors of 0 it is taken as 0; a bound
    clear of its error is weighed."""
    from neuron_batch.layout import prefix_decision

    s = sim_settings()
    prompts = own(20, 700)
    weighed = []
    real = prefix_decision.weigh
    monkeypatch.setattr(prefix_decision, "weigh",
                        lambda *a, **k: weighed.append(1) or real(*a, **k))
    decision = decide(s, prompts, [64] * 20, block=BLOCK, targets=targets(s), bound=640,
                      bound_error=400)
    assert not decision.enable and "tell from none (640 +- 400" in decision.reason
    assert decision.figures["bound_error_tokens"] == 400 and not weighed
    decide(s, prompts, [64] * 20, block=BLOCK, targets=targets(s), bound=640, bound_error=100)
    assert weighed


def test_the_cpu_turns_it_on_wherever_a_block_is_shared():
    s = RunSettings.of(inputs=("x",), device="cpu").validate()
    decision = decide(s, shared_instruction(4, 64, 100), [8] * 4, block=BLOCK)
    assert decision.enable and "vLLM's CPU cache costs a hash per block" in decision.reason


def test_a_neuron_host_without_a_step_model_weighs_the_share():
    s = RunSettings.of(inputs=("x",), device="cpu").validate()
    much = decide(s, shared_instruction(8, 1024, 256), [8] * 8, block=BLOCK, neuron=True)
    little = decide(s, shared_instruction(8, 64, 2048), [8] * 8, block=BLOCK, neuron=True)
    assert much.enable and not little.enable
    assert "give --instance" in little.reason


def test_a_shared_instruction_pays_once_the_graphs_are_compiled():
    """1,024 shared tokens and 256 own (bench_prefix.py's job, 1.69x measured with caching
    on, docs/measurements.md): on with the graphs compiled; the gather is named and does not
    decide it."""
    s = sim_settings(max_model_len=2048, max_num_seqs=16)
    prompts = shared_instruction(100, 1024, 256)
    decision = decide(s, prompts, [64] * 100, block=BLOCK, targets=targets(s),
                      compiled=(True, True))
    assert decision.enable, decision.reason
    f = decision.figures
    assert f["on_total_s"] < f["off_total_s"]
    assert f["on_prefill_s"] < 0.6 * f["off_prefill_s"]
    assert f["hit_tokens"] == 99 * 1024         # every request but the first
    assert f["on_graphs"] > f["off_graphs"]
    assert decision.gather and "gather" in decision.gather
    assert "it pays on this layout" in decision.words


def test_the_compile_it_adds_can_outweigh_the_hits():
    """The same job compiled fresh: 20 requests save less prefill than the grid's extra graphs
    take to compile."""
    s = sim_settings(max_model_len=2048, max_num_seqs=16)
    decision = decide(s, shared_instruction(20, 1024, 256), [64] * 20, block=BLOCK,
                      targets=targets(s))
    f = decision.figures
    assert f["on_startup_s"] > f["off_startup_s"]
    assert not decision.enable and "start-up" in decision.reason


def test_the_gather_term_is_said_to_decide_where_it_does():
    """Hits about worth their prefill: the modelled gather (no published figure) decides it,
    and the decision says which way it would go at zero and doubled."""
    s = sim_settings(max_model_len=8192, max_num_seqs=8)

    def decision(shared, length, out):
        return decide(s, shared_instruction(40, shared, length), [out] * 40, block=BLOCK,
                      targets=targets(s), compiled=(True, True))

    long_outputs = decision(1536, 512, 1024)       # many decode steps, each gathering
    assert not long_outputs.enable
    assert "at zero it would flip to on, doubled still off" in long_outputs.gather
    balanced = decision(1024, 256, 256)
    assert balanced.enable
    assert "at zero still on, doubled it would flip to off" in balanced.gather
    clear = decision(3072, 512, 128)               # the hits win whatever the gather costs
    assert clear.enable and "does not decide it" in clear.gather
    for d in (long_outputs, balanced, clear):
        f = d.figures
        assert f["on_total_s_gather_0"] < f["on_total_s"] < f["on_total_s_gather_2"]


def test_trn2_pays_no_gather_and_compiles_no_more():
    s = sim_settings(instance="trn2.48xlarge", max_model_len=4096, max_num_seqs=16)
    decision = decide(s, shared_instruction(50, 1024, 256), [32] * 50, block=BLOCK,
                      targets=targets(s))
    assert decision.gather is None and decision.figures["gather_s"] == 0
    assert decision.figures["on_graphs"] == decision.figures["off_graphs"]
    assert decision.enable


def test_forced_is_as_asked():
    assert forced(sim_settings().replace(prefix_caching=True)).enable is True
    off = forced(sim_settings().replace(prefix_caching=False))
    assert off.enable is False and off.asked == "off"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=9), min_size=1, max_size=12),
       st.sampled_from([1, 2, 3]), st.one_of(st.none(), st.integers(1, 6)))
def test_hits_are_whole_blocks_an_earlier_prompt_computed(prompts, block, capacity):
    """Each request is served whole blocks only, never its last token, only what an earlier
    prompt computed; in all at most the unbounded cache's bound."""
    lens = [len(p) for p in prompts]
    hits = cache_hits(lens, block_chains(prompts, block), block, capacity)
    for i, (prompt, hit) in enumerate(zip(prompts, hits)):
        assert hit % block == 0 and hit <= max(len(prompt) - 1, 0)
        if hit:
            assert any(other[:hit] == prompt[:hit] and len(other) >= hit
                       for other in prompts[:i])
    assert sum(hits) <= shared_prefix_tokens(prompts, block)
    if capacity is not None:
        assert sum(hits) <= sum(cache_hits(lens, block_chains(prompts, block), block, None))


class _Made(Sequence):
    """`n` prompts made when read (a streamed job's view): a shared 64-token head and a tail
    shorter than a block, so the cache only ever holds the head's two blocks."""

    def __init__(self, n: int):
        self.n, self.head = n, own(1, 2 * BLOCK, seed=99)[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.head + [1 + i % 30000] * 20


def test_weighing_holds_no_prompt_s_block_chain():
    """Auto's weighing of a long job keeps a few bytes a prompt (its lengths and hits as
    arrays), not each prompt's chain of block hashes: the peak of 20,000 prompts less that of
    2,000 stays under 40 bytes a prompt more (the chains held cost ~140)."""
    s = sim_settings()
    tgts = targets(s)

    def peak(n: int) -> int:
        prompts, outs = _Made(n), array("i", [16]) * n
        tracemalloc.start()
        try:
            decision = decide(s, prompts, outs, block=BLOCK, targets=tgts,
                              bound=2 * BLOCK * (n - 1))
            assert decision.figures["hit_tokens"] == 2 * BLOCK * (n - 1)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak(2_000), peak(20_000)
    assert (large - small) / 18_000 < 40, (small, large)


def test_block_chains_made_in_batches_are_each_prompts_own():
    # more prompts than a batch (step_estimate.CHAIN_BATCH), of every length around a block
    from neuron_batch.inputs.block_hashes import BlockHashes
    from neuron_batch.layout import step_estimate

    rng = random.Random(5)
    prompts = [[rng.randrange(50) for _ in range(rng.randrange(0, 40))]
               for _ in range(step_estimate.CHAIN_BATCH * 2 + 7)]
    hashes = BlockHashes(8)
    assert block_chains(prompts, 8) == [hashes.whole(ids).tolist() for ids in prompts]
