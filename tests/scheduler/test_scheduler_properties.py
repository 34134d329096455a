"""Invariants of the Neuron scheduler over random workloads and configurations (hypothesis),
on vLLM's real scheduler for both classes and both kv_reserve rules, driven synchronously and,
for the async class, with one step in flight as vLLM's async engine does."""

import pytest

pytest.importorskip("vllm")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from neuron_batch.runtimes.buckets import max_kv_concurrent_requests  # noqa: E402
from neuron_batch.runtimes.runtime import NXDI, RUNTIMES  # noqa: E402
from neuron_batch.scheduler import NeuronAsyncScheduler, NeuronScheduler, compat  # noqa: E402
from neuron_batch.scheduler.harness import drive, make_request, make_scheduler  # noqa: E402

BLOCK = 16
RULES = ["request", "max_model_len"]


@st.composite
def bucket_list(draw, maximum, low):
    """A valid bucket list ending at `maximum`."""
    inner = draw(st.lists(st.integers(low, max(low, maximum - 1)), max_size=4, unique=True))
    return sorted(b for b in set(inner) if b < maximum) + [maximum]


@st.composite
def scenario(draw):
    max_model_len = draw(st.sampled_from([256, 512, 1024]))
    max_num_batched_tokens = draw(st.sampled_from([64, 128, 256, 1024]))
    max_num_seqs = draw(st.integers(1, 12))
    # KV cache from "one request at max_model_len" up to "everything fits".
    per_request = -(-max_model_len // BLOCK)
    num_blocks = draw(st.integers(per_request + 1, per_request * 14))  # +1: the null block
    prefill_max = min(max_num_batched_tokens, max_model_len)
    neuron_config = {}
    if draw(st.booleans()):
        neuron_config["num_batched_tokens_buckets"] = draw(bucket_list(prefill_max, 16))
    if draw(st.booleans()):
        neuron_config["num_seqs_buckets"] = draw(bucket_list(max_num_seqs, 1))
    return dict(max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens,
                max_num_seqs=max_num_seqs, num_blocks=num_blocks, neuron_config=neuron_config,
                **draw(requests(max_model_len, 14)))


@st.composite
def requests(draw, max_model_len, most):
    """1..`most` requests: prompt lengths, max_tokens and sorted arrival steps."""
    n = draw(st.integers(1, most))
    prompts = draw(st.lists(st.integers(1, max_model_len - 40), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    arrivals = draw(st.lists(st.integers(0, 25), min_size=n, max_size=n))
    return dict(prompts=prompts, outputs=outputs, arrival_steps=sorted(arrivals))


def run_scenario(cls, sc, overlap=False, kv_reserve="max_model_len", **tokenizer):
    """Drive `sc` through `cls`, every step checked. `sc["forms"]`, when given, constrains
    each request to its structured-output form (None: unconstrained); those need a tokenizer
    (`tokenizer=`, `vocab_size=`, as make_scheduler takes them)."""
    sched = make_scheduler(
        cls, max_num_seqs=sc["max_num_seqs"], max_num_batched_tokens=sc["max_num_batched_tokens"],
        max_model_len=sc["max_model_len"], num_blocks=sc["num_blocks"], block_size=BLOCK,
        neuron_config=sc["neuron_config"], async_scheduling=overlap, kv_reserve=kv_reserve,
        **tokenizer)
    arrivals: dict[int, list] = {}
    order = []
    forms = sc.get("forms") or [None] * len(sc["prompts"])
    for i, (p, o, step, form) in enumerate(zip(sc["prompts"], sc["outputs"],
                                               sc["arrival_steps"], forms)):
        request = make_request(p, o, req_id=f"r{i:02d}", block_size=BLOCK, structured=form)
        arrivals.setdefault(step, []).append(request)
        order.append(request)
    checks = StepChecks(sched, {r.request_id: r for r in order})
    result = drive(sched, arrivals=arrivals, max_steps=5_000, overlap=overlap,
                   on_step=checks.check)
    return sched, order, result, checks


class StepChecks:
    """Checks every SchedulerOutput the moment it is produced."""

    def __init__(self, sched, requests):
        self.sched = sched
        self.requests = requests
        self.first_scheduled: list[str] = []
        self.usable = sched.kv_cache_manager.block_pool.num_gpu_blocks - 1   # null block out

    def need(self, req_id):
        """Blocks a request reserves, worked out here independently of the scheduler."""
        request = self.requests[req_id]
        mml = self.sched.max_model_len
        tokens = (mml if self.sched.kv_reserve == "max_model_len"
                  else min(request.num_prompt_tokens + request.max_tokens, mml))
        return -(-tokens // BLOCK)

    def check(self, out):
        sched = self.sched
        before = {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs}
        before.update(zip(out.scheduled_cached_reqs.req_ids,
                          out.scheduled_cached_reqs.num_computed_tokens))
        prefills = [r for r in out.num_scheduled_tokens
                    if before[r] < self.requests[r].num_prompt_tokens]
        decodes = [r for r in out.num_scheduled_tokens if r not in prefills]
        # no step mixes prefill and decode; one prefill a step
        assert not (prefills and decodes)
        assert len(prefills) <= 1
        for r in prefills:
            actual = out.num_scheduled_tokens[r]
            padded = out.num_scheduled_tokens_padded[r]
            # padded >= actual and is a configured bucket
            assert padded >= actual and padded in sched.num_batched_tokens_buckets
            # num_computed_tokens never passes the prompt during prefill
            assert before[r] + actual <= self.requests[r].num_prompt_tokens
        for r in decodes:
            assert out.num_scheduled_tokens_padded[r] == out.num_scheduled_tokens[r]
        if decodes:
            assert out.num_seqs_padded in sched.num_seqs_buckets
            assert out.num_seqs_padded >= len(decodes)
        # the state matches the step
        if prefills:
            assert sched.state.value == "ACTIVE_PREFILL"
        elif decodes:
            assert sched.state.value == "ACTIVE_DECODE"
        # admission never exceeds max_num_seqs or the KV cache's worst-case capacity
        if sched.kv_reserve == "max_model_len":
            assert len(sched.running) <= min(sched.max_num_seqs, sched._max_kv_concurrent)
        else:
            assert len(sched.running) <= sched.max_num_seqs
        self.check_kv(out)
        for new in out.scheduled_new_reqs:
            if new.req_id not in self.first_scheduled:
                self.first_scheduled.append(new.req_id)


    def check_kv(self, out):
        sched = self.sched
        # vLLM never preempted anything
        assert not compat.preempted_req_ids(out)  # (no such field up to vLLM 0.11)
        # the running total of reservations is the sum over the running requests
        reserved = sum(self.need(r.request_id) for r in sched.running)
        assert sched.kv_reserved_blocks == reserved
        # ... fits in the cache, and covers every block really held
        assert reserved <= self.usable
        used = self.usable - sched.kv_cache_manager.block_pool.get_num_free_blocks()
        assert used <= reserved
        # the recorder saw the same total
        assert sched.recorder.steps[-1].kv_reserved_blocks == reserved
        # under `request`, KV refuses the head only when its own need really does not fit
        # (so more than the max_model_len cap run whenever the real needs allow it)
        if sched.recorder.steps[-1].blocked == "kv_saturated":
            head = sched.waiting.peek_request()
            assert reserved + self.need(head.request_id) > self.usable
        if sched.kv_reserve == "max_model_len":
            assert sched.recorder.steps[-1].num_running <= sched._max_kv_concurrent


def assert_invariants(sched, order, result, checks):
    # every request finishes, with exactly its max_tokens (EOS is ignored)
    assert result.finished == {r.request_id: r.max_tokens for r in order}
    # admission is FIFO: first scheduled in arrival order
    assert checks.first_scheduled == [r.request_id for r in order]
    # the recorder saw the same: every step ended, every request timed in order
    assert all(s.t_end is not None for s in sched.recorder.steps)
    for record in sched.recorder.requests.values():
        assert record.arrival <= record.admitted <= record.first_token <= record.finished
    assert not sched.waiting and not sched.running and not sched.holdback_queue


SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.parametrize("kv_reserve", RULES)
@SETTINGS
@given(sc=scenario())
def test_neuron_scheduler_invariants(sc, kv_reserve):
    assert_invariants(*run_scenario(NeuronScheduler, sc, kv_reserve=kv_reserve))


@pytest.mark.parametrize("kv_reserve", RULES)
@SETTINGS
@given(sc=scenario())
def test_neuron_async_scheduler_invariants(sc, kv_reserve):
    assert_invariants(*run_scenario(NeuronAsyncScheduler, sc, kv_reserve=kv_reserve))


@pytest.mark.parametrize("kv_reserve", RULES)
@SETTINGS
@given(sc=scenario())
def test_neuron_async_scheduler_invariants_with_a_step_in_flight(sc, kv_reserve):
    assert_invariants(*run_scenario(NeuronAsyncScheduler, sc, overlap=True,
                                    kv_reserve=kv_reserve))


def test_kv_capacity_in_scenarios_is_what_the_scheduler_uses():
    sched = make_scheduler(NeuronScheduler, max_model_len=1024, num_blocks=200, block_size=BLOCK)
    assert sched._max_kv_concurrent == max_kv_concurrent_requests(200, BLOCK, 1024) == 3


# -- the nxdi runtime: NxDI's compiled shapes --------------------------------------------------
@st.composite
def nxdi_scenario(draw):
    """A static KV cache (max_num_seqs slots of max_model_len, plus vLLM's null block) and
    random context-encoding / token-generation bucket lists."""
    max_model_len = draw(st.sampled_from([256, 512, 1024]))
    max_num_seqs = draw(st.integers(1, 10))
    neuron_config = {}
    if draw(st.booleans()):
        neuron_config["context_encoding_buckets"] = draw(bucket_list(max_model_len, 16))
    if draw(st.booleans()):
        neuron_config["token_generation_buckets"] = draw(bucket_list(max_model_len, 16))
    return dict(max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                num_blocks=max_num_seqs * -(-max_model_len // BLOCK) + 1,
                neuron_config=neuron_config, **draw(requests(max_model_len, 16)))


def _expected_nxdi_buckets(neuron_config, key, max_model_len):
    """The list the scheduler must pad to, worked out here: the given one, else NxDI's
    generate_buckets(128, max_model_len) rule (powers of two up to 2**round(log2 max), then
    the max)."""
    import math
    given = neuron_config.get(key)
    if given is not None:
        return given
    if max_model_len <= 128:
        return [max_model_len]
    top = round(math.log2(max_model_len))
    return [2 ** i for i in range(7, top) if 2 ** i < max_model_len] + [max_model_len]


@pytest.mark.parametrize("cls", [NeuronScheduler, NeuronAsyncScheduler])
@SETTINGS
@given(sc=nxdi_scenario())
def test_nxdi_steps_are_the_shapes_nxdi_compiles(sc, cls):
    mml, seqs = sc["max_model_len"], sc["max_num_seqs"]
    ceb = _expected_nxdi_buckets(sc["neuron_config"], "context_encoding_buckets", mml)
    tkb = _expected_nxdi_buckets(sc["neuron_config"], "token_generation_buckets", mml)
    sched = make_scheduler(cls, max_num_seqs=seqs, max_num_batched_tokens=64,
                           max_model_len=mml, num_blocks=sc["num_blocks"], block_size=BLOCK,
                           neuron_config=sc["neuron_config"], runtime=RUNTIMES[NXDI])
    requests, arrivals = {}, {}
    for i, (p, o, step) in enumerate(zip(sc["prompts"], sc["outputs"], sc["arrival_steps"])):
        request = make_request(p, o, req_id=f"r{i:02d}", block_size=BLOCK)
        arrivals.setdefault(step, []).append(request)
        requests[request.request_id] = request
    first = []

    def check(out):
        before = {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs}
        before.update(zip(out.scheduled_cached_reqs.req_ids,
                          out.scheduled_cached_reqs.num_computed_tokens))
        prefills = [r for r in out.num_scheduled_tokens
                    if before[r] < requests[r].num_prompt_tokens]
        decodes = [r for r in out.num_scheduled_tokens if r not in prefills]
        assert not (prefills and decodes) and len(prefills) <= 1
        for r in prefills:
            # the whole prompt in one step (max_num_batched_tokens 64 asked for chunks),
            # padded to the smallest context-encoding bucket that holds it
            assert before[r] == 0
            assert out.num_scheduled_tokens[r] == requests[r].num_prompt_tokens
            padded = out.num_scheduled_tokens_padded[r]
            assert padded == min(b for b in ceb if b >= requests[r].num_prompt_tokens)
            first.append(r)
        if decodes:
            # every running request decodes, over all max_num_seqs slots, attending the
            # smallest token-generation bucket above the longest position
            assert sorted(decodes) == sorted(q.request_id for q in sched.running)
            assert out.num_seqs_padded == seqs
            longest = max(before[r] for r in decodes)
            assert out.attended_len == min(b for b in tkb if b >= longest + 1)
        # the static cache holds every slot: KV never refuses a request
        assert sched.recorder.steps[-1].blocked != "kv_saturated"
        assert len(sched.running) <= seqs

    result = drive(sched, arrivals=arrivals, max_steps=5_000, on_step=check)
    assert result.finished == {r: q.max_tokens for r, q in requests.items()}
    assert first == list(requests)       # FIFO: requests are numbered in arrival order
    assert sched.recorder.config.runtime == "nxdi"
    assert sched.recorder.config.attention_buckets == tkb


def test_nxdi_refuses_vllms_chunked_prefill():
    """The runner feeds whole prompts: a scheduler under nxdi with vLLM chunking on fails
    at start-up, naming what it needs."""
    with pytest.raises(ValueError, match="whole prompts"):
        make_scheduler(NeuronScheduler, max_num_seqs=4, max_num_batched_tokens=64,
                       max_model_len=512, num_blocks=200, block_size=BLOCK,
                       neuron_batch_config={"runtime": "nxdi"})
