"""Integration: prefix caching through AWS's NxDI plugin (vllm-neuron 0.2.0 on vLLM 0.11.0,
0.1.0 on 0.10.2) on the CPU, against the plugin's own platform, loader, worker and runner and
vLLM's real prefix cache, with our scheduler; NxDI faked at its import boundary
(tests/engine/nxdi_fakes.py: KV by block id and offset, the prefix read from the cache, never
recomputed from the prompt, the next token a hash of the context it can see).

Every output token is checked against a reference worked out from the prompt alone, so a lost or
wrong prefix fails; every prefill the device saw (its cached tokens, as the plugin passed them
in `computed_context_lens`, and prompt length) is the step our records describe, on the cell
NxDI's rule gives. Self-selecting like tests/engine/test_nxdi_plugin.py, whose fixtures it uses.
"""

from __future__ import annotations

import pytest
import test_nxdi_plugin as plugin_suite
from test_nxdi_plugin import (  # noqa: F401 (pytestmark: the suite's skips apply here too)
    NXDI_NEURON_CONFIG_KEYS,
    PLUGIN,
    expected_tokens,
    pytestmark,
)

from neuron_batch.runtimes.prefix_grid import grid_cell

#: The suite's fixtures: the plugin installed once per environment, the tiny model, a case.
case, plugin_dir, model_dir = plugin_suite.case, plugin_suite.plugin_dir, plugin_suite.model_dir

GRID = {"max_num_seqs": 4, "max_model_len": 2048, "max_num_batched_tokens": 64}


def check_prefix_steps(got: dict, max_num_seqs: int) -> list[dict]:
    """Each model call is the step our records describe; each prefill's cell is NxDI's rule
    applied to what the device was given. Returns the prefill steps."""
    steps = [s for s in got["steps"] if s["kind"] != "empty"]
    calls, config = got["calls"], got["neuron_config"]
    assert len(steps) == len(calls), (len(steps), len(calls))
    prefills = []
    for step, call in zip(steps, calls):
        assert step["kind"] == call["phase"] and step["num_preempted"] == 0, (step, call)
        if call["phase"] == "decode":
            assert step["num_seqs"] == call["batch"] == step["num_running"]
            assert step["num_seqs_padded"] == call["padded_batch"] == max_num_seqs
            assert step["attended_len"] == call["attended"]
            assert (step["cached_tokens"], step["prefix_bucket"]) == (0, None)
            continue
        assert call["unwritten"] == 0, call            # the prefix was all in the cache
        cell = grid_cell(call["prompt_len"] - call["cached"], call["cached"],
                         config["context_encoding_buckets"], config["prefix_buckets"])
        assert (step["num_tokens"], step["cached_tokens"]) == (call["num_tokens"],
                                                               call["cached"])
        assert (step["num_tokens_padded"], step["prefix_bucket"], step["recomputed_tokens"]) \
            == (cell.prefill_bucket, cell.prefix_bucket, cell.recomputed), (step, call)
        assert got["cached"][step["req_ids"][0]] == call["cached"]
        prefills.append(step)
    return prefills


def check_outputs(got: dict, requests: list[dict]) -> None:
    wrong = [r["id"] for r in requests if got["outputs"][r["id"]] != expected_tokens(
        r["prompt"], r["max_tokens"], got["vocab"])]
    assert not wrong, wrong


def prompt(stem: int, shared: int, own: int, salt: int) -> list[int]:
    return ([3 + (101 * stem + 7 * j) % 1000 for j in range(shared)]
            + [3 + (977 * salt + 13 * j) % 1000 for j in range(own)])


# -- config and loader contracts -----------------------------------------------------------
def test_config_contract_prefix_caching_is_on_with_the_block_layout(case):
    got = case("config", GRID)
    assert got["scheduler_cls"] == "neuron_batch.scheduler.NeuronScheduler"
    assert got["chunked_prefill_enabled"] is False
    assert got["enable_prefix_caching"] is True and got["block_size"] == 32
    # 2048 / 32 blocks a slot, 4 slots, and vLLM's null block: 0.2.0 adds it, 0.1.0 gets it
    # from us
    assert got["num_gpu_blocks_override"] == 64 * 4 + 1
    assert got["section"]["prefix_buckets"] == [0, 512, 1024, 2048]
    assert got["section"]["token_generation_buckets"] == [256, 512, 1024, 2048]


