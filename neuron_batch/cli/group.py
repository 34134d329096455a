"""The top-level `neuron-batch` click group; the command modules attach to it."""

from __future__ import annotations

import click

from neuron_batch import __version__
from neuron_batch.cli.command import SettingsGroup


@click.group(cls=SettingsGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="neuron-batch")
def main() -> None:
    """Offline batch inference and bucket benchmarking for LLMs on AWS Inferentia2 /
    Trainium, through vLLM with a Neuron-aware scheduler.

    \b
    Start here:
      neuron-batch run                      # built-in prompts and model, on this machine
      neuron-batch run prompts.jsonl        # your prompts
      neuron-batch run trace.csv --device sim --instance inf2.8xlarge --architecture llama-3-8b \\
          --max-model-len 4224 --limit 300  # a simulated inf2: the trace's first 300 requests
      neuron-batch report results/<run>     # the summary of a finished run again
      neuron-batch buckets suggest trace.csv --max-buckets 4
    """

