"""`neuron-batch plan`: what to rent to finish a batch job by a deadline for the least money."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import click

from neuron_batch.cli.group import main
from neuron_batch.cli.options import (
    declared_options,
    int_list,
    load_config_option,
    setting_option,
)
from neuron_batch.settings import RunSettings, SettingsError
from neuron_batch.settings.plan_options import PLAN_DECLARED, check_plan_options


def parse_prices(text: str | None, instances: tuple[str, ...]) -> dict[str, float]:
    """--price-per-hour: "USD" (one instance type) or "inf2.xlarge=0.3,inf2.48xlarge=5"."""
    from neuron_batch.report.cost import check_price_per_hour

    if not text:
        return {}
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, value = part.rpartition("=")
        name = name.strip().lower() or (instances[0] if len(instances) == 1 else "")
        if not name:
            raise SettingsError(f"--price-per-hour {text!r}: with several --instances, give "
                                f"instance=USD pairs, e.g. {instances[0]}=0.30")
        if name not in instances:
            raise SettingsError(f"--price-per-hour names {name!r}, which is not in --instances "
                                f"({', '.join(instances)})")
        try:
            price = check_price_per_hour(float(value))
        except ValueError:
            raise SettingsError(f"--price-per-hour {part!r}: the price must be a positive "
                                f"number of USD") from None
        assert price is not None        # (a number went in)
        out[name] = price
    return out


@main.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--config", type=click.Path(dir_okay=False), callback=load_config_option,
              is_eager=True, expose_value=False, help="A TOML job file (as for `run`).")
@setting_option("architecture", help="Model architecture: a catalogue name (llama-3.1-8b, "
                                     "mistral-7b, ...) or a config.json. Required.")
@declared_options(PLAN_DECLARED, "plan")
@setting_option("order", help="The order each replica submits its requests in (`run --order`); "
                              "length: longest first, which under nxdi wastes less attention.")
@setting_option("compiled", help="The graphs are compiled already (an earlier run's artifacts "
                                 "or compile cache): the start-up counts their load only, and "
                                 "hosts too small to compile the model are weighed too.")
@setting_option("max_model_len")
@setting_option("max_num_batched_tokens", help="Largest prefill chunk.")
@setting_option("weight_dtype", help="Weight storage type.")
@setting_option("cost_profile", help="Step-time profile JSON (from `neuron-batch calibrate`) for "
                                     "every instance.")
@setting_option("model", help="Whose tokenizer counts text prompts. Default: the built-in "
                              "model's.")
@setting_option("pricing", help="Built-in hourly prices: AWS on-demand (us-east-1) or the "
                                "reserved-instance effective rate (docs/prices.md).")
@setting_option("max_tokens")
@setting_option("prompt_column")
@setting_option("dataset_split")
@setting_option("limit", help="Plan for N requests drawn at random (seeded) from the input.")
@setting_option("seed", help="Seed of the random split of the requests over replicas.")
@setting_option("resume", help="Continue a plan in --output (finished simulations are reused).")
@setting_option("quiet", help="Only the final table and recommendation.")
def plan(inputs, architecture, deadline, instances, max_num_instances, seqs_values,
         max_prefill_buckets, splits, runtimes, compiled, weight_dtype, cost_profile, pricing,
         prices, jobs, output, resume, quiet, **options):
    """Which instances, how many, laid out how, to finish INPUTS by --deadline for the least
    money, on the simulated Neuron device.

    \b
    Candidates: every --instances type, every tensor-parallel degree that holds the model,
    replicas filling the instance's cores, 1..--max-num-instances instances, every
    --max-num-seqs, with the prefill buckets the exact optimiser picks and compile time
    counted (unless --compiled); on inf2/trn1 each also split by length at every candidate
    cut (--no-splits: not). One replica is simulated on its share of the requests (a
    seeded random split); options whose lower bounds cannot beat the best one found are
    never simulated. Prints the grid and an estimate first, then a ranked table, the
    recommendation (the cheapest option that meets the deadline, or the fastest) and the
    `neuron-batch run` line that reproduces it; writes plan.json, plan.csv and a plot of
    cost against completion time.
    """
    from neuron_batch.bench.sweep_spec import default_jobs
    from neuron_batch.errors import RunError
    from neuron_batch.job.folder import default_output_dir
    from neuron_batch.plan.planner import PlanJob, run_plan

    if not architecture:
        raise click.UsageError("Missing option '--architecture': the model's shape to plan for "
                               "(a catalogue name such as llama-3.1-8b, or a config.json)")
    if deadline is None:
        raise click.UsageError("Missing option '--deadline': when the job must be done "
                               "(6h, 06:00, 2026-12-01T06:00)")
    base, spec, when = _plan_spec(
        inputs, architecture, deadline, instances, max_num_instances, seqs_values,
        max_prefill_buckets, splits, runtimes, compiled, weight_dtype, cost_profile, pricing,
        prices, jobs, options)
    log = (lambda message: None) if quiet else (lambda message: click.echo(message, err=True))
    name = Path(inputs[0]).stem if not inputs[0].startswith("hf:") else "hf"
    out_dir = Path(output) if output else default_output_dir((f"plan-{name}",))
    job = PlanJob(base, spec, when, out_dir, jobs or default_jobs(), resume, log, quiet)
    try:
        code = run_plan(job)
    except RunError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(error.exit_code)
    sys.exit(code)


def _plan_spec(inputs, architecture, deadline, instances, max_num_instances, seqs_values,
               max_prefill_buckets, splits, runtimes, compiled, weight_dtype, cost_profile,
               pricing, prices, jobs, options):
    """(the run settings planned from, the plan's spec, the deadline) from the options, each
    checked: a bad one is a usage error (exit 2) before any input is read."""
    from neuron_batch.bench.deadline import DeadlineError, parse_deadline
    from neuron_batch.plan.candidates import PlanError, PlanSpec
    from neuron_batch.plan.grid import check_instances, placements
    from neuron_batch.plan.planner import plan_base
    from neuron_batch.report.cost import PricingError

    try:
        seqs = tuple(int_list(seqs_values, "--max-num-seqs"))
        check_plan_options({"max_num_instances": max_num_instances,
                            "max_prefill_buckets": max_prefill_buckets, "jobs": jobs})
        names = check_instances([n for n in instances.split(",") if n.strip()])
        weighed = _runtime_list(runtimes)
        price_of = parse_prices(prices, names)
        when = parse_deadline(deadline)
        settings = RunSettings.of(
            inputs=tuple(inputs), device="sim", max_num_seqs=seqs[0],
            instance=names[0], architecture=architecture, weight_dtype=weight_dtype,
            cost_profile=cost_profile, pricing=pricing, price_per_hour=price_of.get(names[0]),
            quiet=True, **options).validate()
        base, _ = plan_base(settings)
        spec = PlanSpec.from_settings(base, instances=names,
                                      max_num_instances=max_num_instances, seqs_values=seqs,
                                      max_prefill_buckets=max_prefill_buckets,
                                      compiled=compiled, prices=price_of, splits=splits,
                                      runtimes=weighed)
        # An unknown architecture, or a model whose weights or KV fit nowhere, fails here,
        # before any input is read (grid.py looks --architecture up once); a host too small
        # to compile it is left out later, after the inputs' and folder's checks.
        placements(replace(spec, compiled=True))
    except (SettingsError, PlanError, DeadlineError, PricingError) as error:
        raise click.UsageError(str(error)) from None
    return base, spec, when


def _runtime_list(text: str | None) -> tuple[str, ...]:
    """--runtimes nxdi,optimum-neuron -> their names, each looked up where it enters."""
    from neuron_batch.runtimes.runtime import RuntimeNameError, get_runtime

    try:
        return tuple(dict.fromkeys(get_runtime(n).name for n in (text or "").split(",")
                                   if n.strip()))
    except RuntimeNameError as error:
        raise SettingsError(str(error).replace("--runtime ", "--runtimes: each ")) from None
