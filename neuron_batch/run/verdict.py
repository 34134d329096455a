"""The verdict after a run: whether another submission order, prefix-caching choice or a
`max_num_seqs` that loads would have been faster (and so cheaper: the same instance, the
same price) by more than MARGIN, with the figure and the command; and what this run's order
bought, split into prefill saved and decode saved (issue 39: `--order prefix` looked like a
caching win and was the longest-first grouping).

The same step model as bench's sweep and auto's decision (layout/step_estimate.py) on this
run's requests, no second run: each alternative's steps plus the start-up its graphs take,
against the same estimate of the run as it ran, so the estimate's own error cancels. The
figure applies that ratio to the measured run time. Only for a run with a step model (the
simulated device, a Neuron host whose instance is known) that finished every request in one
layout (a split run's parts have their own). A job of more than SAMPLE requests is weighed on a
sample of them (`weighed_sample`: whole groups sharing a first KV block), its steps' time scaled
up, so the verdict costs the same at any size (report.json's verdict says `sampled`).
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from neuron_batch.choices import Order, prefix_caching_word
from neuron_batch.engine.engine import run_block_size
from neuron_batch.inputs.prepare import PreparedRequest, PromptTokens, in_order
from neuron_batch.job.job import Job, resolve_target
from neuron_batch.layout.step_estimate import block_chains, cache_hits, estimate
from neuron_batch.settings import RunSettings

if TYPE_CHECKING:
    from neuron_batch.device.target import Target

#: What a weighing is keyed by: (order, prefix caching, max_num_seqs).
_Key = tuple[str, bool, int]

#: The most requests the verdict weighs; a larger job is weighed on a sample of about this
#: many (`weighed_sample`), so its cost is bounded whatever the job's size (issue 46: 20 s, a
#: tenth of the run, at 100k requests before).
SAMPLE = 5_000

#: An alternative must beat the run by more than this share of its steps' time to be named
#: (the estimate matches
#: the simulated device's accounting to well under 1%, docs/measurements.md; a real device
#: differs more).
MARGIN = 0.02


@dataclass(frozen=True)
class Weighed:
    """One configuration of the run's requests on the step model."""

    order: str
    caching: bool
    max_num_seqs: int
    prefill_s: float
    decode_s: float
    startup_s: float        # this run's start-up of it: compiled fresh where not compiled yet
    load_s: float = 0.0     # its start-up once its graphs are compiled (a load)

    @property
    def steps_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def total_s(self) -> float:
        """Tonight: the compile counted where its graphs are not compiled already."""
        return self.steps_s + self.startup_s

    @property
    def steady_s(self) -> float:
        """Every night after: its graphs compiled (--compiled-artifacts keeps them)."""
        return self.steps_s + self.load_s

    @property
    def compile_s(self) -> float:
        return self.startup_s - self.load_s

    @property
    def flags(self) -> dict[str, str]:
        return {"--order": self.order, "--prefix-caching": prefix_caching_word(self.caching),
                "--max-num-seqs": str(self.max_num_seqs)}


