"""The Neuron scheduler: vLLM v1 scheduler subclasses for Neuron's bucketed, one-prefill-a-step
execution. The dotted paths to give vLLM's `scheduler_cls` / `--scheduler-cls` are
`neuron_batch.scheduler.NeuronScheduler` and `neuron_batch.scheduler.NeuronAsyncScheduler`.

Importing this package imports vLLM; the record format alone lives in `.records` (no vLLM).
"""

from neuron_batch.scheduler.neuron import NeuronAsyncScheduler, NeuronScheduler

__all__ = ["NeuronScheduler", "NeuronAsyncScheduler"]
