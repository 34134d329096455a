"""`--device neuron`: what AWS's vLLM plugin needs so that *our* scheduler runs on the device,
and the device compiles exactly the shapes our records describe. One place, asked through the
resolved `Runtime` (runtimes/runtime.py holds the per-runtime facts; this module composes them with
the installed plugin's release).

Why each setting (sources: ../shared/notes/neuron-runtimes.md, the plugin's public source):
- The NxDI line's platform replaces any `scheduler_cls` with its own unless
  DISABLE_NEURON_CUSTOM_SCHEDULER=1 (`Runtime.scheduler_env`). With that set it leaves chunked
  prefill as vLLM has it, and vLLM (0.10.2, 0.11.0) turns it on whatever we pass; the loader
  then asserts a chunked-prefill config, and the runner (continuous batching) feeds whole prompts
  anyway. So a worker of ours (`neuron_worker.py`) turns it off on the built config before the
  model loads, in every process that loads one, and the token budget is >= max_model_len.
- Bucket lists go to `additional_config[runtime.config_section]` under NxDI's own keys, never
  batch_size / seq_len / max_context_length (the loader derives those from vLLM's settings).
- KV (nxdi_plugin.py, per plugin release): with prefix caching (vLLM's default) NxDI's block
  layout and its (prefill, prefix) grid; without it the contiguous layout, one block of
  max_model_len per slot. Either way vLLM keeps block 0 as its null block, which plugin 0.2.0
  adds to `num_gpu_blocks_override` itself and 0.1.0 does not.
- Sampling (runtimes/sampling.py says why, with sources): NxDI's on-device sampler takes only
  temperature, top_p and top_k, in the runner's request-table order, and has no grammar
  bitmask and no logprobs. A job whose requests ask for more (structured outputs, logprobs,
  penalties, min_p, logit_bias, differing parameters) samples on the CPU (0.2.0; our runner,
  nxdi_runner.py, applies the bitmask to the host logits first) or is refused (0.1.0 has no
  CPU sampler). Decided once, from the job's requests, before the engine is built.
- Compiled artifacts: without NEURON_COMPILED_ARTIFACTS every start recompiles; with it, old
  artifacts load whatever the configuration. We point it at a folder keyed by a hash of every
  input of the compiled graphs.
- optimum-neuron (a runtime whose export fixes the shapes): its platform keeps our scheduler
  and a given worker, turns prefix caching off and sets block_size = max_model_len; our worker
  turns chunked prefill off (optimum_worker.py); the export it loads (optimum_export.py) must
  match the run's limits, and its max_context_length goes to the scheduler's section so the
  records pad every prompt to it. It reads no NEURON_COMPILED_ARTIFACTS (its exports are the
  compiled graphs); `model_loader_extra_config` lets it compile what no export or hub-cache
  entry holds, as the start-up then says.

Pure Python apart from what the callers pass in (no vLLM import).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from neuron_batch.engine.nxdi_plugin import (
    NeuronHostError,
    PluginLine,
    nxdi_kv_layout,
    plugin_line,
)
from neuron_batch.engine.optimum_export import (
    ALLOW_FRESH,
    Export,
    ask_hub_cache,
    check_export,
    check_prompts,
    find_export,
)
from neuron_batch.engine.sampling_params import request_spec, spec_asks
from neuron_batch.runtimes.runtime import NXDI, RUNTIMES, Runtime
from neuron_batch.runtimes.sampling import JobSampling, job_sampling
from neuron_batch.settings import RunSettings

if TYPE_CHECKING:
    from neuron_batch.device.hardware import Instance
    from neuron_batch.device.target import Target

#: Our worker: the plugin's, with chunked prefill turned off before the model loads.
WORKER_CLS = "neuron_batch.engine.neuron_worker.WholePromptNeuronWorker"
#: The same for optimum-neuron's worker.
OPTIMUM_WORKER_CLS = "neuron_batch.engine.optimum_worker.WholePromptOptimumWorker"
ARTIFACTS_ENV = "NEURON_COMPILED_ARTIFACTS"
#: Under the cache folder when --compiled-artifacts is not given.
ARTIFACTS_DIRNAME = "neuron-compiled"
#: The distribution NxDI's model loader imports (one spelling: the runtime's).
NXDI_DISTRIBUTION = RUNTIMES[NXDI].loader_distribution


@dataclass(frozen=True)
class HostSetup:
    """The engine settings of a Neuron host: vLLM keyword arguments, the plugin's config
    section, and environment every process that loads the model needs."""

    kwargs: dict[str, Any]
    section: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    artifacts: Path | None = None
    export: Export | None = None        # optimum-neuron: the export it loads, and from where


def request_params(settings: RunSettings, request) -> SimpleNamespace:
    """A prepared request's SamplingParams as the engine will build them (engine/sampling_params.py:
    its spec, read attribute by attribute), before any engine exists."""
    return spec_asks(request_spec(request, settings))


def job_sampling_of(settings: RunSettings, requests, params_of=request_params
                    ) -> JobSampling:
    """What these prepared requests ask of the sampler: runtimes.sampling.job_sampling over
    `params_of(settings, request)`, each request's SamplingParams as the engine gets them."""
    return job_sampling(params_of(settings, r) for r in requests)


