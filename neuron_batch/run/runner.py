"""`neuron-batch run`: load prompts, run them through vLLM with the Neuron scheduler, write
every output as it finishes, and report. No click here: the CLI turns `RunError`s into exits
(codes in `errors.py`).

Read top-down: `run()` resolves the device once (`job.resolve_target`: the `Target` of
device/target.py), loads the workload (`job/workload.py`), locks the run folder
(`job/folder.py`) and hands one `Job` to `_run_locked()`, which generates (`job/generate.py`)
and reports (`folder_report.py`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_batch.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PARTIAL,
    RunError,
)
from neuron_batch.inputs.job_requests import ids_by_index, job_ids, pending_of
from neuron_batch.inputs.prepare import in_order
from neuron_batch.inputs.prompt_records import InputProblem
from neuron_batch.inputs.skipped import write_skipped
from neuron_batch.job.folder import (
    REPORT,
    OutputError,
    RunFolder,
    default_output_dir,
    input_fingerprint,
    write_json_atomic,
)
from neuron_batch.job.job import Job, resolve_target
from neuron_batch.job.outputs import RunOutputs
from neuron_batch.job.resume_check import REQUEST_FIELDS, take_folder
from neuron_batch.job.stop import (
    READING,
    REPORTING,
    STARTING,
    Interrupted,
    RunSignals,
    pause_point,
)
from neuron_batch.job.workload import Workload, load_workload
from neuron_batch.report.model import STOPPED, Attempt, Ended, Report
from neuron_batch.report.notes import interrupted_line
from neuron_batch.report.schema import or_none
from neuron_batch.run.interrupted import record_early_stop, record_stop
from neuron_batch.settings import SPLIT_AUTO, RunSettings
from neuron_batch.storage.run_bucket import BucketRun, is_bucket_output, local_folder

if TYPE_CHECKING:
    from neuron_batch.device.target import Target


@dataclass
class RunResult:
    exit_code: int
    output_dir: Path
    report: Report | None = None
    problems: list[InputProblem] = field(default_factory=list)


def say(settings: RunSettings, message: str) -> None:
    if not settings.quiet:
        print(message, file=sys.stderr, flush=True)


def run(settings: RunSettings, *, log: Callable[[str], None] | None = None,
        workload: Workload | None = None) -> RunResult:
    settings = settings.validate()
    log = log or (lambda message: say(settings, message))
    if is_bucket_output(settings.output):
        # A run folder in S3: the run works in a staging folder that BucketRun rebuilds from
        # the bucket (under its lock) and mirrors back as it goes (storage/run_bucket.py).
        assert settings.output is not None
        bucket = BucketRun(settings.output, log)
        bucket.open()
        # (the words a run says name the URL where they would name the staging folder)
        staged, url = str(bucket.staging), bucket.url.rstrip("/")
        try:
            return _run_in(settings, lambda text: log(text.replace(staged, url)), workload,
                           bucket.staging)
        except RunError as error:
            raise RunError(str(error).replace(staged, url), error.exit_code) from None
        except Interrupted as stop:
            stop.line = stop.line and stop.line.replace(staged, url)
            raise
        finally:
            bucket.close(failing=sys.exc_info()[0] is not None)
    out_dir = Path(settings.output) if settings.output else default_output_dir(settings.inputs)
    return _run_in(settings, log, workload, out_dir)


def _run_in(settings: RunSettings, log: Callable[[str], None], workload: Workload | None,
            out_dir: Path) -> RunResult:
    try:    # before anything slow: a folder another run holds is refused at once
        RunFolder(out_dir).refuse_if_in_use()
    except OutputError as error:
        raise RunError(str(error), error.exit_code) from None
    # One SIGTERM/SIGINT handler from the first input read to the report (job/stop.py): every
    # phase ends with exit 4 (0 when all completed), attempts.json and one line.
    with RunSignals() as signals:
        started = time.time()
        try:
            signals.enter(READING)  # (a signal the command line held before: stops here)
            pause_point(READING)
            target, workload, settings, prefix_decision = _prepare(settings, workload, log)
        except Interrupted as stop:
            stop.line = record_early_stop(settings, out_dir, stop, started)
            raise
        folder = RunFolder(out_dir)
        try:
            folder.lock()
        except OutputError as error:
            raise RunError(str(error), error.exit_code) from None
        job = Job(settings, workload, folder, log, target, prefix_caching=prefix_decision)
        try:
            return _run_locked(job, signals)
        except OutputError as error:
            raise RunError(str(error), error.exit_code) from None
        finally:
            if job.cluster is not None:
                job.cluster.shutdown()
            folder.unlock()


def _prepare(settings: RunSettings, workload: Workload | None, log):
    """The target, the workload (read and tokenized), the settings a run goes on with
    (prefix caching and --split-at auto decided) and the prefix-caching decision, each checked
    before the run folder is touched."""
    # A device that names its architecture resolves (and a layout that cannot load is
    # refused) before the inputs and the model are read; any other once the model is known.
    target = resolve_target(settings, None)
    workload = workload or load_workload(settings, log, target=target, resolve=resolve_target,
                                         meanwhile=_engine_prefetch(settings))
    if target is None:
        target = resolve_target(settings, workload.model.path)
    from neuron_batch.run.prefix_auto import settle

    # (before a split is weighed, a Neuron host is checked or anything loads: all take it)
    settings, target, prefix_decision = settle(
        settings, workload, target,
        lambda: submission_order(settings, workload.prepared.requests, target, workload), log)
    if settings.split_at == SPLIT_AUTO:
        settings = auto_split(settings, workload, target, log)
    if settings.split_at is not None:
        from neuron_batch.layout.split import check_split

        check_split(settings, workload.prepared.requests)
    if target is not None and target.simulated and settings.uses_ray:
        check_sim_layout(settings, target)
    from neuron_batch.engine.neuron_host import runs_on_neuron

    if runs_on_neuron(settings):
        check_neuron_host(settings, workload)
    return target, workload, settings, prefix_decision


#: Cores from which a run imports vLLM during a split check by default (`_engine_prefetch`).
PREFETCH_CORES = 4


def _engine_prefetch(settings: RunSettings) -> Callable[[], None] | None:
    """What this process does while a split check's processes read the job: import vLLM
    (job/generate.py `prefetch_vllm`) where it starts the engine itself, on the CPU or the
    simulated device, on a host of PREFETCH_CORES cores or more. With fewer, the import's CPU
    time shares the cores with the check's processes (2 cores: a 10M start 15.3 -> 13.7 s),
    and their memory beside vLLM's raised a 1M run's peak by ~40 MB (anonymous 1.12x -> 1.21x
    the 10k run's: issue 46's bound is 1.2x). Not on Ray (the driver imports no vLLM), nor on
    a Neuron host (its plugin's import there is untried). NEURON_BATCH_PREFETCH_VLLM=1 or 0
    decides."""
    from neuron_batch.choices import Device
    from neuron_batch.job.check_parts import cores

    if settings.uses_ray or settings.device not in (Device.CPU, Device.SIM):
        return None
    wanted = os.environ.get("NEURON_BATCH_PREFETCH_VLLM")
    if wanted == "0" or (wanted != "1" and cores() < PREFETCH_CORES):
        return None
    from neuron_batch.job.generate import prefetch_vllm

    return prefetch_vllm


def split_inputs(target: Target | None, model_path: str | None):
    """(slots_at, estimate) a split's cut (`--split-at auto`) and placement are weighed with
    (layout/split.py, layout/placement.py), from the run's target: its static slots at a
    max_model_len, and the step-time model and compile estimate of the simulated device or of
    a known Neuron host (a layout counts as compiled where the device's compile cache holds
    it: job/startup.py `layout_compiled`); (None, None) without one."""
    if target is None:
        return None, None
    from neuron_batch.job.startup import layout_compiled
    from neuron_batch.layout.placement import BoundEstimate

    return target.static_slots, BoundEstimate(
        target, lambda part: layout_compiled(part.settings, target, model_path, part.requests))


def auto_split(settings: RunSettings, workload: Workload, target: Target | None,
               log) -> RunSettings:
    """`--split-at auto` resolved: the cut a --resume'd run chose before (run.json), else the
    one the step-time estimate gives the least time with compile (split.choose_cut), or no
    split when one layout is faster. Needs a step-time model (the run's `target`)."""

    from neuron_batch.layout.split import choose_cut

    if settings.resume and settings.output:
        previous = ((RunFolder(local_folder(settings.output)).read_manifest() or {}).get(
            "settings") or {})
        if "split_at" in previous and previous["split_at"] != SPLIT_AUTO:
            return settings.replace(split_at=previous["split_at"])
    if target is None:
        raise RunError("--split-at auto weighs cuts with the step-time model of the simulated "
                       "device or of a Neuron host whose instance is known (--instance, or "
                       "EC2's); here give the cut (`neuron-batch plan` or "
                       "scripts/split_what_if.py weigh them)")
    slots_at, estimate = split_inputs(target, workload.model.path)
    cut, words = choose_cut(settings, submission_order(settings, workload.prepared.requests,
                                                       target, workload), slots_at, estimate)
    log(words)
    return settings.replace(split_at=cut)


def submission_order(settings: RunSettings, requests, target: Target | None,
                     workload: Workload | None = None) -> Sequence:
    """`requests` in the order `--order` submits them (inputs/prepare.py `in_order`): prefix
    order over the run's KV blocks (engine.run_block_size: the one the engine uses), its
    groups longest first under a runtime whose decode pads every slot to the longest (nxdi).
    With the `workload` whose whole job `requests` is: made once (`Workload.orders`)."""
    from neuron_batch.engine.engine import run_block_size

    runtime = target.runtime if target is not None else settings.resolve_runtime()
    block = run_block_size(settings, target)
    # (pending requests as many as the job's are the whole job, in its order)
    whole = (workload if workload is not None
             and len(requests) == len(workload.prepared.requests) else None)
    orders = whole.orders if whole is not None else {}
    key = (settings.order, block, runtime.static_kv)
    if key not in orders:
        orders[key] = in_order(requests, settings.order, block_size=block,
                               by_length=runtime.static_kv,
                               bounds=whole.prefix_bounds if whole is not None else None)
    return orders[key]


def check_neuron_host(settings: RunSettings, workload) -> None:
    """A Neuron run's settings, checked before anything loads (engine/neuron_host.py): the plugin's
    limits, the sampling it can do, and whether the static KV cache fits beside the weights."""
    from neuron_batch.engine.neuron_host import NeuronHostError, check_host
    from neuron_batch.versions import neuron_plugin

    try:
        check_host(settings, settings.resolve_runtime(), workload.model.path,
                   workload.prepared.requests, neuron_plugin()["version"])
    except NeuronHostError as error:
        raise RunError(str(error)) from None


def check_sim_layout(settings: RunSettings, target: Target) -> None:
    """N simulated engines of T NeuronCores must fit on --num-instances instances."""
    from neuron_batch.device.replica_layout import replica_devices

    try:
        replica_devices(target.instance, target.tp, settings.replicas, settings.num_instances)
    except ValueError as error:
        raise RunError(f"--device sim: {error}") from None


def _run_locked(job: Job, signals: RunSignals) -> RunResult:
    from neuron_batch.job.generate import generate, resolved_device
    from neuron_batch.run.folder_report import build_report

    settings, folder, log = job.settings, job.folder, job.log
    prepared, problems = job.workload.prepared, job.workload.problems
    ids = job_ids(prepared.requests)
    started = time.time()
    _open_folder(job, signals, ids, started)
    # (nothing done yet: the whole job, whose order auto prefix caching may have made)
    pending = submission_order(settings, pending_of(prepared.requests, folder.done),
                               job.target, job.workload)
    attempts = record_killed(folder, folder.attempts())
    # (numbered past every attempt that left records, rather than overwrite them)
    attempt = max([len(attempts), *folder.records_layout()]) + 1
    done_before, recorded = len(folder.done), len(attempts)
    try:
        signals.enter(STARTING)     # (a signal that came while the folder was prepared: now)
        if pending:
            # (on Ray each replica finds its own device: the driver does not import vLLM)
            device = settings.device if settings.uses_ray else resolved_device(job)
            log(f"running {len(pending):,} of {len(ids):,} requests on "
                f"{device_label(settings, device, job)} (output: {folder.path})")
            try:
                outcome = _generate_all(job, pending, attempt, attempts, generate)
            except RunError as error:  # keep a trace of the failed attempt next to its outputs
                job.outputs.end("failed")
                attempts.append(Attempt(attempt=attempt + len(attempts) - recorded,
                                        ended=Ended.FAILED, error=str(error)).to_dict())
                folder.write_attempts(attempts)
                raise
        else:
            outcome = {"ended": Ended.NOTHING_TO_DO.value}
            log(f"all {len(ids):,} requests already done in {folder.path}")
        job.outputs.end(outcome["ended"])
        # A first signal from here lets the report be written (exit 4, or 0 when all completed)
        signals.enter(REPORTING, defer=True)
        pause_point(REPORTING)
        if outcome.get("ended") in STOPPED and not folder.records_layout():
            # Stopped before any engine recorded a step (--max-runtime while Ray's replicas
            # still load): nothing to report yet, and nothing lost; --resume runs it all.
            if settings.quiet:
                why = "--max-runtime reached" if outcome["ended"] == Ended.DEADLINE else "stopped"
                print(f"neuron-batch: {why} before any request ran; rerun with --resume to run "
                      f"{folder.path}", file=sys.stderr, flush=True)
            return RunResult(EXIT_INTERRUPTED, folder.path, None, problems)
        report = build_report(job)
        if outcome.get("ended") not in STOPPED and not (
                report.requests.pending or report.requests.failed):
            from neuron_batch.run.verdict import run_verdict

            verdict = run_verdict(job, or_none(report.throughput.elapsed_s))
            if verdict is not None:         # (none without a step model: the CPU)
                report.verdict = verdict
        write_json_atomic(folder.path / REPORT, report.to_dict())
    except Interrupted as stop:
        if job.outputs is not None and stop.phase != REPORTING:
            job.outputs.end("interrupted")
        if stop.phase != REPORTING:     # (an attempt that stopped at once returned no line)
            finished = len(folder.done) - done_before - sum(
                a.get("requests_finished", 0) for a in attempts[recorded:])
            record_stop(folder, stop, started, finished, attempt + len(attempts) - recorded)
        stop.line = interrupted_line(stop.signal, stop.phase, insisted=stop.insisted,
                                     completed=len(folder.done), total=len(ids),
                                     folder=folder.path)
        raise
    return _said(settings, report, outcome, folder, problems)


def _open_folder(job: Job, signals: RunSignals, ids: Sequence[str], started: float) -> None:
    """The run folder made ready for this attempt: refused if it holds another job's run,
    --restart's move, requests.json, run.json, the skipped lines, what is done already, the
    outputs opened to append. A signal meanwhile is recorded where the folder is this run's."""
    from neuron_batch.run.prefix_auto import MANIFEST_KEY

    settings, folder, log = job.settings, job.folder, job.log
    prepared, problems = job.workload.prepared, job.workload.problems
    written = False
    try:
        # Before the folder is written to: a run of other input or settings is refused here.
        start = take_folder(job, job.runtime.name)
        if settings.uses_ray:
            # Before the folder is written to: a bad address or a cluster too small fails here.
            from neuron_batch.replicas.cluster import connect

            job.cluster = connect(settings, log)
        # The folder is prepared whole before a signal stops the run: a --restart half moved
        # aside would mix two runs.
        signals.enter(STARTING, defer=True)
        written = True
        if start.moved is not None:
            aside = folder.move_aside()
            log(f"--restart: the previous run is now in {aside}"
                + (f" ({start.moved.describe()})" if start.moved else ""))
        if start.fresh:
            folder.write_requests(REQUEST_FIELDS, start.rows)
        start.rows = []     # (a row per request: not held while the job runs)
        folder.write_manifest({"settings": settings.to_dict(), "model": job.workload.model.name,
                               "input_fingerprint": input_fingerprint(ids),
                               "num_requests": len(ids), "num_skipped": len(problems),
                               "input_kind": job.workload.input_kind,
                               "checked_settings": start.checked,
                               MANIFEST_KEY: job.prefix_caching.to_dict()
                               if job.prefix_caching is not None else None})
        write_skipped(folder.path, problems)
        folder.load_done(ids_by_index(prepared.requests))
        folder.open_outputs()
        job.outputs = RunOutputs.begin(job, folder.tally(), problems)
    except Interrupted as stop:
        if written or settings.resume or not folder.has_previous_run():
            record_stop(folder, stop, started, 0)
        stop.line = interrupted_line(stop.signal, stop.phase, insisted=stop.insisted,
                                     completed=None, total=None, folder=folder.path)
        raise


def _said(settings: RunSettings, report: Report, outcome: dict[str, Any], folder: RunFolder,
          problems: list[InputProblem]) -> RunResult:
    """The run's exit code, and what it says of itself: the Prometheus file, the summary (a
    line on stderr instead under --quiet when not a success)."""
    code = EXIT_OK
    if outcome.get("ended") in STOPPED:
        code = EXIT_INTERRUPTED
    elif report.requests.skipped or report.requests.failed:
        code = EXIT_PARTIAL
    elif report.requests.pending:   # (an attempt that ended with some never run: --resume)
        code = EXIT_INTERRUPTED
    if settings.metrics_textfile:
        from neuron_batch.report.prometheus import prometheus_text, write_text_atomic

        write_text_atomic(settings.metrics_textfile,
                          prometheus_text(report, labels={"output": str(folder.path)},
                                          exit_code=code))
    if not settings.quiet:
        from neuron_batch.report.summary import format_summary, terminal_width

        print(format_summary(report, terminal_width(sys.stdout)), flush=True)
    if settings.quiet and code != EXIT_OK:
        # Not a success: cron must not mail silence. One line, why and how to finish.
        from neuron_batch.report.notes import outcome_line

        print(outcome_line(report), file=sys.stderr, flush=True)
    return RunResult(code, folder.path, report, problems)


def record_killed(folder: RunFolder, attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`attempts` with a line for each attempt that left records but none in attempts.json
    (killed -9, or its machine lost), written: `ended` "killed", with the outputs it wrote
    (those of outputs.jsonl no recorded attempt counts) where it is the only one."""
    numbered = {a.get("attempt") for a in attempts}
    killed = [n for n in folder.records_layout() if n not in numbered]
    if not killed:
        return attempts
    counted = sum(a.get("requests_finished") or 0 for a in attempts)
    for number in killed:
        line = Attempt(attempt=number, ended=Ended.KILLED)
        if len(killed) == 1:
            line.requests_finished = max(0, len(folder.done) - counted)
        attempts.append(line.to_dict())
    attempts.sort(key=lambda a: a.get("attempt") or 0)
    folder.write_attempts(attempts)
    return attempts


def _generate_all(job: Job, pending, attempt: int, attempts: list, generate) -> dict[str, Any]:
    """Run `pending` (on one engine, on Ray's replicas, or a split's parts), each attempt's
    line written to attempts.json as it ends; returns the one that says how the run ended."""
    settings, log, folder = job.settings, job.log, job.folder
    if settings.split_at is not None:
        from neuron_batch.layout.split import placement_note, plan_parts
        from neuron_batch.run.split_parts import run_parts

        slots, estimate = split_inputs(job.target, job.workload.model.path)
        parts, placement = plan_parts(settings, pending, slots, estimate, runtime=job.runtime)
        if len(parts) == 2 and settings.uses_ray:
            log(f"parts {placement.mode}" + (
                f" (estimated {placement.estimated_s / 3600:.2f} h with the start-up; "
                f"in turn {placement.in_turn_s / 3600:.2f} h)"
                + placement_note(settings, pending, slots, estimate, placement)
                # (the estimates are all set or none: SplitPlacement.describe)
                if placement.estimated_s is not None and placement.in_turn_s is not None
                else ""))
        outcomes = run_parts(job, parts, attempt, generate, placement)
    elif settings.uses_ray:
        from neuron_batch.replicas.pool import generate_replicas

        outcomes = iter([generate_replicas(job, pending, attempt)])
    else:
        outcomes = iter([generate(job, pending, attempt)])
    stopped = None
    for outcome in outcomes:        # (a split run's parts, one at a time)
        attempts.append(outcome)
        folder.write_attempts(attempts)
        if outcome.get("ended") in STOPPED:
            stopped = outcome       # (side by side, the other part may end after it)
    return stopped or outcome


def device_label(settings: RunSettings, device: str, job: Job | None = None) -> str:
    """`device` (resolved: the word the summary's device= shows) in words."""
    target = job.target if job is not None else None
    if target is not None and target.simulated:
        label = f"a simulated {target.instance.name}"
        if settings.num_instances > 1:
            label = f"{settings.num_instances} simulated {target.instance.name}"
    elif device == "auto":
        label = "the device each replica finds (--device auto)"
    else:
        label = device + (" (--device auto)" if settings.device == "auto" else "")
    if settings.uses_ray:
        label += f", {settings.replicas} replica(s) on Ray"
    return label
