"""Options and helpers shared by the commands: the engine option bundle, `--config` job
files, and turning parsed options into validated `RunSettings`."""

from __future__ import annotations

from pathlib import Path

import click

from neuron_batch.choices import (
    PREFIX_CACHING,
    Device,
    Order,
    Pricing,
    WeightDtype,
    parse_prefix_caching,
    prefix_caching_word,
)
from neuron_batch.config import (
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    SPLIT_AUTO,
    CostOptions,
    RunSettings,
    SettingsError,
    SimOptions,
    parse_buckets_option,
)
from neuron_batch.device.hardware import INSTANCES
from neuron_batch.job_file import load_config_file
from neuron_batch.runtime import RUNTIME_NAMES
from neuron_batch.scheduler.kv_reserve import parse_kv_reserve

EXIT_CODES_HELP = """\b
Exit codes:
  0  every request completed
  1  the run failed (engine or system error); finished outputs are kept
  2  bad usage or bad input, or --output holds a run of other input; nothing was run
  3  partial: finished, but some inputs were skipped (--on-error skip) or failed
  4  interrupted (SIGTERM, SIGINT, --max-runtime); --resume continues
  5  the output folder is in use by another run"""

BUILTIN_PROMPTS = Path(__file__).parents[1] / "data" / "example_prompts.jsonl"


def load_config_option(ctx: click.Context, param: click.Parameter, value: str | None):
    """--config job.toml: its settings become the defaults; command-line options still win."""
    if value is None:
        return None
    try:
        settings = load_config_file(value)
        if "prefix_caching" in settings:     # (TOML's true/false, or auto/on/off)
            parse_prefix_caching(settings["prefix_caching"], f"{value}: prefix-caching")
    except (SettingsError, ValueError) as error:
        raise click.BadParameter(str(error), ctx=ctx, param=param) from None
    ctx.default_map = {**(ctx.default_map or {}), **settings}
    return value



