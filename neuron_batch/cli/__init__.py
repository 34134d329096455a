"""The `neuron-batch` command line. Click lives here and only here: every command parses its
options, calls the library, and turns library errors into messages and exit codes.

One module per command family (`run.py`: run and report; `bench.py`; `plan.py`; `doctor.py`;
`tools.py`: calibrate and buckets); `options.py` holds the option bundles they share. vLLM,
torch and transformers are imported only inside commands, so `--help` is instant.
"""

from neuron_batch.cli import (  # noqa: F401  (registers the commands)
    bench,
    doctor,
    plan,
    run,
    tools,
)
from neuron_batch.cli.group import main

__all__ = ["main"]
