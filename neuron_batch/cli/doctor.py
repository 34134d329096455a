"""`neuron-batch doctor`: can a run start on this host, and if not, why."""

from __future__ import annotations

import json
import sys

import click

from neuron_batch.cli.group import main
from neuron_batch.cli.options import setting_option
from neuron_batch.settings import DEFAULT_MAX_MODEL_LEN, DEFAULT_MAX_NUM_SEQS


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print everything as one JSON object.")
@click.option("-o", "--output", "results_dir", default="results", show_default=True,
              envvar="NEURON_BATCH_OUTPUT", type=click.Path(file_okay=False),
              help="Where run folders go (its free space is checked).")
@click.option("--no-platform", is_flag=True,
              help="Do not import vLLM to see which platform it picks (saves ~10 s).")
@click.option("--model", default=None, envvar="NEURON_BATCH_MODEL",
              help="[Neuron] Check this model's static KV cache (a local directory with "
                   "config.json, or a catalogue name such as llama-3.1-8b).")
@click.option("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS, show_default=True)
@click.option("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN, show_default=True)
@click.option("--tensor-parallel-size", type=int, default=None,
              help="NeuronCores the model is sharded over. Default: vLLM's (1).")
@setting_option("weight_dtype")
@click.option("--instance", default=None, envvar="NEURON_BATCH_INSTANCE",
              help="The instance type. Default: what the host says (EC2's DMI product name).")
@click.option("--prefix-caching/--no-prefix-caching", default=None,
              help="[nxdi] The KV layout to describe: NxDI's block layout and (prefill, "
                   "prefix) grid, or the contiguous one. Default: the runtime's (off on "
                   "optimum-neuron).")
@click.option("--prefix-buckets", default=None, metavar="N,N,...",
              help="[nxdi] Prefix buckets, as `run` takes them. Default: NxDI's.")
@click.option("--block-size", type=int, default=None,
              help="[nxdi] KV block size, as `run` takes it. Default: 32 (max-model-len "
                   "without prefix caching).")
@click.option("--compiled-artifacts", default=None, metavar="DIR",
              envvar="NEURON_BATCH_COMPILED_ARTIFACTS",
              help="Where `run` keeps compiled graphs. Default: <cache>/neuron-compiled.")
def doctor(as_json, results_dir, no_platform, model, max_num_seqs, max_model_len,
           tensor_parallel_size, weight_dtype, instance, prefix_caching, prefix_buckets,
           block_size, compiled_artifacts):
    """Check this host: neuron-batch, Python and vLLM versions (against the tested releases),
    the Neuron plugin (AWS's vllm-neuron or Hugging Face's optimum-neuron), the Neuron runtime
    it runs (nxdi, vllm-neuron or optimum-neuron), NxD Inference, the compiled-artifacts
    folder, the platform vLLM picks, Neuron devices and cores, the built-in model's cache and
    free space for results. On an NxDI host: whether prefix caching is on, the KV layout and
    the graphs it compiles; on optimum-neuron, with --model, the export a run would load (local
    export, hub cache or compiled fresh; batch size, sequence length, TP) and whether it
    matches; with --model, whether max-num-seqs x max-model-len of static KV fits beside the
    weights, before anything loads.

    Exits 0 when a run can start, 1 (with the reasons) when it cannot.
    """
    from neuron_batch.doctor import format_text, gather, report
    from neuron_batch.settings import RunSettings, SettingsError, parse_buckets_option

    if prefix_caching is None:      # (the runtime this host's plugin runs decides it)
        prefix_caching = RunSettings.of(inputs=("-",)).resolve_runtime().prefix_caching
    layout = RunSettings.of(inputs=("-",), model=model, max_num_seqs=max_num_seqs,
                            max_model_len=max_model_len, compiled_artifacts=compiled_artifacts,
                            prefix_caching=prefix_caching, block_size=block_size,
                            tensor_parallel_size=tensor_parallel_size,
                            weight_dtype=weight_dtype, host_instance=instance)
    try:
        layout = layout.replace(prefix_buckets=parse_buckets_option(
            prefix_buckets, "--prefix-buckets"))
        layout.validate()
    except SettingsError as error:
        raise click.BadParameter(str(error)) from None
    if not as_json and not no_platform:
        click.echo("(asking vLLM which platform it picks: about 10 s)", err=True)
    rep = report(gather(results_dir=results_dir, check_platform=not no_platform,
                        layout=layout))
    if as_json:
        click.echo(json.dumps(rep, indent=2, default=str))
    else:
        click.echo(format_text(rep))
    sys.exit(0 if rep["can_run"] else 1)
