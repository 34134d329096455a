"""The NxDI plugin's model runner (vllm-neuron 0.2.0), with vLLM's grammar bitmask applied to
the host logits before its CPU sampler runs.

Why: the plugin's runner has no grammar bitmask at all (../shared/notes/neuron-runtimes.md,
"What a request may ask for, per path"), so a request with structured outputs would run
unconstrained. With CPU sampling (`on_device_sampling_config: None`, set by neuron_host.py when
the job asks for it) its `_sample` reorders the model's fp32 logits into the persistent batch's
order and hands them to `_cpu_sample`, vLLM's sampler: the one place on this path where the
logits of every scheduled request are on the host, in the batch order vLLM's
`apply_grammar_bitmask` expects (the order of `input_batch.req_id_to_index`). The scheduler's
output (its `grammar_bitmask` and `structured_output_request_ids`, vLLM 0.11.0's fields) is
kept for the step in `execute_model`.

Never silently wrong: a step with a grammar bitmask, or a request asking for logprobs, under
on-device sampling raises instead of sampling unconstrained or dropping the logprobs (the job
decision before the engine is built should have turned CPU sampling on).

Imports AWS's plugin: only used where it is installed (our worker names this class).
"""

from __future__ import annotations

from typing import Any

from vllm_neuron.worker.neuronx_distributed_model_runner import NeuronxDistributedModelRunner


class OnDeviceSamplingError(RuntimeError):
    """A request asks for what NxDI's on-device sampler cannot do."""


def on_device_sampling(model: Any) -> bool:
    config = getattr(getattr(model, "neuron_config", None), "on_device_sampling_config", None)
    return config is not None


def prompt_logprobs_refusal(scheduler_output: Any) -> str | None:
    """Requests asking for prompt logprobs: the plugin's runner never computes them
    (`prompt_logprobs_dict={}` in `_generate_model_runner_output`, either sampling mode)."""
    asking = [new.req_id for new in scheduler_output.scheduled_new_reqs
              if getattr(new.sampling_params, "prompt_logprobs", None) is not None]
    return (f"requests {asking} ask for prompt logprobs, which the NxDI plugin's runner never "
            f"returns (its prompt_logprobs_dict is always empty)") if asking else None


def device_refusal(scheduler_output: Any) -> str | None:
    """What in this step on-device sampling would get wrong (None: nothing)."""
    if getattr(scheduler_output, "grammar_bitmask", None) is not None:
        ids = sorted(getattr(scheduler_output, "structured_output_request_ids", None) or ())
        return (f"requests {ids} ask for structured outputs, which NxDI's on-device sampler "
                f"cannot apply (the plugin has no grammar bitmask)")
    asking = [new.req_id for new in scheduler_output.scheduled_new_reqs
              if getattr(new.sampling_params, "logprobs", None) is not None]
    if asking:
        return (f"requests {asking} ask for logprobs, which NxDI's on-device sampler does not "
                f"return")
    return None


class MaskedNxdiModelRunner(NeuronxDistributedModelRunner):
    """The plugin's runner; the grammar bitmask on the host logits before CPU sampling."""

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        refusal = prompt_logprobs_refusal(scheduler_output)
        if refusal is not None:
            raise OnDeviceSamplingError(f"neuron-batch: {refusal}; --device cpu returns them")
        if on_device_sampling(self.model):
            refusal = device_refusal(scheduler_output)
            if refusal is not None:
                raise OnDeviceSamplingError(
                    f"neuron-batch: {refusal}; the engine was built with on-device sampling. "
                    f"A job whose requests ask for it samples on the CPU "
                    f"(override_neuron_config on_device_sampling_config: None), decided from "
                    f"its requests before the engine starts (engine/neuron_host.py)")
        self._step_output = scheduler_output
        try:
            return super().execute_model(scheduler_output, intermediate_tensors)
        finally:
            self._step_output = None

    def _cpu_sample(self, logits, model_input):
        step = getattr(self, "_step_output", None)
        if step is not None and step.grammar_bitmask is not None:
            from vllm.v1.structured_output.utils import apply_grammar_bitmask

            # In place, rows in input_batch order (what `_sample` reordered them to); the
            # sampler's logprobs then see the constrained distribution, as on vLLM's GPU path.
            apply_grammar_bitmask(step, self.input_batch, logits, logits.device)
        return super()._cpu_sample(logits, model_input)