def host_sampling(runtime: Runtime, line: PluginLine, sampling: JobSampling | None
                  ) -> dict[str, Any]:
    """The plugin config keys that sample `sampling`'s job on the host (empty: the device
    samples it); NeuronHostError, naming what asks and where it runs, when the installed
    plugin cannot."""
    path = runtime.sampling
    if sampling is not None and sampling.prompt_logprob_requests and not path.prompt_logprobs:
        raise NeuronHostError(
            f"{sampling.prompt_logprob_requests} request(s) ask for prompt logprobs, which the "
            f"{runtime.name} runtime's plugin never returns (vllm-neuron's runner: "
            f"prompt_logprobs_dict is always empty); --device cpu returns them, or drop "
            f"prompt_logprobs")
    reasons = path.host_reasons(sampling) if sampling is not None else []
    if not reasons:
        return {}
    if not line.cpu_sampling:
        raise NeuronHostError(
            f"{'; '.join(reasons)}: vllm-neuron {line.version} samples on the device only, "
            f"with temperature, top_p and top_k in its own request order (its runner returns "
            f"logprobs=None and has no grammar bitmask; NeuronCausalLM.sample raises 'CPU "
            f"sampler not implemented' without on_device_sampling_config). vllm-neuron 0.2.0 "
            f"(vLLM 0.11.0) samples these on the CPU; the CPU engine (--device cpu) and trn2 "
            f"under the vllm-neuron runtime do structured outputs too. Or drop the fields and "
            f"give every request the same temperature")
    return dict(path.host_config or ())


def host_setup(settings: RunSettings, runtime: Runtime, *, model_path: str,
               plugin_version: str | None, sampling: JobSampling | None = None,
               nxdi_version: str | None = None,
               artifacts_root: str | Path | None = None,
               hub_lookup=ask_hub_cache) -> HostSetup:
    """Everything `--device neuron` sets for this run under `runtime`; NeuronHostError, before
    anything loads, for a setting the plugin cannot run."""
    if runtime.fixed_export:
        return export_setup(settings, runtime, find_export(settings, model_path, hub_lookup))
    line = plugin_line(plugin_version)
    kwargs: dict[str, Any] = {}
    tp = settings.tensor_parallel_size
    if tp:
        kwargs["tensor_parallel_size"] = tp
    if runtime.host_block_size is None:         # NxDI: its layout and grid, per release
        layout = nxdi_kv_layout(settings, runtime, line)
        kwargs.update(layout.engine_kwargs)
        section = dict(layout.section)
    else:
        kwargs["block_size"] = settings.block_size or runtime.host_block_size
        kwargs["enable_prefix_caching"] = bool(settings.prefix_caching)
        section = {**settings.shapes(runtime).bucket_lists(), **dict(runtime.layout_config)}
    section.update(host_sampling(runtime, line, sampling))
    env = dict(runtime.scheduler_env)
    if runtime.scheduler_env:
        kwargs["worker_cls"] = WORKER_CLS
    artifacts = artifacts_dir(settings, runtime, model_path, kwargs, section,
                              plugin_version=plugin_version, nxdi_version=nxdi_version,
                              root=artifacts_root)
    env[ARTIFACTS_ENV] = str(artifacts)
    return HostSetup(kwargs, section, env, artifacts)


