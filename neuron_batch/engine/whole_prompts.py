"""Chunked prefill off on a built vLLM config, before a Neuron plugin's worker loads the model.

Why: both Neuron host runtimes that prefill whole prompts keep our scheduler only with chunked
prefill off, and vLLM's engine arguments turn it on for generative models whatever we pass
(0.11.0: `EngineArgs._set_default_args`). The AWS NxDI plugin's loader then asserts a
chunked-prefill config; optimum-neuron's runner would still feed each new request's whole
prompt (runner.py `_prepare_prompt`) while our scheduler refuses to start with chunking on.
A worker of ours calls this in every process that loads a model, on the config the engine
core also schedules with (neuron_worker.py, optimum_worker.py).

Pure Python (takes vLLM's SchedulerConfig, imports nothing).
"""

from __future__ import annotations

from typing import Any


def whole_prompts(scheduler_config: Any) -> None:
    """Chunked prefill off on a built SchedulerConfig (the field the plugins read is
    `chunked_prefill_enabled`; vLLM keeps the requested value in `enable_chunked_prefill`)."""
    for name in ("enable_chunked_prefill", "chunked_prefill_enabled"):
        if getattr(scheduler_config, name, False):
            try:
                setattr(scheduler_config, name, False)
            except AttributeError:  # a read-only property derived from the other field
                pass
    if getattr(scheduler_config, "chunked_prefill_enabled", False):
        raise RuntimeError("neuron-batch could not turn vLLM's chunked prefill off; the Neuron "
                           "plugin's model would be fed chunks our scheduler never makes")