def run_verdict(job: Job, elapsed_s: float | None, argv: list[str] | None = None
                ) -> dict[str, Any] | None:
    """{"lines": [{"text", "command"?}], "weighed", "wall_time_s"} for the report, or None where
    there is nothing to weigh. `elapsed_s`: the run's measured time (its steps)."""
    settings = job.settings
    if job.target is None or settings.split_at is not None or not elapsed_s:
        return None
    started = time.perf_counter()
    requests = job.workload.prepared.requests
    if not requests:
        return None
    block = run_block_size(settings, job.target)
    sample, scale_up = weighed_sample(requests, block)
    weighed = _weigh_all(job, settings, sample, scale_up)
    if not weighed:
        return None
    ran = weighed.get((str(settings.order), bool(settings.prefix_caching),
                       settings.max_num_seqs))
    if ran is None or ran.total_s <= 0:
        return None
    scale = elapsed_s / (ran.prefill_s + ran.decode_s) if ran.prefill_s + ran.decode_s else 1.0
    lines = []
    attribution = _order_attribution(ran, weighed, scale)
    if attribution:
        lines.append({"text": attribution})
    choice = choose(weighed.values(), ran)
    if choice.steady is not None:
        lines.append({"text": _better_words(choice.steady, ran, scale, choice.tonight),
                      "command": command_with(argv, settings, ran, choice.steady)})
    elif choice.tonight is not None:
        lines.append({"text": _tonight_only_words(choice.tonight, ran)})
    out = {"lines": lines, "wall_time_s": round(time.perf_counter() - started, 3),
           "weighed": [{**w.__dict__, "total_s": w.total_s} for w in weighed.values()]}
    if len(sample) < len(requests):
        out["sampled"] = {"requests": len(sample), "of": len(requests)}
    return out


@dataclass(frozen=True)
class Choice:
    """What the verdict names against the run (None: the run is as fast, within MARGIN):
    `steady`, the fastest once every layout's graphs are compiled (what a nightly job with
    --compiled-artifacts pays from its second night); `tonight`, the fastest with each
    layout's compile counted where its graphs are not compiled yet (the compile is paid
    once, so it decides only where it changes the answer, and then both are said)."""

    steady: Weighed | None
    tonight: Weighed | None


def choose(weighed: Iterable[Weighed], ran: Weighed) -> Choice:
    """THE verdict's weighing: the alternatives against the run, compile counted once."""
    # (noise is a share of the steps' time: a start-up both pay alike is not noise)
    noise = MARGIN * ran.steps_s
    options = list(weighed)
    steady = min(options, key=lambda w: (w.steady_s, w != ran))
    tonight = min(options, key=lambda w: (w.total_s, w != ran))
    return Choice(steady if steady != ran and ran.steady_s - steady.steady_s > noise else None,
                  tonight if tonight != ran and ran.total_s - tonight.total_s > noise else None)


def weighed_sample(requests: Sequence[PreparedRequest], block: int, most: int = SAMPLE
                   ) -> tuple[list[PreparedRequest], float]:
    """(the requests the verdict weighs, what their steps' time is multiplied by to stand
    for the job's): every request up to `most`; beyond, whole groups of requests that share
    their first KV block (a prompt shorter than a block is a group of its own), picked by the
    group's hash, 1 in round(n / most), so the sample keeps the prefix sharing the cache
    would find; where one group is most of the job (a system prompt every request shares),
    every k-th request instead, which keeps the lengths but not that group's sharing. Prompts
    that share nothing (`PromptTokens.share_nothing`: a token-count trace's) are each a group
    of their own: every k-th, none read but those."""
    n = len(requests)
    if n <= most:
        return list(requests), 1.0
    every = max(round(n / most), 2)
    if PromptTokens(requests).share_nothing(block):
        picked = list(requests[::every])
        return picked, n / len(picked)
    picked = [r for i, r in enumerate(requests)
              if hash(tuple(r.prompt_token_ids[:block]) if len(r.prompt_token_ids) >= block
                      else i) % every == 0]
    if not picked or len(picked) > 2 * most:
        picked = list(requests[::every])
    return picked, n / len(picked)


