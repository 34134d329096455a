"""The simulated device's virtual clock: seconds of modelled device time, not wall time.

The simulated executor advances a `VirtualClock` by each step's modelled duration; the Neuron
scheduler's recorder reads the same clock, so every time in the records is simulated time.
Both live in vLLM's engine-core process (a separate process when vLLM multiprocessing is on),
so the recorder finds the clock by name ("module:attribute", see scheduler/records.py's
`resolve_clock`) rather than being handed the object:

- `neuron_batch.device.virtual_clock:virtual_now` reads the clock of the simulated engine
  started last in this process;
- `neuron_batch.device.virtual_clock:engine_<key>` reads one engine's own clock. The executor
  registers one per engine and points the scheduler at it, so two simulated engines alive in
  one process (tests) never share time.

Pure Python, no vLLM import.
"""

from __future__ import annotations

import itertools
import os

#: Prefix of the per-engine clock attributes of this module.
ENGINE_PREFIX = "engine_"


class VirtualClock:
    """A clock that moves only when told to. Calling it returns the current time."""

    __slots__ = ("now",)

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now

    def __repr__(self) -> str:
        return f"VirtualClock(now={self.now!r})"


_clocks: dict[str, VirtualClock] = {}
_current = VirtualClock()
_keys = itertools.count()


def new_engine_clock() -> tuple[str, VirtualClock]:
    """A fresh clock at 0.0 for a new engine, registered in this process. Returns the
    "module:attribute" name the scheduler's recorder resolves, and the clock. It also becomes
    the clock `virtual_now` reads."""
    global _current
    key = f"{os.getpid()}_{next(_keys)}"
    clock = VirtualClock()
    _clocks[key] = clock
    _current = clock
    return f"{__name__}:{ENGINE_PREFIX}{key}", clock


def release_engine_clock(name: str) -> None:
    """Forget an engine's clock (at executor shutdown); its value stays readable by whoever
    still holds the object."""
    _clocks.pop(name.rpartition(":")[2].removeprefix(ENGINE_PREFIX), None)


def virtual_now() -> float:
    """Current simulated time of the engine started last in this process."""
    return _current.now


def __getattr__(name: str) -> VirtualClock:
    # engine_<key> -> that engine's clock (module-level __getattr__, PEP 562).
    if name.startswith(ENGINE_PREFIX):
        clock = _clocks.get(name[len(ENGINE_PREFIX):])
        if clock is not None:
            return clock
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
