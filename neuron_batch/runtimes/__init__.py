"""The Neuron runtimes (NxDI, AWS's vllm-neuron plugin, optimum-neuron) and what each compiles,
decides and hints (pure: no vLLM import):

- runtime.py     the `Runtime` object, one per runtime: bucket keys and words, KV layout, what
                 an export fixes, engine limits; `runtime_of`, `default_runtime`
- choice.py      the runtime a run follows, decided once per (--runtime, device, instance
                 family, installed plugin)
- shapes.py      the compiled shapes of one configuration (`Shapes`, `BucketOption`)
- buckets.py     bucket defaults and lookups
- prefix_grid.py NxDI's prefill x prefix grid under prefix caching
- sampling.py    what a request's SamplingParams ask of the sampler and where each runtime
                 samples (on the device, or the logits to the host)
- hints.py       a runtime's lists in words: what to give instead of another runtime's
                 bucket lists, and the lists as tables name them
"""