def engine_options(func):
    """Options shared by every command that runs the engine."""
    options = [
        click.option("--model", envvar="NEURON_BATCH_MODEL", default=None,
                     help="Local model directory or Hugging Face id. Default: the built-in "
                          "SmolLM2-135M-Instruct (prepared once into the cache)."),
        click.option("--device", type=click.Choice(Device.values()), default=Device.AUTO.value,
                     envvar="NEURON_BATCH_DEVICE", show_default=True,
                     help="auto picks what vLLM finds (cpu, cuda, neuron); sim is the simulated "
                          "Neuron device."),
        click.option("--max-num-seqs", default=str(DEFAULT_MAX_NUM_SEQS), show_default=True,
                     help="Most requests decoding at once (the largest decode batch). `bench` "
                          "takes a list to sweep, e.g. 8,16,32."),
        click.option("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
                     show_default=True, help="[vllm-neuron] Largest prefill chunk; longer "
                     "prompts are prefilled in chunks of this size (nxdi prefills whole "
                     "prompts)."),
        click.option("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN,
                     show_default=True, help="Longest prompt + output, in tokens."),
        click.option("--runtime", type=click.Choice(RUNTIME_NAMES), default=None,
                     envvar="NEURON_BATCH_RUNTIME",
                     help="What Neuron compiles: nxdi (inf2/trn1, buckets), vllm-neuron "
                          "(trn2/trn3, paged KV), optimum-neuron (inf2/trn1, an export's two "
                          "graphs). Default: the instance's, the plugin's, else vllm-neuron."),
        click.option("--context-encoding-buckets", default=None, metavar="N,N,...",
                     help="[nxdi] Prefill buckets over whole prompt lengths, ascending, ending "
                          "at max-model-len. Default: NxDI's, 128, 256, ... (from 512 with "
                          "prefix caching, and token generation from 256)."),
        click.option("--token-generation-buckets", default=None, metavar="N,N,...",
                     help="[nxdi] Decode attention lengths, ascending, ending at "
                          "max-model-len; each decode step attends the smallest above its "
                          "longest sequence. Default: as --context-encoding-buckets."),
        click.option("--prefill-buckets", default=None, metavar="N,N,...",
                     help="[vllm-neuron] Prefill chunk token buckets, ascending, ending at "
                          "min(max-num-batched-tokens, max-model-len). Default: 128, 256, ... "
                          "then that max."),
        click.option("--decode-buckets", default=None, metavar="N,N,...",
                     help="[vllm-neuron] Decode batch-size buckets, ascending, ending at "
                          "max-num-seqs. Default: 1, 2, 4, ... then max-num-seqs."),
        click.option("--decode-context-buckets", default=None, metavar="N,N,...",
                     help="[vllm-neuron] Decode KV context-length buckets (multiples of 128, "
                          "below max-model-len): a decode step reads the smallest above its "
                          "longest sequence instead of a whole max-model-len. Default: none."),
        click.option("--max-context-length", type=int, default=None, metavar="N",
                     help="[optimum-neuron] The export's context-encoding length: every "
                          "prompt is padded to it, none may be longer. Default: max-model-len."),
        click.option("--block-size", type=int, default=None,
                     help="KV block size. Default 32 on Neuron and sim (nxdi takes 16 or 32; "
                          "max-model-len with --no-prefix-caching); on the CPU vLLM's own."),
        click.option("--prefix-caching", type=PrefixCachingType(), default="auto",
                     is_flag=False, flag_value="on", show_default=True,
                     help="vLLM's prefix cache. auto: on where the step model says shared "
                          "blocks pay for it (docs/inputs-outputs.md)."),
        click.option("--no-prefix-caching", is_flag=True, default=False,
                     help="The same as --prefix-caching off."),
        click.option("--prefix-buckets", default=None, metavar="N,N,...",
                     help="[nxdi, prefix caching] Prefix buckets: multiples of the block size, "
                          "ending at max-model-len (0 is always added). Default: 0, 512, 1024..."),
        click.option("--compiled-artifacts", default=None, metavar="DIR",
                     envvar="NEURON_BATCH_COMPILED_ARTIFACTS",
                     help="Compiled graphs, a folder per hash of the compiled shapes (the "
                          "same shapes load, others compile; on sim: count no compile). "
                          "Default [neuron]: <cache>/neuron-compiled; [sim]: none."),
        click.option("--compiled", is_flag=True, default=False,
                     help="[sim] Count the graphs as compiled before (cached): the start-up "
                          "is their load only. Default: compiled fresh."),
        click.option("--kv-reserve", default="request", show_default=True, metavar="RULE",
                     help="[vllm-neuron] KV admission: request reserves each request's prompt "
                          "+ max_tokens, max-model-len a max_model_len each; `bench` takes "
                          "both, comma-separated."),
        click.option("--order", type=click.Choice(Order.values()), default=Order.INPUT.value,
                     show_default=True,
                     help="Submission order: as read, longest prompt + max_tokens first (under "
                          "nxdi like lengths decoding together waste less), or shared prefixes "
                          "together."),
        click.option("--ignore-field", "ignore_field", multiple=True, metavar="NAME",
                     help="Run JSON requests without this field (body.NAME in an OpenAI "
                          "batch file) instead of refusing them: unknown fields and those the "
                          "device cannot honour are refused otherwise. Repeatable."),
        click.option("--instance", default="inf2.8xlarge", show_default=True,
                     envvar="NEURON_BATCH_INSTANCE",
                     help=f"[sim] {', '.join(INSTANCES)}."),
        click.option("--architecture", default=None,
                     help="[sim] Model architecture: a catalogue name (llama-3-8b, "
                          "mistral-7b, ...) or a config.json. Default: the --model's."),
        click.option("--tensor-parallel-size", type=int, default=None,
                     help="NeuronCores to shard over. [sim] Default: all of the instance's. "
                          "[neuron] Default: vLLM's (1); with --replicas, per replica."),
        weight_dtype_option("[sim] Weight storage type."),
        click.option("--cost-profile", default=None, envvar="NEURON_BATCH_COST_PROFILE",
                     help="[sim] Step-time profile JSON (from `neuron-batch calibrate`). "
                          "Default: the instance's built-in profile."),
    ]
    for option in reversed(options):
        func = option(func)
    return func

