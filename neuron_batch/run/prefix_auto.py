"""A run's prefix caching, settled once after its inputs are read and before anything loads
(the engine, a Neuron host's checks, --split-at auto's weighing): as asked (--prefix-caching
on/off), or auto's decision (layout/prefix_decision.py) on the requests in their submission
order and the run's device with and without caching.

A --resume'd auto run keeps the decision its folder made on the first attempt (the checked
settings stay the folder's). A night in a new folder weighs the graphs an earlier night
compiled as a load only (the artifacts folder holds them), which keeps that night's decision
unless tonight's input clearly goes the other way; either way it says when tonight's input
alone would decide otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from neuron_batch.choices import prefix_caching_word
from neuron_batch.inputs.job_requests import lengths_of
from neuron_batch.inputs.prepare import PromptTokens
from neuron_batch.job.folder import RunFolder
from neuron_batch.job.job import resolve_target
from neuron_batch.layout.prefix_decision import PrefixDecision, decide, forced, platform_off
from neuron_batch.settings import RunSettings
from neuron_batch.storage.run_bucket import local_folder

if TYPE_CHECKING:
    from neuron_batch.device.target import Target
    from neuron_batch.job.workload import Workload

#: run.json's key for the decision (beside "settings", which holds what it decided).
MANIFEST_KEY = "prefix_caching"


def settle(settings: RunSettings, workload: Workload, target: Target | None,
           in_order: Callable[[], Sequence], log) -> tuple[RunSettings, Target | None,
                                                       PrefixDecision]:
    """(the settings with prefix caching on or off, the device resolved for it, the decision).
    `in_order()`: the prepared requests in submission order (asked only under auto)."""
    if settings.prefix_caching is not None:
        return settings, target, forced(settings)
    from neuron_batch.engine.neuron_host import runs_on_neuron

    model_path = workload.model.path
    runtime = (settings.resolve_runtime() if settings.simulated or runs_on_neuron(settings)
               else None)
    decision = (platform_off(runtime) if runtime is not None and not runtime.prefix_caching
                else auto_decision(settings, in_order(), model_path,
                                   bounds=workload.prefix_bounds))
    kept = _first_decision(settings)
    if kept is not None:
        if kept.enable != decision.enable:
            log(f"prefix caching: kept {prefix_caching_word(kept.enable)}, this run folder's "
                f"first decision (its compiled graphs stay valid); tonight's input would "
                f"decide {prefix_caching_word(decision.enable)}: {decision.reason}. "
                f"--restart decides anew")
        decision = replace(kept, figures={**kept.figures, "tonight": decision.to_dict()})
    settled = settings.replace(prefix_caching=decision.enable)
    if target is not None or settings.simulated:
        target = resolve_target(settled, model_path)
    return settled, target, decision


def auto_decision(settings: RunSettings, requests, model_path: str | None, *,
                  bounds: dict[int, Any] | None = None) -> PrefixDecision:
    """Auto's decision for `requests` (in submission order: the whole job) on the run's
    device. `bounds`: where the prefix bound it counts is kept, by block size (the report
    reuses it: Workload.prefix_bounds)."""
    from neuron_batch.engine.neuron_host import runs_on_neuron
    from neuron_batch.inputs.prefix_bound import prefix_bound
    from neuron_batch.job.startup import layout_compiled

    started = time.perf_counter()
    off, on = (resolve_target(settings.replace(prefix_caching=c), model_path)
               for c in (False, True))
    targets = (off, on) if off is not None and on is not None else None
    from neuron_batch.engine.engine import run_block_size

    block = run_block_size(settings, off)
    compiled = (
        layout_compiled(settings.replace(prefix_caching=False), off, model_path, requests)
        if off is not None else False,
        layout_compiled(settings.replace(prefix_caching=True), on, model_path, requests)
        if on is not None else False)
    known = targets is not None
    # (a streamed job's lengths from its arrays: only the bound reads every prompt's tokens)
    prompts, outputs = PromptTokens(requests), lengths_of(requests)[1]
    # (the check's, where it counted it as it tokenized: text not tokenized again)
    bound = bounds.get(block) if bounds is not None else None
    if bound is None:
        bound = prefix_bound(prompts, block)
        if bounds is not None:
            bounds[block] = bound
    decision = decide(settings, prompts, outputs, block=block,
                      targets=targets, compiled=compiled,
                      neuron=runs_on_neuron(settings), bound=bound.tokens(),
                      bound_error=bound.error_tokens())
    if known and compiled[0] != compiled[1]:
        # One layout's graphs are compiled (an earlier night's decision): that start-up is a
        # load, which holds the decision; say when tonight's input alone would go the other way.
        alone = decide(settings, prompts, outputs, block=block, targets=targets,
                       compiled=(True, True), bound=bound.tokens(),
                       bound_error=bound.error_tokens())
        if alone.enable != decision.enable:
            decision = replace(decision, reason=(
                f"{decision.reason}; kept {prefix_caching_word(decision.enable)} because its "
                f"graphs are compiled already: on equal start-ups tonight's input would decide "
                f"{prefix_caching_word(alone.enable)}"), figures={
                    **decision.figures, "equal_startups": alone.to_dict()})
    # (what deciding took, against the run's wall time: docs/measurements.md)
    decision.figures["wall_time_s"] = round(time.perf_counter() - started, 3)
    return decision


def _first_decision(settings: RunSettings) -> PrefixDecision | None:
    """What a --resume'd folder ran with on its first attempt (None: a fresh run): its
    decision, or for a folder written before auto its settings' on/off."""
    if not (settings.resume and settings.output):
        return None
    manifest = RunFolder(local_folder(settings.output)).read_manifest() or {}
    stored = manifest.get(MANIFEST_KEY)
    if isinstance(stored, dict) and "enable" in stored:
        return PrefixDecision.from_dict(stored)
    before = (manifest.get("settings") or {}).get("prefix_caching")
    if not isinstance(before, bool):
        return None
    return PrefixDecision("auto", before, f"kept from the run folder's first attempt "
                          f"(--prefix-caching {prefix_caching_word(before)})")
