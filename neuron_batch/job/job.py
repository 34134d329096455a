"""One run's resolved context, built once by the runner and handed down whole: the settings,
the workload, the locked run folder, the simulated device (when there is one) and the logger.
It replaces the nine positional parameters the runner's stages used to thread through."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from neuron_batch.config import RunSettings
from neuron_batch.job.folder import RunFolder
from neuron_batch.job.workload import Workload

if TYPE_CHECKING:
    from neuron_batch.device.target import SimTarget


@dataclass
class Job:
    settings: RunSettings
    workload: Workload
    folder: RunFolder
    log: Callable[[str], None]
    target: SimTarget | None = None     # the simulated device, resolved once; None elsewhere
    # The Ray connection of a --replicas run (replicas/cluster.py RayCluster; typed loosely so
    # this lower stage never imports the Ray one); None elsewhere.
    cluster: Any = None

    @property
    def simulated(self) -> bool:
        return self.target is not None
