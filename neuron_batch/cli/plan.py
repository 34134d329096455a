"""`neuron-batch plan`: what to rent to finish a batch job by a deadline for the least money."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import click

from neuron_batch.cli.group import main
from neuron_batch.cli.options import int_list, load_config_option, setting_option
from neuron_batch.device.hardware import DEFAULT_PLAN_INSTANCES
from neuron_batch.settings import RunSettings, SettingsError


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
@click.option("--deadline", required=True,
              help="When the job must be done: a duration (6h, 90m, 1h30m) or a moment "
                   "(06:00 = the next 6 a.m., 2026-12-01T06:00).")
@click.option("--instances", default=",".join(DEFAULT_PLAN_INSTANCES), show_default=True,
              metavar="I,I,...",
              help="Instance types to consider.")
@click.option("--max-num-instances", type=int, default=4, show_default=True,
              help="Consider 1..N instances of each type.")
@click.option("--max-num-seqs", default="8,16,32,64", show_default=True, metavar="N,N,...",
              help="max_num_seqs values to consider (each is also the one decode bucket).")
@click.option("--max-prefill-buckets", type=int, default=4, show_default=True,
              help="The exact optimiser picks at most this many prefill buckets, as many as "
                   "are worth their compile time.")
@click.option("--splits/--no-splits", default=True, show_default=True,
              help="Also weigh the job split by length (`run --split-at N`, nxdi) at every "
                   "cut where the short layout's slots change; chosen only when cheaper, or "
                   "alone on time.")
@setting_option("order", help="The order each replica submits its requests in (`run --order`); "
                              "length: longest first, which under nxdi wastes less attention.")
@click.option("--runtimes", default=None, metavar="R,R",
              help="Runtimes to weigh side by side where they run, e.g. nxdi,optimum-neuron "
                   "on inf2. Default: each instance's own (nxdi on inf2/trn1).")
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
@click.option("--price-per-hour", default=None, metavar="USD|I=USD,...",
              help="Hourly prices overriding the built-in table (spot, negotiated): one number "
                   "when --instances names one type, else instance=USD pairs.")
@setting_option("max_tokens")
@setting_option("prompt_column")
@setting_option("dataset_split")
@setting_option("limit", help="Plan for N requests drawn at random (seeded) from the input.")
@setting_option("seed", help="Seed of the random split of the requests over replicas.")
@click.option("--jobs", type=int, default=None,
              help="Simulations run in parallel on this many processes. Default: the cores.")
@click.option("-o", "--output", type=click.Path(file_okay=False), default=None,
              help="Where plan.json, plan.csv, the plot and the simulated runs go. Default: "
                   "results/<timestamp>-plan-<input name>/.")
@setting_option("resume", help="Continue a plan in --output (finished simulations are reused).")
@setting_option("quiet", help="Only the final table and recommendation.")
def plan(inputs, architecture, deadline, instances, max_num_instances, max_num_seqs,
         max_prefill_buckets, splits, runtimes, compiled, weight_dtype, cost_profile, pricing,
         price_per_hour, jobs, output, resume, quiet, **options):
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
    from neuron_batch.bench.deadline import DeadlineError, parse_deadline
    from neuron_batch.bench.sweep_spec import default_jobs
    from neuron_batch.errors import RunError
    from neuron_batch.job.folder import default_output_dir
    from neuron_batch.plan.candidates import PlanError, PlanSpec
    from neuron_batch.plan.grid import check_instances, placements
    from neuron_batch.runtime import RuntimeNameError, get_runtime

    if not architecture:
        raise click.UsageError("Missing option '--architecture': the model's shape to plan for "
                               "(a catalogue name such as llama-3.1-8b, or a config.json)")

    def runtime_list(text: str | None) -> tuple[str, ...]:
        """--runtimes nxdi,optimum-neuron -> their names, each looked up where it enters."""
        try:
            return tuple(dict.fromkeys(get_runtime(n).name for n in (text or "").split(",")
                                       if n.strip()))
        except RuntimeNameError as error:
            raise SettingsError(str(error).replace("--runtime ", "--runtimes: each ")) from None

    from neuron_batch.plan.planner import PlanJob, plan_base, run_plan
    from neuron_batch.report.cost import PricingError

    try:
        seqs = tuple(int_list(max_num_seqs, "--max-num-seqs"))
        for name, value in (("--max-num-instances", max_num_instances),
                            ("--max-prefill-buckets", max_prefill_buckets),
                            ("--jobs", jobs if jobs is not None else 1)):
            if value < 1:
                raise SettingsError(f"{name} must be 1 or more, got {value}")
        names = check_instances([n for n in instances.split(",") if n.strip()])
        weighed = runtime_list(runtimes)
        prices = parse_prices(price_per_hour, names)
        when = parse_deadline(deadline)
        settings = RunSettings.of(
            inputs=tuple(inputs), device="sim", max_num_seqs=seqs[0],
            instance=names[0], architecture=architecture, weight_dtype=weight_dtype,
            cost_profile=cost_profile, pricing=pricing, price_per_hour=prices.get(names[0]),
            quiet=True, **options).validate()
        base, _ = plan_base(settings)
        spec = PlanSpec.from_settings(base, instances=names,
                                      max_num_instances=max_num_instances, seqs_values=seqs,
                                      max_prefill_buckets=max_prefill_buckets,
                                      compiled=compiled, prices=prices, splits=splits,
                                      runtimes=weighed)
        # An unknown architecture, or a model whose weights or KV fit nowhere, fails here,
        # before any input is read (grid.py looks --architecture up once); a host too small
        # to compile it is left out later, after the inputs' and folder's checks.
        placements(replace(spec, compiled=True))
    except (SettingsError, PlanError, DeadlineError, PricingError) as error:
        raise click.UsageError(str(error)) from None
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
