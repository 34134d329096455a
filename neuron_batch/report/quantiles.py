"""A latency distribution kept as values arrive, in memory that stops growing with the run: the
report's mean and percentiles (p50, p90, p99) of TTFT, time per output token and end-to-end
latency. Pure logic (numpy).

The values are held exactly up to `EXACT_LIMIT` of them, and the percentiles are numpy's
default (linear between the two closest ranks), as report/metrics.py `distribution` computes
them. Past that the values go into a log-bucketed histogram (the DDSketch of Masson, Rim and
Lee, VLDB 2019): a value v > 0 falls in bucket ceil(log_gamma v), gamma = (1 + a) / (1 - a),
and stands for 2 gamma^i / (gamma + 1), within a relative error a = RELATIVE_ERROR of every
value in it; so each order statistic, and the interpolation between two, is within a of the
exact one. Zeros (a simulated step that took no time) are counted apart. Latencies from 1 us
to a day take ~2,500 buckets at a = 0.5%, however many requests. The mean is exactly rounded
while the values are held (math.fsum of them all, as `distribution`), and past that the fsum
of each batch's exactly rounded sum.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import cast

import numpy as np

#: the report's percentiles, by their key in `latency`
PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))
#: values held exactly (8 bytes each): 1 MiB a distribution
EXACT_LIMIT = 1 << 17
#: the histogram's relative error past EXACT_LIMIT
RELATIVE_ERROR = 0.005
_GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(_GAMMA)


class Quantiles:
    def __init__(self, limit: int = EXACT_LIMIT):
        self.limit = limit
        self.count = 0
        self._held: list[np.ndarray] = []
        self._sums: list[float] = []        # per batch added, fsum'd at the end
        self._buckets: dict[int, int] | None = None
        self._zeros = 0

    @property
    def exact(self) -> bool:
        return self._buckets is None

    def add(self, values: np.ndarray | Iterable[float]) -> None:
        batch = np.asarray(values, dtype=np.float64)
        if not len(batch):
            return
        self.count += len(batch)
        self._sums.append(math.fsum(batch.tolist()))
        if len(self._sums) > 64:    # (one more rounding each 64 batches, in bounded memory)
            self._sums = [math.fsum(self._sums)]
        if self._buckets is None:
            self._held.append(batch)
            if self.count <= self.limit:
                return
            batch, self._held = np.concatenate(self._held), []
            self._buckets = {}
        self._bucket(batch)

    def _bucket(self, batch: np.ndarray) -> None:
        assert self._buckets is not None
        positive = batch[batch > 0]
        self._zeros += len(batch) - len(positive)
        keys, counts = np.unique(np.ceil(np.log(positive) / _LOG_GAMMA).astype(np.int64),
                                 return_counts=True)
        for key, count in zip(keys.tolist(), counts.tolist()):
            self._buckets[key] = self._buckets.get(key, 0) + count

    def merge(self, other: Quantiles) -> None:
        """Add `other`'s values (another engine's, another attempt's)."""
        if other.exact:
            for batch in other._held:
                self.add(batch)
            return
        self.count += other.count
        self._sums.extend(other._sums)
        if self._buckets is None:
            held, self._held = self._held, []
            self._buckets = {}
            if held:
                self._bucket(np.concatenate(held))
        assert other._buckets is not None
        for key, count in other._buckets.items():
            self._buckets[key] = self._buckets.get(key, 0) + count
        self._zeros += other._zeros

    def describe(self) -> dict[str, float | None]:
        """{"mean", "p50", "p90", "p99"}: None each where there are no values."""
        n = self.count
        if not n:
            return {"mean": None, **{key: None for key, _ in PERCENTILES}}
        total = (math.fsum(v for batch in self._held for v in batch.tolist()) if self.exact
                 else math.fsum(self._sums))
        result: dict[str, float | None] = {"mean": total / n}
        ranks = sorted({r for _, fraction in PERCENTILES for r in _ranks(n, fraction)})
        ordered = dict(zip(ranks, self._order_statistics(ranks)))
        for key, fraction in PERCENTILES:
            lower, upper = _ranks(n, fraction)
            weight = fraction * (n - 1) - lower
            result[key] = ordered[lower] + (ordered[upper] - ordered[lower]) * weight
        return result

    def _order_statistics(self, ranks: list[int]) -> list[float]:
        if self._buckets is None:
            values = np.concatenate(self._held) if len(self._held) > 1 else self._held[0]
            return cast(list[float], np.partition(values, ranks)[ranks].tolist())
        out, seen = [], self._zeros
        wanted = iter(ranks)
        rank = next(wanted, None)
        while rank is not None and rank < seen:
            out.append(0.0)
            rank = next(wanted, None)
        for key in sorted(self._buckets):
            seen += self._buckets[key]
            while rank is not None and rank < seen:
                out.append(2 * _GAMMA ** key / (_GAMMA + 1))
                rank = next(wanted, None)
        return out


def _ranks(n: int, fraction: float) -> tuple[int, int]:
    lower = math.floor(fraction * (n - 1))
    return lower, min(lower + 1, n - 1)
