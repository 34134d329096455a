"""Which runtime a run follows, decided once per (--runtime, device, instance family,
installed plugin): the one place a --runtime name is looked up or a runtime chosen without
one (config.RunSettings.resolve_runtime asks here; plan's instances through
`simulated_runtime`). Pure: the installed plugin is read by the caller."""

from __future__ import annotations

from functools import cache

from neuron_batch.choices import Device
from neuron_batch.runtimes.runtime import Runtime, default_runtime, get_runtime


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
        from neuron_batch.versions import runtime_of_plugin
        detected = runtime_of_plugin(plugin[1], plugin[0])
        if detected is not None:
            return detected
    return default_runtime(family)
