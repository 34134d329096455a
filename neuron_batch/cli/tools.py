"""Tools around runs: `neuron-batch calibrate` and `neuron-batch buckets suggest`."""

from __future__ import annotations

from pathlib import Path

import click

from neuron_batch.cli.group import main
from neuron_batch.cli.options import setting_option


@main.command()
@click.argument("run_dirs", nargs=-1, type=click.Path(exists=True, file_okay=False))
@click.option("--published", "published", type=click.Path(exists=True, dir_okay=False),
              help="Fit to a CSV of static-batching benchmark figures in the columns of "
                   "AWS's published tables (model, instance, tp_degree, batch_size, ...; a "
                   "missing one is named) instead of run folders.")
@click.option("--instance", default=None,
              help="The instance the runs were made on (required with RUN_DIRS). With "
                   "--published: the instance to name the profile after, and the only one whose "
                   "rows are fitted (default: every row).")
@click.option("--architecture", default=None,
              help="The model's architecture: a catalogue name or its config.json (required with "
                   "RUN_DIRS; --published rows name their model).")
@setting_option("tensor_parallel_size", help="NeuronCores the runs used. Default: all of the "
                                             "instance's.")
@setting_option("weight_dtype")
@click.option("-o", "--output", type=click.Path(dir_okay=False), required=True,
              help="Where to write the fitted profile (JSON), for --cost-profile.")
def calibrate(run_dirs, published, instance, architecture, tensor_parallel_size, weight_dtype,
              output):
    """Fit a step-time profile to the step records of real runs (your own inf2/trn1 runs), or
    with --published to a benchmark table, so `--device sim --cost-profile FILE` predicts your
    hardware and model.

    From run folders, each step's measured duration (t_end - t_start in records-N.jsonl) is
    matched by the cost model's formula for its padded shape; runs with both prefill and decode
    steps of varied sizes fit best. From a table, each row is reproduced as a static batch
    (prefilled together, decoded together) and its TPOT, output tokens/s and TTFT are matched;
    its columns: model, instance, tp_degree, batch_size, max_seq_len, input_len, output_len,
    output_tok_per_s, ttft_p50_ms, tpot_p50_ms, weight_dtype. Either way the parameters are
    fitted by least squares on the relative error. From run folders of a Neuron host, the
    profile's `compile` section is also read from the last start-up that compiled (the phases
    its engine log states, else the start-up measured).
    """
    if published and run_dirs:
        raise click.UsageError("give run folders or --published FILE, not both")
    if published:
        _calibrate_published(published, instance, output)
        return
    if not run_dirs:
        raise click.UsageError("give run folders to fit (or --published FILE)")
    if not instance or not architecture:
        raise click.UsageError("--instance and --architecture are required with run folders")
    from neuron_batch.device.calibrate import fit_from_steps
    from neuron_batch.device.cost_model import StepCostModel, save_profile
    from neuron_batch.device.hardware import default_tp

    steps, runtime, prefix_caching = _timed_steps(run_dirs)
    if len(steps) < 10:
        raise click.UsageError(f"only {len(steps)} timed steps in {', '.join(run_dirs)}; "
                               f"calibration needs at least 10")
    try:
        instance, architecture = _device(instance, architecture)
        tp = tensor_parallel_size or default_tp(instance)
        profile = fit_from_steps(steps, instance, architecture, tp, weight_dtype=weight_dtype,
                                 runtime=runtime, prefix_caching=prefix_caching)
    except (ValueError, FileNotFoundError) as error:
        raise click.UsageError(str(error)) from None
    startup = _compile_from_startup(run_dirs, instance, architecture, tp, weight_dtype,
                                    runtime)
    if startup is not None:
        profile = profile.replace(compile=startup[0])
    save_profile(profile, output)
    model = StepCostModel(profile, instance, architecture, tp, weight_dtype=weight_dtype,
                          runtime=runtime)
    errors = sorted(abs(model.step_time(s) / ((s.t_end or s.t_start) - s.t_start) - 1)
                    for s in steps)        # (every step kept has its end)
    click.echo(f"fitted {len(steps):,} steps from {len(run_dirs)} run(s): median step-time "
               f"error {errors[len(errors) // 2]:.1%}, p90 {errors[int(len(errors) * 0.9)]:.1%}")
    click.echo(f"compile section: from {startup[1]}" if startup is not None else
               "compile section: the built-in fit (no run's engine log shows a compile: every "
               "start came from the cache, or none was on a Neuron host)")
    click.echo(f"wrote {output}; use it with --device sim --cost-profile {output}")


