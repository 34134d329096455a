"""`neuron-batch run` and `neuron-batch report`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from neuron_batch.choices import OnError, PlacementMode
from neuron_batch.cli.group import main
from neuron_batch.cli.options import (
    EXIT_CODES_HELP,
    SplitAt,
    cost_options,
    engine_options,
    int_list,
    kv_reserve_list,
    load_config_option,
    settings_from_options,
)
from neuron_batch.config import DEFAULT_MAX_TOKENS, SettingsError


@main.command(epilog=EXIT_CODES_HELP)
@click.argument("inputs", nargs=-1)
@click.option("--config", type=click.Path(dir_okay=False), callback=load_config_option,
              is_eager=True, expose_value=False,
              help="A TOML job file whose keys are these options' names (a [sim] table for "
                   "the sim ones). Command-line options override it.")
@engine_options
@cost_options
@click.option("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, show_default=True,
              help="Output tokens per request where the input gives none.")
@click.option("--temperature", type=float, default=0.0, show_default=True,
              help="Sampling temperature where the input gives none (0 = greedy).")
@click.option("--ignore-eos", is_flag=True,
              help="Generate exactly max-tokens per request, as benchmarks do (always so on "
                   "--device sim, which does not sample).")
@click.option("--prompt-column", default="prompt", show_default=True,
              help="CSV/Parquet/data-set column holding the prompt.")
@click.option("--split", "dataset_split", default="train", show_default=True,
              help="Data-set split to read.")
@click.option("--limit", type=int, default=None, help="Run only the first N prompts.")
@click.option("--shuffle/--no-shuffle", default=False, help="Shuffle prompts (before --limit).")
@click.option("--seed", type=int, default=0, show_default=True, help="For --shuffle and sampling.")
@click.option("--on-error", type=click.Choice(OnError.values()), default=OnError.FAIL.value,
              show_default=True,
              help="Bad input lines: fail before loading the model, or skip them and report.")
@click.option("-o", "--output", type=click.Path(file_okay=False), default=None,
              envvar="NEURON_BATCH_OUTPUT",
              help="Run folder. Default: results/<timestamp>-<input name>/.")
@click.option("--resume", is_flag=True,
              help="Finish a run in --output that was stopped: only the requests not yet in "
                   "outputs.jsonl run again. A run of other input or settings is refused "
                   "(exit 2), naming what changed.")
@click.option("--restart", is_flag=True,
              help="Move the run already in --output aside (into previous-<time>/ there; "
                   "nothing is deleted) and start anew. With --resume, only a run of other "
                   "input or settings is moved; an unchanged one resumes.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary (for cron).")
@click.option("--max-runtime", type=float, default=None, metavar="SECONDS",
              help="Stop cleanly after this long (exit 4; --resume continues).")
@click.option("--metrics-textfile", type=click.Path(dir_okay=False), default=None,
              envvar="NEURON_BATCH_METRICS_TEXTFILE",
              help="Also write the headline figures in Prometheus text format here "
                   "(node_exporter's textfile collector).")
@click.option("--split-at", type=SplitAt(), default=None, metavar="N|auto",
              help="Run requests of prompt + max_tokens <= N first, in a layout of "
                   "max-model-len N, then the rest: one report. auto: the cut the step-time "
                   "model finds fastest (sim, or a known Neuron instance).")
@click.option("--split-placement", type=click.Choice(PlacementMode.values()),
              default=PlacementMode.AUTO.value,
              show_default=True,
              help="With --split-at and --replicas: each part on every replica in turn, or "
                   "the parts on separate replicas side by side; auto: the shorter estimate.")
@click.option("--replicas", type=int, default=1, show_default=True,
              help="Engines sharing the prompts (data parallel), each with these settings; "
                   "more than 1 runs on Ray, local or --ray's (needs neuron-batch[ray]).")
@click.option("--ray", "ray", default=None, metavar="ADDRESS",
              help="Run the replicas on this Ray cluster: the host:port of `ray start "
                   "--head`, or auto. `local` starts a local Ray instance even for one "
                   "replica. Without it, --replicas 1 never touches Ray.")
@click.option("--num-instances", type=int, default=1, show_default=True,
              help="[sim] Instances of --instance the --replicas engines are spread over.")
def run(inputs, **options):
    """Run prompts through vLLM with the Neuron scheduler and report what happened.

    INPUTS are files (.jsonl, OpenAI batch .jsonl, .csv, .parquet, .txt), data-set folders
    written by save_to_disk, or hf:NAME[:CONFIG] Hugging Face data sets. With none, a small
    built-in set of prompts runs.

    Writes outputs.jsonl (a line per request, as each finishes), report.json and
    records-N.jsonl (every scheduler step) into the run folder, and prints a summary:
    throughput, padding waste per bucket, time per scheduler state and admission blocks.
    """
    from neuron_batch.errors import EXIT_INTERRUPTED, RunError
    from neuron_batch.job.stop import Interrupted
    from neuron_batch.run.runner import run as run_job

    try:
        seqs_values = int_list(options.pop("max_num_seqs"), "--max-num-seqs")
        if len(seqs_values) > 1:
            raise SettingsError("--max-num-seqs takes one value in `run`; sweep several with "
                                "`neuron-batch bench`")
        if len(kv_reserve_list(options["kv_reserve"])) > 1:
            raise SettingsError("--kv-reserve takes one rule in `run`; compare both with "
                                "`neuron-batch bench --kv-reserve request,max-model-len`")
        result = run_job(settings_from_options(inputs, seqs_values[0], options))
    except SettingsError as error:
        raise click.UsageError(str(error)) from None
    except RunError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(error.exit_code)
    except Interrupted as stop:  # (not click's "Aborted!", exit 1: an interrupted run is a 4)
        click.echo(stop.line or f"neuron-batch: Stopped by {stop.signal} while {stop.phase}; "
                                f"rerun with --resume to finish.", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(result.exit_code)

@main.command()
@click.argument("path", type=click.Path(exists=True))
def report(path):
    """Print the summary of a finished run (or the table of a finished sweep, re-drawing its
    plots, or of a plan) again, from its files."""
    from neuron_batch.errors import RunError
    from neuron_batch.run.folder_report import rerender

    try:
        if (Path(path) / "sweep.json").exists():
            from neuron_batch.bench.sweep import render

            click.echo(render(Path(path)))
            return
        if (Path(path) / "split.json").exists():
            from neuron_batch.bench.split_compare import rerender_comparison

            click.echo(rerender_comparison(Path(path)))
            return
        if (Path(path) / "plan.json").exists():
            from neuron_batch.plan.report import rerender_plan

            click.echo(rerender_plan(Path(path)))
            return
        click.echo(rerender(Path(path)))
    except RunError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(error.exit_code)

