"""An engine's start-up, around the engine's construction: whether its graphs were compiled
before, the warning when the host cannot compile them, and afterwards what it cost.

- Simulated device: the graphs count as compiled with `--compiled`, or when the
  `--compiled-artifacts` folder recorded this configuration's shapes in an earlier run
  (device/compile_cache.py); a run that starts records them. The attempt keeps the estimate
  (device/compile_time.py) and whether it was a load only.
- Neuron host: the artifacts folder (engine/neuron_host.py, one per hash of the compiled
  shapes) either held this configuration or not; the engine log says how many graphs the
  compile cache served ("Using a cached neff") and how long each phase took
  (device/compile_log.py); the attempt keeps the start-up time measured around the engine's
  construction. Under optimum-neuron the export it loads says it instead (engine/
  optimum_export.py: a local export or the hub cache's artifacts are compiled, a fresh export
  is not), said before it starts and, with the time it took, after.
Either way a host whose memory cannot compile the model (compile_time.host_memory_warning) is
warned before anything loads, unless the graphs are compiled already.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_batch.settings import RunSettings


@dataclass
class StartupState:
    """What is known before the engine starts."""

    compiled: bool                      # graphs compiled before (artifacts, cache, --compiled)
    artifacts: Path | None = None       # the folder that holds (or will hold) the graphs
    log_offset: int = 0                 # engine.log's size before this start (Neuron host)
    export: str | None = None           # optimum-neuron: where its graphs come from


def layout_compiled(settings: RunSettings, target, model_path: str | None = None,
                    requests=()) -> bool:
    """Whether a layout's graphs count as compiled on `target`. Simulated: --compiled, or the
    --compiled-artifacts folder recorded its shapes. A Neuron host: the artifacts folder this
    layout's run would use (one per hash of its compiled inputs, engine/neuron_host.py) holds
    graphs. (Neuron's own compile cache may serve more than that folder says; only the run's
    engine log tells, so an estimate counts such a layout as compiled fresh.)"""
    if target.simulated:
        from neuron_batch.device import compile_cache

        if settings.compiled:
            return True
        return compile_cache.holds(settings.compiled_artifacts, target,
                                   settings.shapes(target.runtime))
    if model_path is None:
        return False
    folder = host_artifacts(settings, target.runtime, model_path, requests)
    return folder is not None and holds_graphs(folder)


def host_artifacts(settings: RunSettings, runtime, model_path: str, requests=()) -> Path | None:
    """The artifacts folder a Neuron run of these settings uses (the same inputs as the
    engine's: the installed plugin and NxDI releases, what the requests ask of the sampler);
    None for settings the plugin refuses (the run itself says why)."""
    from neuron_batch.engine.neuron_host import (
        NeuronHostError,
        installed_host_setup,
        job_sampling_of,
    )

    try:
        return installed_host_setup(settings, runtime, model_path,
                                    sampling=job_sampling_of(settings, requests)).artifacts
    except NeuronHostError:
        return None


def holds_graphs(folder: Path) -> bool:
    """Whether an artifacts folder holds what an earlier start compiled (not just made)."""
    return folder.is_dir() and any(folder.iterdir())


def before_start(job, kwargs: dict[str, Any], log_path: Path, log) -> StartupState:
    """The start-up's state, and the host-memory warning when it must compile here."""
    from neuron_batch.device.compile_time import host_memory_warning

    settings = job.settings
    if job.simulated:
        state = StartupState(layout_compiled(settings, job.target))
    else:
        own = (kwargs.get("additional_config") or {}).get("neuron_batch") or {}
        env = own.get("process_env") or {}
        from neuron_batch.engine.neuron_host import ARTIFACTS_ENV

        folder = Path(env[ARTIFACTS_ENV]) if env.get(ARTIFACTS_ENV) else None
        reused = folder is not None and holds_graphs(folder)
        export = own.get("export")
        if export is not None:
            reused = bool(export["compiled"])
            log(f"{job.runtime.name}: {export['words']}")
        state = StartupState(reused, folder, log_path.stat().st_size
                             if log_path.exists() else 0,
                             export["source"] if export is not None else None)
    instance, arch, dtype = _device_of(job)
    if not state.compiled and instance is not None and arch is not None:
        warning = host_memory_warning(instance, arch, dtype)
        if warning:
            log(f"warning: {warning}")
    return state


def after_start(job, state: StartupState, seconds: float, log_path: Path) -> dict[str, Any]:
    """The attempt's `startup` record, once the engine is up."""
    from neuron_batch.device import compile_cache
    from neuron_batch.device.compile_log import parse_startup, read_from

    settings = job.settings
    if job.simulated:
        shapes = settings.shapes(job.target.runtime)
        if settings.compiled_artifacts:
            compile_cache.record(settings.compiled_artifacts, job.target, shapes)
        return {"compiled_before": state.compiled, "simulated": True}
    found = parse_startup(read_from(log_path, state.log_offset))
    startup = {"compiled_before": state.compiled or found["from_cache"],
               "artifacts": str(state.artifacts) if state.artifacts else None,
               "artifacts_reused": state.compiled, "measured_s": round(seconds, 1), **found}
    if state.export is not None:
        startup["export"] = state.export
    return startup


def startup_words(startup: dict[str, Any] | None) -> str | None:
    """The line said once a Neuron host's engine is up, where its graphs came from (an
    optimum-neuron export); None where there is nothing to say."""
    if not startup or not startup.get("export"):
        return None
    return f"model loaded in {startup['measured_s']:.1f} s ({startup['export']})"


def _device_of(job) -> tuple[Any, Any, str]:
    """(Instance, Architecture, weight type) of the run's device: its target's (the simulated
    one, or a Neuron host whose instance is known), else the host's and the model's own,
    None where unknown."""
    if job.target is not None:
        return job.target.instance, job.target.arch, job.target.weight_dtype
    # A Neuron host without a Target (its layout cannot load, or its model's shape is not one
    # the cost model reads): its instance and model, as host_target would take them,
    # still name the warning.
    from neuron_batch.device.model_dir import architecture_of
    from neuron_batch.engine.neuron_host import NeuronHostError, host_hardware

    try:
        inst = host_hardware(job.settings)
    except NeuronHostError:     # (an --instance the table lacks: no warning, as for none)
        inst = None
    try:
        arch = architecture_of(job.workload.model.path)[0]
    except (OSError, ValueError):   # (ArchitectureError is one)
        arch = None
    return inst, arch, job.settings.weight_dtype
