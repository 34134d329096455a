"""Exit codes and the error a run raises; the CLI turns a `RunError` into its message and code.

Exit codes (also in `neuron-batch run --help` and the README):
    0  every request completed
    1  the run failed (engine or system error); finished outputs are kept
    2  bad usage or bad input, or the run folder holds a run of other input; nothing was run
    3  partial: the run finished but some inputs were skipped (--on-error skip) or failed
    4  interrupted (SIGTERM, SIGINT or --max-runtime); finished outputs are kept, --resume goes on
    5  the output folder is in use by another run
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PARTIAL, EXIT_INTERRUPTED, EXIT_BUSY = 0, 1, 2, 3, 4, 5


class RunError(Exception):
    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


class ModelError(Exception):
    """A model that cannot be used; the message names it and says what to do."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """"; did you mean 'x'?" for the choice closest to a misspelt `word`, else "": one
    spelling of the suggestion every unknown-name error shares."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
