"""KV admission by each request's real need (`kv_reserve = "request"`): the reservation
arithmetic (pure), and on vLLM's real scheduler every case that could break the guarantee that
no admitted request runs out of blocks: async placeholders, prefix caching, early stops,
clamped and missing max_tokens, a request bigger than the cache."""

import logging

import pytest

from neuron_batch.scheduler.kv_reserve import (
    KVLedger,
    blocks_for_tokens,
    parse_kv_reserve,
    reachable_tokens,
    too_big_message,
)

# -- the arithmetic (no vLLM) ---------------------------------------------------------------


def test_reachable_tokens_clamps_to_max_model_len_and_defaults_to_it():
    assert reachable_tokens(1000, 129, 16384) == 1129
    assert reachable_tokens(1000, 50_000, 16384) == 16384     # max_tokens past the context
    assert reachable_tokens(1000, None, 16384) == 16384       # no max_tokens: up to the end


def test_blocks_are_counted_per_kv_cache_group_as_vllm_allocates_them():
    assert blocks_for_tokens(1129, [(32, 512)]) == 36           # ceil(1129 / 32)
    assert blocks_for_tokens(1024, [(32, 512)]) == 32           # exact multiple
    assert blocks_for_tokens(1129, [(32, 512), (16, 512)]) == 36 + 71
    assert blocks_for_tokens(20_000, [(32, 512), (16, 40)]) == 512 + 40   # window-bounded group


def test_ledger_keeps_a_running_total():
    ledger = KVLedger(usable_blocks=100)
    assert ledger.fits(100) and not ledger.fits(101)
    ledger.reserve("a", 60)
    ledger.reserve("a", 60)                 # once per request
    ledger.reserve("b", 30)
    assert ledger.total == 90 and ledger.peak == 90 and len(ledger) == 2
    assert ledger.fits(10) and not ledger.fits(11)
    assert ledger.release("a") == 60 and ledger.release("a") == 0
    assert ledger.total == 30 and ledger.peak == 90 and "a" not in ledger


def test_rule_names_accept_the_cli_spelling():
    assert parse_kv_reserve("request") == "request"
    assert parse_kv_reserve("max-model-len") == parse_kv_reserve("max_model_len") \
        == parse_kv_reserve("mml") == "max_model_len"
    with pytest.raises(ValueError, match="request, max-model-len"):
        parse_kv_reserve("sometimes")


def test_too_big_message_names_the_request_and_the_numbers():
    text = too_big_message("r7", 600, 200, 1024, 25, 19, 32)
    assert "request r7" in text and "600 prompt tokens + max_tokens 200 reach 800 tokens" in text
    assert "25 KV blocks" in text and "19 usable blocks of 32 tokens (608 tokens)" in text


# -- on vLLM's real scheduler ---------------------------------------------------------------

vllm = pytest.importorskip("vllm")

from vllm.v1.request import RequestStatus  # noqa: E402

from neuron_batch.scheduler import NeuronAsyncScheduler, NeuronScheduler, compat  # noqa: E402
from neuron_batch.scheduler.harness import (  # noqa: E402
    EOS_TOKEN_ID,
    drive,
    fake_model_output,
    make_request,
    make_scheduler,
)

BOTH = [NeuronScheduler, NeuronAsyncScheduler]


def used_blocks(sched) -> int:
    """Blocks really held by requests (free ones, cached or not, do not count)."""
    pool = sched.kv_cache_manager.block_pool
    return pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()


class Watch:
    """Per-step checks: no preemption, reservations = their sum over running, and every block
    held is covered by a reservation that fits the cache."""

    def __init__(self, sched):
        self.sched = sched
        self.max_running = 0
        self.max_table: dict[str, int] = {}

    def __call__(self, out):
        sched = self.sched
        assert not compat.preempted_req_ids(out)  # (no such field up to vLLM 0.11)
        assert sched.kv_reserved_blocks == sum(sched.kv_blocks_needed(r) for r in sched.running)
        assert used_blocks(sched) <= sched.kv_reserved_blocks <= sched.kv_usable_blocks
        self.max_running = max(self.max_running, len(sched.running))
        for request in sched.running:
            held = len(sched.kv_cache_manager.get_block_ids(request.request_id)[0])
            assert held <= sched.kv_blocks_needed(request)
            self.max_table[request.request_id] = max(self.max_table.get(request.request_id, 0),
                                                     held)


