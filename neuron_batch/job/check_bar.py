"""A progress bar over the check before the run, for a job big enough that the check takes a
while before anything else is said (10M text lines: ~12 minutes on 2 cores, ~47 s on an
inf2.8xlarge's 32): lines checked against the job's lines, as estimated from each input's
first bytes (a table's footer counts its rows exactly). Only on a terminal, never under
--quiet, as the run's own bar (job/generate.py `progress_bar`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from neuron_batch.settings import RunSettings

#: Lines (estimated) from which a check gets a bar: below, it takes a few seconds at most.
MIN_LINES = 100_000


class CheckBar:
    """`add(items)` as items are checked; `restart()` where a split check gives the job back
    to one pass; `close()`."""

    def __init__(self, total: int):
        from tqdm import tqdm

        self._bar = tqdm(total=total, unit="line", unit_scale=True, desc="checking inputs",
                         file=sys.stderr, smoothing=0.1, mininterval=0.5)

    def add(self, items: int) -> None:
        bar = self._bar
        if bar.n + items > bar.total:   # (the estimate was low: tqdm would drop the total)
            bar.total = bar.n + items
        bar.update(items)

    def restart(self) -> None:
        self._bar.reset(total=self._bar.total)

    def close(self) -> None:
        if self._bar.n != self._bar.total:     # (the estimate was off: end at the end)
            self._bar.total = self._bar.n
            self._bar.refresh()
        self._bar.close()


def wanted(settings: RunSettings) -> bool:
    """Whether a bar may be shown: on a terminal, not under --quiet."""
    return not settings.quiet and sys.stderr.isatty()


def check_bar(sizes: Sequence[tuple[int, int]] | None) -> CheckBar | None:
    """A bar for the check of a job of `sizes` (job/check_parts.py `job_sizes`, read where
    the bar is `wanted`) where it has about MIN_LINES lines or more; None otherwise."""
    total = sum(lines for _, lines in sizes) if sizes is not None else 0
    return CheckBar(total) if total >= MIN_LINES else None
