"""`neuron-batch run`: load prompts, run them through vLLM with the Neuron scheduler, write
every output as it finishes, and report. No click here: the CLI turns `RunError`s into exits
(codes in `errors.py`).

Read top-down: `run()` loads the workload (`workload.py`), resolves the simulated device once
(`device/target.py`), locks the run folder (`folder.py`) and hands one `Job` to
`_run_locked()`, which generates (`generate.py`) and reports (`folder_report.py`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_batch.config import SPLIT_AUTO, RunSettings
from neuron_batch.errors import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PARTIAL,
    RunError,
)
from neuron_batch.inputs.prepare import in_order
from neuron_batch.inputs.records import InputProblem
from neuron_batch.job.folder import (
    REPORT,
    OutputError,
    RunFolder,
    default_output_dir,
    input_fingerprint,
    write_json_atomic,
)
from neuron_batch.job.job import Job
from neuron_batch.job.workload import Workload, load_workload


@dataclass
class RunResult:
    exit_code: int
    output_dir: Path
    report: dict[str, Any] | None = None
    problems: list[InputProblem] = field(default_factory=list)


def say(settings: RunSettings, message: str) -> None:
    if not settings.quiet:
        print(message, file=sys.stderr, flush=True)


def run(settings: RunSettings, *, log: Callable[[str], None] | None = None,
        workload: Workload | None = None) -> RunResult:
    settings = settings.validate()
    log = log or (lambda message: say(settings, message))
    target = None
    if settings.device == "sim" and settings.sim.architecture:
        # A layout that cannot load is refused before the inputs and the model are read.
        target = resolve_sim_target(settings, None)
    workload = workload or load_workload(settings, log)
    if settings.device == "sim" and target is None:
        target = resolve_sim_target(settings, workload.model)
    if settings.split_at == SPLIT_AUTO:
        settings = auto_split(settings, workload, log)
    if settings.split_at is not None:
        from neuron_batch.layout.split import check_split

        check_split(settings, workload.prepared.requests)
    if target is not None and settings.uses_ray:
        check_sim_layout(settings, target)
    if runs_on_neuron(settings):
        check_neuron_host(settings, workload)

    out_dir = Path(settings.output) if settings.output else default_output_dir(settings.inputs)
    folder = RunFolder(out_dir)
    try:
        folder.lock()
    except OutputError as error:
        raise RunError(str(error), error.exit_code) from None
    job = Job(settings, workload, folder, log, target)
    try:
        return _run_locked(job)
    except OutputError as error:
        raise RunError(str(error), error.exit_code) from None
    finally:
        if job.cluster is not None:
            job.cluster.shutdown()
        folder.unlock()


def resolve_sim_target(settings: RunSettings, model):
    """The simulated device for these settings, checked before any set-up (instance,
    architecture, TP, context length, KV capacity)."""
    from neuron_batch.device.target import SimSettings, SimTarget

    sim = settings.sim
    try:
        return SimTarget.resolve(
            SimSettings(instance=sim.instance, arch=sim.architecture or model.path,
                        tp_degree=sim.tensor_parallel_size, weight_dtype=sim.weight_dtype,
                        profile=sim.cost_profile, runtime=settings.resolve_runtime().name),
            settings.max_model_len, settings.kv_reserve, max_num_seqs=settings.max_num_seqs)
    except (ValueError, FileNotFoundError) as error:
        raise RunError(f"--device sim: {error}") from None


def on_neuron_host() -> bool:
    """AWS's plugin installed and Neuron devices present: `--device auto` runs on Neuron."""
    import glob

    from neuron_batch.versions import neuron_plugin

    plugin = neuron_plugin()
    return bool((plugin["version"] or plugin["entry_point"]) and glob.glob("/dev/neuron*"))


def runs_on_neuron(settings: RunSettings) -> bool:
    """--device neuron, or auto on a Neuron host."""
    return settings.device == "neuron" or (settings.device == "auto" and on_neuron_host())


def static_slots_at(settings: RunSettings, model):
    """settings -> the slots of settings.max_model_len a static KV cache holds beside the
    weights (None when unknown): on the simulated device from its target, on a Neuron host
    from its instance (--instance or EC2's) and the model's shape, elsewhere None."""
    if settings.device == "sim":
        return lambda s: resolve_sim_target(s, model).kv.get("max_static_seqs")
    if runs_on_neuron(settings):
        from neuron_batch.engine.neuron_host import host_static_slots

        return lambda s: host_static_slots(s, s.resolve_runtime(), model.path)
    return lambda s: None


