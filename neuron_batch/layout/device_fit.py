"""Whether a run's layout loads on its Neuron device, asked in one place: `run` on the simulated
device and on a Neuron host, and `doctor` before either, build the device's Target here, so
what one refuses the others refuse, in the same words (tests/test_doctor.py asserts it on a
grid of instances, runtimes and limits).

A layout loads when the runtime ships for the instance (runtime.not_shipped_for), its TP
degree is one the instance has, the weights fit, max_model_len is within the model's context,
and its KV cache holds what the runtime needs: max_num_seqs static slots of max_model_len
(nxdi, optimum-neuron: device/static_kv.py), or one max_model_len request in the paged pool
under --kv-reserve max-model-len (vllm-neuron: device/target.checked_kv_capacity). Each
refusal names the numbers and what would fit.

The two devices differ only in their defaults, both said here: the simulated one shards over
every NeuronCore and pages KV in blocks of 32; a Neuron host takes vLLM's TP (1) and the
runtime's own block (NxDI's contiguous cache: one block of max_model_len per slot).
"""

from __future__ import annotations

from pathlib import Path

from neuron_batch.device.cost_model import CapacityError
from neuron_batch.device.hardware import HardwareError, Instance
from neuron_batch.device.target import NEURON_BLOCK_SIZE, SimError, Target
from neuron_batch.runtimes.runtime import Runtime
from neuron_batch.settings import RunSettings


class LayoutRefused(ValueError):
    """A layout that cannot load on its device; the message says why and what would fit."""


def device_target(settings: RunSettings, instance: Instance, arch: str | Path,
                  runtime: Runtime, *, simulated: bool) -> Target:
    """The device `settings` describe on `instance` (the model's shape `arch`: a catalogue
    name, a config.json or a model folder), its layout checked: LayoutRefused when it cannot
    load. An architecture or cost profile that cannot be read raises as Target.resolve does
    (ArchitectureError, FileNotFoundError): the caller says whether that is an error (the
    simulated device) or only a question it cannot answer (a Neuron host)."""
    refused = runtime.not_shipped_for(instance.name, instance.family)
    if refused:
        raise LayoutRefused(refused)
    sim = settings.target
    if simulated:
        tp, block, caching = (sim.tensor_parallel_size, NEURON_BLOCK_SIZE,
                              bool(settings.prefix_caching))
    else:           # (a host's Target is for estimates: its prefix cache is the run's to say)
        tp, block, caching = (sim.tensor_parallel_size or 1,
                              runtime.host_block_size or settings.max_model_len, False)
    try:
        return Target.resolve(
            instance=instance, arch=arch, tp=tp, weight_dtype=sim.weight_dtype,
            profile=sim.cost_profile, runtime=runtime, max_model_len=settings.max_model_len,
            max_num_seqs=settings.max_num_seqs, kv_reserve=settings.kv_reserve,
            block_size=block, simulated=simulated, prefix_caching=caching)
    except (CapacityError, SimError, HardwareError) as error:
        raise LayoutRefused(str(error)) from None
