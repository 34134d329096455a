"""Stage 2: a run. The engine builder (vLLM + NeuronScheduler + a device), the run folder
(lock, resume, outputs) and the runner that ties inputs, engine and report together."""
