"""Which runtime a run follows, decided once per (--runtime, device, instance family,
installed plugin): the one place a --runtime name is looked up or a runtime chosen without
one (config.RunSettings.resolve_runtime asks here; plan's instances through
`simulated_runtime`). Pure: the installed plugin is read by the caller."""

from __future__ import annotations

from functools import cache

from neuron_batch.choices import Device
from neuron_batch.runtimes.runtime import (
    NXDI,
    OPTIMUM_NEURON,
    RUNTIMES,
    VLLM_NEURON,
    Runtime,
    default_runtime,
    get_runtime,
)

#: The distribution name of Hugging Face's plugin (versions.py's plugin lines name it too).
OPTIMUM_DISTRIBUTION = "optimum-neuron"


def simulated_runtime(name: str | None, family: str) -> Runtime:
    """The runtime a simulated instance of `family` follows under --runtime `name` (None: the
    family's): what `resolve_runtime` decides for --device sim, for plan's instances."""
    return decide_runtime(name, Device.SIM, family, None)


@cache
def decide_runtime(name: str | None, device: Device, family: str | None,
                    plugin: tuple[str, str | None] | None) -> Runtime:
    """The one place a run's --runtime name is looked up, or the runtime decided without one:
    a Neuron host's (or auto's) installed plugin (`plugin`: its distribution and version) and
    its line, else the simulated instance family's (`family` is None off the simulated
    device: the seed design's)."""
    if name:
        return get_runtime(name)
    if name is None and device != Device.SIM and plugin is not None:
        detected = runtime_of_plugin(plugin[1], plugin[0])
        if detected is not None:
            return detected
    return default_runtime(family)


def runtime_of_plugin(plugin_version: str | None,
                      distribution: str | None = None) -> Runtime | None:
    """The runtime an installed plugin runs. optimum-neuron: its own (any release). A
    `vllm-neuron` distribution (the default): the NxDI line is versioned 0.x (0.1.0, 0.2.0,
    0.4.x, 0.5.x), the Beta line by the vLLM it pins then its own release (0.21.0.1.0.0,
    0.24.0.1.1.0, 0.29.0.1.2.0). None when no plugin is installed."""
    if distribution == OPTIMUM_DISTRIBUTION:
        return RUNTIMES[OPTIMUM_NEURON]
    if not plugin_version:
        return None
    parts = [int(p) for p in plugin_version.split("+")[0].split(".")[:2] if p.isdigit()]
    minor = parts[1] if len(parts) > 1 else 0
    return RUNTIMES[VLLM_NEURON] if minor >= 21 else RUNTIMES[NXDI]
