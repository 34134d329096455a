"""Where the engines of a simulated `--replicas N` run sit: N engines of T NeuronCores each on M
instances of one type, an engine never spanning two instances (a tensor-parallel group shares
one instance's NeuronLink). Pure, no vLLM or Ray import."""

from __future__ import annotations

from neuron_batch.device.hardware import Instance, valid_tp_degrees
from neuron_batch.device.target import SimError


def replica_devices(inst: Instance, tp: int, replicas: int, num_instances: int) -> list[str]:
    """A label per replica ("inf2.48xlarge#0 cores 4-7"), filling one instance before the next;
    SimError when N engines of `tp` cores do not fit on `num_instances` instances."""
    per_instance = inst.num_cores // tp
    if replicas > per_instance * num_instances:
        cores = inst.num_cores * num_instances
        needed = -(-replicas // per_instance) if per_instance else None
        fits = [d for d in valid_tp_degrees(inst)
                if (inst.num_cores // d) * num_instances >= replicas]
        hints = []
        if needed is not None:
            hints.append(f"--num-instances {needed}")
        if fits:
            hints.append(f"--tensor-parallel-size {max(fits)}")
        raise SimError(
            f"--replicas {replicas} x --tensor-parallel-size {tp} needs {replicas * tp} "
            f"NeuronCores in groups of {tp}, but {num_instances} {inst.name} "
            f"{'has' if num_instances == 1 else 'have'} {cores} ({per_instance} engine"
            f"{'' if per_instance == 1 else 's'} of TP {tp} per instance); "
            f"try {' or '.join(hints) if hints else 'fewer replicas'}")
    labels = []
    for k in range(replicas):
        first = (k % per_instance) * tp
        span = f"core {first}" if tp == 1 else f"cores {first}-{first + tp - 1}"
        labels.append(f"sim {inst.name}#{k // per_instance} {span}")
    return labels
