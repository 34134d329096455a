"""SIGTERM and SIGINT over a whole run: one outcome whatever the phase the signal comes in.

A run passes through four phases (`READING` .. `REPORTING`); the runner installs one handler
(`RunSignals`) for all of them, and it knows which phase it is in:
- while the inputs are read and while the engine starts, nothing is worth waiting for: the
  first signal raises `Interrupted` there and then; the runner records the attempt in
  attempts.json, says in one line what was done and how to resume, and the CLI exits 4;
- while requests run, while the run folder is being prepared and while the report is
  written, the first signal only sets a flag (`deferred` phases): the engine loop stops
  admitting at its next step (vLLM is never cut halfway through a step), a folder is never
  left half moved aside, and the report is finished; exit 4, or 0 when every request had
  completed;
- a second signal raises `Interrupted` in any phase: the user insists.
(Exit codes: errors.py, docs/cron.md.) `Interrupted` is a KeyboardInterrupt, so what already
stops on Ctrl-C around a run (bench, plan) stops on it too, SIGTERM included.

Before the run's handler exists (Python importing the CLI, click parsing: about 0.3 s) the
command line holds a signal instead of dying of it (`hold_early_signals`, the first thing
`neuron_batch.cli` does when it is the `neuron-batch` process): `run` takes the held signal as
one that came while its inputs were read, so a SIGTERM at any point after the interpreter has
started ends the same way; any other command gets the signal back as if it had come then.

`pause_point` lets a test stop a real process at a phase's start and send it a signal there,
instead of sleeping and hoping (NEURON_BATCH_TEST_PAUSE; nothing else reads it).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

READING = "reading the inputs"
STARTING = "starting the engine"
RUNNING = "running"
REPORTING = "writing the report"


class Interrupted(KeyboardInterrupt):
    """A signal stopped the run where it does not wait (`phase`), or a second one came."""

    def __init__(self, signal_name: str, phase: str, *, insisted: bool = False):
        super().__init__(signal_name)
        self.signal = signal_name
        self.phase = phase
        self.insisted = insisted
        # The one line the CLI prints (what was done, how to resume), set by the runner,
        # which knows the folder and the counts; None when it had no time to.
        self.line: str | None = None


class RunSignals:
    """The run's SIGTERM/SIGINT handler; `reason`, `signal` as the engine loops read them."""

    def __init__(self):
        self.phase = READING
        self.deferred = False
        self.signal: str | None = None   # the first signal's name, for the words a stop ends with
        self.reason: str | None = None   # "interrupted" once signalled ("deadline": the loops')
        self.count = 0                   # signals received
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> RunSignals:
        global _current
        held = release_early_signals(deliver=False)
        self._install()
        if held is not None:    # it came before this handler: the run stops at its first phase
            self.signal, self.reason, self.count = held, "interrupted", 1
        self._outer, _current = _current, self
        return self

    def _install(self) -> None:
        """This handler for both signals, again where another took them meanwhile (Ray's
        driver does in ray.init: its SIGTERM aborted the run, exit -6); the handlers found
        the first time are the ones put back at the end."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                if signal.getsignal(signum) != self._handle:
                    previous = signal.signal(signum, self._handle)
                    self._previous.setdefault(signum, previous)
            except ValueError:  # not the main thread (a test runner's thread): flags only
                pass

    def __exit__(self, *exc) -> None:
        global _current
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        _current = self._outer

    def enter(self, phase: str, *, defer: bool = False) -> None:
        """From here the run is in `phase`; a phase that does not wait stops at once for a
        signal that came while the one before it finished."""
        self.phase, self.deferred = phase, defer
        self._install()
        if not defer and self.signal is not None:
            raise Interrupted(self.signal, phase)

    def _handle(self, signum, frame) -> None:
        self.count += 1
        self.signal = self.signal or signal.Signals(signum).name
        self.reason = "interrupted"
        if self.deferred and self.count == 1:
            return      # the loop (or the folder's preparation, the report) ends first
        raise Interrupted(self.signal, self.phase, insisted=self.count > 1)


_current: RunSignals | None = None


def enter(phase: str, *, defer: bool = False) -> None:
    """The run's handler (if any) in `phase` (RunSignals.enter)."""
    if _current is not None:
        _current.enter(phase, defer=defer)


