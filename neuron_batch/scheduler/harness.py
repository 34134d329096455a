"""Build and drive a real vLLM scheduler without a model: the test bench for the scheduler.

`make_scheduler()` builds any v1 `Scheduler` subclass from a `config.json`-only model
directory and a KV cache of a chosen size; `drive()` runs the engine's loop (schedule, a
hand-built model output, update_from_output) until every request is done. Tests, the
scheduler benchmark and the simulated device's baseline all use it, so they exercise the
same vLLM code the engine runs.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from vllm.config import CacheConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from neuron_batch.runtimes.runtime import Runtime, default_runtime
from neuron_batch.scheduler import compat

#: A small llama-shaped architecture: only its shape matters to the scheduler.
TINY_LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}

EOS_TOKEN_ID = 2


@cache
def tiny_model_dir(vocab_size: int = TINY_LLAMA_CONFIG["vocab_size"]) -> str:
    """A directory holding only a config.json, created once per process (per vocabulary: a
    scheduler given a tokenizer needs the model's vocabulary to be the tokenizer's)."""
    path = Path(tempfile.mkdtemp(prefix="neuron-batch-tiny-model-"))
    # (one a process: each run left one in /tmp; a forked child inherits the hook, and only
    # the process that made the folder removes it)
    atexit.register(_remove_if_made_here, path, os.getpid())
    (path / "config.json").write_text(json.dumps({**TINY_LLAMA_CONFIG, "vocab_size": vocab_size}))
    return str(path)


def _remove_if_made_here(path: Path, pid: int) -> None:
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)


def make_scheduler(
    scheduler_cls: type,
    *,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 8192,
    max_model_len: int = 8192,
    num_blocks: int = 10_000,
    block_size: int = 32,
    enable_prefix_caching: bool = False,
    neuron_config: dict[str, Any] | None = None,
    neuron_batch_config: dict[str, Any] | None = None,
    async_scheduling: bool = False,
    kv_reserve: str | None = None,
    runtime: Runtime | None = None,
    tokenizer: str | None = None,
    vocab_size: int | None = None,
) -> Any:
    """A scheduler of `scheduler_cls` over a KV cache of `num_blocks` blocks. `kv_reserve`
    ("request" or "max_model_len") is put into `neuron_batch_config`; None: the default.
    `runtime` (runtimes/runtime.py's RUNTIMES; None: the scheduler's default, vllm-neuron) sets
    vLLM's chunking and token budget as the runtime needs them (nxdi: whole prompts, so
    `max_num_batched_tokens` is raised to max_model_len) and where `neuron_config` (the
    bucket lists by the runtime's keys) goes. `tokenizer` (a tokenizer's folder, with its
    `vocab_size`) gives vLLM's structured-output manager a tokenizer, so that constrained
    requests (`make_request(structured=...)`) get their grammars and bitmasks."""
    resolved = runtime or default_runtime()
    limits = resolved.engine_limits(max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                                    max_num_batched_tokens=max_num_batched_tokens)
    model_config = compat.model_config(
        model=tiny_model_dir(vocab_size or TINY_LLAMA_CONFIG["vocab_size"]),
        skip_tokenizer_init=tokenizer is None, max_model_len=max_model_len, dtype="float32",
        seed=0, **({"tokenizer": tokenizer} if tokenizer is not None else {}))
    scheduler_config = compat.scheduler_config(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=limits["max_num_batched_tokens"],
        max_model_len=max_model_len, enable_chunked_prefill=limits["enable_chunked_prefill"],
        is_encoder_decoder=False, async_scheduling=async_scheduling)
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching)
    additional: dict[str, Any] = {}
    if neuron_config is not None:
        additional[resolved.config_section] = neuron_config
    if runtime is not None:
        neuron_batch_config = {**(neuron_batch_config or {}), "runtime": resolved.name}
    if kv_reserve is not None:
        neuron_batch_config = {**(neuron_batch_config or {}), "kv_reserve": kv_reserve}
    if neuron_batch_config is not None:
        additional["neuron_batch"] = neuron_batch_config
    vllm_config = compat.cpu_vllm_config(model_config=model_config,
                                         scheduler_config=scheduler_config,
                                         cache_config=cache_config, additional_config=additional)
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], compat.full_attention_spec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    return scheduler_cls(
        vllm_config=vllm_config, kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        log_stats=False, **compat.scheduler_init_kwargs(block_size))


_request_ids = itertools.count()


def make_request(prompt_len: int, max_tokens: int, *, req_id: str | None = None,
                 prompt_token_ids: Sequence[int] | None = None, block_size: int = 32,
                 ignore_eos: bool = True, structured: dict[str, Any] | None = None) -> Request:
    """A request of `prompt_len` tokens that generates up to `max_tokens` tokens; `structured`
    (a structured-output form, inputs/structured.py) constrains it (its grammar is compiled
    when `drive` adds it) and lets EOS end it."""
    if prompt_token_ids is None:
        # Distinct ids per request so prefix caching only hits where a test wants it.
        base = next(_request_ids) * 7919
        prompt_token_ids = [3 + (base + i) % 1000 for i in range(prompt_len)]
    extra = {}
    if structured is not None:
        extra = compat.structured_output_kwargs(structured, backend="xgrammar")
        ignore_eos = False
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, **extra)
    if not ignore_eos:
        params.update_from_generation_config({}, EOS_TOKEN_ID)
    return compat.make_request(
        req_id if req_id is not None else f"req-{next(_request_ids)}",
        list(prompt_token_ids), params, EOS_TOKEN_ID, block_size)


def fake_model_output(scheduler_output: SchedulerOutput, requests: dict[str, Request],
                      token_id: int = 5, grammar_rows: dict[str, Any] | None = None
                      ) -> ModelRunnerOutput:
    """What a model runner would return: one sampled token for every request that reached
    the end of its prompt this step, none for a prefill chunk that did not. A request with a
    row of the step's grammar bitmask (`grammar_rows`, compat.grammar_rows) samples the
    lowest token the row allows, as a runner applying the mask to its logits would sample
    one of them."""
    req_ids = list(scheduler_output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    computed_before = _computed_before(scheduler_output)
    for req_id in req_ids:
        request = requests[req_id]
        done = computed_before[req_id] + scheduler_output.num_scheduled_tokens[req_id]
        # (num_prompt_tokens, not num_tokens: under async scheduling num_tokens lags behind
        # the placeholders already counted in num_computed_tokens.)
        row = (grammar_rows or {}).get(req_id)
        token = token_id if row is None else lowest_allowed(row)
        sampled.append([token] if done >= request.num_prompt_tokens else [])
    return compat.model_runner_output(req_ids=req_ids,
                                      req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                      sampled_token_ids=sampled)


def lowest_allowed(row: Any) -> int:
    """The lowest token id a grammar bitmask row allows (32 tokens a 32-bit word, bit j of
    word k is token 32k + j)."""
    words = np.asarray(row).astype(np.int64) & 0xFFFFFFFF
    nonzero = np.flatnonzero(words)
    if not len(nonzero):
        raise ValueError("the grammar allows no token")
    word = int(words[nonzero[0]])
    return int(nonzero[0]) * 32 + (word & -word).bit_length() - 1


def _computed_before(scheduler_output: SchedulerOutput) -> dict[str, int]:
    before = {new.req_id: new.num_computed_tokens for new in scheduler_output.scheduled_new_reqs}
    cached = scheduler_output.scheduled_cached_reqs
    before.update(zip(cached.req_ids, cached.num_computed_tokens))
    return before


@dataclass
class DriveResult:
    """What happened while driving a scheduler to completion."""

    outputs: list[SchedulerOutput] = field(default_factory=list)
    finished: dict[str, int] = field(default_factory=dict)   # req_id -> output tokens
    # per step kept: the req_ids of its grammar bitmask rows (constrained requests only)
    grammar_ids: list[set[str]] = field(default_factory=list)
    num_steps: int = 0


def drive(scheduler: Any, requests: Iterable[Request] = (), *, max_steps: int = 100_000,
          arrivals: dict[int, list[Request]] | None = None, keep_outputs: bool = True,
          overlap: bool = False,
          on_step: Callable[[SchedulerOutput], None] | None = None) -> DriveResult:
    """Run schedule -> fake output -> update_from_output until no request is left.

    `arrivals` maps a step number to requests added just before that step (requests arriving
    while others run). `overlap=True` drives the loop as vLLM's async engine does: step N+1 is
    scheduled before step N's output is applied. Raises RuntimeError if no request is left
    unfinished after `max_steps` steps (a deadlock or livelock), naming what was stuck.
    """
    result = DriveResult()
    added: dict[str, Request] = {}

    def add(request: Request) -> None:
        added[request.request_id] = request
        if request.structured_output_request is not None:
            # (the engine core does this before the scheduler sees the request)
            scheduler.structured_output_manager.grammar_init(request)
            compat.wait_for_grammar(request)
        scheduler.add_request(request)

    rows_of: dict[int, dict[str, Any]] = {}     # id(output) -> its grammar rows

    def apply(output: SchedulerOutput) -> None:
        model_output = fake_model_output(output, added, grammar_rows=rows_of.pop(id(output)))
        for client_outputs in scheduler.update_from_output(output, model_output).values():
            for out in client_outputs.outputs:
                if out.finish_reason is not None:
                    result.finished[out.request_id] = added[out.request_id].num_output_tokens

    for request in requests:
        add(request)
    pending_arrivals = dict(arrivals or {})
    in_flight: SchedulerOutput | None = None
    step = 0
    while scheduler.has_requests() or pending_arrivals or in_flight is not None:
        for request in pending_arrivals.pop(step, []):
            add(request)
        if step >= max_steps:
            raise RuntimeError(
                f"no completion after {max_steps} steps: {len(scheduler.waiting)} waiting, "
                f"{len(scheduler.running)} running, {len(result.finished)} finished")
        output = scheduler.schedule() if (scheduler.has_requests() or in_flight is None) else None
        if output is not None:
            # (what the engine core asks right after schedule(), before the model runs)
            rows_of[id(output)] = compat.grammar_rows(scheduler, output)
            if keep_outputs:
                result.grammar_ids.append(set(rows_of[id(output)]))
            if on_step is not None:
                on_step(output)
            if keep_outputs:
                result.outputs.append(output)
        if overlap:
            if in_flight is not None:
                apply(in_flight)
            in_flight = output
        elif output is not None:
            apply(output)
        step += 1
    result.num_steps = step
    return result