def cost_options(func):
    """--pricing and --price-per-hour: what the instances cost (run, bench, plan)."""
    options = [
        click.option("--pricing", type=click.Choice(Pricing.values()),
                     default=Pricing.ON_DEMAND.value, show_default=True,
                     help="Built-in hourly prices to use: AWS on-demand (us-east-1) or the "
                          "reserved-instance effective rate (sources: docs/prices.md)."),
        click.option("--price-per-hour", type=float, default=None, metavar="USD",
                     help="Price of one instance-hour, overriding the built-in table (spot, "
                          "negotiated, other regions; needed for an instance it lacks)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def weight_dtype_option(help: str | None = None):
    """--weight-dtype: how the simulated model's weights are stored (run, bench, plan, doctor,
    calibrate, buckets suggest)."""
    return click.option("--weight-dtype", type=click.Choice(WeightDtype.values()),
                        default=WeightDtype.BF16.value, show_default=True, help=help)


SIM_OPTIONS = ("instance", "architecture", "tensor_parallel_size", "weight_dtype",
               "cost_profile", "compiled")


def settings_from_options(inputs, max_num_seqs: int, options: dict) -> RunSettings:
    """RunSettings from a command's options (the ones RunSettings knows; buckets parsed)."""
    sim = SimOptions(**{name: options.pop(name) for name in SIM_OPTIONS},
                     num_instances=options.pop("num_instances", 1))  # `run` only
    cost = CostOptions(pricing=options.pop("pricing", CostOptions.pricing),
                       price_per_hour=options.pop("price_per_hour", None),
                       instance=(sim.instance if _given("instance")
                                 and options.get("device") != "sim" else None))
    options["prefill_buckets"] = parse_buckets_option(options.get("prefill_buckets"),
                                                      "--prefill-buckets")
    for name in ("decode_buckets", "context_encoding_buckets", "token_generation_buckets",
                 "decode_context_buckets", "prefix_buckets"):
        options[name] = parse_buckets_option(options.get(name),
                                             "--" + name.replace("_", "-"))
    if "kv_reserve" in options:
        options["kv_reserve"] = kv_reserve_list(options["kv_reserve"])[0]
    if "prefix_caching" in options:
        options["prefix_caching"] = prefix_caching_option(options["prefix_caching"],
                                                          options.pop("no_prefix_caching", False))
    options["ignore_field"] = tuple(options.get("ignore_field") or ())
    settings = RunSettings(inputs=tuple(inputs) or (str(BUILTIN_PROMPTS),),
                           max_num_seqs=max_num_seqs, sim=sim, cost=cost, **options).validate()
    # Before any input, model or vLLM loads: say now if the device cannot work here.
    from neuron_batch.engine.engine import check_device_available

    check_device_available(settings.device)
    return settings


def _given(name: str) -> bool:
    """Whether option `name` was set by the user (command line, environment or job file), not
    left at its default."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return False
    source = ctx.get_parameter_source(name)
    return source is not None and source != click.core.ParameterSource.DEFAULT


def prefix_caching_option(value: bool | None, no_prefix_caching: bool) -> bool | None:
    """--prefix-caching VALUE and its alias --no-prefix-caching (off) as the setting; both
    given are refused, whatever they say, before anything runs."""
    if no_prefix_caching:
        if _given("prefix_caching"):
            raise SettingsError(f"--prefix-caching {prefix_caching_word(value)} and "
                                f"--no-prefix-caching together: give one (--no-prefix-caching "
                                f"is --prefix-caching off)")
        return False
    return value


class PrefixCachingType(click.ParamType):
    """--prefix-caching auto|on|off (bare: on, as the old flag); a job file's true/false too."""

    name = "auto|on|off"

    def convert(self, value, param, ctx):
        try:
            return parse_prefix_caching(value)
        except ValueError:
            self.fail(f"{value!r} is not one of {', '.join(PREFIX_CACHING)}", param, ctx)

    def get_metavar(self, param, ctx=None):
        return "[" + "|".join(PREFIX_CACHING) + "]"


def kv_reserve_list(text: str) -> list[str]:
    """--kv-reserve request,max-model-len -> ["request", "max_model_len"] (canonical names)."""
    try:
        values = [parse_kv_reserve(part) for part in str(text).split(",") if part.strip()]
    except ValueError as error:
        raise SettingsError(f"--{error}") from None
    if not values:
        raise SettingsError(f"--kv-reserve: no rule in {text!r}; use request or max-model-len")
    return list(dict.fromkeys(values))


def int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise SettingsError(f"{option}: {text!r} is not a whole number or a list like 8,16,32"
                            ) from None
    if not values or any(v <= 0 for v in values):
        raise SettingsError(f"{option} must be positive whole numbers, got {text!r}")
    return values


class SplitAt(click.ParamType):
    """--split-at: a number of tokens, or auto."""

    name = "split-at"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == SPLIT_AUTO:
            return SPLIT_AUTO
        try:
            return int(text)
        except ValueError:
            self.fail(f"{value!r} is neither a number of tokens nor auto", param, ctx)