def _timed_steps(run_dirs):
    """(every timed prefill and decode step of the run folders' records, the runtime whose
    compiled shapes they ran, whether prefix caching was on in any): the runs must share a
    runtime (their steps read different KV)."""
    from neuron_batch.runtimes.runtime import runtime_of
    from neuron_batch.scheduler.records import iter_records

    steps = []
    runtimes, caching = set(), set()     # (prefix caching: block KV a decode gathers first)
    for run_dir in run_dirs:
        paths = sorted(Path(run_dir).glob("records-*.jsonl"))
        if not paths:
            raise click.UsageError(f"{run_dir}: no records-N.jsonl here; is it a neuron-batch "
                                   f"run folder?")
        for path in paths:
            for kind, record in iter_records(path):     # (streamed: timed steps kept only)
                if kind == "config":
                    runtimes.add(record.runtime)
                    caching.add(bool(record.enable_prefix_caching))
                elif (kind == "step" and record.kind in ("prefill", "decode")
                      and record.t_end is not None and record.t_end > record.t_start):
                    steps.append(record)
    if len(runtimes) > 1:
        raise click.UsageError(f"the runs mix runtimes ({', '.join(sorted(runtimes))}): "
                               f"their steps read different KV; calibrate each on its own")
    # what a decode step reads is its runtime's compiled shape, as the records say
    return steps, runtime_of({"runtime": runtimes.pop()} if runtimes else None), any(caching)


def _device(instance: str, architecture: str | None = None):
    """(Instance, Architecture or None) of the --instance and --architecture given: where the
    tools' names become objects (a ValueError naming the choices for an unknown one)."""
    from neuron_batch.device.architectures import resolve_architecture
    from neuron_batch.device.hardware import get_instance

    inst = get_instance(instance)
    return inst, None if architecture is None else resolve_architecture(architecture)


def _compile_from_startup(run_dirs, instance, architecture, tp, weight_dtype, runtime):
    """(compile section, what was read) from the last start-up that compiled, among the run
    folders' attempts (attempts.json `startup`, with the graphs of report.json), or None."""
    import json

    from neuron_batch.device.calibrate_compile import fit_from_startup

    for run_dir in reversed(run_dirs):
        folder = Path(run_dir)
        try:
            attempts = json.loads((folder / "attempts.json").read_text(encoding="utf-8"))
            config = json.loads((folder / "report.json").read_text(encoding="utf-8"))["config"]
        except (OSError, ValueError, KeyError):
            continue
        prefill = len(config.get("prefill_buckets") or [])
        graphs = int(config.get("compiled_graphs") or 0)
        for attempt in reversed(attempts if isinstance(attempts, list) else []):
            found = fit_from_startup(attempt.get("startup") or {}, arch=architecture, tp=tp,
                                     instance=instance, prefill_graphs=prefill,
                                     decode_graphs=max(graphs - prefill, 0),
                                     weight_dtype=weight_dtype,
                                     parallel=runtime.parallel_compile)
            if found is not None:
                return found[0], f"{run_dir} attempt {attempt.get('attempt')}: {found[1]}"
    return None


def _calibrate_published(path: str, instance: str | None, output: str) -> None:
    """`calibrate --published FILE`: fit to a benchmark table, print how well it reproduces it."""
    from neuron_batch.device.calibrate import (
        evaluate_published,
        fit_published,
        max_abs_errors,
        median_abs_errors,
        read_published,
    )
    from neuron_batch.device.cost_model import load_profile, save_profile

    try:
        rows = read_published(path)
        if instance:
            instance = _device(instance)[0].name
        # Start from the built-in profile: what the table cannot set stays AWS-calibrated.
        start = load_profile(instance or rows[0].instance)
        profile = fit_published(rows=rows, instance=instance, start=start, table=path)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    save_profile(profile, output)
    fitted = [r for r in rows if instance is None or r.instance == instance]
    table = evaluate_published(profile, rows=fitted)
    med, worst = median_abs_errors(table), max_abs_errors(table)
    click.echo(f"fitted {len(fitted)} published row(s) from {path}: median |error| TPOT "
               f"{med['tpot']:.1%}, tok/s {med['throughput']:.1%}, TTFT {med['ttft']:.1%} "
               f"(worst {worst['tpot']:.1%}, {worst['throughput']:.1%}, {worst['ttft']:.1%})")
    if len(fitted) < 8:
        click.echo(f"note: {len(fitted)} rows set 7 parameters loosely; what the rows cannot "
                   f"set keeps the built-in profile's value", err=True)
    click.echo(f"wrote {output}; use it with --device sim --cost-profile {output}")


@main.group()
def buckets():
    """Choose bucket sets for a workload."""


@buckets.command("suggest")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--max-buckets", type=int, default=4, show_default=True,
              help="Most prefill buckets (compiled graphs) to allow.")
@setting_option("max_num_batched_tokens", help="Prompts are cut into prefill chunks of this "
                                               "size (vllm-neuron; nxdi prefills them whole).")
@setting_option("max_model_len", help="Longest prompt + output, in tokens; longer prompts are "
                                      "left out.")
@setting_option("prompt_column")
@click.option("--objective", type=click.Choice(["tokens", "time"]), default="tokens",
              show_default=True,
              help="Minimise padded prefill tokens, or modelled prefill time on the simulated "
                   "device's cost model (--instance, --architecture).")
