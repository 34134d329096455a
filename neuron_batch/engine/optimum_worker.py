"""optimum-neuron's vLLM worker, with chunked prefill off before the model loads.

optimum-neuron's platform keeps a given `scheduler_cls` (it sets none: platform.py
`check_and_update_config`) and a given `worker_cls` (it sets its own only for "auto"), but
leaves chunked prefill as vLLM built it: on, for every generative model in vLLM 0.11.0. Its
runner feeds a new request's whole prompt whatever the step schedules, so our scheduler
insists on whole prompts; this worker turns chunking off on the config the engine core
schedules with, before the model loads (whole_prompts.py says why there). `neuron_host.py`
names it as vLLM's `worker_cls` under a runtime whose plugin is optimum-neuron.

Imports optimum-neuron's plugin: only used where it is installed.
"""

from __future__ import annotations

from typing import Any

from optimum.neuron.vllm.worker import OptimumNeuronWorker

from neuron_batch.engine.whole_prompts import whole_prompts


class WholePromptOptimumWorker(OptimumNeuronWorker):
    def __init__(self, vllm_config, *args: Any, **kwargs: Any) -> None:
        whole_prompts(vllm_config.scheduler_config)
        super().__init__(vllm_config, *args, **kwargs)
