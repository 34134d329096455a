"""`--prefix-caching auto`: whether vLLM's prefix cache pays for this job on this layout, and
why, decided once before anything loads. The one decision run makes (run/prefix_auto.py)
and the one the verdict after a run weighs (run/verdict.py). Pure Python.

- Nothing shared (an unbounded cache of the run's blocks would serve no prompt token,
  inputs/shared_prefix.py `shared_prefix_tokens`): off, everywhere. Caching would only cost.
- A device with a step-time model (the simulated one, a Neuron host whose instance is known):
  the job's steps on it with caching and without (layout/step_estimate.py: the hits in the
  submission order against the pool, NxDI's prefill x prefix grid, NeuronCore-v2's gather of
  block KV before every decode) plus the start-up each layout's graphs take
  (device/compile_time.py; none when they are compiled already). On when that is shorter by
  more than LEVEL_SHARE. The gather has no published figure (device/cost_model.py models it as
  twice the attended KV traffic): the decision says whether it would flip with that term at
  zero or doubled.
- The CPU (and a GPU): vLLM's own cache costs a hash per block and no compiled shape, so it is
  on wherever a block is shared.
- A Neuron host without a step model (its instance unknown): on where at least
  UNMODELLED_SHARE of the prompt tokens could be served; AWS's trn2 table (neuron-runtimes.md,
  "Prefix caching under NxDI") shows ~25% hits already paying in TTFT and 0% costing 2%.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from neuron_batch.choices import prefix_caching_word
from neuron_batch.inputs.prepare import prompt_lengths
from neuron_batch.inputs.shared_prefix import shared_prefix_tokens
from neuron_batch.layout.step_estimate import Estimate, cache_hits, estimate, iter_block_chains
from neuron_batch.settings import RunSettings

#: Estimates closer than this share of the steps' time (without caching) are level: the cache
#: (its graphs, its gather) is not worth it (bench's verdict on measured runs,
#: bench/prefix_verdict.py, takes the same share of throughput).
LEVEL_SHARE = 0.005
#: Without a step model, the share of prompt tokens a cache must be able to serve.
UNMODELLED_SHARE = 0.25


@dataclass(frozen=True)
class PrefixDecision:
    """What a run does with vLLM's prefix cache, and why (report.json, run.json, summary)."""

    asked: str                      # "auto", "on" or "off"
    enable: bool
    reason: str                     # one sentence
    figures: dict[str, Any] = field(default_factory=dict)   # what it rests on, by name
    gather: str | None = None       # whether it flips with the gather at zero or doubled

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrefixDecision:
        return cls(**{k: data[k] for k in ("asked", "enable", "reason", "figures", "gather")
                      if k in data})

    @property
    def words(self) -> str:
        """"auto: off, <reason>", or "on, as asked" (the summary's line, for a log)."""
        state = prefix_caching_word(self.enable)
        return ((f"auto: {state}" if self.asked == "auto" else state)
                + (f", {self.reason}" if self.reason else "")
                + (f"; {self.gather}" if self.gather else ""))


def forced(settings: RunSettings) -> PrefixDecision:
    """The decision of a run that named it (--prefix-caching on/off, --no-prefix-caching)."""
    word = prefix_caching_word(settings.prefix_caching)
    return PrefixDecision(word, bool(settings.prefix_caching), "as asked"
                          + (" (--prefix-buckets shape its grid)"
                             if settings.prefix_buckets is not None else ""))


def platform_off(runtime) -> PrefixDecision:
    """Auto's decision under a runtime whose platform turns the cache off (optimum-neuron's
    `check_and_update_config`): off, with nothing to weigh."""
    return PrefixDecision("auto", False, f"the {runtime.name} runtime's platform turns prefix "
                          f"caching off")


def decide(settings: RunSettings, prompts: Sequence[Sequence[int]], output_lens: Sequence[int],
           *, block: int, targets: tuple[Any, Any] | None = None,
           compiled: tuple[bool, bool] = (False, False), neuron: bool = False,
           bound: int | None = None, bound_error: int = 0) -> PrefixDecision:
    """Auto's decision for `prompts` (token ids, in submission order) and their output
    lengths, on `targets` = (the device without caching, with it) (device/target.py Target;
    None: no step model), whose graphs are `compiled` already (without, with). `neuron`: a
    Neuron host (without a step model the cache is weighed by UNMODELLED_SHARE). `bound`: the
    prompts' `shared_prefix_tokens`, where the caller counted it already (a pass over every
    prompt's tokens); `bound_error`: one standard error of it where it was estimated (within
    two of 0, it is taken as 0)."""
    prompt_tokens = sum(prompt_lengths(prompts))    # (a streamed job's: from its arrays)
    if bound is None:
        bound = shared_prefix_tokens(prompts, block)
    figures: dict[str, Any] = {"prompt_tokens": prompt_tokens, "bound_tokens": bound,
                               "block_size": block}
    if bound == 0:
        return PrefixDecision("auto", False, f"the prompts share no KV block of {block} tokens "
                              f"(an unbounded cache would serve 0 of {prompt_tokens:,} prompt "
                              f"tokens), so caching would only cost", figures)
    if bound <= 2 * bound_error:
        # (past its exact count the bound is estimated, inputs/prefix_bound.py: a job that
        # shares nothing reads as a little; weighing it walks every prompt again, for text a
        # second tokenization of the whole job, to find what the estimate cannot tell from 0)
        figures["bound_error_tokens"] = bound_error
        return PrefixDecision("auto", False, f"the prompts share no KV block of {block} tokens "
                              f"that the bound's estimate can tell from none ({bound:,} +- "
                              f"{bound_error:,} of {prompt_tokens:,} prompt tokens), so caching "
                              f"would only cost", figures)
    share = bound / prompt_tokens
    if targets is None or None in targets:
        if not neuron:
            return PrefixDecision("auto", True, f"an unbounded cache could serve {share:.1%} "
                                  f"of the prompt tokens and vLLM's CPU cache costs a hash "
                                  f"per block, no compiled graph", figures)
        enable = share >= UNMODELLED_SHARE
        return PrefixDecision("auto", enable, f"an unbounded cache could serve {share:.1%} of "
                              f"the prompt tokens ({'at least' if enable else 'below'} "
                              f"{UNMODELLED_SHARE:.0%}, with no step model of this host: give "
                              f"--instance to weigh it)", figures)
    weighed = weigh(settings, prompts, output_lens, block=block, targets=targets,
                    compiled=compiled)
    figures.update(weighed)
    on_s, off_s = weighed["on_total_s"], weighed["off_total_s"]
    level = LEVEL_SHARE * weighed["off_steps_s"]
    enable = _pays(on_s, off_s, level)
    reason = (f"the step model gives {_pair(on_s, off_s)} (with it against without, start-up "
              f"included: {_because(figures)})")
    reason = ("it pays on this layout: " if enable else "it does not pay on this layout: ") \
        + reason
    gather = None
    if weighed["gather_s"]:
        flips = {scale: _pays(weighed[f"on_total_s_gather_{scale}"], off_s, level) != enable
                 for scale in ("0", "2")}
        gather = ("the block-KV gather (no published figure; modelled as twice the attended "
                  f"KV traffic) {_flip_words(flips, enable)}")
    return PrefixDecision("auto", enable, reason, figures, gather)


