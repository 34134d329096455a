"""One run's resolved context, built once by the runner and handed down whole: the settings,
the workload, the locked run folder, the device target (when there is one) and the logger.
It replaces the nine positional parameters the runner's stages used to thread through.

`resolve_target` is where a run's device is worked out from its settings and its model, once:
everything below takes the `Target` it returns (device/target.py) or the objects it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from neuron_batch.errors import RunError
from neuron_batch.job.folder import RunFolder
from neuron_batch.job.workload import Workload
from neuron_batch.settings import RunSettings

if TYPE_CHECKING:
    from neuron_batch.device.target import Target
    from neuron_batch.layout.prefix_decision import PrefixDecision
    from neuron_batch.runtimes.runtime import Runtime


@dataclass
class Job:
    settings: RunSettings
    workload: Workload
    folder: RunFolder
    log: Callable[[str], None]
    # The device, resolved once (`resolve_target`): the simulated one, or a Neuron host whose
    # instance is known (not simulated: its step-time model and static slots); None elsewhere.
    target: Target | None = None
    # The device the engine runs on, --device auto resolved by vLLM's platform once a run
    # (job/generate.py resolved_device; kept by the parts `replace`d from this job).
    device: str | None = None
    # The Ray connection of a --replicas run (replicas/cluster.py RayCluster; typed loosely so
    # this lower stage never imports the Ray one); None elsewhere.
    cluster: Any = None
    # What the run does with vLLM's prefix cache and why (layout/prefix_decision.py
    # PrefixDecision; run/prefix_auto.py settles it); None for a folder's report alone.
    prefix_caching: PrefixDecision | None = None
    # Where each request ends, for this attempt (job/outputs.py RunOutputs: outputs.jsonl,
    # errors.jsonl, batch.json); set by the runner once the folder is taken.
    outputs: Any = None

    @property
    def simulated(self) -> bool:
        return self.target is not None and self.target.simulated

    @property
    def runtime(self) -> Runtime:
        """The run's runtime: its target's, else the one its settings decided."""
        return self.target.runtime if self.target is not None else self.settings.resolve_runtime()


def resolve_target(settings: RunSettings, model_path: str | None) -> Target | None:
    """The device of a run, from its settings and the model (`model_path`; None before the
    model is read: then only a device that names its architecture resolves).

    On --device sim, the simulated instance, checked (RunError naming what does not fit). On a
    Neuron host whose instance is known (--instance, or EC2's name), the same object for that
    instance, the loaded model's shape and the host's runtime: how --split-at auto estimates
    there (None when it cannot be told; the host's own checks, neuron_host.check_host, say why
    a layout cannot load). Elsewhere None."""
    from neuron_batch.device.target import Target
    from neuron_batch.engine import neuron_host

    sim = settings.target
    if settings.simulated:
        arch = sim.architecture or model_path
        if arch is None:
            return None
        try:
            return Target.resolve(
                instance=settings.sim_instance(), arch=arch, tp=sim.tensor_parallel_size,
                weight_dtype=sim.weight_dtype, profile=sim.cost_profile,
                runtime=settings.resolve_runtime(), max_model_len=settings.max_model_len,
                max_num_seqs=settings.max_num_seqs, kv_reserve=settings.kv_reserve,
                # (None, auto: off until the run decides; the Target holds it as a bool)
                prefix_caching=bool(settings.prefix_caching))
        except (ValueError, FileNotFoundError) as error:
            raise RunError(f"--device sim: {error}") from None
    if model_path is None or not neuron_host.runs_on_neuron(settings):
        return None
    try:
        return neuron_host.host_target(settings, settings.resolve_runtime(), model_path,
                                       neuron_host.host_hardware(settings))
    except neuron_host.NeuronHostError:
        return None
