"""Runs one case of tests/engine/test_nxdi_plugin.py in a fresh interpreter: AWS's plugin patches
vLLM's ModelConfig globally when its platform is built, so no two cases share a process.

    python tests/engine/nxdi_driver.py CASE '<json arguments>'   (PYTHONPATH: the repository and
                                                            the plugin's install folder)

Prints one JSON line, prefixed with RESULT, that the test reads. Cases: `config` (our engine
settings through the plugin platform's check_and_update_config), `loader` (the plugin's real
get_neuron_model with NxDI's load captured), `run` (vLLM's engine with our scheduler, the
plugin's worker and model runner, and the fake NxDI model of nxdi_fakes.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nxdi_fakes  # noqa: E402

nxdi_fakes.install()
nxdi_fakes.fake_neuron_devices()

from neuron_batch.engine import engine  # noqa: E402
from neuron_batch.runtimes.sampling import JobSampling  # noqa: E402
from neuron_batch.settings import RunSettings  # noqa: E402


def settings_of(args: dict) -> RunSettings:
    given = dict(args.get("settings", {}))
    for key in ("context_encoding_buckets", "token_generation_buckets", "prefix_buckets"):
        if given.get(key) is not None:
            given[key] = tuple(given[key])
    tp = given.pop("tensor_parallel_size", None)
    # A run settles --prefix-caching auto before the engine is built (run/prefix_auto.py); a
    # case that names none runs as vLLM's default, on.
    given.setdefault("prefix_caching", True)
    return RunSettings.of(inputs=("x.jsonl",), model=args["model"], device="neuron",
                       tensor_parallel_size=tp, **given).validate()


def kwargs_of(args: dict, settings: RunSettings, apply_env: bool = True) -> dict:
    work = Path(args["work"])
    kwargs = engine.engine_kwargs(settings, "neuron", args["model"], work / "records.jsonl",
                                  work, has_tokenizer=False,
                                  sampling=JobSampling(mixed=True) if args.get("mixed") else None)
    if apply_env:
        os.environ.update(kwargs["additional_config"]["neuron_batch"]["process_env"])
    return kwargs


def built_config(kwargs: dict):
    from vllm.engine.arg_utils import EngineArgs

    engine_args = {k: v for k, v in kwargs.items() if k != "use_tqdm_on_load"}
    return EngineArgs(**engine_args).create_engine_config()


def case_config(args: dict) -> dict:
    from vllm.platforms import current_platform

    settings = settings_of(args)
    kwargs = kwargs_of(args, settings, apply_env=not args.get("without_env"))
    config = built_config(kwargs)
    scheduler = config.scheduler_config
    chunked_built = bool(scheduler.chunked_prefill_enabled)
    if not args.get("without_worker"):
        from neuron_batch.engine.neuron_worker import whole_prompts

        whole_prompts(scheduler)   # what our worker does before the model loads
    return {
        "detected_device": engine.detect_device(),   # what --device auto runs on
        "platform": f"{type(current_platform).__module__}.{type(current_platform).__name__}",
        "device_type": current_platform.device_type,
        "kwargs": {k: v for k, v in kwargs.items() if k != "additional_config"},
        "scheduler_cls": str(scheduler.scheduler_cls),
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "max_num_seqs": scheduler.max_num_seqs,
        "chunked_prefill_as_built": chunked_built,
        "chunked_prefill_enabled": bool(scheduler.chunked_prefill_enabled),
        "block_size": config.cache_config.block_size,
        "enable_prefix_caching": bool(config.cache_config.enable_prefix_caching),
        "num_gpu_blocks_override": config.cache_config.num_gpu_blocks_override,
        "worker_cls": config.parallel_config.worker_cls,
        "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        "section": kwargs["additional_config"]["override_neuron_config"],
    }


def case_loader(args: dict) -> dict:
    from vllm_neuron.worker.neuronx_distributed_model_loader import get_neuron_model

    from neuron_batch.engine.neuron_worker import whole_prompts

    settings = settings_of(args)
    config = built_config(kwargs_of(args, settings))
    whole_prompts(config.scheduler_config)
    get_neuron_model(config.model_config, config.cache_config, config.parallel_config,
                     config.scheduler_config, None, config.speculative_config,
                     config.additional_config)
    shapes = settings.shapes()
    return {"neuron_config": nxdi_fakes.CAPTURED["neuron_config"],
            "compiled": nxdi_fakes.CAPTURED["compiled"],
            "loaded": nxdi_fakes.CAPTURED["loaded"],
            "artifacts": os.environ.get("NEURON_COMPILED_ARTIFACTS"),
            "vllm_num_blocks": config.cache_config.num_gpu_blocks_override,
            "vllm_block_size": config.cache_config.block_size,
            "prefill_buckets": list(shapes.prefill_buckets),
            "attention_buckets": list(shapes.attention_buckets)}


def case_run(args: dict) -> dict:
    """The whole engine: our Engine (which applies the plugin's switches), vLLM's engine core
    with our scheduler, the plugin's worker and model runner, the fake NxDI model."""
    from neuron_batch.scheduler.records import read_records

    settings = settings_of(args)
    kwargs = kwargs_of(args, settings, apply_env=False)   # Engine applies them itself
    run = engine.Engine(kwargs, quiet=True)
    outputs: dict[str, list[int]] = {}
    for request in args["requests"]:
        temperature = request.get("temperature", 0.0)
        run.add(request["id"], request["prompt"],
                {"max_tokens": request["max_tokens"], "temperature": temperature, "stop": None,
                 "seed": request.get("seed", 0) if temperature > 0 else None,
                 "ignore_eos": True})
    for _ in range(args.get("max_steps", 100_000)):
        if not run.has_unfinished():
            break
        for done in run.step():
            outputs[done.request_id] = done.token_ids
    run.close()
    records = read_records(Path(args["work"]) / "records.jsonl")
    steps = [{"kind": s.kind, "req_ids": s.req_ids, "num_tokens": s.num_tokens,
              "num_tokens_padded": s.num_tokens_padded, "num_seqs": s.num_seqs,
              "num_seqs_padded": s.num_seqs_padded, "attended_len": s.attended_len,
              "num_preempted": s.num_preempted, "num_running": s.num_running,
              "cached_tokens": s.cached_tokens, "recomputed_tokens": s.recomputed_tokens,
              "prefix_bucket": s.prefix_bucket}
             for s in records.steps]
    config = records.config
    return {"calls": nxdi_fakes.CALLS, "steps": steps, "outputs": outputs,
            "cached": {r.req_id: r.num_cached_tokens for r in records.requests},
            "neuron_config": nxdi_fakes.CAPTURED["neuron_config"],
            "vocab": 1024,
            "run_config": {"runtime": config.runtime, "block_size": config.block_size,
                           "num_kv_blocks": config.num_kv_blocks,
                           "prefill_buckets": config.prefill_buckets,
                           "attention_buckets": config.attention_buckets}}


def sampling_params(spec: dict):
    """vLLM's SamplingParams of one request spec: what the job's mapping (inputs/) would give."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    given = {k: spec[k] for k in ("max_tokens", "temperature", "logprobs", "ignore_eos", "seed")
             if k in spec}
    structured = spec.get("structured")
    if structured:
        import vllm.sampling_params as sp

        if hasattr(sp, "StructuredOutputsParams"):        # vLLM 0.11 and later
            given["structured_outputs"] = sp.StructuredOutputsParams(**structured)
        else:                                             # 0.10.2
            given["guided_decoding"] = sp.GuidedDecodingParams(**structured)
    return SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY, **given)


def case_sampling(args: dict) -> dict:
    """Requests with their own SamplingParams (structured outputs, logprobs) through the whole
    engine, as case_run, with the model's tokenizer; `sampling` off: the job decision is
    skipped (on-device sampling whatever the requests ask)."""
    from neuron_batch.runtimes.sampling import job_sampling

    settings = settings_of(args)
    params = {r["id"]: sampling_params(r) for r in args["requests"]}
    work = Path(args["work"])
    try:
        kwargs = engine.engine_kwargs(
            settings, "neuron", args["model"], work / "records.jsonl", work, has_tokenizer=True,
            sampling=job_sampling(params.values()) if args.get("decide", True) else None)
    except Exception as error:      # refused before anything loads
        return {"refused": f"{type(error).__name__}: {error}"}
    run = engine.Engine(kwargs, quiet=True)
    outputs: dict[str, dict] = {}
    for request in args["requests"]:
        run.engine.add_request(request["id"], {"prompt_token_ids": request["prompt"]},
                               params[request["id"]])
    try:
        while run.has_unfinished():
            for out in run.engine.step():
                if not out.finished:
                    continue
                done = out.outputs[0]
                outputs[out.request_id] = {
                    "tokens": list(done.token_ids), "text": done.text,
                    "finish_reason": done.finish_reason,
                    "logprobs": None if done.logprobs is None else [
                        {str(t): lp.logprob for t, lp in step.items()}
                        for step in done.logprobs]}
    except Exception as error:      # what the engine raised mid-run
        return {"failed": f"{type(error).__name__}: {error}", "outputs": outputs,
                "neuron_config": nxdi_fakes.CAPTURED["neuron_config"]}
    finally:
        run.close()
    return {"outputs": outputs, "vocab": json.loads(
                (Path(args["model"]) / "config.json").read_text())["vocab_size"],
            "neuron_config": nxdi_fakes.CAPTURED["neuron_config"]}


if __name__ == "__main__":
    case, payload = sys.argv[1], json.loads(sys.argv[2])
    result = {"config": case_config, "loader": case_loader, "run": case_run,
              "sampling": case_sampling}[case](payload)
    print("RESULT " + json.dumps(result, default=str), flush=True)