def weigh(settings: RunSettings, prompts: Sequence[Sequence[int]], output_lens: Sequence[int],
          *, block: int, targets: tuple[Any, Any], compiled: tuple[bool, bool] = (False, False)
          ) -> dict[str, Any]:
    """The step model's figures for the job with caching off and on (seconds: one engine's
    share of the steps when `settings.replicas` engines serve it, plus the start-up)."""
    lens = prompt_lengths(prompts)
    out: dict[str, Any] = {}
    engines = max(settings.replicas, 1)
    # (made as the caching case's hits walk them: no prompt's chain is held, only the cache's
    # blocks, at most the target's pool)
    chains = iter_block_chains(prompts, block)
    for caching, target, ready in zip((False, True), targets, compiled):
        shapes = settings.replace(prefix_caching=caching).shapes(target.runtime)
        hits = (cache_hits(lens, chains, block, capacity=target.pool_blocks)
                if caching else None)
        chunk = settings.max_num_batched_tokens if target.runtime.chunked_prefill else None
        steps = estimate(target.cost_model, shapes, lens, output_lens, hits, chunk)
        start = target.compile_s(shapes, compiled=ready) or 0.0
        key = "on" if caching else "off"
        out.update({f"{key}_prefill_s": round(steps.prefill_s, 3),
                    f"{key}_decode_s": round(steps.decode_s, 3),
                    f"{key}_startup_s": round(start, 3), f"{key}_graphs": shapes.num_graphs,
                    f"{key}_steps_s": steps.seconds / engines,
                    f"{key}_total_s": steps.seconds / engines + start})
        if caching:
            out.update(hit_tokens=steps.hit_tokens, gather_s=round(steps.gather_s, 3),
                       on_total_s_gather_0=_total(steps, 0.0, engines, start),
                       on_total_s_gather_2=_total(steps, 2.0, engines, start))
    return out


def _total(steps: Estimate, scale: float, engines: int, start: float) -> float:
    """The run with the gather term scaled by `scale` (it is linear in the step's memory
    time: gather_s is what it adds at 1, gather2_s what doubling it adds more)."""
    extra = -steps.gather_s if scale == 0 else steps.gather2_s
    return (steps.seconds + extra) / engines + start


def _pays(on_s: float, off_s: float, level: float) -> bool:
    """On saves more than `level` seconds (the noise: a share of the steps' time, not of a
    start-up both pay alike)."""
    return off_s - on_s > level


def _because(w: dict[str, Any]) -> str:
    share = w["hit_tokens"] / w["prompt_tokens"] if w["prompt_tokens"] else 0.0
    parts = [f"{share:.1%} of the prompt tokens served from the cache",
             f"prefill {_signed(w['off_prefill_s'] - w['on_prefill_s'])} saved"]
    if w["gather_s"]:
        parts.append(f"decode gather {_seconds(w['gather_s'])} paid")
    parts.append(f"{w['on_graphs']} graphs against {w['off_graphs']}")
    more = w["on_startup_s"] - w["off_startup_s"]
    if abs(more) >= 1:
        parts.append(f"start-up {_signed(more)} more")
    return ", ".join(parts)


def _flip_words(flips: dict[str, bool], enable: bool) -> str:
    if not any(flips.values()):
        return "does not decide it: the same at zero and doubled"
    return "decides it: " + ", ".join(
        f"{'at zero' if scale == '0' else 'doubled'} "
        + (f"it would flip to {prefix_caching_word(not enable)}" if flip
           else f"still {prefix_caching_word(enable)}")
        for scale, flip in flips.items())


def _pair(a: float, b: float) -> str:
    """Two durations in one unit: "1.12 h against 0.74 h", "412 s against 380 s"."""
    if max(a, b) >= 3600:
        return f"{a / 3600:.2f} h against {b / 3600:.2f} h"
    return f"{a:,.0f} s against {b:,.0f} s"


def _seconds(seconds: float) -> str:
    return f"{seconds:,.0f} s" if abs(seconds) >= 10 else f"{seconds:.1f} s"


def _signed(seconds: float) -> str:
    return _seconds(seconds) if seconds >= 0 else f"-{_seconds(-seconds)}"
