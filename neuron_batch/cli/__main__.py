"""`python -m neuron_batch.cli`: the same as the `neuron-batch` command."""

from neuron_batch.cli import main

main()
