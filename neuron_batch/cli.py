"""The `neuron-batch` command line. Click lives here and only here; every command parses its
options, calls the library, and turns library errors into messages and exit codes.

vLLM, torch and transformers are imported only inside commands, so `--help` is instant.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import click

from neuron_batch import __version__
from neuron_batch.config import (
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    DEFAULT_MAX_TOKENS,
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

BUILTIN_PROMPTS = Path(__file__).parent / "data" / "example_prompts.jsonl"


def _load_config(ctx: click.Context, param: click.Parameter, value: str | None):
    """--config job.toml: its settings become the defaults; command-line options still win."""
    if value is None:
        return None
    try:
        settings = load_config_file(value)
    except SettingsError as error:
        raise click.BadParameter(str(error), ctx=ctx, param=param) from None
    ctx.default_map = {**(ctx.default_map or {}), **settings}
    return value


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="neuron-batch")
def main() -> None:
    """Offline batch inference and bucket benchmarking for LLMs on AWS Inferentia2 /
    Trainium, through vLLM with a Neuron-aware scheduler.

    \b
    Start here:
      neuron-batch run                      # built-in prompts and model, on this machine
      neuron-batch run prompts.jsonl        # your prompts
      neuron-batch run trace.csv --device sim --instance inf2.8xlarge --architecture llama-3-8b
      neuron-batch report results/<run>     # the summary of a finished run again
      neuron-batch buckets suggest trace.csv --max-buckets 4
    """


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
                     help="[sim] NeuronCores to shard over. Default: all of the instance's."),
        click.option("--weight-dtype", type=click.Choice(["bf16", "fp8", "int8"]),
                     default="bf16", show_default=True, help="[sim] Weight storage type."),
        click.option("--cost-profile", default=None, envvar="NEURON_BATCH_COST_PROFILE",
                     help="[sim] Step-time profile JSON (from `neuron-batch calibrate`). "
                          "Default: the instance's built-in profile."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@main.command(epilog=EXIT_CODES_HELP)
@click.argument("inputs", nargs=-1)
@click.option("--config", type=click.Path(dir_okay=False), callback=_load_config,
              is_eager=True, expose_value=False,
              help="A TOML job file whose keys are these options' names (a [sim] table for "
                   "the sim ones). Command-line options override it.")
@engine_options
@click.option("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, show_default=True,
              help="Output tokens per request where the input gives none.")
@click.option("--temperature", type=float, default=0.0, show_default=True,
              help="Sampling temperature where the input gives none (0 = greedy).")
@click.option("--ignore-eos", is_flag=True,
              help="Generate exactly max-tokens per request, as benchmarks do (always so on "
                   "--device sim, which does not sample).")
@click.option("--prompt-column", default="prompt", show_default=True,
              help="CSV/Parquet/data-set column holding the prompt.")
@click.option("--split", default="train", show_default=True, help="Data-set split to read.")
@click.option("--limit", type=int, default=None, help="Run only the first N prompts.")
@click.option("--shuffle/--no-shuffle", default=False, help="Shuffle prompts (before --limit).")
@click.option("--seed", type=int, default=0, show_default=True, help="For --shuffle and sampling.")
@click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
              help="Bad input lines: fail before loading the model, or skip them and report.")
@click.option("-o", "--output", type=click.Path(file_okay=False), default=None,
              envvar="NEURON_BATCH_OUTPUT",
              help="Run folder. Default: results/<timestamp>-<input name>/.")
@click.option("--resume", is_flag=True,
              help="Finish a run in --output that was stopped: only the requests not yet in "
                   "outputs.jsonl run again.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary (for cron).")
@click.option("--max-runtime", type=float, default=None, metavar="SECONDS",
              help="Stop cleanly after this long (exit 4; --resume continues).")
@click.option("--metrics-textfile", type=click.Path(dir_okay=False), default=None,
              envvar="NEURON_BATCH_METRICS_TEXTFILE",
              help="Also write the headline figures in Prometheus text format here "
                   "(node_exporter's textfile collector).")
def run(inputs, **options):
    """Run prompts through vLLM with the Neuron scheduler and report what happened.

    INPUTS are files (.jsonl, OpenAI batch .jsonl, .csv, .parquet, .txt), data-set folders
    written by save_to_disk, or hf:NAME[:CONFIG] Hugging Face data sets. With none, a small
    built-in set of prompts runs.

    Writes outputs.jsonl (a line per request, as each finishes), report.json and
    records-N.jsonl (every scheduler step) into the run folder, and prints a summary:
    throughput, padding waste per bucket, time per scheduler state and admission blocks.
    """
    from neuron_batch.run.runner import RunError, run as run_job

    try:
        seqs_values = _int_list(options.pop("max_num_seqs"), "--max-num-seqs")
        if len(seqs_values) > 1:
            raise SettingsError("--max-num-seqs takes one value in `run`; sweep several with "
                                "`neuron-batch bench`")
        result = run_job(_settings(inputs, seqs_values[0], options))
    except SettingsError as error:
        raise click.UsageError(str(error)) from None
    except RunError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(error.exit_code)
    sys.exit(result.exit_code)


SIM_OPTIONS = ("instance", "architecture", "tensor_parallel_size", "weight_dtype",
               "cost_profile")


def _settings(inputs, max_num_seqs: int, options: dict) -> RunSettings:
    """RunSettings from a command's options (the ones RunSettings knows; buckets parsed)."""
    sim = SimOptions(**{name: options.pop(name) for name in SIM_OPTIONS})
    options["prefill_buckets"] = parse_buckets_option(options.get("prefill_buckets"),
                                                      "--prefill-buckets")
    options["decode_buckets"] = parse_buckets_option(options.get("decode_buckets"),
                                                     "--decode-buckets")
    return RunSettings(inputs=tuple(inputs) or (str(BUILTIN_PROMPTS),),
                       max_num_seqs=max_num_seqs, sim=sim, **options).validate()


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        raise SettingsError(f"{option}: {text!r} is not a whole number or a list like 8,16,32"
                            ) from None
    if not values or any(v <= 0 for v in values):
        raise SettingsError(f"{option} must be positive whole numbers, got {text!r}")
    return values