def export_setup(settings: RunSettings, runtime: Runtime, export: Export) -> HostSetup:
    """What `--device neuron` sets under a runtime whose export fixes the shapes
    (optimum-neuron): the export checked against the run first (NeuronHostError with the
    settings that would run it)."""
    check_export(export, settings)
    length = settings.max_model_len
    if settings.block_size is not None and settings.block_size != length:
        raise NeuronHostError(
            f"--block-size {settings.block_size}: {runtime.name}'s platform sets the KV block "
            f"to max_model_len ({length}), one per slot; drop --block-size")
    kwargs: dict[str, Any] = {"block_size": length, "enable_prefix_caching": False,
                              "worker_cls": OPTIMUM_WORKER_CLS,
                              "model_loader_extra_config": ALLOW_FRESH}
    tp = settings.tensor_parallel_size or export.tp_degree
    if tp:
        kwargs["tensor_parallel_size"] = tp
    # The plugin reads no section; our scheduler reads the context-encoding length from it.
    section = {runtime.prefill.key: [export.max_context_length]}
    return HostSetup(kwargs, section, dict(runtime.scheduler_env), None, export)


def installed_host_setup(settings: RunSettings, runtime: Runtime, model_path: str, *,
                         sampling: JobSampling | None = None) -> HostSetup:
    """`host_setup` with the plugin and NxDI releases installed here: what the engine sets,
    and so the artifacts folder its run uses (a split's estimate asks for that folder too)."""
    from neuron_batch.versions import neuron_plugin

    return host_setup(settings, runtime, model_path=model_path,
                      plugin_version=neuron_plugin()["version"], sampling=sampling,
                      nxdi_version=installed_version(NXDI_DISTRIBUTION))


# -- compiled artifacts ---------------------------------------------------------------------
def artifacts_key(fields: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str)
                          .encode()).hexdigest()[:16]


def artifacts_dir(settings: RunSettings, runtime: Runtime, model_path: str,
                  kwargs: dict[str, Any], section: dict[str, Any], *,
                  plugin_version: str | None, nxdi_version: str | None,
                  root: str | Path | None = None) -> Path:
    """<root>/<model>-<hash>: a hash of every input of the compiled graphs (the model's
    config.json, the releases that compile, the limits, the KV layout, TP, the plugin's config
    section), so a changed shape compiles anew and an unchanged one loads."""
    path = Path(model_path)
    config = path / "config.json"
    fields = {
        "model": str(path.resolve()) if path.exists() else model_path,
        "model_config": (hashlib.sha256(config.read_bytes()).hexdigest()
                         if config.is_file() else None),
        "runtime": runtime.name, "plugin": plugin_version, "nxdi": nxdi_version,
        "max_model_len": settings.max_model_len, "max_num_seqs": settings.max_num_seqs,
        "kwargs": {k: v for k, v in kwargs.items() if k != "worker_cls"},
        "section": section,
    }
    if root is None:
        root = settings.compiled_artifacts or _default_root()
    return Path(root).expanduser() / f"{path.name or 'model'}-{artifacts_key(fields)}"


def _default_root() -> Path:
    from neuron_batch.engine.models import default_cache_dir

    return default_cache_dir() / ARTIFACTS_DIRNAME


def installed_version(distribution: str | None) -> str | None:
    import importlib.metadata as metadata

    if distribution is None:        # (a runtime that loads no package of its own)
        return None
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


# -- which platform vLLM picked ---------------------------------------------------------------
def is_neuron_platform(class_name: str | None, module: str | None,
                       device_type: str | None = None) -> bool:
    """Whether vLLM's current platform is a Neuron one. The NxDI plugin's NeuronPlatform says
    device_type "cpu", so the class and its module decide, not device_type."""
    names = f"{class_name or ''} {module or ''}".lower()
    return "neuron" in names or (device_type or "") in ("neuron", "xla")


