"""`neuron-batch run` and `neuron-batch report`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from neuron_batch.cli.group import main
from neuron_batch.cli.options import (
    EXIT_CODES_HELP,
    load_config_option,
    settings_from_options,
    settings_options,
)
from neuron_batch.settings import SettingsError


@main.command(epilog=EXIT_CODES_HELP)
@click.argument("inputs", nargs=-1)
@click.option("--config", type=click.Path(dir_okay=False), callback=load_config_option,
              is_eager=True, expose_value=False,
              help="A TOML job file whose keys are these options' names (a [sim] table for "
                   "the sim ones). Command-line options override it.")
@settings_options("run")
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
        result = run_job(settings_from_options(inputs, options))
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

def _unreported_run(folder: Path) -> str | None:
    """Why a run folder holds no report (its run failed or stopped before writing one, as its
    attempts.json says), or None: it has one, or it is no run folder."""
    import json

    from neuron_batch.job.folder import ATTEMPTS, MANIFEST, REPORT

    if not folder.is_dir() or (folder / REPORT).exists() or not (
            (folder / ATTEMPTS).exists() or (folder / MANIFEST).exists()):
        return None
    try:
        attempts = json.loads((folder / ATTEMPTS).read_text(encoding="utf-8"))
        last = attempts[-1] if isinstance(attempts, list) and attempts else {}
    except (OSError, ValueError):
        last = {}
    ended = last.get("ended") or "did not finish"
    why = f": {last['error']}" if last.get("error") else ""
    return (f"{folder} is a run folder without a report: its attempt "
            f"{last.get('attempt', '?')} {ended} before writing one{why}. "
            f"`neuron-batch run --resume -o {folder}` with the same inputs and settings "
            f"finishes it")


@main.command()
@click.argument("path")
def report(path):
    """Print the summary of a finished run (or the table of a finished sweep, re-drawing its
    plots, or of a plan) again, from its files. PATH is a folder, or the s3:// prefix of a run
    folder that `run --output s3://...` wrote."""
    from neuron_batch.errors import RunError
    from neuron_batch.storage.urls import is_url

    try:
        if is_url(path):
            _report_of_bucket(path)
            return
        if not Path(path).exists():
            raise RunError(f"{path}: no such file or folder", exit_code=2)
        _report_of(path)
    except RunError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(error.exit_code)


def _report_of_bucket(url: str) -> None:
    """A run folder in S3: its report files read into a scratch folder, shown as the URL."""
    import tempfile

    from neuron_batch.errors import RunError
    from neuron_batch.run.folder_report import rerender
    from neuron_batch.storage.run_bucket import fetch_report_files

    with tempfile.TemporaryDirectory(prefix="neuron-batch-report-") as scratch:
        fetch_report_files(url, Path(scratch))
        shown = url.rstrip("/")
        if no_report := _unreported_run(Path(scratch)):
            raise RunError(no_report.replace(scratch, shown))
        click.echo(rerender(Path(scratch), shown_as=shown))


def _report_of(path: str) -> None:
    from neuron_batch.errors import RunError
    from neuron_batch.run.folder_report import rerender

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
    if no_report := _unreported_run(Path(path)):
        raise RunError(no_report)
    click.echo(rerender(Path(path)))

