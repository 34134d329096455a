"""Options and helpers shared by the commands: the engine option bundle, `--config` job
files, and turning parsed options into validated `RunSettings`."""

from __future__ import annotations

from pathlib import Path

import click

from neuron_batch.config import (
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    DEVICES,
    RunSettings,
    SettingsError,
    SimOptions,
    load_config_file,
    parse_buckets_option,
)

EXIT_CODES_HELP = """\b
Exit codes:
  0  every request completed
  1  the run failed (engine or system error); finished outputs are kept
  2  bad usage or bad input; nothing was run
  3  partial: finished, but some inputs were skipped (--on-error skip)
  4  interrupted (SIGTERM, SIGINT, --max-runtime); --resume continues
  5  the output folder is in use by another run"""

BUILTIN_PROMPTS = Path(__file__).parents[1] / "data" / "example_prompts.jsonl"


def load_config_option(ctx: click.Context, param: click.Parameter, value: str | None):
    """--config job.toml: its settings become the defaults; command-line options still win."""
    if value is None:
        return None
    try:
        settings = load_config_file(value)
    except SettingsError as error:
        raise click.BadParameter(str(error), ctx=ctx, param=param) from None
    ctx.default_map = {**(ctx.default_map or {}), **settings}
    return value



def engine_options(func):
    """Options shared by every command that runs the engine."""
    options = [
        click.option("--model", envvar="NEURON_BATCH_MODEL", default=None,
                     help="Local model directory or Hugging Face id. Default: the built-in "
                          "SmolLM2-135M-Instruct (prepared once into the cache)."),
        click.option("--device", type=click.Choice(DEVICES), default="auto",
                     envvar="NEURON_BATCH_DEVICE", show_default=True,
                     help="auto picks what vLLM finds (cpu, cuda, neuron); sim is the simulated "
                          "Neuron device."),
        click.option("--max-num-seqs", default=str(DEFAULT_MAX_NUM_SEQS), show_default=True,
                     help="Most requests decoding at once (the largest decode batch). `bench` "
                          "takes a list to sweep, e.g. 8,16,32."),
        click.option("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
                     show_default=True, help="Largest prefill chunk; longer prompts are "
                     "prefilled in chunks of this size."),
        click.option("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN,
                     show_default=True, help="Longest prompt + output, in tokens."),
        click.option("--prefill-buckets", default=None, metavar="N,N,...",
                     help="Prefill token buckets, ascending, ending at min(max-num-batched-"
                          "tokens, max-model-len). Default: 128, 256, ... then that max."),
        click.option("--decode-buckets", default=None, metavar="N,N,...",
                     help="Decode batch-size buckets, ascending, ending at max-num-seqs. "
                          "Default: 1, 2, 4, ... then max-num-seqs."),
        click.option("--block-size", type=int, default=None,
                     help="KV cache block size. Default: the device's (32 on Neuron)."),
        click.option("--instance", default="inf2.8xlarge", show_default=True,
                     envvar="NEURON_BATCH_INSTANCE",
                     help="[sim] inf2.xlarge, inf2.8xlarge, inf2.24xlarge, inf2.48xlarge or "
                          "trn1.32xlarge."),
        click.option("--architecture", default=None,
                     help="[sim] Model architecture: a catalogue name (llama-3-8b, "
                          "mistral-7b, ...) or a config.json. Default: the --model's."),
        click.option("--tensor-parallel-size", type=int, default=None,
                     help="[sim] NeuronCores to shard over. Default: all of the instance's. "
                          "With --replicas on Neuron: the NeuronCores of each replica."),
        click.option("--weight-dtype", type=click.Choice(["bf16", "fp8", "int8"]),
                     default="bf16", show_default=True, help="[sim] Weight storage type."),
        click.option("--cost-profile", default=None, envvar="NEURON_BATCH_COST_PROFILE",
                     help="[sim] Step-time profile JSON (from `neuron-batch calibrate`). "
                          "Default: the instance's built-in profile."),
    ]
    for option in reversed(options):
        func = option(func)
    return func

SIM_OPTIONS = ("instance", "architecture", "tensor_parallel_size", "weight_dtype",
               "cost_profile")


def settings_from_options(inputs, max_num_seqs: int, options: dict) -> RunSettings:
    """RunSettings from a command's options (the ones RunSettings knows; buckets parsed)."""
    sim = SimOptions(**{name: options.pop(name) for name in SIM_OPTIONS},
                     num_instances=options.pop("num_instances", 1))  # `run` only
    options["prefill_buckets"] = parse_buckets_option(options.get("prefill_buckets"),
                                                      "--prefill-buckets")
    options["decode_buckets"] = parse_buckets_option(options.get("decode_buckets"),
                                                     "--decode-buckets")
    return RunSettings(inputs=tuple(inputs) or (str(BUILTIN_PROMPTS),),
                       max_num_seqs=max_num_seqs, sim=sim, **options).validate()


def int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise SettingsError(f"{option}: {text!r} is not a whole number or a list like 8,16,32"
                            ) from None
    if not values or any(v <= 0 for v in values):
        raise SettingsError(f"{option} must be positive whole numbers, got {text!r}")
    return values

