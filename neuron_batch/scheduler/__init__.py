"""The Neuron scheduler: vLLM v1 scheduler subclasses for Neuron's bucketed, one-prefill-a-step
execution. The dotted paths to give vLLM's `scheduler_cls` / `--scheduler-cls` are
`neuron_batch.scheduler.NeuronScheduler` and `neuron_batch.scheduler.NeuronAsyncScheduler`.

The classes are imported on first use, so `neuron_batch.scheduler.records` (the record format,
no vLLM) stays cheap to import for reports and metrics.
"""

__all__ = ["NeuronScheduler", "NeuronAsyncScheduler"]

#: The dotted path every engine this package builds gives vLLM as `scheduler_cls` (vLLM imports
#: it in the engine core; naming it keeps the caller free of vLLM).
SCHEDULER_CLS = "neuron_batch.scheduler.NeuronScheduler"


def __getattr__(name: str) -> type:
    if name in __all__:
        from neuron_batch.scheduler import neuron

        cls: type = getattr(neuron, name)
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