@main.command(epilog=EXIT_CODES_HELP)
@click.argument("inputs", nargs=-1)
@click.option("--config", type=click.Path(dir_okay=False), callback=_load_config,
              is_eager=True, expose_value=False, help="A TOML job file (as for `run`).")
@engine_options
@click.option("--sweep-buckets", is_flag=True,
              help="Run the workload under many bucket configurations and rank them.")
@click.option("--prefill-buckets-set", multiple=True, metavar="N,N,...",
              help="A prefill bucket set to include in the sweep (repeatable).")
@click.option("--decode-buckets-set", multiple=True, metavar="N,N,...",
              help="A decode bucket set to include in the sweep (repeatable).")
@click.option("--max-prefill-buckets", type=int, default=4, show_default=True,
              help="Also sweep the optimal prefill sets of 1..K buckets for this workload "
                   "(0: none).")
@click.option("--max-decode-buckets", type=int, default=3, show_default=True,
              help="Also sweep the optimal decode sets of 1..K buckets (0: none).")
@click.option("--repeat", type=int, default=None,
              help="Without --sweep-buckets: run the configuration N times after a warm-up "
                   "and report the spread.")
@click.option("--warmup", type=int, default=1, show_default=True,
              help="Warm-up runs before --repeat.")
@click.option("--jobs", type=int, default=None,
              help="Simulated configurations run in parallel on this many processes. "
                   "Default: the machine's cores.")
