"""`neuron-batch doctor`: can a run start on this host, and if not, why."""

from __future__ import annotations

import json
import sys

import click

from neuron_batch.cli.group import main


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print everything as one JSON object.")
@click.option("-o", "--output", "results_dir", default="results", show_default=True,
              envvar="NEURON_BATCH_OUTPUT", type=click.Path(file_okay=False),
              help="Where run folders go (its free space is checked).")
@click.option("--no-platform", is_flag=True,
              help="Do not import vLLM to see which platform it picks (saves ~10 s).")
def doctor(as_json, results_dir, no_platform):
    """Check this host: neuron-batch, Python and vLLM versions (against the tested releases),
    AWS's Neuron plugin and the platform vLLM picks, Neuron devices and cores, the built-in
    model's cache and free space for results.

    Exits 0 when a run can start, 1 (with the reasons) when it cannot.
    """
    from neuron_batch.doctor import format_text, gather, report

    if not as_json and not no_platform:
        click.echo("(asking vLLM which platform it picks: about 10 s)", err=True)
    rep = report(gather(results_dir=results_dir, check_platform=not no_platform))
    if as_json:
        click.echo(json.dumps(rep, indent=2, default=str))
    else:
        click.echo(format_text(rep))
    sys.exit(0 if rep["can_run"] else 1)
