"""The AWS NxDI plugin's worker, with chunked prefill off before the model loads and our model
runner (nxdi_runner.py: vLLM's grammar bitmask on the host logits before CPU sampling).

Why a worker: to keep our scheduler, the plugin's platform must be told
DISABLE_NEURON_CUSTOM_SCHEDULER=1, and then it leaves chunked prefill as vLLM set it. vLLM's
engine arguments turn it on for generative models whatever we pass (0.11.0:
`EngineArgs._set_default_args`; seen on 0.10.2 and 0.11.0 in tests/engine/test_nxdi_plugin.py), and
the plugin's loader then asserts a chunked-prefill config (and its runner would read chunk
sizes our whole-prompt scheduler never makes). The worker is built, in every process that
loads a model, from the config the engine core also schedules with, before the model loads:
the one place where turning it off reaches both the loader and our scheduler. `neuron_host.py`
names this class as vLLM's `worker_cls` (the plugin's platform keeps a given one).

Imports AWS's plugin: only used where it is installed.
"""

from __future__ import annotations

from typing import Any

from vllm_neuron.worker.neuron_worker import NeuronWorker

from neuron_batch.engine.whole_prompts import whole_prompts

__all__ = ["WholePromptNeuronWorker", "whole_prompts"]


class WholePromptNeuronWorker(NeuronWorker):
    def __init__(self, vllm_config, *args: Any, **kwargs: Any) -> None:
        whole_prompts(vllm_config.scheduler_config)
        super().__init__(vllm_config, *args, **kwargs)

    def get_neuronx_distributed_model_runner(self, vllm_config, device):
        # (the plugin's worker builds its runner through this method, 0.1.0 and 0.2.0)
        from neuron_batch.engine.nxdi_runner import MaskedNxdiModelRunner

        return MaskedNxdiModelRunner(vllm_config=vllm_config, device=device)