@click.option("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, show_default=True)
@click.option("--ignore-eos", is_flag=True, help="Generate exactly max-tokens (as on sim).")
@click.option("--prompt-column", default="prompt", show_default=True)
@click.option("--split", default="train", show_default=True)
@click.option("--limit", type=int, default=None, help="Use only the first N prompts.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("-o", "--output", type=click.Path(file_okay=False), default=None,
              help="Bench folder. Default: results/<timestamp>-bench-<input name>/.")
@click.option("--resume", is_flag=True, help="Continue a sweep in --output.")
@click.option("-q", "--quiet", is_flag=True, help="Only the final table.")
def bench(inputs, sweep_buckets, prefill_buckets_set, decode_buckets_set, max_prefill_buckets,
          max_decode_buckets, repeat, warmup, jobs, resume, **options):
    """Benchmark a workload: one configuration (--repeat for the spread), or with
    --sweep-buckets many bucket configurations, ranked, with a recommendation.

    \b
    A sweep runs, each in a fresh engine:
      - the default buckets at every --max-num-seqs value (e.g. 8,16,32),
      - prefill sets: defaults, every --prefill-buckets-set, and the optimal sets of
        1..--max-prefill-buckets buckets for this workload's prefill chunks,
      - crossed with decode sets: defaults, every --decode-buckets-set, and the optimal sets
        of 1..--max-decode-buckets buckets for the batch sizes the defaults produced.
    It prints the grid's size and an estimate first, writes sweep.json and sweep.csv after every
    configuration (--resume continues after a crash or Ctrl-C), then a ranked table, the
    recommendation (fastest, best per compiled graph, Pareto front of throughput against
    compile cost, and why) and PNG plots. `--device sim` is the planning tool: simulated
    configurations run in parallel.
    """
    from neuron_batch.run.folder import default_output_dir
    from neuron_batch.run.runner import RunError
    from neuron_batch.bench.sweep import default_jobs, run_repeats, run_sweep

    try:
        seqs_values = _int_list(options.pop("max_num_seqs"), "--max-num-seqs")
        output, quiet = options.pop("output"), options.pop("quiet")
        base = _settings(inputs, seqs_values[0], {**options, "quiet": True})
        user_prefill = [parse_buckets_option(t, "--prefill-buckets-set") for t in
                        prefill_buckets_set]
        user_decode = [parse_buckets_option(t, "--decode-buckets-set") for t in
                       decode_buckets_set]
        for buckets in user_prefill:
            replace(base, prefill_buckets=buckets).validate()
        for buckets in user_decode:
            if buckets[-1] not in seqs_values:
                raise SettingsError(f"--decode-buckets-set {','.join(map(str, buckets))}: the "
                                    f"last bucket must be one of --max-num-seqs "
                                    f"{','.join(map(str, seqs_values))}")
        if len(seqs_values) > 1 and not sweep_buckets:
            raise SettingsError("several --max-num-seqs values need --sweep-buckets")
    except SettingsError as error:
        raise click.UsageError(str(error)) from None
    log = (lambda message: None) if quiet else (lambda message: click.echo(message, err=True))
    name = Path(base.inputs[0]).stem if not base.inputs[0].startswith("hf:") else "hf"
    out_dir = Path(output) if output else default_output_dir((f"bench-{name}",))
    try:
        if sweep_buckets:
            code = run_sweep(base, out_dir, seqs_values=seqs_values, user_prefill=user_prefill,
                             user_decode=user_decode, max_prefill_buckets=max_prefill_buckets,
                             max_decode_buckets=max_decode_buckets,
                             jobs=jobs or default_jobs(), resume=resume, log=log)
        else:
            code = run_repeats(base, out_dir, repeats=repeat or 1, warmup=warmup if repeat else 0,
                               log=log)
    except RunError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(error.exit_code)
    log(f"results in {out_dir}")
    sys.exit(code)


@main.command()
@click.argument("path", type=click.Path(exists=True))
def report(path):
    """Print the summary of a finished run (or the table of a finished sweep, re-drawing its
    plots) again, from its files."""
    from neuron_batch.run.runner import RunError, rerender

    try:
        if (Path(path) / "sweep.json").exists():
            from neuron_batch.bench.sweep import render

            click.echo(render(Path(path)))
            return
        click.echo(rerender(Path(path)))
    except RunError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(error.exit_code)


@main.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--instance", required=True, help="The instance the runs were made on.")
@click.option("--architecture", required=True,
              help="The model's architecture: a catalogue name or its config.json.")
@click.option("--tensor-parallel-size", type=int, default=None,
              help="NeuronCores the runs used. Default: all of the instance's.")
@click.option("--weight-dtype", type=click.Choice(["bf16", "fp8", "int8"]), default="bf16",
              show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="Where to write the fitted profile (JSON), for --cost-profile.")
def calibrate(run_dirs, instance, architecture, tensor_parallel_size, weight_dtype, output):
    """Fit a step-time profile to the step records of real runs (your own inf2/trn1 runs), so
    `--device sim --cost-profile FILE` predicts your hardware and model.

    Each step's measured duration (t_end - t_start in records-N.jsonl) is matched by the cost
    model's formula for its padded shape; the profile's parameters are fitted by least squares
    on the relative error. Runs with both prefill and decode steps of varied sizes fit best.
    """
    from neuron_batch.device.calibrate import fit_from_steps
    from neuron_batch.device.cost_model import StepCostModel, save_profile
    from neuron_batch.device.hardware import default_tp
    from neuron_batch.scheduler.records import read_records

    steps = []
    for run_dir in run_dirs:
        paths = sorted(Path(run_dir).glob("records-*.jsonl"))
        if not paths:
            raise click.UsageError(f"{run_dir}: no records-N.jsonl here; is it a neuron-batch "
                                   f"run folder?")
        for path in paths:
            steps += [s for s in read_records(path).steps
                      if s.kind in ("prefill", "decode") and s.t_end is not None
                      and s.t_end > s.t_start]
    if len(steps) < 10:
        raise click.UsageError(f"only {len(steps)} timed steps in {', '.join(run_dirs)}; "
                               f"calibration needs at least 10")
    try:
        tp = tensor_parallel_size or default_tp(instance)
        profile = fit_from_steps(steps, instance, architecture, tp, weight_dtype=weight_dtype)
    except (ValueError, FileNotFoundError) as error:
        raise click.UsageError(str(error)) from None
    save_profile(profile, output)
    model = StepCostModel(profile, instance, architecture, tp, weight_dtype=weight_dtype)
    errors = sorted(abs(model.step_time(s) / (s.t_end - s.t_start) - 1) for s in steps)
    click.echo(f"fitted {len(steps):,} steps from {len(run_dirs)} run(s): median step-time "
               f"error {errors[len(errors) // 2]:.1%}, p90 {errors[int(len(errors) * 0.9)]:.1%}")
    click.echo(f"wrote {output}; use it with --device sim --cost-profile {output}")


@main.group()
def buckets():
    """Choose bucket sets for a workload."""


@buckets.command("suggest")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--max-buckets", type=int, default=4, show_default=True,
              help="Most prefill buckets (compiled graphs) to allow.")
