"""`run --split-at N`, the rules: which requests each of two compiled layouts serves, its slots
and buckets, and which cut and placement an estimate prefers (run/split_parts.py runs the parts).

Under NxDI (inf2, trn1) the KV cache is static: `max_num_seqs` slots of `max_model_len` each, so
one long request sizes every slot for itself. A batch job knows every request's length before
it starts: the requests whose prompt + max_tokens fit in N run first in a layout compiled for
max_model_len N, with as many slots as fit there (on the simulated device under a static-KV
runtime; elsewhere the --max-num-seqs given), then the rest in the layout of --max-model-len
with --max-num-seqs. Each part is its own engine start (on a Neuron host, its own compile) and
its own attempt in the run folder (records-N.jsonl, a line in attempts.json with its `part`), so
`--resume` and the report work as for any run; the report adds `split`: each part's layout and
figures, and the compile time of both. With --replicas each part runs across every replica, one
part after the other (records-N-rK.jsonl per replica; a part's elapsed time is its slowest
replica's on the simulated device), and the short layout's slots are capped at a replica's share
of its requests.

Buckets: under a runtime of whole prompts (nxdi) each layout's context-encoding and
token-generation lists are fitted to its own requests (the exact optimiser over their prompt
lengths and their lengths, as many buckets as NxDI's default for that max_model_len, so no more
graphs to compile): a default list is powers of two, and a cut just above one (2176) would pad
every prompt past 1024 to the cut. Lists the user gave are the long layout's (a list must end at
its own max_model_len). A chunked runtime (vllm-neuron) keeps its defaults: its buckets are over
chunks and batch sizes, not over what a split sorts by. No vLLM import here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_batch.errors import RunError
from neuron_batch.inputs.job_requests import lengths_of, over_length, split_by_length
from neuron_batch.inputs.prepare import PreparedRequest
from neuron_batch.layout.optimiser import optimal_buckets
from neuron_batch.layout.placement import (
    AUTO,
    IN_TURN,
    SIDE_BY_SIDE,
    PartTime,
    SplitPlacement,
    choose,
)
from neuron_batch.runtimes.buckets import nxdi_default_buckets, round_model_len
from neuron_batch.runtimes.runtime import Runtime
from neuron_batch.settings import RunSettings

SHORT, LONG = "short", "long"
#: Cuts are multiples of this (the KV block granularity `plan` rounds max_model_len to).
CUT_STEP = 128
#: The most slots the short layout is given (vLLM's own default max_num_seqs): past that a
#: static cache would only add idle slots to every decode step.
MAX_SHORT_SLOTS = 256


@dataclass(frozen=True)
class Part:
    """One layout of a split run and the requests it serves."""

    name: str                       # SHORT or LONG
    settings: RunSettings
    requests: Sequence[PreparedRequest]     # a streamed job's view (nothing held), or a list

    def describe(self) -> dict[str, Any]:
        shapes = self.settings.shapes()
        compiled = {option.key: list(value) for option, value in (
            (shapes.runtime.prefill, shapes.prefill_buckets),
            (shapes.runtime.decode, shapes.decode_buckets),
            (shapes.runtime.attention, shapes.attention_buckets)) if option and value}
        return {"part": self.name, "max_model_len": self.settings.max_model_len,
                "max_num_seqs": self.settings.max_num_seqs, "requests": len(self.requests),
                "buckets": compiled}


def fitted_buckets(runtime: Runtime, prompt_lens: Sequence[int], lengths: Sequence[int],
                   max_model_len: int
                   ) -> tuple[tuple[int, ...] | None, None, tuple[int, ...] | None]:
    """(prefill, decode, attention) lists for a layout of `max_model_len` serving requests of
    these prompt lengths and lengths (prompt + max_tokens): under whole-prompt prefill the
    optimiser's least-padding lists over each (a decode step attends the bucket of its longest
    request, which reaches its length at its last token), as many as NxDI's default for
    `max_model_len`; None (the runtime's default) for a chunked runtime or no requests."""
    if runtime.chunked_prefill or not prompt_lens:
        return None, None, None
    count = len(nxdi_default_buckets(max_model_len))
    prompts = Counter(min(p, max_model_len) for p in prompt_lens)
    reach = Counter(min(n, max_model_len) for n in lengths)
    return (tuple(optimal_buckets(prompts, count, max_model_len).buckets), None,
            tuple(optimal_buckets(reach, count, max_model_len).buckets))


def fitted_count(sizes: Collection[int], count: int, maximum: int) -> int:
    """How many buckets `fitted_buckets` gives for these sizes, without solving: the
    optimiser's least-padding list of at most `count` buckets (ties: fewer) has one per
    distinct size below `maximum` plus `maximum`, or `count` when that is fewer (each further
    bucket takes padding off some size). tests/layout/test_split_cuts.py checks it against the
    optimiser."""
    return min(count, len({s for s in sizes if s < maximum}) + 1)


def fitted_to(runtime: Runtime, requests: Sequence[PreparedRequest], max_model_len: int):
    """`fitted_buckets` for these requests."""
    prompts, outputs = lengths_of(requests)
    return fitted_buckets(runtime, prompts, [p + o for p, o in zip(prompts, outputs)],
                          max_model_len)


def cut_candidates(lengths: Sequence[int], slots_at, max_model_len: int, step: int = 128
                   ) -> list[tuple[int, int]]:
    """The cuts worth weighing, as (cut, short-layout slots): for each number of slots
    `slots_at(N)` gives over the multiples of `step` below `max_model_len`, the largest N with
    that many (the same layout holds more of the requests), while some request fits under N
    and some does not. Under a static KV cache the slots fall as N grows, so these are where
    the trade between slots and requests served changes."""
    ordered = sorted(lengths)
    if not ordered:
        return []
    first = -(-ordered[0] // step) * step
    out: list[tuple[int, int]] = []
    for cut in range(first, max_model_len, step):
        if cut >= ordered[-1]:          # nothing left for the long layout
            break
        slots = slots_at(cut)
        if out and out[-1][1] == slots:
            out[-1] = (cut, slots)
        else:
            out.append((cut, slots))
    return out


def choose_cut(settings: RunSettings, requests: Sequence[PreparedRequest], slots_at, estimate
               ) -> tuple[int | None, str]:
    """`--split-at auto`: the cut whose split the estimate (placement.BoundEstimate) finishes
    soonest, the start-up of both layouts (and their placement on --replicas) included, over
    every candidate (`cut_candidates`); None when the single layout of the settings as given
    is as fast. Each layout's start-up counts its compile only when it is not compiled yet
    (BoundEstimate.compile_of); the line returned says so, and when the choice would differ
    were every layout compiled fresh, or every one compiled before, it says that too."""
    runtime = settings.resolve_runtime()
    if not runtime.static_kv or not requests:
        return None, (f"--split-at auto: no split (the {runtime.name} runtime's paged KV cache "
                      f"does not size its slots by max_model_len)")
    best, best_s, single_s = _best_cut(settings, requests, slots_at, estimate)
    words = (f"--split-at auto: no split: one layout is estimated fastest "
             f"({single_s / 3600:.2f} h with its start-up)" if best is None else
             f"--split-at auto: {best:,} ({best_s / 3600:.2f} h with both layouts' start-up, "
             f"against {single_s / 3600:.2f} h for one layout, as estimated)")
    words += f"; {_compile_assumption(settings, requests, slots_at, estimate, best)}"
    others = []
    for compiled, when in ((False, "compiled fresh every run"),
                           (True, "compiled before (loaded only)")):
        other = _best_cut(settings, requests, slots_at, estimate.assuming(compiled))[0]
        if other != best:
            others.append(f"{_cut_words(other)} if every layout is {when}")
    if others:
        words += f". {_cut_words(best).capitalize()} as things stand; " + ", ".join(others)
    return best, words


def _best_cut(settings: RunSettings, requests: Sequence[PreparedRequest], slots_at, estimate
              ) -> tuple[int | None, float, float]:
    """(best cut or None, its estimated seconds, the single layout's) under `estimate`."""
    from bisect import bisect_right

    single = Part(LONG, settings.replace(split_at=None, split_placement=AUTO).validate(),
                  requests)
    single_s = estimate.seconds(single) + (estimate.compile_of(single) or 0.0)
    prompts, outputs = lengths_of(requests)
    ordered = sorted(p + o for p, o in zip(prompts, outputs))

    def slots(cut: int) -> int:
        return short_layout_slots(settings.replace(split_at=cut), slots_at,
                                  bisect_right(ordered, cut))

    best, best_s, runtime = None, single_s, settings.resolve_runtime()
    for cut, _ in cut_candidates(ordered, slots, settings.max_model_len, CUT_STEP):
        parts, placement = plan_parts(settings.replace(split_at=cut), requests, slots_at,
                                      estimate, runtime=runtime)
        total = placement.estimated_s if placement.estimated_s is not None else sum(
            estimate.seconds(p) + (estimate.compile_of(p) or 0.0) for p in parts)
        if total < best_s:
            best, best_s = cut, total
    return best, best_s, single_s


def placement_note(settings: RunSettings, pending: Sequence[PreparedRequest], slots_at, estimate,
                   placement: SplitPlacement) -> str:
    """"" when the parts' placement does not rest on the start-up; else what it would be were
    every layout compiled fresh, or every one compiled before."""
    if estimate is None or placement.estimated_s is None:
        return ""
    others = []
    for compiled, when in ((False, "compiled fresh every run"),
                           (True, "compiled before (loaded only)")):
        other = plan_parts(settings, pending, slots_at, estimate.assuming(compiled))[1]
        if other.mode != placement.mode:
            others.append(f"{other.mode} if every layout is {when}")
    return "; " + ", ".join(others) if others else ""


def _cut_words(cut: int | None) -> str:
    return "no split" if cut is None else f"split at {cut:,}"


def _compile_assumption(settings: RunSettings, requests, slots_at, estimate,
                        cut: int | None) -> str:
    """Which of the chosen layouts' start-ups count a compile (compiled fresh) and which a
    load only (compiled before: --compiled, or the artifacts folder holds them)."""
    if cut is None:
        parts = [Part(LONG, settings.replace(split_at=None, split_placement=AUTO).validate(),
                      requests)]
    else:
        parts = plan_parts(settings.replace(split_at=cut), requests, slots_at, estimate)[0]
    states = []
    for part in parts:
        loaded = estimate.compile_of(part) == estimate.assuming(True).compile_of(part)
        states.append(f"{part.name if cut is not None else 'the layout'} "
                      f"{'compiled before: load only' if loaded else 'compiled fresh'}")
    return "start-up counted: " + ", ".join(states)


def resolved_cut(settings: RunSettings) -> int:
    """The run's --split-at as tokens: a part is planned only once `auto` is resolved to its
    cut (a bug otherwise, not a user's error)."""
    cut = settings.split_at
    if not isinstance(cut, int):
        raise TypeError(f"--split-at {cut!r} is planned before it is resolved to tokens")
    return cut


def check_split(settings: RunSettings, requests: Sequence[PreparedRequest]) -> None:
    """RunError (exit 2, nothing run) for a cut no request fits under, or a request longer than
    every layout (named: a batch job never cuts one short)."""
    if not requests:
        return
    split_at = resolved_cut(settings)
    shortest = min(p + o for p, o in zip(*lengths_of(requests)))
    if split_at < shortest:
        raise RunError(f"--split-at {split_at:,} is below the shortest request (prompt + "
                       f"max_tokens = {shortest:,} tokens): no request would run in the short "
                       f"layout; choose a cut of at least {shortest:,} (--split-at {shortest})")
    # (a request whose max_tokens the input stage clamped to fit max_model_len is one too)
    too_long = list(over_length(requests, settings.max_model_len))
    if too_long:
        # What they ask for, before the input stage clamped max_tokens to fit.
        reach = {r.record.id: r.prompt_len
                 + max(r.max_tokens, r.record.max_tokens or 0) for r in too_long}
        named = ", ".join(f"{r.record.id} ({reach[r.record.id]:,})" for r in too_long[:5])
        more = f" and {len(too_long) - 5} more" if len(too_long) > 5 else ""
        raise RunError(f"{len(too_long)} request(s) reach more than --max-model-len "
                       f"{settings.max_model_len} tokens (prompt + max_tokens): {named}{more}; "
                       f"raise it for the long layout (--max-model-len "
                       f"{round_model_len(max(reach.values()))} holds them all) or lower their "
                       f"max_tokens")


def short_layout_slots(settings: RunSettings, slots_at, num_requests: int) -> int:
    """max_num_seqs of the short layout: under a static-KV runtime, every slot of split_at
    tokens that fits beside the weights (`slots_at(split_at)`: the run's Target.static_slots,
    on the simulated device or on a Neuron host whose instance and model shape are known), but
    no more than one engine has requests (NxDI decodes every slot each step: an idle slot
    still reads its KV): the part's, or with --replicas R about a replica's share of them,
    ceil(requests / R); when that cannot be told (`slots_at` None, or it says None), the
    --max-num-seqs given."""
    slots = slots_at(resolved_cut(settings)) if slots_at is not None else None
    if not slots:
        return settings.max_num_seqs
    per_engine = -(-num_requests // settings.replicas) if settings.uses_ray else num_requests
    return max(1, min(int(slots), MAX_SHORT_SLOTS, per_engine))


def short_part(settings: RunSettings, requests: Sequence[PreparedRequest], slots_at,
               engines: int, runtime: Runtime) -> Part:
    """The short layout for `requests` served by `engines` engines (its slots are capped at
    an engine's share), under the run's `runtime`."""
    cut = resolved_cut(settings)
    short = settings.replace(max_model_len=cut, split_at=None,
                             split_placement=AUTO)       # (a part is not split again)
    short = short.replace(replicas=engines, max_num_seqs=short_layout_slots(
        settings.replace(replicas=engines), slots_at, len(requests)))
    short = short.with_buckets(runtime, *fitted_to(runtime, requests, cut))
    return Part(SHORT, short.validate(), requests)


def long_part(settings: RunSettings, requests: Sequence[PreparedRequest], engines: int,
              runtime: Runtime) -> Part:
    """The long layout (--max-model-len, --max-num-seqs) for `requests` on `engines` engines,
    under the run's `runtime`."""
    long = settings.replace(split_at=None, split_placement=AUTO, replicas=engines)
    if not any(settings.bucket_lists().values()):     # the user's lists win
        long = long.with_buckets(runtime, *fitted_to(runtime, requests, settings.max_model_len))
    return Part(LONG, long.validate(), requests)


def plan_parts(settings: RunSettings, pending: Sequence[PreparedRequest], slots_at,
               estimate=None, *, runtime: Runtime | None = None
               ) -> tuple[list[Part], SplitPlacement]:
    """The parts of the pending requests, short first, empty parts left out, and where they
    run (placement.py: in turn, or side by side on --replicas as --split-placement and
    `estimate` say). `slots_at(max_model_len)`: the static slots of that length that load
    (the run's Target.static_slots), None when unknown. `estimate`: a
    placement.BoundEstimate, or None when the device has no step-time model. `runtime`: the
    run's (default: the one `settings` decided)."""
    runtime = runtime or settings.resolve_runtime()
    cut = resolved_cut(settings)
    short, long = split_by_length(pending, cut)
    replicas = settings.replicas
    parts = ([short_part(settings, short, slots_at, replicas, runtime)] if short else []) + \
        ([long_part(settings, long, replicas, runtime)] if long else [])
    if len(parts) < 2 or not settings.uses_ray:
        return parts, SplitPlacement(IN_TURN, replicas)

    def on(part: Part, engines: int) -> Part:
        """`part` on `engines` engines: its buckets stay (fitted to its requests, whoever
        serves them); the short layout's slots follow an engine's share."""
        changed = part.settings.replace(replicas=engines)
        if part.name == SHORT:
            changed = changed.replace(max_num_seqs=short_layout_slots(
                settings.replace(replicas=engines), slots_at, len(part.requests)))
        return Part(part.name, changed.validate(), part.requests)

    def timed(part: Part) -> PartTime:
        if estimate is None:
            return PartTime(0.0, None)
        return PartTime(estimate.compile_of(part) or 0.0,
                        lambda n: estimate.seconds(on(part, n)))

    placement = choose(settings.split_placement, replicas,
                       estimate.per_instance if estimate is not None else replicas,
                       *(timed(part) for part in parts))
    if placement.mode == SIDE_BY_SIDE:
        k = placement.short_replicas
        parts = [on(parts[0], k), on(parts[1], replicas - k)]
    return parts, placement
