"""Runs one case of tests/engine/test_optimum_plugin.py in a fresh interpreter: the plugin's
platform patches vLLM's ModelConfig globally, so no two cases share a process.

    python tests/engine/optimum_driver.py CASE '<json arguments>'   (PYTHONPATH: the
                                        repository and optimum-neuron's install folder)

Prints one JSON line, prefixed with RESULT, that the test reads. Cases: `config` (our engine
settings through the plugin platform's check_and_update_config), `run` (`neuron-batch run
--device neuron` in this process: vLLM's engine with our scheduler, optimum-neuron's worker,
model runner and loader, the fake model of optimum_fakes.py; or what it refused), `check`
(our checks of the settings before anything loads: the error they raise).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import optimum_fakes  # noqa: E402

PAYLOAD = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
optimum_fakes.install(PAYLOAD.get("hub_entries"))

from neuron_batch.engine import engine  # noqa: E402
from neuron_batch.settings import RunSettings, SettingsError  # noqa: E402


def settings_of(args: dict) -> RunSettings:
    given = dict(args.get("settings", {}))
    tp = given.pop("tensor_parallel_size", None)
    return RunSettings.of(inputs=("x.jsonl",), model=args["model"], device="neuron",
                       tensor_parallel_size=tp, **given).validate()


def kwargs_of(args: dict, settings: RunSettings) -> dict:
    work = Path(args["work"])
    return engine.engine_kwargs(settings, "neuron", args["model"], work / "records.jsonl",
                                work, has_tokenizer=False)


def case_config(args: dict) -> dict:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    settings = settings_of(args)
    kwargs = kwargs_of(args, settings)
    os.environ.update(kwargs["additional_config"]["neuron_batch"]["process_env"])
    config = EngineArgs(**{k: v for k, v in kwargs.items()
                           if k != "use_tqdm_on_load"}).create_engine_config()
    return {
        "detected_device": engine.detect_device(),
        "platform": f"{type(current_platform).__module__}.{type(current_platform).__name__}",
        "runtime": settings.resolve_runtime().name,
        "scheduler_cls": str(config.scheduler_config.scheduler_cls),
        "worker_cls": config.parallel_config.worker_cls,
        "block_size": config.cache_config.block_size,
        "enable_prefix_caching": bool(config.cache_config.enable_prefix_caching),
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "chunked_prefill_as_built": bool(config.scheduler_config.chunked_prefill_enabled),
    }


def case_check(args: dict) -> dict:
    """Our checks, before anything loads: settings, then the engine's keyword arguments."""
    try:
        settings = settings_of(args)
        kwargs_of(args, settings)
    except SettingsError as error:
        return {"error": str(error), "type": type(error).__name__}
    return {"error": None}


def case_run(args: dict) -> dict:
    """`neuron-batch run --device neuron` on the requests, through click in this process (the
    fakes are installed here): its exit code and terminal output, and when it ran, every
    graph call, every step record and each request's tokens."""
    from click.testing import CliRunner

    from neuron_batch.cli import main
    from neuron_batch.scheduler.records import read_records

    work = Path(args["work"])
    prompts = work / "x.jsonl"
    prompts.write_text("".join(json.dumps(
        {"id": r["id"], "prompt_token_ids": r["prompt"], "max_tokens": r["max_tokens"],
         "temperature": r.get("temperature", 0.0)}) + "\n" for r in args["requests"]))
    given = args["settings"]
    command = ["run", str(prompts), "--device", "neuron", "--model", args["model"],
               "--max-num-seqs", str(given["max_num_seqs"]),
               "--max-model-len", str(given["max_model_len"]), "--no-prefix-caching",
               "--ignore-eos", "-o", str(work / "out")]
    for flag in ("tensor_parallel_size", "max_context_length"):
        if given.get(flag) is not None:
            command += [f"--{flag.replace('_', '-')}", str(given[flag])]
    result = CliRunner().invoke(main, command, catch_exceptions=False)
    out = work / "out"
    got = {"exit_code": result.exit_code, "output": result.output,
           "calls": optimum_fakes.CALLS, "captured": optimum_fakes.CAPTURED, "vocab": 1024}
    if result.exit_code != 0:
        return got
    outputs = [json.loads(line) for line in (out / "outputs.jsonl").read_text().splitlines()]
    records = read_records(out / "records-1.jsonl")
    attempts = json.loads((out / "attempts.json").read_text())
    got.update(
        outputs={row["id"]: row["output_token_ids"] for row in outputs},
        steps=[{"kind": s.kind, "req_ids": s.req_ids, "num_tokens": s.num_tokens,
                "num_tokens_padded": s.num_tokens_padded, "num_seqs": s.num_seqs,
                "num_seqs_padded": s.num_seqs_padded, "attended_len": s.attended_len,
                "num_preempted": s.num_preempted, "num_running": s.num_running}
               for s in records.steps],
        startup=attempts[-1].get("startup"),
        run_config={"runtime": records.config.runtime, "block_size": records.config.block_size,
                    "prefill_buckets": records.config.prefill_buckets,
                    "attention_buckets": records.config.attention_buckets,
                    "enable_prefix_caching": records.config.enable_prefix_caching})
    return got


if __name__ == "__main__":
    case = sys.argv[1]
    result = {"config": case_config, "run": case_run, "check": case_check}[case](PAYLOAD)
    print("RESULT " + json.dumps(result, default=str), flush=True)