@pytest.mark.parametrize("cls", BOTH)
def test_design_deadlock_scenario_runs_past_the_max_model_len_cap(cls):
    """The design's deadlock set-up (max_num_seqs 64, room for 2 requests at max_model_len):
    requests needing 600 + 40 tokens (20 blocks) run 3 at a time, all finish, none preempted."""
    sched = make_scheduler(cls, max_num_seqs=64, max_num_batched_tokens=1024, max_model_len=1024,
                           num_blocks=70, block_size=32, kv_reserve="request")
    assert sched._max_kv_concurrent == 2
    watch = Watch(sched)
    result = drive(sched, [make_request(600, 40) for _ in range(10)], max_steps=20_000,
                   on_step=watch)
    assert len(result.finished) == 10 and set(result.finished.values()) == {40}
    assert watch.max_running == 3 > sched._max_kv_concurrent
    assert sched.recorder.blocked_counts["kv_saturated"] > 0
    assert sched.kv_reserved_blocks == 0 and sched.recorder.config.kv_reserve == "request"


def test_under_request_the_check_is_still_what_prevents_the_deadlock(monkeypatch):
    sched = make_scheduler(NeuronScheduler, max_num_seqs=64, max_num_batched_tokens=1024,
                           max_model_len=1024, num_blocks=70, block_size=32)
    monkeypatch.setattr(sched, "kv_saturated", lambda request: False)
    with pytest.raises(RuntimeError, match="no completion"):
        drive(sched, [make_request(600, 40) for _ in range(10)], max_steps=3_000,
              keep_outputs=False)


@pytest.mark.parametrize("overlap", [False, True])
def test_async_placeholders_stay_inside_the_reservation(overlap):
    """Reservations that fill the cache exactly, prompt + max_tokens one past a block boundary
    (a slot planned ahead would need a new block): no preemption, every block covered."""
    # 100 + 61 = 161 tokens = 6 blocks of 32 (160 + 1); 4 requests fill 24 usable blocks.
    sched = make_scheduler(NeuronAsyncScheduler, max_num_seqs=8, max_model_len=1024,
                           max_num_batched_tokens=1024, num_blocks=25, block_size=32,
                           async_scheduling=True, kv_reserve="request")
    watch = Watch(sched)
    requests = [make_request(100, 61) for _ in range(10)]
    result = drive(sched, requests, overlap=overlap, on_step=watch)
    assert set(result.finished.values()) == {61} and len(result.finished) == 10
    assert watch.max_running == 4
    # vLLM writes at most prompt + max_tokens - 1 slots (5 blocks here): the spare slot of
    # the reservation covers a step planned ahead, should vLLM ever plan one.
    assert max(watch.max_table.values()) <= 6


@pytest.mark.parametrize("cls", BOTH)
def test_prefix_cache_blocks_freed_but_cached_count_as_free(cls):
    sched = make_scheduler(cls, max_num_seqs=8, max_model_len=512, max_num_batched_tokens=512,
                           num_blocks=41, block_size=16, enable_prefix_caching=True,
                           kv_reserve="request")
    shared = [7 + i % 500 for i in range(320)]          # 20 blocks of 16
    first = make_request(320, 40, req_id="first", prompt_token_ids=shared, block_size=16)
    drive(sched, [first])
    # its blocks stay in the prefix cache, but nothing holds them: usage and reservations 0
    assert used_blocks(sched) == 0 and sched.kv_reserved_blocks == 0
    # two requests sharing that prefix reserve 23 blocks each without sharing (conservative):
    # they run one at a time, the second hits the cache; then four small requests needing
    # 10 blocks each take the whole cache (the cached blocks get evicted), never preempted.
    watch = Watch(sched)
    again = [make_request(352, 8, prompt_token_ids=shared + [900 + i] * 32, block_size=16)
             for i in range(2)]
    small = [make_request(150, 10, block_size=16) for _ in range(4)]
    result = drive(sched, again + small, on_step=watch)
    assert set(result.finished) == {r.request_id for r in again + small}
    assert sched.recorder.requests[again[1].request_id].num_cached_tokens >= 320
    assert watch.max_running == 4


