"""A run: the runner ties inputs, the device, the run folder, the engine loop (one engine,
replicas, or a split's parts) and the report together."""
