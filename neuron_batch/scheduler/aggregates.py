"""The step figures of a run as running aggregates: what the report reads of the steps, kept as
exact counts and sums while the steps go by, so no step stays in memory and building the report
never reads the steps again (issue 46). Pure Python.

`Aggregates` is updated once per finished step (`StepTiler.add`, which also owns the time
accounting) and written into the records' summary line at shutdown (`to_dict`/`from_dict`);
the aggregates of several engines or attempts add up (`merge`). What it holds:

- per prefill bucket, decode batch bucket and attended length: steps, actual and padded work
  (the padding tables), and per (prefill, prefix) grid cell the same plus the tokens computed
  again (NxDI with prefix caching);
- steps per kind, preemptions, recomputed prefill tokens, sampling seconds and step seconds;
- KV: the peak reservation and usage, and the duration-weighted usage as exact sums
  (`ExactSum`, so the mean is the correctly rounded one a full pass with `math.fsum` gives);
- time per scheduler state, with IDLE told incrementally (see `StepTiler`), and the seconds the
  engine was full (a replica's `busy_fraction`);
- the window: the first step's start, the last end, and (set at shutdown) the run's start and
  end as the report counts them.

The figures equal the full pass over every step (report/metrics.py `summarize`) for a run whose
requests all finished; tests/report/test_aggregates.py checks that on random step streams.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

_IDLE = "IDLE"
_KNOWN_STATES = ("IDLE", "ACTIVE_PREFILL", "ACTIVE_DECODE")


class ExactSum:
    """A running float sum kept exactly as non-overlapping partials (Shewchuk's algorithm, the
    one `math.fsum` uses), so `value()` is the correctly rounded sum of everything added, in
    any order: equal to `math.fsum` over the same values."""

    __slots__ = ("partials",)

    def __init__(self, partials: list[float] | None = None):
        self.partials: list[float] = list(partials or [])

    def add(self, x: float) -> None:
        partials = self.partials
        i = 0
        for y in partials:
            if abs(x) < abs(y):
                x, y = y, x
            high = x + y
            low = y - (high - x)
            if low:
                partials[i] = low
                i += 1
            x = high
        partials[i:] = [x]

    def value(self) -> float:
        return math.fsum(self.partials)


def _table_to_dict(table: dict[int, list[int]]) -> dict[str, list[int]]:
    return {str(key): row for key, row in sorted(table.items())}


def _table_from_dict(data: dict[str, list[int]] | None) -> dict[int, list[int]]:
    return {int(key): list(row) for key, row in (data or {}).items()}


_Key = TypeVar("_Key", int, tuple[int, int])  # a table's key: a bucket, or a grid cell


def _add_rows(into: dict[_Key, list[int]], other: dict[_Key, list[int]]) -> None:
    for key, row in other.items():
        mine = into.get(key)
        if mine is None:
            into[key] = list(row)
        else:
            for i, value in enumerate(row):
                mine[i] += value


@dataclass
class Aggregates:
    """The steps' figures of one engine (or, merged, of several). See the module text."""

    num_steps: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    prefill: dict[int, list[int]] = field(default_factory=dict)    # bucket -> [n, actual, padded]
    decode: dict[int, list[int]] = field(default_factory=dict)
    attention: dict[int, list[int]] = field(default_factory=dict)
    grid: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # [n, act, pad, again]
    grid_used: bool = False         # a prefill ran on a (prefill, prefix) cell
    recomputed_tokens: int = 0
    preemptions: int = 0
    sampling_s: float = 0.0
    step_s: float = 0.0
    kv_peak_reserved: int = 0
    kv_peak_usage: float = 0.0
    kv_weight: ExactSum = field(default_factory=ExactSum)
    kv_weighted: ExactSum = field(default_factory=ExactSum)
    kv_usage_sum: ExactSum = field(default_factory=ExactSum)
    kv_timed_steps: int = 0         # steps (any) whose usage counted, for the unweighted mean
    state_steps: dict[str, int] = field(default_factory=dict)
    state_seconds: dict[str, float] = field(default_factory=dict)
    full_s: float = 0.0             # seconds in steps where the engine was full
    first_start: float | None = None
    last_end: float | None = None   # the latest step end (a step never ended: its start)
    start: float | None = None      # the run's window as the report counts it (set by close)
    end: float | None = None

    # -- one step ------------------------------------------------------------------------------
    def count(self, step: Any) -> None:
        """Everything of a step but its time span (StepTiler adds that)."""
        self.num_steps += 1
        kind = step.kind
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        self.state_steps[step.state] = self.state_steps.get(step.state, 0) + 1
        self.preemptions += step.num_preempted
        self.sampling_s += step.sampling_s
        if step.t_end is not None:
            self.step_s += step.t_end - step.t_start
        usage = step.kv_usage
        if step.kv_reserved_blocks > self.kv_peak_reserved:
            self.kv_peak_reserved = step.kv_reserved_blocks
        if usage > self.kv_peak_usage:
            self.kv_peak_usage = usage
        self.kv_usage_sum.add(usage)
        self.kv_timed_steps += 1
        weight = 0.0 if step.t_end is None else max(step.t_end - step.t_start, 0.0)
        if weight:
            self.kv_weight.add(weight)
            self.kv_weighted.add(usage * weight)
        if kind == "prefill":
            self.recomputed_tokens += step.recomputed_tokens
            actual, padded, table = step.num_tokens, step.num_tokens_padded, self.prefill
            bucket = step.bucket if step.bucket is not None else padded
            cell = self.grid.get((bucket, step.prefix_bucket or 0))
            if cell is None:
                cell = self.grid[(bucket, step.prefix_bucket or 0)] = [0, 0, 0, 0]
            cell[0] += 1
            cell[1] += step.num_tokens
            cell[2] += step.num_tokens_padded
            cell[3] += step.recomputed_tokens
            if step.prefix_bucket is not None:
                self.grid_used = True
        elif kind == "decode":
            actual, padded, table = step.num_seqs, step.num_seqs_padded, self.decode
            if step.attended_len is not None:
                row = self.attention.get(step.attended_len)
                if row is None:
                    row = self.attention[step.attended_len] = [0, 0, 0]
                row[0] += 1
                row[1] += step.context_tokens + step.num_seqs
                row[2] += step.num_seqs_padded * step.attended_len
        else:
            return
        bucket = step.bucket if step.bucket is not None else padded
        row = table.get(bucket)
        if row is None:
            row = table[bucket] = [0, 0, 0]
        row[0] += 1
        row[1] += actual
        row[2] += padded

    # -- results -------------------------------------------------------------------------------
    @property
    def elapsed(self) -> float:
        if self.start is None or self.end is None:
            return 0.0
        return max(self.end - self.start, 0.0)

    def kv_mean(self) -> float:
        total = self.kv_weight.value()
        if total > 0:
            return self.kv_weighted.value() / total
        return self.kv_usage_sum.value() / self.kv_timed_steps if self.kv_timed_steps else 0.0

    def states(self) -> dict[str, dict[str, float | int]]:
        table: dict[str, dict[str, float | int]] = {
            state: {"steps": 0, "seconds": 0.0} for state in _KNOWN_STATES}
        for state in {**self.state_seconds, **self.state_steps}:
            table[state] = {"steps": self.state_steps.get(state, 0),
                            "seconds": self.state_seconds.get(state, 0.0)}
        return table

    # -- several engines or attempts ------------------------------------------------------------
    def merge(self, other: Aggregates) -> Aggregates:
        """These aggregates plus `other`'s (in place; returns self). Time per state and the full
        seconds add up (engine-seconds); the window spans both."""
        self.num_steps += other.num_steps
        for mine, theirs in ((self.kinds, other.kinds), (self.state_steps, other.state_steps)):
            for key, value in theirs.items():
                mine[key] = mine.get(key, 0) + value
        for state, seconds in other.state_seconds.items():
            self.state_seconds[state] = self.state_seconds.get(state, 0.0) + seconds
        for table, their_table in ((self.prefill, other.prefill), (self.decode, other.decode),
                                   (self.attention, other.attention)):
            _add_rows(table, their_table)
        _add_rows(self.grid, other.grid)
        self.grid_used = self.grid_used or other.grid_used
        self.recomputed_tokens += other.recomputed_tokens
        self.preemptions += other.preemptions
        self.sampling_s += other.sampling_s
        self.step_s += other.step_s
        self.kv_peak_reserved = max(self.kv_peak_reserved, other.kv_peak_reserved)
        self.kv_peak_usage = max(self.kv_peak_usage, other.kv_peak_usage)
        for exact, their_exact in ((self.kv_weight, other.kv_weight),
                                   (self.kv_weighted, other.kv_weighted),
                                   (self.kv_usage_sum, other.kv_usage_sum)):
            for part in their_exact.partials:
                exact.add(part)
        self.kv_timed_steps += other.kv_timed_steps
        self.full_s += other.full_s
        self.first_start = _min(self.first_start, other.first_start)
        self.last_end = _max(self.last_end, other.last_end)
        self.start = _min(self.start, other.start)
        self.end = _max(self.end, other.end)
        return self

    # -- checkpoints: the tables as changes, the rest whole ---------------------------------------
    TABLES = ("kinds", "state_steps", "prefill", "decode", "attention", "grid")

    def tables(self) -> dict[str, Any]:
        """The tables (counts that only grow) as `to_dict` writes them."""
        whole = self.to_dict()
        return {name: whole.get(name, [] if name == "grid" else {}) for name in self.TABLES}

    def tables_since(self, before: dict[str, Any]) -> dict[str, Any]:
        """The tables' changes since `before` (a `tables()`): only the rows that moved."""
        now = self.tables()
        out: dict[str, Any] = {}
        for name in self.TABLES:
            if name == "grid":
                old = {(r[0], r[1]): r[2:] for r in before.get(name, [])}
                rows = [[p, q, *[a - b for a, b in zip(row, old.get((p, q), [0] * len(row)))]]
                        for p, q, *row in now[name]]
                out[name] = [r for r in rows if any(r[2:])]
                continue
            old = before.get(name, {})
            changed = {}
            for key, value in now[name].items():
                if isinstance(value, list):
                    delta = [a - b for a, b in zip(value, old.get(key, [0] * len(value)))]
                    if any(delta):
                        changed[key] = delta
                elif value != old.get(key, 0):
                    changed[key] = value - old.get(key, 0)
            out[name] = changed
        return out

    @staticmethod
    def add_tables(total: dict[str, Any], change: dict[str, Any]) -> None:
        """Add a `tables_since` change into `total` (tables as `to_dict` writes them)."""
        for name in Aggregates.TABLES:
            if name == "grid":
                cells = {(r[0], r[1]): list(r[2:]) for r in total.get(name, [])}
                for p, q, *row in change.get(name, []):
                    mine = cells.setdefault((p, q), [0] * len(row))
                    for i, value in enumerate(row):
                        mine[i] += value
                total[name] = [[p, q, *row] for (p, q), row in sorted(cells.items())]
                continue
            table = total.setdefault(name, {})
            for key, value in change.get(name, {}).items():
                if isinstance(value, list):
                    mine = table.setdefault(key, [0] * len(value))
                    for i, item in enumerate(value):
                        mine[i] += item
                else:
                    table[key] = table.get(key, 0) + value

    # -- the summary line ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = {
            "num_steps": self.num_steps, "kinds": dict(self.kinds),
            "prefill": _table_to_dict(self.prefill), "decode": _table_to_dict(self.decode),
            "attention": _table_to_dict(self.attention),
            "grid": [[p, q, *row] for (p, q), row in sorted(self.grid.items())],
            "grid_used": self.grid_used, "recomputed_tokens": self.recomputed_tokens,
            "preemptions": self.preemptions, "sampling_s": self.sampling_s,
            "step_s": self.step_s, "kv_peak_reserved": self.kv_peak_reserved,
            "kv_peak_usage": self.kv_peak_usage, "kv_weight": self.kv_weight.partials,
            "kv_weighted": self.kv_weighted.partials, "kv_usage_sum": self.kv_usage_sum.partials,
            "kv_timed_steps": self.kv_timed_steps, "state_steps": dict(self.state_steps),
            "state_seconds": dict(self.state_seconds), "full_s": self.full_s,
            "first_start": self.first_start, "last_end": self.last_end,
            "start": self.start, "end": self.end,
        }
        if not self.grid_used:  # (the grid repeats the prefill table: only where it differs)
            del out["grid"]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Aggregates:
        return cls(
            num_steps=int(data.get("num_steps", 0)), kinds=dict(data.get("kinds") or {}),
            prefill=_table_from_dict(data.get("prefill")),
            decode=_table_from_dict(data.get("decode")),
            attention=_table_from_dict(data.get("attention")),
            grid={(int(r[0]), int(r[1])): list(r[2:]) for r in data.get("grid") or []},
            grid_used=bool(data.get("grid_used")),
            recomputed_tokens=int(data.get("recomputed_tokens", 0)),
            preemptions=int(data.get("preemptions", 0)),
            sampling_s=float(data.get("sampling_s", 0.0)), step_s=float(data.get("step_s", 0.0)),
            kv_peak_reserved=int(data.get("kv_peak_reserved", 0)),
            kv_peak_usage=float(data.get("kv_peak_usage", 0.0)),
            kv_weight=ExactSum(data.get("kv_weight")),
            kv_weighted=ExactSum(data.get("kv_weighted")),
            kv_usage_sum=ExactSum(data.get("kv_usage_sum")),
            kv_timed_steps=int(data.get("kv_timed_steps", 0)),
            state_steps=dict(data.get("state_steps") or {}),
            state_seconds=dict(data.get("state_seconds") or {}),
            full_s=float(data.get("full_s", 0.0)), first_start=data.get("first_start"),
            last_end=data.get("last_end"), start=data.get("start"), end=data.get("end"))