def _weigh_all(job: Job, settings: RunSettings, requests: Sequence[PreparedRequest],
               scale_up: float = 1.0) -> dict[_Key, Weighed]:
    """Every (order, caching, max_num_seqs) the verdict weighs, on the step model; `requests`
    a sample standing for `scale_up` times as many (`weighed_sample`): their steps' time is
    scaled up, and the prefix cache they share is the pool's share of them."""
    model_path = job.workload.model.path
    targets = {}
    for caching in (False, True):
        target = (job.target if bool(settings.prefix_caching) == caching
                  else resolve_target(settings.replace(prefix_caching=caching), model_path))
        if target is None:
            return {}
        targets[caching] = target
    block = run_block_size(settings, targets[False])
    runtime = targets[False].runtime
    orders = {o.value: in_order(requests, o.value, block_size=block, by_length=runtime.static_kv)
              for o in Order}
    # (a prompt's block hashes do not depend on the order: computed once)
    chain_of = dict(zip(map(id, requests),
                        block_chains(PromptTokens(requests), block)))
    out = {}
    for order, ordered in orders.items():
        lens = [r.prompt_len for r in ordered]
        outs = [r.max_tokens for r in ordered]
        chains = [chain_of[id(r)] for r in ordered]
        for caching, target in targets.items():
            for seqs in _slots(settings, target):
                try:
                    laid = target.with_layout(settings.max_model_len, seqs, warn=False)
                except ValueError:
                    continue
                shaped = settings.replace(prefix_caching=caching, max_num_seqs=seqs)
                shapes = shaped.shapes(runtime)
                pool = max(round(laid.pool_blocks / scale_up), 1)
                hits = cache_hits(lens, chains, block, capacity=pool) if caching else None
                chunk = settings.max_num_batched_tokens if runtime.chunked_prefill else None
                steps = estimate(laid.cost_model, shapes, lens, outs, hits, chunk)
                engines = max(settings.replicas, 1)
                start = laid.compile_s(shapes, compiled=_compiled(job, shaped, laid)) or 0.0
                load = laid.compile_s(shapes, compiled=True) or 0.0
                out[(order, caching, seqs)] = Weighed(order, caching, seqs,
                                                      steps.prefill_s * scale_up / engines,
                                                      steps.decode_s * scale_up / engines,
                                                      start, min(load, start))
    return out


