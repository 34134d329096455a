"""What `neuron-batch doctor` finds on the host, as plain data: package metadata, /dev,
`neuron-ls`, the environment, the model cache, the results folder, the Neuron runtime and a
layout's static KV cache, the `--model` given, and (in a child process, so that a broken
install cannot take the doctor down with it) the platform vLLM picks."""

from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from neuron_batch import __version__
from neuron_batch.doctor.export import export_facts
from neuron_batch.runtimes.choice import runtime_of_plugin
from neuron_batch.runtimes.runtime import Runtime
from neuron_batch.settings import RunSettings
from neuron_batch.storage.urls import is_url
from neuron_batch.versions import (
    describe_release,
    installed_vllm,
    neuron_plugin,
    plugin_line_of,
    tested_release,
    tested_versions,
)

PLATFORM_TIMEOUT_S = 180

#: Run in a child interpreter: which platform vLLM picks (importing vLLM takes ~10 s).
_PLATFORM_PROBE = r"""
import json, sys
try:
    from vllm.platforms import current_platform as p
    print(json.dumps({"class": type(p).__name__, "module": type(p).__module__,
                      "device_type": getattr(p, "device_type", ""),
                      "device_name": getattr(p, "device_name", "")}))
except BaseException as error:
    print(json.dumps({"error": f"{type(error).__name__}: {error}"}))
"""