@click.option("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
              show_default=True)
@click.option("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN, show_default=True)
@click.option("--prompt-column", default="prompt", show_default=True)
@click.option("--objective", type=click.Choice(["tokens", "time"]), default="tokens",
              show_default=True,
              help="Minimise padded prefill tokens, or modelled prefill time on the simulated "
                   "device's cost model (--instance, --architecture).")
@click.option("--instance", default="inf2.8xlarge", show_default=True,
              help="[--objective time] The instance whose cost model prices a bucket.")
@click.option("--architecture", default="llama-3.1-8b", show_default=True,
              help="[--objective time] Catalogue name or config.json.")
@click.option("--tensor-parallel-size", type=int, default=None,
              help="[--objective time] Default: all NeuronCores of the instance.")
@click.option("--weight-dtype", type=click.Choice(["bf16", "fp8", "int8"]), default="bf16",
              show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def buckets_suggest(inputs, max_buckets, max_num_batched_tokens, max_model_len, prompt_column,
                    objective, instance, architecture, tensor_parallel_size, weight_dtype,
                    as_json):
    """The prefill bucket set of at most --max-buckets buckets that pads the workload's
    prompts least (exact optimum, by dynamic programming), against the default powers of two.

    Prompt lengths come from token counts (traces, prompt_len, prompt_token_ids); text prompts
    are counted with the built-in model's tokenizer. Prompts are cut into chunks of
    --max-num-batched-tokens first, as the scheduler does. With --objective time, each chunk
    costs the modelled prefill time of its bucket instead of its padded tokens (bucket sizes
    are then searched over every whole number, not only the observed lengths).
    """
    import json

    from neuron_batch.bench.optimiser import suggest_prefill
    from neuron_batch.inputs.prompts import InputError, load_prompts

    if max_buckets < 1:
        raise click.BadParameter("must be at least 1", param_hint="--max-buckets")
    try:
        loaded = load_prompts(inputs, prompt_column=prompt_column)
    except InputError as error:
        raise click.UsageError(str(error)) from None
    lengths = _prompt_lengths(loaded.records)
    too_long = [n for n in lengths if n > max_model_len]
    if too_long:
        click.echo(f"note: {len(too_long)} prompt(s) longer than --max-model-len "
                   f"{max_model_len:,} are left out", err=True)
        lengths = [n for n in lengths if n <= max_model_len]
    cost, candidates = None, None
    if objective == "time":
        from neuron_batch.device.cost_model import StepCostModel, load_profile
        from neuron_batch.device.hardware import default_tp

        try:
            tp = tensor_parallel_size or default_tp(instance)
            model = StepCostModel(load_profile(instance), instance, architecture, tp,
                                  weight_dtype=weight_dtype)
        except (ValueError, FileNotFoundError) as error:
            raise click.UsageError(str(error)) from None
        cost = model.prefill_time
        candidates = range(1, min(max_num_batched_tokens, max_model_len) + 1)
    result = suggest_prefill(lengths, max_buckets=max_buckets,
                             max_num_batched_tokens=max_num_batched_tokens,
                             max_model_len=max_model_len, cost=cost, candidates=candidates)
    result["objective"] = objective
    if as_json:
        click.echo(json.dumps(result))
        return
    default = result["default"]
    click.echo(f"{len(lengths):,} prompts -> {result['num_chunks']:,} prefill chunks "
               f"(max_num_batched_tokens {max_num_batched_tokens:,})")
    click.echo(f"suggested ({len(result['buckets'])} buckets): "
               f"{','.join(map(str, result['buckets']))}")
    click.echo(f"  padded tokens {result['padded_tokens']:,} for {result['actual_tokens']:,} "
               f"actual: waste {result['waste_fraction']:.1%}")
    click.echo(f"default ({len(default['buckets'])} buckets): "
               f"{','.join(map(str, default['buckets']))}")
    click.echo(f"  padded tokens {default['padded_tokens']:,}: waste "
               f"{default['waste_fraction']:.1%}")
    if objective == "time":
        click.echo(f"modelled prefill time on {instance} ({architecture}): suggested "
                   f"{result['cost']:,.1f} s, default {default['cost']:,.1f} s")


def _prompt_lengths(records) -> list[int]:
    lengths, texts = [], []
    for record in records:
        if record.prompt_len is not None:
            lengths.append(record.prompt_len)
        elif record.prompt_token_ids is not None:
            lengths.append(len(record.prompt_token_ids))
        else:
            texts.append(record)
    if texts:
        from neuron_batch.run.models import load_tokenizer, resolve_model

        tokenizer = load_tokenizer(resolve_model(None))
        for record in texts:
            if record.messages is not None:
                lengths.append(len(tokenizer.apply_chat_template(
                    record.messages, add_generation_prompt=True, tokenize=True)))
            else:
                lengths.append(len(tokenizer(record.prompt).input_ids))
    return lengths


if __name__ == "__main__":
    main()
