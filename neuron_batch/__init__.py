"""neuron-batch: offline batch inference and bucket benchmarking on AWS Neuron through vLLM."""

__version__ = "0.1.0"