def estimate_target(settings: RunSettings, model):
    """(target, resolve) a split's time estimate uses: the simulated device's; on a Neuron
    host whose instance is known (--instance or EC2's), the same step-time model for that
    instance, the loaded model's shape and the host's runtime; else (None, None)."""
    from dataclasses import replace

    if settings.device == "sim":
        resolve = lambda s: resolve_sim_target(s, model)  # noqa: E731
        return resolve(settings), resolve
    if not runs_on_neuron(settings):
        return None, None
    from neuron_batch.engine.neuron_host import host_instance

    instance, runtime = host_instance(settings), settings.resolve_runtime().name
    if instance is None:
        return None, None

    def resolve(s: RunSettings):
        sim = replace(s.sim, instance=instance,
                      tensor_parallel_size=s.sim.tensor_parallel_size or 1)
        return resolve_sim_target(replace(s, device="sim", runtime=runtime, sim=sim), model)

    try:
        return resolve(settings), resolve
    except RunError:            # (the host's own checks say why the layout cannot load)
        return None, None


def split_estimate(target, resolve):
    """The time model a split's cut (`--split-at auto`) and placement are weighed with
    (layout/placement.py), from `estimate_target`: the step-time model and compile
    estimate of the simulated device or of a known Neuron host; None without one."""
    if target is None:
        return None
    from neuron_batch.device.cost_model import StepCostModel
    from neuron_batch.device.replica_layout import engines_per_instance
    from neuron_batch.job.startup import layout_compiled
    from neuron_batch.layout.placement import BoundEstimate
    from neuron_batch.layout.split import part_compile_s

    def compile_of(part, compiled=None):
        layout = resolve(part.settings)
        return part_compile_s(part, layout, layout_compiled(part.settings, layout)
                              if compiled is None else compiled)

    model = StepCostModel(target.profile, target.instance, target.arch, target.tp,
                          weight_dtype=target.weight_dtype, runtime=target.runtime)
    return BoundEstimate(model, engines_per_instance(target.instance, target.tp), compile_of)


def auto_split(settings: RunSettings, workload: Workload, log) -> RunSettings:
    """`--split-at auto` resolved: the cut a --resume'd run chose before (run.json), else the
    one the step-time estimate gives the least time with compile (split.choose_cut), or no
    split when one layout is faster. Needs a step-time model (`estimate_target`)."""
    from dataclasses import replace

    from neuron_batch.layout.split import choose_cut

    out_dir = Path(settings.output) if settings.output else None
    if settings.resume and out_dir is not None:
        previous = ((RunFolder(out_dir).read_manifest() or {}).get("settings") or {})
        if "split_at" in previous and previous["split_at"] != SPLIT_AUTO:
            return replace(settings, split_at=previous["split_at"])
    estimate = split_estimate(*estimate_target(settings, workload.model))
    if estimate is None:
        raise RunError("--split-at auto weighs cuts with the step-time model of the simulated "
                       "device or of a Neuron host whose instance is known (--instance, or "
                       "EC2's); here give the cut (`neuron-batch plan` or "
                       "scripts/split_what_if.py weigh them)")
    cut, words = choose_cut(settings, in_order(workload.prepared.requests, settings.order),
                            static_slots_at(settings, workload.model), estimate)
    log(words)
    return replace(settings, split_at=cut)


def check_neuron_host(settings: RunSettings, workload) -> None:
    """A Neuron run's settings, checked before anything loads (neuron_host.py): the plugin's
    limits, the sampling it can do, and whether the static KV cache fits beside the weights."""
    from neuron_batch.engine.neuron_host import NeuronHostError, check_host
    from neuron_batch.versions import neuron_plugin

    try:
        check_host(settings, settings.resolve_runtime(), workload.model.path,
                   workload.prepared.requests, neuron_plugin()["version"])
    except NeuronHostError as error:
        raise RunError(str(error)) from None


def check_sim_layout(settings: RunSettings, target) -> None:
    """N simulated engines of T NeuronCores must fit on --num-instances instances."""
    from neuron_batch.device.replica_layout import replica_devices

    try:
        replica_devices(target.instance, target.tp, settings.replicas, settings.sim.num_instances)
    except ValueError as error:
        raise RunError(f"--device sim: {error}") from None