@pytest.mark.parametrize("cls", BOTH)
def test_eos_and_abort_release_the_reservation_at_once(cls):
    """A request that stops early (EOS in the engine; a stop string, which the client turns
    into an abort) gives its blocks back in that step, and the next one starts at once."""
    sched = make_scheduler(cls, max_model_len=1024, max_num_batched_tokens=1024, num_blocks=30,
                           block_size=32, kv_reserve="request")
    # 100 + 500 tokens = 19 blocks: one at a time in 29
    a = make_request(100, 500, req_id="a", ignore_eos=False)
    b = make_request(100, 500, req_id="b", ignore_eos=False)
    c = make_request(100, 500, req_id="c")
    requests = {"a": a, "b": b, "c": c}
    for request in requests.values():
        sched.add_request(request)
    out = sched.schedule()
    assert list(out.num_scheduled_tokens) == ["a"] and sched.kv_reserved_blocks == 19
    sched.update_from_output(out, fake_model_output(out, requests))
    for _ in range(3):
        out = sched.schedule()
        sched.update_from_output(out, fake_model_output(out, requests))
    out = sched.schedule()
    sched.update_from_output(out, fake_model_output(out, requests, token_id=EOS_TOKEN_ID))
    assert a.is_finished() and a.num_output_tokens == 5
    assert sched.kv_reserved_blocks == 0
    out = sched.schedule()
    assert [n.req_id for n in out.scheduled_new_reqs] == ["b"]
    sched.update_from_output(out, fake_model_output(out, requests))
    sched.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    assert sched.kv_reserved_blocks == 0
    out = sched.schedule()
    assert [n.req_id for n in out.scheduled_new_reqs] == ["c"]
    assert sched.kv_reserved_blocks == 19


def test_max_tokens_past_max_model_len_is_clamped_and_missing_max_tokens_reserves_it_all():
    sched = make_scheduler(NeuronScheduler, max_model_len=1024, max_num_batched_tokens=1024,
                           num_blocks=100, block_size=32, kv_reserve="request")
    clamped = make_request(900, 5000)
    # vLLM's input processor turns a missing max_tokens into max_model_len - prompt ...
    filled_in = make_request(300, 1024 - 300)
    # ... and a request built without one reserves up to max_model_len too.
    missing = make_request(300, 10)
    missing.sampling_params.max_tokens = None
    assert [sched.kv_blocks_needed(r) for r in (clamped, filled_in, missing)] == [32, 32, 32]
    assert sched.kv_blocks_needed(make_request(300, 10)) == 10
    watch = Watch(sched)
    result = drive(sched, [clamped, make_request(300, 10)], on_step=watch)
    assert result.finished[clamped.request_id] == 1024 - 900    # stopped at max_model_len


def test_a_request_bigger_than_the_cache_is_refused_with_the_numbers(caplog):
    """Under `request` a cache smaller than one max_model_len request is only a warning: the
    requests that fit run; one that can never fit finishes at once with an error saying why."""
    with caplog.at_level(logging.WARNING):
        sched = make_scheduler(NeuronScheduler, max_model_len=1024, max_num_batched_tokens=1024,
                               num_blocks=20, block_size=32, kv_reserve="request")
    assert "19 blocks x 32 tokens = 608 tokens, less than one request of max_model_len = " \
           "1,024" in caplog.text
    big = make_request(500, 200, req_id="big")          # 700 tokens = 22 blocks > 19
    small = [make_request(100, 20, req_id=f"s{i}") for i in range(3)]
    requests = {r.request_id: r for r in [small[0], big, *small[1:]]}
    for request in requests.values():
        sched.add_request(request)
    out = sched.schedule()
    outputs = sched.update_from_output(out, fake_model_output(out, requests))
    refused = [o for eco in outputs.values() for o in eco.outputs if o.request_id == "big"]
    assert len(refused) == 1 and str(refused[0].finish_reason) == "error"
    assert refused[0].stop_reason.startswith("Neuron scheduler: request big cannot start: "
                                             "500 prompt tokens + max_tokens 200 reach 700 "
                                             "tokens = 22 KV blocks, but the KV cache has only "
                                             "19 usable blocks")
    assert "big" not in sched.requests and sched.recorder.requests["big"].finish_reason == "error"
    watch = Watch(sched)
    for _ in range(1000):
        if not sched.has_requests():
            break
        out = sched.schedule()
        watch(out)
        sched.update_from_output(out, fake_model_output(out, requests))
    assert all(r.num_output_tokens == 20 and r.is_finished() for r in small)
    assert not sched.has_requests()


def test_preemptions_are_counted_when_vllm_does_preempt(monkeypatch):
    """With the KV check switched off vLLM has to preempt: the records count it (the report's
    `preemptions`), and the preempted request gives its reservation back."""
    sched = make_scheduler(NeuronScheduler, max_num_seqs=6, max_model_len=1024,
                           max_num_batched_tokens=1024, num_blocks=70, block_size=32)
    monkeypatch.setattr(sched, "kv_saturated", lambda request: False)

    def check(out):
        assert sched.kv_reserved_blocks == sum(sched.kv_blocks_needed(r) for r in sched.running)

    try:
        drive(sched, [make_request(300, 600) for _ in range(6)], max_steps=4_000,
              keep_outputs=False, on_step=check)
    except RuntimeError:      # it may also livelock: the point is what was recorded
        pass
    assert sum(step.num_preempted for step in sched.recorder.steps) > 0
