"""The report of a run folder: every attempt's scheduler records and the outputs file, summed
over the whole input; and `neuron-batch report DIR`."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_batch.errors import EXIT_FAILED, RunError
from neuron_batch.inputs.job_requests import JobFigures, done_of, ids_by_index, job_figures
from neuron_batch.job.folder import REPORT, RunFolder
from neuron_batch.job.job import Job
from neuron_batch.job.request_spec import report_defaults
from neuron_batch.report.model import SCHEMA_VERSION, Attempt, Cost, PrefixCache, Report, Tokens
from neuron_batch.report.schema import or_none
from neuron_batch.runtimes.prefix_grid import grid_size

if TYPE_CHECKING:
    from neuron_batch.inputs.prepare import Prepared
    from neuron_batch.job.done import DoneRequests
    from neuron_batch.job.workload import Workload
    from neuron_batch.report.replicas import DoneIds
    from neuron_batch.settings import RunSettings


def build_report(job: Job) -> Report:
    """The report over the whole input, from every attempt's records and the outputs file:
    the records' figures (`summarize`), then what only the folder knows (outputs, attempts,
    cost), each a typed step on the report."""
    from neuron_batch.report.replicas import DoneIds, has_replicas

    folder, settings, prepared = job.folder, job.settings, job.workload.prepared
    layout = folder.records_layout()
    if not layout:
        raise RunError(f"{folder.path} has no scheduler records", EXIT_FAILED)
    as_read = job_figures(prepared.requests)
    # (only the replicas' report matches records to outputs by id: the done ids' hashes)
    done_ids = done_ids_of(folder, prepared) if has_replicas(layout) else DoneIds(())
    report = Report.new(_figures(job, layout, _run_config(job, as_read.openai), done_ids))
    _tokens_from_outputs(report, folder)
    _add_prefix_bound(report, job.workload, folder.done, settings)
    report.prefix_caching = (job.prefix_caching.to_dict() if job.prefix_caching is not None
                             else (folder.read_manifest() or {}).get("prefix_caching"))
    _count_requests(report, job, as_read)
    _add_cost(report, settings)
    attempts = folder.attempts()
    report.attempts = [Attempt.from_dict(a) for a in attempts]
    if any("part" in a for a in attempts):
        report.split = split_section(attempts, folder, settings, job.simulated, done_ids)
    report.output_dir = str(folder.path)
    return report


def _run_config(job: Job, openai: bool) -> dict[str, Any]:
    """What the report's config says beside the records' own: the model, device, tokenizer,
    defaults, inputs, order, and on the simulated device its target and graphs."""
    folder, settings, model = job.folder, job.settings, job.workload.model
    devices = [a.get("device") for a in folder.attempts() if a.get("device")]
    extra = {"model": model.name, "device": devices[-1] if devices else settings.device,
             "tokenizer": job.workload.prepared.tokenizer_name,
             "max_tokens": settings.max_tokens,
             **report_defaults(settings, openai, model.path),
             "inputs": list(settings.inputs),
             "order": settings.order}
    if job.simulated:
        assert job.target is not None  # (simulated: there is a target, job.simulated says so)
        shapes = settings.shapes(job.target.runtime)
        # (under nxdi's prefix-caching grid, a prefill graph per (prefill, prefix) pair)
        prefill_graphs = grid_size(shapes.prefill_buckets, shapes.prefix_buckets or (0,))
        extra["sim"] = job.target.describe(num_prefill_buckets=prefill_graphs,
                                           num_decode_buckets=len(shapes.attention_buckets)
                                           if shapes.runtime.static_kv
                                           else len(shapes.decode_buckets),
                                           num_graphs=shapes.num_graphs,
                                           compiled=compiled_before(job))
        if settings.architecture:  # the model simulated, not the one lending its tokenizer
            extra["model"] = f"{extra['sim']['arch']} (simulated)"
    return extra


def _figures(job: Job, layout: Any, extra: dict[str, Any], done_ids: DoneIds
             ) -> dict[str, Any]:
    """The records' figures: the replicas' (their records matched to outputs by id), or a
    single engine's, each attempt's file added up as it is read."""
    from neuron_batch.report.metrics import summarize_run
    from neuron_batch.report.replicas import has_replicas, summarize_replicas
    from neuron_batch.report.run_records import concat, load

    folder, settings, problems = job.folder, job.settings, job.workload.problems
    total = len(job.workload.prepared.requests) + len(problems)
    if has_replicas(layout):
        extra.update(replicas=settings.replicas,
                     ray=next((a["ray"] for a in reversed(folder.attempts()) if a.get("ray")),
                              None))
        if "sim" in extra:
            extra["sim"]["num_instances"] = settings.num_instances
        return summarize_replicas(layout, attempts=folder.attempts(), done_ids=done_ids,
                                  simulated=job.simulated, extra_config=extra, total=total,
                                  skipped=len(problems))
    # (the completed requests added up as each file is read: aborted or failed requests are
    # not completed work, and no column of the whole run is held)
    records = concat([load(p, ids=False, streamed=True) for p in folder.records_paths()])
    return summarize_run(records, extra_config=extra, total=total, skipped=len(problems),
                         failed=0)


def _count_requests(report: Report, job: Job, as_read: JobFigures) -> None:
    """The report's request counts from the folder: completed (done), failed (what the last
    attempt could not run: a --resume tries those again), pending, and max_tokens clamped."""
    prepared = job.workload.prepared
    ran = [a for a in job.folder.attempts() if "requests_failed" in a]
    failed = ran[-1]["requests_failed"] if ran else 0
    completed = len(done_of(prepared.requests, job.folder.done))
    requests = report.requests
    requests.completed = completed
    requests.failed = failed
    requests.pending = len(prepared.requests) - completed - failed
    clamped = as_read.clamped
    requests.max_tokens_clamped = len(clamped)
    if as_read.asked is not None:   # (only then: a plain run's report is as it was)
        requests.asked = as_read.asked
    # what they were cut to (max_model_len - prompt), so the summary can say it
    requests.max_tokens_clamped_to = ({"min": min(clamped), "max": max(clamped)} if clamped
                                      else None)


def compiled_before(job: Job) -> bool:
    """Whether the run's first start found its graphs compiled (its attempt's `startup`), else
    whether they count as compiled now (--compiled, or the artifacts folder holds them)."""
    from neuron_batch.job.startup import layout_compiled

    for attempt in job.folder.attempts():
        if "compiled_before" in (attempt.get("startup") or {}):
            return bool(attempt["startup"]["compiled_before"])
    return layout_compiled(job.settings, job.target)


def split_section(attempts: list[dict[str, Any]], folder: RunFolder, settings: RunSettings,
                  simulated: bool, done_ids: DoneIds) -> dict[str, Any]:
    """A --split-at run's parts: each attempt that ran a part, its layout and its own figures
    (from its records), and the compile time of the layouts (both are compiled). A part run on
    replicas counts as the whole report does (report/replicas.py attempt_figures): its elapsed time
    the slowest replica's on the simulated device (else from the first replica ready to the
    last output), its output tokens summed, and per replica its requests and time; so the
    parts' elapsed times add up to the run's, as without replicas, or side by side
    (`placement`) the longer one is the run's."""
    from neuron_batch.report.metrics import summarize_run
    from neuron_batch.report.replicas import attempt_figures, has_replicas
    from neuron_batch.report.run_records import load

    layout = folder.records_layout()
    on_replicas = {}
    if has_replicas(layout):
        on_replicas = attempt_figures(layout, attempts=attempts, done_ids=done_ids,
                                      simulated=simulated)
    parts = []
    for attempt in attempts:
        if "part" not in attempt:
            continue
        entry = layout.get(attempt["attempt"])
        extra = {}
        if entry is None:       # stopped before a record was written (replicas still loading)
            elapsed, output_tokens = 0.0, 0
        elif isinstance(entry, dict):
            figures = on_replicas[attempt["attempt"]]
            elapsed, output_tokens = figures["elapsed_s"], figures["output_tokens"]
            extra = {"replicas": figures["replicas"]}
        else:
            one = Report.new(summarize_run(load(entry, ids=False, streamed=True)))
            elapsed, output_tokens = one.throughput.elapsed_s, one.tokens.output
        parts.append({**attempt["part"], "attempt": attempt["attempt"],
                      "ended": attempt.get("ended"), "elapsed_s": elapsed,
                      "output_tokens": output_tokens,
                      "output_tokens_per_s": output_tokens / elapsed if elapsed > 0 else 0.0,
                      **extra})
    compile_s = [p["estimated_compile_s"] for p in parts
                 if p.get("estimated_compile_s") is not None]   # (None: host cannot compile)
    # a layout compiled in an earlier attempt (resumed run) is counted once
    layouts = {(p["part"], p["max_model_len"], p["max_num_seqs"]): p.get("estimated_compile_s")
               for p in parts}
    total = sum(v for v in layouts.values() if v is not None) if compile_s else None
    placement = next((a["placement"] for a in reversed(attempts) if a.get("placement")), None)
    if compile_s and any(a.get("side_by_side") is not None for a in attempts):
        # side by side the layouts compile at once where their replicas sit on separate
        # instances (layout/placement.py compile_wall_s); the wall time is what the run waits
        wall = (placement or {}).get("compile_wall_s")
        total = wall if wall is not None else max(compile_s)
    out = {"split_at": settings.split_at, "parts": parts, "estimated_compile_s": total}
    if placement is not None:
        out["placement"] = placement
    return out