def _min(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


class StepTiler:
    """Feeds finished steps into `Aggregates` in step order, with the time accounting of
    report/metrics.py `time_per_state` done as they go: each step owns the time from its start
    to the next step's start, the part after its output came back IDLE when no request was in
    the system then. A step's span is known once the next step's start is final, so the tiler
    holds one step back; `close(start, end)` ends the last span at the run's end.

    `empty_at(t)`: whether no request was in the system at t (every one that had arrived had
    finished), asked once per step with a tail after its work, in step order; the recorder
    answers it from counts of arrivals and finishes (`InSystem`), a rebuild from the
    requests' times. `max_num_seqs`: the engine's slots, for the seconds it was full.
    """

    def __init__(self, aggregates: Aggregates, empty_at: Callable[[float], bool],
                 max_num_seqs: int | None = None, start: float | None = None,
                 fold: Callable[[float], None] | None = None):
        self.aggregates = aggregates
        self.empty_at = empty_at
        self.fold = fold
        self.max_num_seqs = max_num_seqs
        self._held: Any = None
        # (`start`, where known before the steps: the first span begins no earlier)
        self._cursor: float | None = None
        self._start = start

    def copy_onto(self, aggregates: Aggregates, in_system: InSystem | None = None
                  ) -> StepTiler:
        """A tiler in this one's place (the step it holds, where its spans reached) feeding
        `aggregates` (a copy of this one's): to close a copy without closing this. Where this
        one asks an `InSystem`, the copy must ask a copy of it (`in_system`): its questions
        fold events up to times this one has not reached yet."""
        empty_at, fold = ((in_system.empty_at, in_system.fold) if in_system is not None
                          else (self.empty_at, self.fold))
        copy = StepTiler(aggregates, empty_at, self.max_num_seqs, self._start, fold)
        copy._held, copy._cursor = self._held, self._cursor
        return copy

    def add(self, step: Any) -> None:
        """The next finished step (its `t_end` None: its output never came back)."""
        agg = self.aggregates
        agg.count(step)
        if agg.first_start is None:
            agg.first_start = step.t_start
        ended = step.t_start if step.t_end is None else step.t_end
        agg.last_end = ended if agg.last_end is None else max(agg.last_end, ended)
        if self._held is not None:
            self._span(self._held, step.t_start, None)
        self._held = step

    def close(self, start: float, end: float) -> None:
        """End the last span at `end` and count the time before the first step as IDLE; the
        window [start, end] must hold every step (the run's own window does)."""
        agg = self.aggregates
        agg.start, agg.end = start, end
        seconds = agg.state_seconds
        if self._held is not None:
            self._span(self._held, None, end)
            self._held = None
        first = agg.first_start
        if first is not None:
            before = min(max(first, start), end) - start
        else:
            before = max(end - start, 0.0)
        seconds[_IDLE] = seconds.get(_IDLE, 0.0) + before

    def _span(self, step: Any, next_start: float | None, end: float | None) -> None:
        agg = self.aggregates
        seconds = agg.state_seconds
        cursor = self._cursor
        if cursor is None:
            cursor = step.t_start if self._start is None else max(step.t_start, self._start)
        if next_start is None:
            assert end is not None  # (close() passes the run's end; add() always a next start)
            span_end = max(end, cursor)
        else:
            span_end = max(next_start, cursor)
        done = step.t_end
        if done is None:
            done = next_start if next_start is not None else step.t_start
        work_end = min(max(done, cursor), span_end)
        state = step.state
        seconds[state] = seconds.get(state, 0.0) + (work_end - cursor)
        if span_end > work_end:
            tail = _IDLE if self.empty_at(done) else state
            seconds[tail] = seconds.get(tail, 0.0) + (span_end - work_end)
        if self.fold is not None:   # (no later step asks before the span's start)
            self.fold(cursor)
        if self.max_num_seqs is not None and (
                step.num_waiting > 0 or step.num_running >= self.max_num_seqs):
            # (a replica's busy_fraction: from the step's start to the next one's)
            begin = step.t_start
            agg.full_s += max(next_start if next_start is not None else end, begin) - begin
        self._cursor = span_end


class InSystem:
    """Whether any request is in the system at a time, from arrivals and finishes counted as
    they happen (times in the order they happen): `empty_at(t)` folds the events up to t into
    two counts, so memory holds only the events not yet asked about."""

    def __init__(self) -> None:
        self.arrivals: deque[float] = deque()
        self.finishes: deque[float] = deque()
        self.arrived = 0
        self.finished = 0

    def copy(self) -> InSystem:
        """An independent copy (the events not yet asked about: those of the work in flight)."""
        other = InSystem()
        other.arrivals, other.finishes = deque(self.arrivals), deque(self.finishes)
        other.arrived, other.finished = self.arrived, self.finished
        return other

    def arrive(self, t: float) -> None:
        self.arrivals.append(t)

    def finish(self, t: float) -> None:
        self.finishes.append(t)

    def empty_at(self, t: float) -> bool:
        self.fold(t)
        return self.arrived - self.finished <= 0

    def fold(self, t: float) -> None:
        """Count the events up to t (StepTiler folds up to each span's start even where no
        step asks, so a run whose steps leave no idle tail still keeps no events)."""
        arrivals, finishes = self.arrivals, self.finishes
        while arrivals and arrivals[0] <= t:
            arrivals.popleft()
            self.arrived += 1
        while finishes and finishes[0] <= t:
            finishes.popleft()
            self.finished += 1


def system_empty_checker(arrivals: Iterable[float], finishes: Iterable[float | None]
                         ) -> Callable[[float], bool]:
    """A function t -> True when every request that had arrived by t had finished by t, from
    every request's arrival and finish (None: never finished, it stays in the system for
    good): what `StepTiler` asks where the requests are known up front (records read back).

    The answer only changes at an arrival or a finish, and successive queries (step ends)
    mostly fall between the same two events, so the last interval's answer is cached; a miss
    costs two bisections.
    """
    pairs = list(zip(arrivals, finishes))
    arrived_at = sorted(a for a, _ in pairs)
    # A finish stamped before its arrival (clock skew) would unbalance the counts: clamp it.
    finished_at = sorted(max(f, a) for a, f in pairs if f is not None)
    cached: list[float] = [math.inf, -math.inf, False]  # [low, high, answer] for low <= t < high

    def system_empty_at(t: float) -> bool:
        if cached[0] <= t < cached[1]:
            return cast(bool, cached[2])  # (the answer slot only ever holds a bool)
        arrived, finished = bisect_right(arrived_at, t), bisect_right(finished_at, t)
        low = max(arrived_at[arrived - 1] if arrived else -math.inf,
                  finished_at[finished - 1] if finished else -math.inf)
        high = min(arrived_at[arrived] if arrived < len(arrived_at) else math.inf,
                   finished_at[finished] if finished < len(finished_at) else math.inf)
        cached[:] = low, high, arrived - finished <= 0
        return cast(bool, cached[2])

    return system_empty_at
