"""`neuron-batch doctor`: can a run start on this host, and if not, why."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from neuron_batch.cli.group import main
from neuron_batch.cli.options import settings_from_options, settings_options


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print everything as one JSON object.")
@click.option("-o", "--output", "results_dir", default="results", show_default=True,
              envvar="NEURON_BATCH_OUTPUT", type=click.Path(file_okay=False),
              help="Where run folders go (its free space is checked); an s3://bucket/prefix/ "
                   "is checked for writing (a test object written and deleted) and names the "
                   "identity used.")
@click.option("--no-platform", is_flag=True,
              help="Do not import vLLM to see which platform it picks (saves ~10 s).")
@click.option("--input", "input_urls", multiple=True, metavar="URL",
              help="An input URL a run will read (s3://bucket/key, a glob or a prefix): listed "
                   "now, with the identity the store sees. Repeatable.")
@settings_options("doctor")
def doctor(as_json: bool, results_dir: str, no_platform: bool, input_urls: tuple[str, ...],
           **options: Any) -> None:
    """Check this host: neuron-batch, Python and vLLM versions (against the tested releases),
    the Neuron plugin (AWS's vllm-neuron or Hugging Face's optimum-neuron), the Neuron runtime
    it runs (nxdi, vllm-neuron or optimum-neuron), NxD Inference, the compiled-artifacts
    folder, the platform vLLM picks, Neuron devices and cores, the built-in model's cache and
    free space for results. On an NxDI host: whether prefix caching is on, the KV layout and
    the graphs it compiles; on optimum-neuron, with --model, the export a run would load (local
    export, hub cache or compiled fresh; batch size, sequence length, TP) and whether it
    matches; with --model, whether the layout loads here (max-num-seqs x max-model-len of KV
    beside the weights, under --runtime on --instance), checked as `run` checks it, before
    anything loads.

    Exits 0 when a run can start, 1 (with the reasons) when it cannot.
    """
    from neuron_batch.doctor import format_text, gather, report
    from neuron_batch.doctor.facts import unplugged_runtime
    from neuron_batch.settings import SettingsError

    # No Neuron plugin here: the --instance named says the runtime, as on --device sim.
    options["runtime"] = options.get("runtime") or unplugged_runtime(options.get("instance"))
    try:
        layout = settings_from_options((), options, "doctor")
        if layout.prefix_caching is None:   # (the runtime this host's plugin runs decides it)
            layout = layout.replace(
                prefix_caching=layout.resolve_runtime().prefix_caching).validate()
    except SettingsError as error:
        raise click.UsageError(str(error)) from None
    if not as_json and not no_platform:
        click.echo("(asking vLLM which platform it picks: about 10 s)", err=True)
    rep = report(gather(results_dir=results_dir, check_platform=not no_platform,
                        layout=layout, urls=input_urls))
    if as_json:
        click.echo(json.dumps(rep, indent=2, default=str))
    else:
        click.echo(format_text(rep))
    sys.exit(0 if rep["can_run"] else 1)