def done_ids_of(folder: RunFolder, prepared: Prepared) -> DoneIds:
    """The done requests' ids, as the replicas' report matches their records to outputs:
    hashed as they are decoded (report/replicas.py `DoneIds`), none held."""
    from neuron_batch.report.replicas import DoneIds

    done = folder.done
    by_index = ids_by_index(prepared.requests)
    ids = (by_index[index] for index in done.indices() if index < len(by_index))
    return DoneIds(itertools.chain((i for i in ids if i is not None), done.by_id_ids))


def _add_prefix_bound(report: Report, workload: Workload, done: DoneRequests,
                      settings: RunSettings) -> None:
    """`prefix_cache.bound_tokens`: what an unbounded cache could serve the completed requests'
    prompts, in whole blocks of the run's KV block (report/prefix_cache.py), and
    `bound_error_tokens` where a job past inputs/prefix_bound.py's exact count estimated it.
    Every request completed: the bound auto's decision counted of the whole job, where it did
    (the bound does not depend on the order), else counted here."""
    from neuron_batch.engine.engine import run_block_size
    from neuron_batch.inputs.prefix_bound import prefix_bound
    from neuron_batch.inputs.prepare import PromptTokens

    if not isinstance(report.prefix_cache, PrefixCache):
        return
    # (the engine's, as it reported it; the one the run decided with where it did not)
    block = or_none(report.config.block_size) or run_block_size(settings, None)
    completed = done_of(workload.prepared.requests, done)
    bound = workload.prefix_bounds.get(block)
    if bound is None or len(completed) != len(workload.prepared.requests):
        # (streamed: one prompt at a time, and past its exact count in fixed memory)
        bound = prefix_bound(PromptTokens(completed), block)
    report.prefix_cache.with_bound(bound.tokens(), bound.error_tokens())