# -- this host: is it one, which instance, the Target of it --------------------------------------
#: The EC2 instance type, as the hypervisor reports it (Nitro instances: e.g. "inf2.xlarge").
DMI_PRODUCT_NAME = Path("/sys/devices/virtual/dmi/id/product_name")


@functools.cache
def on_neuron_host() -> bool:
    """AWS's plugin installed and Neuron devices present: `--device auto` runs on Neuron. Asked
    once a process (it reads package metadata and globs /dev): the host does not change."""
    import glob

    from neuron_batch.versions import neuron_plugin

    plugin = neuron_plugin()
    return bool((plugin["version"] or plugin["entry_point"]) and glob.glob("/dev/neuron*"))


def runs_on_neuron(settings: RunSettings) -> bool:
    """--device neuron, or auto on a Neuron host."""
    return settings.device == "neuron" or (settings.device == "auto" and on_neuron_host())


def host_instance(settings: RunSettings, product_name: Path = DMI_PRODUCT_NAME) -> str | None:
    """The instance this host is: --instance when given, else what the DMI product name says
    when it is one the hardware table knows; None when unknown."""
    from neuron_batch.device.hardware import INSTANCES

    if settings.host_instance:
        return settings.host_instance
    try:
        name = product_name.read_text(encoding="utf-8").strip().lower()
    except OSError:
        return None
    return name if name in INSTANCES else None


def host_hardware(settings: RunSettings) -> Instance | None:
    """This host's Instance (`host_instance`'s name looked up: the one place a Neuron host's
    name becomes the object); None when unknown; NeuronHostError for an --instance the
    hardware table lacks."""
    from neuron_batch.device.hardware import HardwareError, get_instance

    name = host_instance(settings)
    try:
        return None if name is None else get_instance(name)
    except HardwareError as error:
        raise NeuronHostError(f"--device neuron: {error}") from None


def host_target(settings: RunSettings, runtime: Runtime, model_path: str,
                instance: Instance | None) -> Target | None:
    """This host as a device Target (not simulated): `instance`, the loaded model's shape,
    `runtime`, the run's TP (vLLM's default, 1, when none is given) and its layout, with the
    host's own KV block (one of max_model_len per slot under NxDI's contiguous layout). The
    step-time model and the static slots of a split come from it. None when it cannot be told
    (unknown instance or model shape); NeuronHostError with what would fit when its layout
    cannot load (layout/device_fit.py: the one check of run and doctor, on sim as here)."""
    from neuron_batch.layout.device_fit import LayoutRefused, device_target

    if instance is None:
        return None
    try:
        return device_target(settings, instance, model_path, runtime, simulated=False)
    except LayoutRefused as error:
        raise NeuronHostError(f"--device neuron: {error}") from None
    except (ValueError, OSError):       # (a model shape or cost profile not known here)
        return None


def layout_fit(settings: RunSettings, runtime: Runtime, model_path: str,
               instance: Instance | None) -> dict[str, Any] | None:
    """Whether the run's layout loads on this host: its KV figures (a static cache's slots
    beside the weights, or the paged pool), None when it cannot be told (unknown instance or
    model shape); NeuronHostError with what would fit when it does not load."""
    target = host_target(settings, runtime, model_path, instance)
    return None if target is None else target.kv


def check_host(settings: RunSettings, runtime: Runtime, model_path: str, requests,
               plugin_version: str | None) -> HostSetup:
    """Every check of a Neuron run that needs no device, before anything loads: the plugin's
    settings (host_setup; under optimum-neuron the export it loads, and no prompt longer
    than its context-encoding graph) and whether the layout loads (`layout_fit`)."""
    setup = host_setup(settings, runtime, model_path=model_path, plugin_version=plugin_version,
                       sampling=job_sampling_of(settings, requests),
                       nxdi_version=installed_version(NXDI_DISTRIBUTION))
    if setup.export is not None:
        check_prompts(setup.export, requests)
    layout_fit(settings, runtime, model_path, host_hardware(settings))
    return setup