def test_loader_contract_block_layout_keys_and_the_grid_in_the_artifacts_key(case, tmp_path):
    got = case("loader", {**GRID, "block_size": 16})
    config = got["neuron_config"]
    assert set(config) <= NXDI_NEURON_CONFIG_KEYS, set(config) - NXDI_NEURON_CONFIG_KEYS
    assert config["is_prefix_caching"] is True and config["is_block_kv_layout"] is True
    assert config["pa_block_size"] == got["vllm_block_size"] == 16
    assert config["pa_num_blocks"] == got["vllm_num_blocks"] == 128 * 4 + 1
    assert config["context_encoding_buckets"] == [512, 1024, 2048]
    assert config["prefix_buckets"] == [0, 512, 1024, 2048]
    assert config["token_generation_buckets"] == [256, 512, 1024, 2048]
    # another prefix bucket list never loads these graphs
    other = case("loader", {**GRID, "block_size": 16, "prefix_buckets": [1024, 2048]})
    assert other["neuron_config"]["prefix_buckets"] == [0, 1024, 2048]
    assert other["compiled"] == [other["artifacts"]] != [got["artifacts"]]
    again = case("loader", {**GRID, "block_size": 16})
    assert again["compiled"] == [] and again["loaded"] == [got["artifacts"]]


# -- data path ------------------------------------------------------------------------------
def test_shared_prefixes_of_several_lengths_are_read_from_the_cache(case):
    """Many requests on one long prefix, others on shorter ones, a small new part after a long
    hit, and hits NxDI recomputes whole (a prompt of 257-512 tokens runs as (512, 0))."""
    spec = ([(0, 1500, 20 + 37 * i) for i in range(8)]          # one long prefix
            + [(1, 700, 40 + 90 * i) for i in range(4)]         # a shorter one
            + [(2, 300, 30 + 50 * i) for i in range(3)]         # totals of 330-430
            + [(0, 1500, 3)])                                   # a small new part
    requests = [{"id": f"r{i}", "prompt": prompt(stem, shared, own, i),
                 "max_tokens": 4 + i % 5, "temperature": 0.0, "seed": i}
                for i, (stem, shared, own) in enumerate(spec)]
    got = case("run", GRID, requests=requests)
    prefills = check_prefix_steps(got, GRID["max_num_seqs"])
    check_outputs(got, requests)
    hits = {s["req_ids"][0]: s for s in prefills}
    assert all(hits[f"r{i}"]["cached_tokens"] == 1472 for i in range(1, 8))   # 46 blocks
    assert all(hits[f"r{i}"]["cached_tokens"] == 672 for i in range(9, 12))   # 21 blocks
    corner = [hits[f"r{i}"] for i in (13, 14)]
    assert all(s["cached_tokens"] == 288 and (s["num_tokens_padded"], s["prefix_bucket"],
               s["recomputed_tokens"]) == (512, 0, 288) for s in corner)      # full recompute
    small = hits["r15"]
    assert (small["num_tokens"], small["cached_tokens"]) == (31, 1472)
    assert (small["num_tokens_padded"], small["prefix_bucket"]) == (512, 1024)


def test_evicted_prefix_and_a_job_larger_than_the_block_pool(case):
    """A pool of 2 x 1024 / 16 usable blocks: a prefix is used, then unrelated prompts take
    every block, then the prefix's next user comes (its blocks are gone: computed again, and
    right); 30 requests of up to 1000 tokens go through it."""
    limits = {"max_num_seqs": 2, "max_model_len": 1024, "max_num_batched_tokens": 64,
              "block_size": 16}
    requests = [{"id": "first", "prompt": prompt(5, 600, 20, 0), "max_tokens": 3},
                {"id": "hit", "prompt": prompt(5, 600, 40, 1), "max_tokens": 3}]
    requests += [{"id": f"other{i}", "prompt": prompt(10 + i, 0, 500 + 53 * i % 450, 2 + i),
                  "max_tokens": 2 + i % 6} for i in range(26)]
    requests += [{"id": "after", "prompt": prompt(5, 600, 60, 99), "max_tokens": 3},
                 {"id": "again", "prompt": prompt(5, 600, 80, 98), "max_tokens": 3}]
    for i, request in enumerate(requests):
        request.update(temperature=0.0, seed=i)
    got = case("run", limits, requests=requests)
    check_prefix_steps(got, limits["max_num_seqs"])
    check_outputs(got, requests)
    cached = got["cached"]
    assert cached["hit"] == 592 and cached["again"] == 592       # 37 blocks of 16
    assert cached["after"] < 592, cached["after"]                 # evicted before it came
    blocks = got["run_config"]["num_kv_blocks"]
    assert blocks == 2 * 64 + 1
    total = sum(len(r["prompt"]) + r["max_tokens"] for r in requests)
    assert total > 5 * blocks * 16


def test_batch_size_1_is_refused_where_the_plugin_is_wrong(case):
    if PLUGIN != "0.2.0":
        pytest.skip(f"vllm-neuron {PLUGIN}'s README.md (Known Issues) does not list wrong "
                    f"output with prefix caching at batch size 1 (0.2.0's lists it as issue 3), "
                    f"so neuron-batch does not refuse it there (nxdi_plugin.plugin_line)")
    with pytest.raises(AssertionError, match="--max-num-seqs 1 with prefix caching"):
        case("config", {**GRID, "max_num_seqs": 1})

