"""The `neuron-batch` command line. Click lives here and only here: every command parses its
options, calls the library, and turns library errors into messages and exit codes.

One module per command family (`run.py`: run and report; `bench.py`; `plan.py`; `doctor.py`;
`tools.py`: calibrate and buckets); `options.py` holds the option bundles they share. vLLM,
torch and transformers are imported only inside commands, so `--help` is instant.
"""

from neuron_batch.job import stop as _stop

if _stop.is_the_command_line():  # first, before click and the commands import (~0.3 s): a
    _stop.hold_early_signals()   # SIGTERM then ends the run as one while it reads (exit 4)

from neuron_batch.cli import (  # noqa: E402, F401  (registers the commands)
    bench,
    doctor,
    plan,
    run,
    tools,
)
from neuron_batch.cli.group import main  # noqa: E402

__all__ = ["main"]