def _run_locked(job: Job) -> RunResult:
    from neuron_batch.job.generate import generate
    from neuron_batch.run.folder_report import build_report

    settings, folder, log = job.settings, job.folder, job.log
    prepared, problems = job.workload.prepared, job.workload.problems
    ids = [r.record.id for r in prepared.requests]
    fingerprint = input_fingerprint(ids)
    manifest = folder.read_manifest()
    if folder.has_previous_run():
        if not settings.resume:
            raise RunError(f"{folder.path} already holds a run; pass --resume to finish it, or "
                           f"choose another --output")
        if manifest is not None and manifest.get("input_fingerprint") != fingerprint:
            raise RunError(f"{folder.path} holds a run of different input (other prompts, "
                           f"--limit, --shuffle or --seed); choose another --output")
    if settings.uses_ray:
        # Before the folder is written to: a bad address or a cluster too small fails here.
        from neuron_batch.replicas.cluster import connect

        job.cluster = connect(settings, log)
    folder.write_manifest({"settings": settings.to_dict(), "model": job.workload.model.name,
                           "input_fingerprint": fingerprint, "num_requests": len(ids),
                           "num_skipped": len(problems), "input_kind": job.workload.input_kind})
    folder.load_done()
    folder.open_outputs()
    pending = in_order([r for r in prepared.requests if r.record.id not in folder.done_ids],
                       settings.order)
    attempts = folder.attempts()
    # After a kill -9 the killed attempt left records but no line in attempts.json: number past
    # it rather than overwrite its records.
    attempt = max([len(attempts), *folder.records_layout()]) + 1
    if pending:
        log(f"running {len(pending):,} of {len(ids):,} requests on {device_label(settings)} "
            f"(output: {folder.path})")
        try:
            if settings.split_at is not None:
                from neuron_batch.layout.split import plan_parts
                from neuron_batch.run.split import run_parts

                resolve = lambda s: resolve_sim_target(s, job.workload.model)  # noqa: E731
                model = job.workload.model
                from neuron_batch.layout.split import placement_note

                slots = static_slots_at(settings, model)
                estimate = split_estimate(*estimate_target(settings, model))
                parts, placement = plan_parts(settings, pending, slots, estimate)
                if len(parts) == 2 and settings.uses_ray:
                    log(f"parts {placement.mode}" + (
                        f" (estimated {placement.estimated_s / 3600:.2f} h with the start-up; "
                        f"in turn {placement.in_turn_s / 3600:.2f} h)"
                        + placement_note(settings, pending, slots, estimate, placement)
                        if placement.estimated_s is not None else ""))
                outcomes = run_parts(job, parts, attempt, generate, resolve, placement)
            elif settings.uses_ray:
                from neuron_batch.replicas.pool import generate_replicas

                outcomes = iter([generate_replicas(job, pending, attempt)])
            else:
                outcomes = iter([generate(job, pending, attempt)])
            stopped = None
            for outcome in outcomes:        # (a split run's parts, one at a time)
                attempts.append(outcome)
                folder.write_attempts(attempts)
                attempt = outcome["attempt"] + 1
                if outcome.get("ended") in ("interrupted", "deadline"):
                    stopped = outcome       # (side by side, the other part may end after it)
            outcome = stopped or outcome
        except RunError as error:  # keep a trace of the failed attempt next to its outputs
            attempts.append({"attempt": attempt, "ended": "failed", "error": str(error)})
            folder.write_attempts(attempts)
            raise
    else:
        outcome = {"ended": "nothing to do"}
        log(f"all {len(ids):,} requests already done in {folder.path}")

    report = build_report(job)
    write_json_atomic(folder.path / REPORT, report)
    if settings.metrics_textfile:
        from neuron_batch.report.prometheus import prometheus_text, write_text_atomic

        write_text_atomic(settings.metrics_textfile,
                          prometheus_text(report, labels={"output": str(folder.path)}))
    if not settings.quiet:
        from neuron_batch.report.summary import format_summary

        print(format_summary(report), flush=True)
    code = EXIT_OK
    if outcome.get("ended") in ("interrupted", "deadline"):
        code = EXIT_INTERRUPTED
    elif report["requests"]["skipped"] or report["requests"]["failed"]:
        code = EXIT_PARTIAL
    return RunResult(code, folder.path, report, problems)


def device_label(settings: RunSettings) -> str:
    if settings.device == "sim":
        label = f"a simulated {settings.sim.instance}"
        if settings.sim.num_instances > 1:
            label = f"{settings.sim.num_instances} simulated {settings.sim.instance}"
    else:
        label = f"device '{settings.device}'"
    if settings.uses_ray:
        label += f", {settings.replicas} replica(s) on Ray"
    return label