# -- looking at the host ---------------------------------------------------------------------
def probe_platform(python: str = sys.executable, timeout: float = PLATFORM_TIMEOUT_S
                   ) -> dict[str, Any]:
    """Which platform vLLM picks here, asked in a child process."""
    try:
        done = subprocess.run([python, "-c", _PLATFORM_PROBE], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    except subprocess.TimeoutExpired:
        return {"error": f"importing vLLM took over {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"the platform probe exited {done.returncode}: {tail[0]}"}
    return json.loads(lines[-1])


def parse_neuron_ls(text: str) -> dict[str, Any]:
    """Devices and NeuronCores from `neuron-ls`' table (its JSON flags changed between Neuron
    releases; the table's first two columns, device and cores, have not)."""
    devices = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit() and cells[1].isdigit():
            devices.append({"device": int(cells[0]), "cores": int(cells[1])})
    return {"devices": devices, "neuron_cores": sum(d["cores"] for d in devices) if devices
            else None}


def run_neuron_ls(which: Callable[[str], str | None] = shutil.which) -> dict[str, Any] | None:
    path = which("neuron-ls")
    if path is None:
        return None
    try:
        done = subprocess.run([path], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"path": path, "error": str(error), "devices": [], "neuron_cores": None}
    parsed = parse_neuron_ls(done.stdout)
    parsed.update(path=path, exit_code=done.returncode,
                  error=None if done.returncode == 0 else (done.stderr.strip() or None))
    return parsed


def disk_state(folder: str | Path) -> dict[str, Any]:
    """Free space and writability where run folders go (the nearest existing parent when the
    folder does not exist yet)."""
    path = Path(folder).expanduser().absolute()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    return {"path": str(path), "exists": path.exists(), "checked_at": str(probe),
            "free_bytes": usage.free, "writable": os.access(probe, os.W_OK)}


def neuron_runtime_facts(plugin_version: str | None, layout: RunSettings | None,
                         distribution: str | None = None) -> dict[str, Any]:
    """The Neuron runtime this host would run (from the installed plugin), NxDI's presence,
    the compiled-artifacts folder, the KV layout and an export's facts, all before anything
    loads (whether a layout loads is `layout_fit_facts`)."""
    from neuron_batch.engine.neuron_host import (
        NXDI_DISTRIBUTION,
        host_instance,
        installed_version,
    )
    from neuron_batch.engine.nxdi_plugin import layout_facts
    runtime = runtime_of_plugin(plugin_version, distribution)
    settings = layout or RunSettings.of(inputs=("-",))
    root = settings.compiled_artifacts
    if root is None:
        from neuron_batch.engine.models import default_cache_dir
        from neuron_batch.engine.neuron_host import ARTIFACTS_DIRNAME

        root = str(default_cache_dir() / ARTIFACTS_DIRNAME)
    return {
        "runtime": runtime.name if runtime else None,
        "runtime_summary": runtime.summary if runtime else None,
        "nxdi": installed_version(NXDI_DISTRIBUTION),
        "compiled_artifacts": root, "instance": host_instance(settings),
        "kv_layout": layout_facts(settings, runtime, plugin_version) if runtime else None,
        "export": export_facts(layout, runtime),
    }


def unplugged_runtime(instance: str | None) -> str | None:
    """The runtime a layout on `instance` is checked under on a host without a Neuron plugin
    (whose plugin would say): the instance family's, as the simulated device decides; None
    when a plugin is installed or the instance is unknown."""
    from neuron_batch.device.hardware import INSTANCES
    from neuron_batch.runtimes.runtime import default_runtime

    plugin = neuron_plugin()
    if runtime_of_plugin(plugin["version"], plugin.get("distribution")) is not None:
        return None
    known = INSTANCES.get((instance or "").strip().lower())
    return default_runtime(known.family).name if known is not None else None


def layout_fit_facts(layout: RunSettings | None, plugin_runtime: Runtime | None
                     ) -> dict[str, Any] | None:
    """For a `layout` naming a model: whether it loads on this host's instance (--instance,
    else EC2's name) under the runtime a run here follows (--runtime; else the installed
    plugin's; else the instance family's, as on --device sim), asked as `run` asks it
    (neuron_host.layout_fit, layout/device_fit.py): `fits` True, False (with why and what
    would fit) or None (the instance or the model's shape unknown). None without a model."""
    from neuron_batch.engine.neuron_host import NeuronHostError, host_hardware, layout_fit
    from neuron_batch.runtimes.runtime import default_runtime, get_runtime

    if layout is None or not layout.model:
        return None
    check: dict[str, Any] = {
        "model": layout.model, "max_num_seqs": layout.max_num_seqs,
        "max_model_len": layout.max_model_len,
        "tensor_parallel_size": layout.tensor_parallel_size or 1,
        "weight_dtype": str(layout.weight_dtype), "runtime": None, "instance": None,
        "fits": None, "detail": None}
    try:
        instance = host_hardware(layout)
    except NeuronHostError as error:
        return {**check, "fits": False, "detail": str(error)}
    runtime = (get_runtime(layout.runtime) if layout.runtime else plugin_runtime
               or (default_runtime(instance.family) if instance is not None else None))
    check.update(runtime=runtime.name if runtime else None,
                 instance=instance.name if instance else None)
    if runtime is None or instance is None:
        return check
    try:
        fit = layout_fit(layout, runtime, layout.model, instance)
    except NeuronHostError as error:
        return {**check, "fits": False, "detail": str(error)}
    return {**check, "fits": None if fit is None else True,
            "detail": None if fit is None else fit["derivation"]}


def gather(*, results_dir: str | Path = "results", check_platform: bool = True,
           dev_glob: Callable[[str], list[str]] = glob.glob,
           which: Callable[[str], str | None] = shutil.which,
           environ: dict[str, str] | None = None,
           layout: RunSettings | None = None, urls: Sequence[str] = ()) -> dict[str, Any]:
    """Everything doctor reports, as plain data (`layout`: the model and limits to check the
    static KV cache of, from doctor's options; `urls`: input URLs to list)."""
    from neuron_batch.engine.models import builtin_model_state

    environ = dict(os.environ if environ is None else environ)
    version, distribution = installed_vllm()
    entry = tested_release(version) if version else None
    plugin = plugin_facts()
    facts: dict[str, Any] = {
        "neuron_batch": {"version": __version__},
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "vllm": {"version": version, "distribution": distribution,
                 "tested": entry is not None,
                 "tested_scope": entry.scope if entry else None,
                 "tested_versions": tested_versions(),
                 "runs_on": describe_release(version)},
        "neuron_plugin": plugin,
        "neuron_runtime": neuron_runtime_facts(plugin["version"], layout,
                                               plugin.get("distribution")),
        "layout_fit": layout_fit_facts(layout, runtime_of_plugin(plugin["version"],
                                                                 plugin.get("distribution"))),
        "platform": None,
        "neuron": {
            "devices": sorted(dev_glob("/dev/neuron*")),
            "neuron_ls": run_neuron_ls(which),
            "visible_cores": environ.get("NEURON_RT_VISIBLE_CORES"),
        },
        "builtin_model": builtin_model_state(),
        "results": disk_state(_local_results(results_dir)),
        "output_url": output_url_facts(str(results_dir)) if is_url(str(results_dir)) else None,
        "model": model_facts(layout.model if layout is not None else None),
        "urls": [url_facts(url) for url in urls],
    }
    if check_platform and version is not None:
        facts["platform"] = probe_platform()
    return facts


def url_facts(url: str) -> dict[str, Any]:
    """An input URL as a run would read it: the objects it names and the identity the store
    sees, or the store's refusal (its URL and error code; never a credential)."""
    from neuron_batch.storage.urls import StorageError, expand, identity

    try:
        return {"url": url, "objects": len(expand(url)), "identity": identity(url)}
    except StorageError as error:
        return {"url": url, "error": str(error)}


def _local_results(results_dir: str | Path) -> str | Path:
    """Where a run's files are written on this host: the folder, or for an s3:// run folder
    its staging folder (storage/run_bucket.py), whose free space the run needs as much."""
    if is_url(str(results_dir)):
        from neuron_batch.storage.run_bucket import staging_dir

        return staging_dir(str(results_dir))
    return results_dir


def output_url_facts(url: str) -> dict[str, Any]:
    """An --output URL as a run would use it: a test object written and deleted under it, and
    the identity the store sees; or the store's refusal (URL and error code, no credential)."""
    from neuron_batch.storage.run_bucket import check_output_url
    from neuron_batch.storage.urls import StorageError, identity, probe_writable

    who: str | None = None
    try:
        check_output_url(url)
        who = identity(url)
        probe_writable(url)
        return {"url": url, "writable": True, "identity": who}
    except StorageError as error:
        return {"url": url, "error": str(error), "identity": who}


def model_facts(spec: str | None) -> dict[str, Any] | None:
    """The --model given, as `run` takes it (engine/models.py resolve_model: a model
    directory, the built-in name, a Hugging Face id), or a catalogue architecture name (the
    shape the static KV check uses); `error` says why a run could not use it. None when none
    was given. A path is a path: '/models/Llama-3.1-8B' must exist, whatever its name reads."""
    if spec is None:
        return None
    from neuron_batch.device.architectures import ArchitectureError, get_architecture
    from neuron_batch.engine.models import (
        BUILTIN_MODEL,
        ModelError,
        looks_like_path,
        resolve_model,
    )

    facts: dict[str, Any] = {"model": spec, "source": None, "path": None, "error": None}
    if spec.strip().lower() == BUILTIN_MODEL:
        return {**facts, "source": "built-in"}
    if not (Path(spec).expanduser().exists() or looks_like_path(spec)):
        try:
            return {**facts, "source": "catalogue", "path": get_architecture(spec).name}
        except ArchitectureError:
            pass
    try:
        info = resolve_model(spec)
    except ModelError as error:
        return {**facts, "error": str(error)}
    return {**facts, "source": info.source, "path": info.path}


def plugin_facts() -> dict[str, Any]:
    """The installed plugin, and the line its release belongs to (the vLLM it pins, its SDK,
    instances and runtime) when versions.NEURON_PLUGIN_RELEASES knows it."""
    plugin = neuron_plugin()
    line = plugin_line_of(plugin["version"], plugin.get("distribution"))
    return {**plugin, "line": asdict(line) if line else None}
