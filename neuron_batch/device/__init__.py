"""What runs the model: hardware tables, model shapes, and the simulated Neuron device's
step-time cost model (pure Python; vLLM is imported only by the executor modules)."""