def num_instances(settings: RunSettings) -> int:
    """Instances the run is billed for: the simulated layout's (--num-instances), else one."""
    return int(settings.num_instances) if settings.simulated else 1


def _add_cost(report: Report, settings: RunSettings) -> None:
    """`cost` whenever the instance is known: run time x price x instances (report/cost.py)."""
    from neuron_batch.report.cost import no_price_message, report_cost

    device = or_none(report.config.device)
    if settings.device == "auto" and device != "neuron":
        return      # resolved to a machine that is not a Neuron host: nothing to price
    price = settings.price()
    if price is not None:
        report.cost = Cost.from_dict(report_cost(report, price, num_instances(settings)))
    elif (instance := settings.priced_instance()) is not None:
        report.cost_missing = no_price_message(instance)


def _tokens_from_outputs(report: Report, folder: RunFolder) -> None:
    """Token totals and rates from outputs.jsonl, the record of what finished (scheduler
    records of an attempt killed with -9 may lack its last fraction of a second): its sums as
    written (job/outputs_tally.py), only the lines past their last save read."""
    tally = folder.tally()
    input_tokens, output_tokens = tally.prompt_tokens, tally.completion_tokens
    total = input_tokens + output_tokens
    report.tokens = Tokens(input=input_tokens, output=output_tokens, total=total)
    # blank outputs (text only: the simulated device writes none), for the summary's hint
    report.requests.empty_outputs = tally.empty
    throughput = report.throughput
    elapsed = throughput.elapsed_s

    def rate(amount: float) -> float:
        return amount / elapsed if elapsed > 0 else 0.0

    throughput.input_tokens_per_s = rate(input_tokens)
    throughput.output_tokens_per_s = rate(output_tokens)
    throughput.total_tokens_per_s = rate(total)
    report.total_num_tokens = total
    report.tokens_per_second = rate(total)


def rerender(path: Path, *, shown_as: str | None = None) -> str:
    """`neuron-batch report DIR`: the summary of a finished run again, from its files
    (`shown_as`: where the folder is, said in place of `path`: an s3:// run folder read into a
    scratch folder)."""
    from neuron_batch.report.summary import format_summary, terminal_width

    report_path = path / REPORT if path.is_dir() else path
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunError(f"{report_path}: no report here; is {path} a neuron-batch run "
                       f"folder?") from None
    report = Report.from_dict(report)   # (an older folder's report reads too: model.py)
    if report.version > SCHEMA_VERSION:     # (a newer release wrote it: its fields may differ)
        raise RunError(f"{report_path}: report schema_version {report.version} is newer than "
                       f"this release reads (0 to {SCHEMA_VERSION}); upgrade neuron-batch to "
                       f"render it")
    # where it is now, if it was moved
    report.output_dir = shown_as or str(report_path.parent)
    return format_summary(report, terminal_width(sys.stdout))     # (the CLI prints it there)
