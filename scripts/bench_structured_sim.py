#!/usr/bin/env python
"""Structured outputs on the simulated inf2.8xlarge (Llama-3.1-8B, --max-model-len 2048, nxdi):
the same workload with no request constrained (on-device sampling) and with every request
under a JSON schema (so the whole model samples on the host: NxDI's CPU sampling, the logits
over the host link every step, vLLM's CPU sampler), in the same run. The second half of
issue 38's `scripts/bench_structured.py` (whose first half measures the CPU engine), kept in
its own file.

Workload: the first --requests requests of the Azure conversation trace (datasets/) whose
prompt + output fit 2,048 tokens, all at time zero. Each configuration runs --repeats times,
alternating; the simulated figures are deterministic (the same every repeat), the wall times
are this machine's (medians). Prints output tokens per simulated second, the share of step
time charged to sampling, and the ratio schema / none.

    .venv/bin/python scripts/bench_structured_sim.py              # 400 requests, 3 repeats
    .venv/bin/python scripts/bench_structured_sim.py --requests 2000 --max-num-seqs 8
    .venv/bin/python scripts/bench_structured_sim.py --host-passes   # the cost model's figures
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TRACE = ROOT / "datasets" / "azure-llm-inference-conv-2023.csv"
MAX_MODEL_LEN = 2048
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}


def workload(count: int) -> list[tuple[int, int]]:
    out = []
    with open(TRACE, newline="") as handle:
        for row in csv.DictReader(handle):
            prompt, output = int(row["num_prefill_tokens"]), int(row["num_decode_tokens"])
            if prompt + output <= MAX_MODEL_LEN and output > 0:
                out.append((prompt, output))
                if len(out) == count:
                    break
    return out


def run_once(requests, constrained: bool, max_num_seqs: int, workdir: Path) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from neuron_batch.device import sampling_cost
    from neuron_batch.device.executor import engine_core, shutdown_llm
    from neuron_batch.device.hardware import get_instance
    from neuron_batch.device.target import Target
    from neuron_batch.report.sampling import sampling_section
    from neuron_batch.runtimes.runtime import RUNTIMES
    from neuron_batch.runtimes.sampling import HOST_SAMPLING_KEY, job_sampling
    from neuron_batch.scheduler.records import KEEP_RECORDS_ENV

    runtime = RUNTIMES["nxdi"]
    params = [SamplingParams(max_tokens=out, ignore_eos=True, detokenize=False,
                             structured_outputs=StructuredOutputsParams(json=SCHEMA)
                             if constrained else None) for _, out in requests]
    target = Target.resolve(instance=get_instance("inf2.8xlarge"), arch="llama-3.1-8b",
                            runtime=runtime, max_model_len=MAX_MODEL_LEN,
                            max_num_seqs=max_num_seqs)
    kwargs = target.engine_kwargs(max_num_batched_tokens=MAX_MODEL_LEN, workdir=workdir)
    # The engine's decision (engine.engine_kwargs): the job's requests, before it is built.
    host = bool(runtime.sampling.host_reasons(job_sampling(params)))
    kwargs["additional_config"]["neuron_batch"][HOST_SAMPLING_KEY] = host
    started = time.perf_counter()
    os.environ[KEEP_RECORDS_ENV] = "1"     # (this small run's steps, read back below)
    llm = LLM(**kwargs)
    try:
        prompts = [{"prompt_token_ids": [1000 + (i * 37 + j) % 30000 for j in range(p)]}
                   for i, (p, _) in enumerate(requests)]
        outputs = llm.generate(prompts, [sampling_cost.for_simulated(p) for p in params],
                               use_tqdm=False)
        recorder = engine_core(llm).scheduler.recorder
    finally:
        shutdown_llm(llm)
    wall = time.perf_counter() - started
    steps = recorder.steps
    elapsed = max(s.t_end for s in steps if s.t_end is not None)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    section = sampling_section(steps, list(recorder.requests.values())) or {}
    return {"host_sampling": host, "sim_s": elapsed, "tokens": tokens,
            "tok_per_s": tokens / elapsed, "sampling_s": section.get("sampling_s", 0.0),
            "sampling_share": section.get("share_of_step_time", 0.0),
            "constrained": section.get("constrained_requests", 0), "wall_s": wall}


def host_passes(vocab: int = 128256, repeats: int = 25) -> None:
    """The host sampler's per-logit figures the cost model uses (device/sampling_cost.py):
    one greedy pass (argmax) and log-softmax + top-k over one fp32 row, one thread, medians."""
    import torch

    torch.set_num_threads(1)
    row = torch.randn(1, vocab)

    def median(fn) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    greedy = median(lambda: row.argmax(-1))
    logprobs = median(lambda: torch.log_softmax(row, -1).topk(5, -1))
    print(f"one row of {vocab} fp32 logits, 1 thread, median of {repeats}: argmax "
          f"{greedy * 1e3:.3f} ms ({greedy / vocab * 1e9:.2f} ns a logit), log-softmax + "
          f"top-5 {logprobs * 1e3:.3f} ms ({logprobs / greedy:.1f} passes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--host-passes", action="store_true",
                        help="only measure the host sampler's per-logit figures")
    args = parser.parse_args()
    if args.host_passes:
        host_passes()
        return
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    requests = workload(args.requests)
    results: dict[str, list[dict]] = {"none": [], "schema": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name in ("none", "schema"):          # alternating, same run
                results[name].append(run_once(requests, name == "schema", args.max_num_seqs,
                                              Path(tmp) / f"{name}-{repeat}"))
    print(f"simulated inf2.8xlarge, llama-3.1-8b, nxdi, max_model_len {MAX_MODEL_LEN}, "
          f"max_num_seqs {args.max_num_seqs}, {len(requests)} requests (Azure conv trace)")
    print(f"{'schema':8} {'host':5} {'sim s':>9} {'out tok/s':>10} {'sampling s':>11} "
          f"{'share':>6} {'wall s (median)':>16}")
    row = {}
    for name, runs in results.items():
        first = runs[0]
        assert all(r["sim_s"] == first["sim_s"] for r in runs), "the simulation must repeat"
        row[name] = first
        print(f"{name:8} {str(first['host_sampling']):5} {first['sim_s']:9.2f} "
              f"{first['tok_per_s']:10.1f} {first['sampling_s']:11.2f} "
              f"{first['sampling_share']:6.1%} "
              f"{statistics.median(r['wall_s'] for r in runs):16.2f}")
    ratio = row["schema"]["tok_per_s"] / row["none"]["tok_per_s"]
    print(f"ratio schema / none, simulated output tokens per second: {ratio:.3f}")


if __name__ == "__main__":
    main()