def _slots(settings: RunSettings, target: Target) -> list[int]:
    """The run's max_num_seqs, half and twice it, and the most that load (a static cache:
    the slots that fit beside the weights); a paged cache only the run's own."""
    seqs = settings.max_num_seqs
    if not target.runtime.static_kv:
        return [seqs]
    most = target.static_slots(settings.max_model_len) or seqs
    return sorted({s for s in (seqs, seqs // 2, seqs * 2, most) if 1 <= s <= max(most, seqs)})


def _compiled(job: Job, settings: RunSettings, target: Target) -> bool:
    from neuron_batch.job.startup import layout_compiled

    return layout_compiled(settings, target, job.workload.model.path, ())


def _order_attribution(ran: Weighed, weighed: dict[_Key, Weighed], scale: float) -> str:
    """What this run's order bought against input order (same caching and slots), by phase."""
    if ran.order == Order.INPUT.value:
        return ""
    base = weighed.get((Order.INPUT.value, ran.caching, ran.max_num_seqs))
    if base is None:
        return ""
    prefill = (base.prefill_s - ran.prefill_s) * scale
    decode = (base.decode_s - ran.decode_s) * scale
    gained = prefill + decode
    if abs(gained) < MARGIN * (base.prefill_s + base.decode_s) * scale:
        return (f"--order {ran.order} ran about as fast as input order would have "
                f"(prefill {_signed(prefill)}, decode {_signed(decode)} saved)")
    where = ("the prefill it saved (the prefix cache's hits)" if prefill > decode else
             "the decode it saved (like lengths decoding together), not the cache's hits"
             if ran.caching else "the decode it saved (like lengths decoding together)")
    return (f"--order {ran.order} saved about {_signed(gained)} against input order (prefill "
            f"{_signed(prefill)}, decode {_signed(decode)} saved): the gain is {where}")


def _changed(best: Weighed, ran: Weighed) -> str:
    return " ".join(f"{flag} {value}" for flag, value in best.flags.items()
                    if ran.flags[flag] != value)


def _better_words(best: Weighed, ran: Weighed, scale: float,
                  tonight: Weighed | None = None) -> str:
    """`best` (the fastest once compiled) against the run; where counting this night's
    compile changes the answer, both figures."""
    now, then = ran.steps_s * scale, best.steps_s * scale
    prefill = (ran.prefill_s - best.prefill_s) * scale
    decode = (ran.decode_s - best.decode_s) * scale
    startup = ran.startup_s - best.startup_s
    words = (f"{_changed(best, ran)} would have been faster and cheaper: about {_seconds(then)} "
             f"of steps instead of {_seconds(now)} (prefill {_signed(prefill)}, decode "
             f"{_signed(decode)} saved")
    if tonight == best:     # the compile does not change the answer: one figure
        return (words + (f", start-up {_signed(startup)} saved" if abs(startup) >= 1 else "")
                + f"; {1 - best.total_s / ran.total_s:.0%} less with the start-up), by the "
                f"step model on this run's requests")
    # The compile decides tonight's answer: its graphs are not compiled yet (or this run's
    # are). Both figures, the compile once and every night after.
    tonight_share = 1 - best.total_s / ran.total_s
    return (words + f"; {1 - best.steady_s / ran.steady_s:.0%} less a night once its graphs "
            f"are compiled, {_percent_words(tonight_share)} the first night, counting its "
            f"compile of {_seconds(best.compile_s)} once), by the step model on this run's "
            f"requests")


def _percent_words(share: float) -> str:
    return f"{share:.0%} less" if share >= 0 else f"{-share:.0%} more"


def _tonight_only_words(tonight: Weighed, ran: Weighed) -> str:
    """A layout faster tonight only because this run compiled its graphs and that one's are
    compiled already: once compiled, this run's layout is as fast or faster."""
    return (f"{_changed(tonight, ran)} would have been faster tonight only, by the compile "
            f"this run paid ({_seconds(ran.compile_s)}; its graphs are compiled already): "
            f"once this run's graphs are compiled too, its layout is as fast or faster, so "
            f"keep it")


def command_with(argv: list[str] | None, settings: RunSettings, ran: Weighed, best: Weighed
                 ) -> str:
    """The command that runs `best`: this run's own command line (`argv`, else sys.argv
    when it ran `neuron-batch run`) with the changed options replaced and its --output,
    --resume and --restart left out (a new folder); without one, the inputs and the changes."""
    argv = argv if argv is not None else _invocation()
    changes = {flag: value for flag, value in best.flags.items() if ran.flags[flag] != value}
    if argv is None:
        words = ["neuron-batch", "run", *settings.inputs, "..."]
    else:
        words = ["neuron-batch", *_without(argv, set(changes) | {"--output", "-o"},
                                           {"--resume", "--restart"})]
    for flag, value in changes.items():
        words += [flag, value]
    return " ".join(shlex.quote(w) if w != "..." else w for w in words)


def _invocation() -> list[str] | None:
    args = sys.argv[1:]
    return args if args[:1] == ["run"] and sys.argv[0].endswith("neuron-batch") else None


def _without(argv: list[str], valued: set[str], flags: set[str]) -> list[str]:
    """`argv` less the options in `valued` (with their value) and `flags`; --prefix-caching's
    value is optional, and --no-prefix-caching goes with it."""
    out, skip = [], False
    for index, word in enumerate(argv):
        if skip:
            skip = False
            continue
        name = word.split("=", 1)[0]
        if name in flags or (name == "--no-prefix-caching" and "--prefix-caching" in valued):
            continue
        if name in valued:
            if "=" not in word:
                following = argv[index + 1] if index + 1 < len(argv) else None
                skip = following is not None and (name != "--prefix-caching"
                                                  or following in ("auto", "on", "off"))
            continue
        out.append(word)
    return out


def _seconds(seconds: float) -> str:
    seconds = abs(seconds)
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds:,.0f} s"


def _signed(seconds: float) -> str:
    return ("-" if seconds < 0 else "") + _seconds(seconds)