@contextmanager
def deferring(phase: str = RUNNING) -> Iterator[RunSignals]:
    """The run's handler in a phase that finishes first (`phase`); an engine loop run outside
    a run (a test driving `generate`) gets a handler of its own for as long as it runs."""
    if _current is not None:
        _current.enter(phase, defer=True)
        yield _current
        return
    with RunSignals() as own:
        own.enter(phase, defer=True)
        yield own


# -- before the run's handler: the command line's first ~0.3 s ----------------------------------

_held: str | None = None             # the first signal held, by name
_held_previous: dict[int, Any] = {}  # the handlers found (empty: not holding)


def is_the_command_line() -> bool:
    """Whether this process is the `neuron-batch` command (its script, or `python -m
    neuron_batch.cli`, whose argv[0] reads "-m" while the package imports), not a library
    user or a test importing the CLI."""
    first = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return first == "neuron-batch" or (first == "-m" and "neuron_batch.cli" in sys.orig_argv)


def hold_early_signals() -> None:
    """Hold SIGTERM/SIGINT from now until a run's handler takes them (RunSignals) or the
    command is known not to be `run` (`release_early_signals`). A second signal while held
    ends the process at once with the run's exit for a signal (4): nothing was done yet."""
    if _held_previous or threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        _held_previous[signum] = signal.signal(signum, _hold)


def _hold(signum, frame) -> None:
    global _held
    if _held is None:
        _held = signal.Signals(signum).name
        return
    from neuron_batch.errors import EXIT_INTERRUPTED

    sys.stderr.write(f"neuron-batch: Stopped by {_held} before the run started; nothing was "
                     f"done.\n")
    os._exit(EXIT_INTERRUPTED)   # (the user insists, and nothing is open that needs closing)


def release_early_signals(*, deliver: bool = True) -> str | None:
    """Give SIGTERM/SIGINT their handlers back and return the signal held meanwhile (None:
    none, or not holding). `deliver`: raise it again now, for a command that is not `run`
    (it then ends as that signal always ended it)."""
    global _held
    held, _held = _held, None
    for signum, handler in _held_previous.items():
        signal.signal(signum, handler)
    _held_previous.clear()
    if held is not None and deliver:
        signal.raise_signal(signal.Signals[held])
        return None
    return held


#: NEURON_BATCH_TEST_PAUSE="<phase>[,<signals>]" and NEURON_BATCH_TEST_PAUSE_FILE=<path>: at
#: that pause point the process writes the file and waits for that many signals (1 unless
#: given), at most PAUSE_LIMIT_S. For tests only.
PAUSE_ENV, PAUSE_FILE_ENV = "NEURON_BATCH_TEST_PAUSE", "NEURON_BATCH_TEST_PAUSE_FILE"
PAUSE_LIMIT_S = 120.0


def pause_point(phase: str) -> None:
    """Where a test may hold the process in `phase` (see PAUSE_ENV); nothing otherwise."""
    wanted = os.environ.get(PAUSE_ENV)
    if not wanted or wanted.split(",")[0] != phase or _current is None:
        return
    signals = int(wanted.split(",")[1]) if "," in wanted else 1
    marker = os.environ.get(PAUSE_FILE_ENV)
    if marker:
        Path(marker).write_text(f"{os.getpid()} {phase}\n", encoding="utf-8")
    until = time.monotonic() + PAUSE_LIMIT_S
    while _current.count < signals and time.monotonic() < until:
        time.sleep(0.02)   # a signal that stops here raises out of the sleep
