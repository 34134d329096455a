"""The vLLM and model boundary: the engine builder for each device, the engine's log, the Neuron
host's plugin settings and worker, and the built-in model."""