@setting_option("instance", help="The instance whose runtime takes the buckets and, with "
                                 "--objective time, whose cost model prices one.")
@click.option("--architecture", default="llama-3.1-8b", show_default=True,
              help="[--objective time] Catalogue name or config.json.")
@setting_option("tensor_parallel_size", help="[--objective time] Default: all NeuronCores of "
                                             "the instance.")
@setting_option("weight_dtype")
@setting_option("runtime", help="The runtime whose prefill buckets to suggest (nxdi prefills "
                                "whole prompts, vllm-neuron chunks). Default: --instance's.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def buckets_suggest(inputs, max_buckets, max_num_batched_tokens, max_model_len, prompt_column,
                    objective, instance, architecture, tensor_parallel_size, weight_dtype,
                    runtime, as_json):
    """The prefill bucket set of at most --max-buckets buckets that pads the workload's
    prompts least (exact optimum, by dynamic programming), against the default powers of two.

    Prompt lengths come from token counts (traces, prompt_len, prompt_token_ids); text prompts
    are counted with the built-in model's tokenizer. Prompts are cut into chunks of
    --max-num-batched-tokens first, as the scheduler does. With --objective time, each chunk
    costs the modelled prefill time of its bucket instead of its padded tokens (bucket sizes
    are then searched over every whole number, not only the observed lengths).
    """
    import json

    from neuron_batch.bench.suggest import suggest_prefill
    from neuron_batch.inputs.load import load_prompts
    from neuron_batch.inputs.prompt_records import InputError

    if max_buckets < 1:
        raise click.BadParameter("must be at least 1", param_hint="--max-buckets")
    from neuron_batch.runtimes.choice import simulated_runtime
    from neuron_batch.runtimes.runtime import RuntimeNameError

    try:
        follows = simulated_runtime(runtime, _device(instance, None)[0].family)
    except (ValueError, RuntimeNameError) as error:
        raise click.UsageError(str(error)) from None
    if follows.prefill.single:
        raise click.UsageError(f"{follows.name} compiles one context-encoding length "
                               f"({follows.prefill.flag}): there is no bucket list to suggest")
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
        cost = _prefill_cost(instance, architecture, tensor_parallel_size, weight_dtype)
        candidates = range(1, min(max_num_batched_tokens, max_model_len) + 1)
    result = suggest_prefill(lengths, max_buckets=max_buckets,
                             max_num_batched_tokens=max_num_batched_tokens,
                             max_model_len=max_model_len, cost=cost, candidates=candidates,
                             runtime=follows)
    result["objective"] = objective
    if as_json:
        click.echo(json.dumps(result))
        return
    _say_suggestion(result, len(lengths), max_num_batched_tokens, follows,
                    f"{instance} ({architecture})" if objective == "time" else None)


def _prefill_cost(instance, architecture, tensor_parallel_size, weight_dtype):
    """The modelled prefill time of a bucket on the simulated instance (--objective time)."""
    from neuron_batch.device.cost_model import StepCostModel, load_profile
    from neuron_batch.device.hardware import default_tp

    try:
        inst, arch = _device(instance, architecture)
        tp = tensor_parallel_size or default_tp(inst)
        model = StepCostModel(load_profile(inst.name), inst, arch, tp, weight_dtype=weight_dtype)
    except (ValueError, FileNotFoundError) as error:
        raise click.UsageError(str(error)) from None
    return model.prefill_time


def _say_suggestion(result, num_prompts: int, max_num_batched_tokens: int, follows,
                    timed_on: str | None) -> None:
    """The suggestion against the default powers of two, in words (`timed_on`: the instance
    and model whose modelled prefill time was the objective)."""
    default = result["default"]
    click.echo(f"{num_prompts:,} prompts -> {result['num_chunks']:,} prefill chunks "
               + (f"(max_num_batched_tokens {max_num_batched_tokens:,})"
                  if follows.chunked_prefill else f"(whole prompts under {follows.name})"))
    click.echo(f"suggested ({len(result['buckets'])} buckets): {result['flag']} "
               f"{','.join(map(str, result['buckets']))}")
    click.echo(f"  padded tokens {result['padded_tokens']:,} for {result['actual_tokens']:,} "
               f"actual: waste {result['waste_fraction']:.1%}")
    click.echo(f"default ({len(default['buckets'])} buckets): "
               f"{','.join(map(str, default['buckets']))}")
    click.echo(f"  padded tokens {default['padded_tokens']:,}: waste "
               f"{default['waste_fraction']:.1%}")
    if timed_on is not None:
        click.echo(f"modelled prefill time on {timed_on}: suggested "
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
        from neuron_batch.engine.models import load_tokenizer, resolve_model

        tokenizer = load_tokenizer(resolve_model(None))
        for record in texts:
            if record.messages is not None:
                lengths.append(len(tokenizer.apply_chat_template(
                    record.messages, add_generation_prompt=True, tokenize=True)))
            else:
                lengths.append(len(tokenizer(record.prompt).input_ids))
    return lengths

