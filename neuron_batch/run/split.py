"""`run --split-at N`: a batch job split by length into two compiled layouts, one after the other.

Under NxDI (inf2, trn1) the KV cache is static: `max_num_seqs` slots of `max_model_len` each, so
one long request sizes every slot for itself. A batch job knows every request's length before
it starts: the requests whose prompt + max_tokens fit in N run first in a layout compiled for
max_model_len N, with as many slots as fit there (on the simulated device under a static-KV
runtime; elsewhere the --max-num-seqs given), then the rest in the layout of --max-model-len
with --max-num-seqs. Each part is its own engine start (on a Neuron host, its own compile) and
its own attempt in the run folder (records-N.jsonl, a line in attempts.json with its `part`), so
`--resume` and the report work as for any run; the report adds `split`: each part's layout and
figures, and the compile time of both.

The first part takes its runtime's default buckets (the lists given are the long layout's: a
list must end at its own max_model_len). No vLLM import here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from neuron_batch.config import RunSettings
from neuron_batch.inputs.prepare import PreparedRequest
from neuron_batch.run.errors import RunError

SHORT, LONG = "short", "long"
#: The most slots the short layout is given (vLLM's own default max_num_seqs): past that a
#: static cache would only add idle slots to every decode step.
MAX_SHORT_SLOTS = 256


@dataclass(frozen=True)
class Part:
    """One layout of a split run and the requests it serves."""

    name: str                       # SHORT or LONG
    settings: RunSettings
    requests: list[PreparedRequest]

    def describe(self) -> dict[str, Any]:
        return {"part": self.name, "max_model_len": self.settings.max_model_len,
                "max_num_seqs": self.settings.max_num_seqs, "requests": len(self.requests)}


def request_length(request: PreparedRequest) -> int:
    """What a request can reach: its prompt plus every token it may generate."""
    return len(request.prompt_token_ids) + request.max_tokens


def check_split(settings: RunSettings, requests: list[PreparedRequest]) -> None:
    """RunError (exit 2, nothing run) for a cut no request fits under, or a request longer than
    every layout (named: a batch job never cuts one short)."""
    if not requests:
        return
    split_at = settings.split_at
    shortest = min(request_length(r) for r in requests)
    if split_at < shortest:
        raise RunError(f"--split-at {split_at:,} is below the shortest request (prompt + "
                       f"max_tokens = {shortest:,} tokens): no request would run in the short "
                       f"layout; choose a cut of at least {shortest:,}")
    # (a request whose max_tokens the input stage clamped to fit max_model_len is one too)
    too_long = [r for r in requests if r.max_tokens_clamped
                or request_length(r) > settings.max_model_len]
    if too_long:
        named = ", ".join(f"{r.record.id} ({request_length(r):,})" for r in too_long[:5])
        more = f" and {len(too_long) - 5} more" if len(too_long) > 5 else ""
        raise RunError(f"{len(too_long)} request(s) reach more than --max-model-len "
                       f"{settings.max_model_len:,} tokens (prompt + max_tokens): {named}{more}; "
                       f"raise --max-model-len (the long layout) or lower their max_tokens")


def short_layout_slots(settings: RunSettings, resolve_target, num_requests: int) -> int:
    """max_num_seqs of the short layout: on the simulated device under a static-KV runtime,
    every slot of split_at tokens that fits beside the weights, but no more than the part has
    requests (NxDI decodes every slot each step: an idle slot still reads its KV); elsewhere
    the one given."""
    if settings.device != "sim":
        return settings.max_num_seqs
    target = resolve_target(replace(settings, max_model_len=settings.split_at))
    slots = target.kv.get("max_static_seqs")
    if not slots:
        return settings.max_num_seqs
    return max(1, min(int(slots), MAX_SHORT_SLOTS, num_requests))


def plan_parts(settings: RunSettings, pending: list[PreparedRequest],
               resolve_target) -> list[Part]:
    """The parts of the pending requests, short first, empty parts left out.
    `resolve_target(settings)` resolves a simulated device (runner.resolve_sim_target)."""
    short = [r for r in pending if request_length(r) <= settings.split_at]
    long = [r for r in pending if request_length(r) > settings.split_at]
    runtime = settings.resolve_runtime()
    parts = []
    if short:
        short_settings = replace(settings, max_model_len=settings.split_at, split_at=None,
                                 max_num_seqs=short_layout_slots(settings, resolve_target,
                                                                 len(short)))
        # this layout's own default buckets (the lists given end at the long max_model_len)
        short_settings = short_settings.with_buckets(runtime, None, None, None)
        parts.append(Part(SHORT, short_settings.validate(), short))
    if long:
        parts.append(Part(LONG, replace(settings, split_at=None), long))
    return parts


def run_parts(job, parts: list[Part], attempt: int, generate, resolve_target
              ) -> Iterator[dict[str, Any]]:
    """Each part in its own engine, in turn, as attempts `attempt`, `attempt` + 1; yields
    their attempts.json lines (with `part`) as each ends, so a part that fails later cannot
    lose the record of one that finished. Stops after a part that did not finish."""
    for number, part in enumerate(parts, start=attempt):
        target = resolve_target(part.settings) if part.settings.device == "sim" else None
        part_job = replace(job, settings=part.settings, target=target)
        job.log(f"part {part.name}: {len(part.requests):,} requests at max_model_len "
                f"{part.settings.max_model_len:,}, max_num_seqs {part.settings.max_num_seqs} "
                f"(a separate engine start)")
        job.folder.open_outputs()       # (each engine's generate closes it when it ends)
        outcome = generate(part_job, part.requests, number)
        outcome["part"] = part.describe()
        if target is not None:
            shapes = part.settings.shapes(target.runtime)
            outcome["part"]["estimated_compile_s"] = target.describe(
                num_prefill_buckets=len(shapes.prefill_buckets),
                num_decode_buckets=len(shapes.decode_buckets),
                num_graphs=shapes.num_graphs)["compile"]["estimated_compile_s"]
            outcome["part"]["compiled_graphs"] = shapes.num_graphs
        yield outcome
        if outcome.get("ended") != "completed":      # interrupted, or past --max-runtime
            break
