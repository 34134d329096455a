"""`python -m neuron_batch.cli`: the same command line as the `neuron-batch` script (the
kill/resume tests start runs this way, since the CLI became a package)."""

from neuron_batch.cli import main

if __name__ == "__main__":
    main()
