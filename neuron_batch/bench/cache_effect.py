"""What prefix caching did in one run, from its records: prompt tokens served from vLLM's
prefix cache, the time its prefills and decodes took, and of the decodes the block-KV gather
NxDI pays on NeuronCore-v2 (the cost model's share of each recorded step). Also what an
unbounded cache could serve the whole job (inputs/shared_prefix.py `shared_prefix_tokens`). Read by
the sweep (one `prefix` dict per configuration) and by plan. Pure Python (no vLLM).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from neuron_batch.inputs.shared_prefix import DEFAULT_BLOCK, shared_prefix_tokens
from neuron_batch.scheduler.records import DECODE, PREFILL, iter_records
from neuron_batch.settings import RunSettings


def job_bound(prompts: Sequence[Sequence[int]], block: int = DEFAULT_BLOCK) -> dict[str, int]:
    """{"prompt_tokens", "bound_tokens"}: the job's prompt tokens, and how many of them an
    unbounded prefix cache of `block`-token blocks serves at most (0: nothing is shared)."""
    return {"prompt_tokens": sum(len(p) for p in prompts),
            "bound_tokens": shared_prefix_tokens(prompts, block)}


def run_figures(run_dir: str | Path, settings: RunSettings) -> dict[str, Any] | None:
    """The prefix-cache figures of a finished run in `run_dir`: {"prefix_caching", "order",
    "prompt_tokens", "hit_tokens", "hit_fraction", "recomputed_tokens", "prefill_s",
    "decode_s", "gather_s"}; None when it left no records. `gather_s` is the part of the
    decode steps' time the simulated device charged for gathering block KV (0 elsewhere, and
    on a real device, whose records do not split it)."""
    paths = sorted(Path(run_dir).glob("records-*.jsonl"))
    if not paths:
        return None
    model = _cost_model(settings)
    prompt = hits = recomputed = 0
    prefill_s = decode_s = gather_s = 0.0
    for path in paths:
        for kind, record in iter_records(path):     # (streamed: the steps are never all held)
            if kind == "request":
                prompt += record.num_prompt_tokens
                hits += record.num_cached_tokens
            if kind != "step":
                continue
            step = record
            took = (step.t_end - step.t_start) if step.t_end is not None else 0.0
            if step.kind == PREFILL:
                prefill_s += took
                recomputed += step.recomputed_tokens
            elif step.kind == DECODE:
                decode_s += took
                if model is not None:
                    gather_s += _gather_seconds(model, step)
    return {"prefix_caching": bool(settings.prefix_caching), "order": str(settings.order),
            "prompt_tokens": prompt, "hit_tokens": hits,
            "hit_fraction": hits / prompt if prompt else 0.0,
            "recomputed_tokens": recomputed, "prefill_s": prefill_s, "decode_s": decode_s,
            "gather_s": gather_s}


def _cost_model(settings: RunSettings):
    """The simulated device's step-time model of the run (None off the simulated device, or
    where it does not gather block KV: nothing to split off)."""
    from neuron_batch.errors import RunError
    from neuron_batch.job.job import resolve_target

    if not settings.simulated:
        return None
    try:
        target = resolve_target(settings, None)
    except RunError:
        return None
    if target is None or not target.cost_model.gathers_block_kv:
        return None
    return target.cost_model


def _gather_seconds(model, step) -> float:
    """The part of a recorded decode step's time that gathered block KV: its time as charged,
    less the same step without the gather."""
    padded = step.num_seqs_padded or step.num_seqs
    gathered = model.gathered_tokens(padded, step.attended_len)
    if not gathered:
        return 0.0
    kv = model.decode_kv_tokens(padded, step.attended_len, step.context_tokens)
    return model.decode_time(padded, kv, gathered) - model.decode_time(padded, kv)
