"""A run's records as the report reads them (`RunRecords`): the scheduler's settings, the
steps' aggregates, the admission counts and the finished requests as columns. Pure Python.

The aggregates come from the records' summary line (scheduler/aggregates.py), or on a
replica's records, which never get one, from its checkpoints, so the steps are not read again:
a records file's step blocks are skipped unparsed. A file without them (records written before
issue 46, or an attempt killed before it closed its file) gets them by one pass over its
steps, as the report was built before. A single engine's requests are added up block by
block as they are read (`load(streamed=True)`, report/request_figures.py: sums, and latency
percentiles exact to 131,072 requests, within 0.5% past them), so its report holds nothing a
request; so are a replica's, those its `keep` counts (report/replicas.py: each request once,
matched to outputs by the hashes of their ids).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from neuron_batch.report.request_figures import RequestFigures
from neuron_batch.scheduler.aggregates import Aggregates, StepTiler, system_empty_checker
from neuron_batch.scheduler.record_blocks import REQUEST_COLUMNS, decode
from neuron_batch.scheduler.records import (
    NOT_COMPLETED,
    RequestRecord,
    RunConfig,
    StepRecord,
    blocked_from_steps,
    iter_records,
)

_NAN = float("nan")
_FLOATS = ("arrival", "admitted", "first_token", "finished")
_INTS = ("num_prompt_tokens", "num_output_tokens", "num_cached_tokens", "constrained",
         "logprobs")
_TEXTS = ("req_id", "finish_reason", "sample_of")


@dataclass
class RequestColumns:
    """Finished requests by column: floats (NaN: None) and integers in numpy arrays, strings
    in lists (None: absent). Built with `add`/`add_block`, then `done()`."""

    req_id: list[str] = field(default_factory=list)
    finish_reason: list[str | None] = field(default_factory=list)
    sample_of: list[str | None] = field(default_factory=list)
    arrival: np.ndarray = field(default_factory=lambda: np.zeros(0))
    admitted: np.ndarray = field(default_factory=lambda: np.zeros(0))
    first_token: np.ndarray = field(default_factory=lambda: np.zeros(0))
    finished: np.ndarray = field(default_factory=lambda: np.zeros(0))
    num_prompt_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    num_output_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    num_cached_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    constrained: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    logprobs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # False: `req_id` stays empty. Only the replicas' report matches records to outputs by id;
    # a single engine's report reads none, and a million ids are ~70 MB it need not hold.
    with_ids: bool = True
    _chunks: dict[str, list[Any]] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.finish_reason)

    def add(self, record: RequestRecord) -> None:
        for name in _FLOATS:
            value = getattr(record, name)
            self._chunks.setdefault(name, []).append([_NAN if value is None else value])
        for name in _INTS:
            self._chunks.setdefault(name, []).append([int(getattr(record, name))])
        for name in _TEXTS:
            if name != "req_id" or self.with_ids:
                getattr(self, name).append(getattr(record, name))

    def add_block(self, line: dict[str, Any]) -> None:
        decoded = decode(line, REQUEST_COLUMNS)
        n = int(line["n"])
        for name in _FLOATS:
            self._chunks.setdefault(name, []).append(decoded.get(name, np.full(n, _NAN)))
        for name in _INTS:
            self._chunks.setdefault(name, []).append(decoded.get(name, np.zeros(n, np.int64)))
        if self.with_ids:
            self.req_id.extend(decoded.get("req_id", [""] * n))
        for name in ("finish_reason", "sample_of"):
            getattr(self, name).extend(v or None for v in decoded.get(name, [""] * n))

    def done(self) -> RequestColumns:
        """Join the chunks added into the columns (returns self)."""
        for name, chunks in self._chunks.items():
            dtype = np.float64 if name in _FLOATS else np.int64
            joined = [np.asarray(c, dtype=dtype) for c in chunks]
            setattr(self, name, np.concatenate([getattr(self, name), *joined]))
        self._chunks = {}
        return self

    def take(self, keep: Iterable[int] | np.ndarray) -> RequestColumns:
        """The rows at the indices `keep`, in that order."""
        at = np.asarray(list(keep) if not isinstance(keep, np.ndarray) else keep, dtype=np.int64)
        out = RequestColumns(with_ids=self.with_ids)
        for name in (*_FLOATS, *_INTS):
            setattr(out, name, getattr(self, name)[at])
        picked = at.tolist()
        for name in _TEXTS:
            column = getattr(self, name)
            setattr(out, name, [column[i] for i in picked] if column else [])
        return out

    def completed(self) -> RequestColumns:
        """The requests that are completed work (not aborted, not failed): these columns
        themselves where every request is."""
        bad = [i for i, reason in enumerate(self.finish_reason) if reason in NOT_COMPLETED]
        ok = ~np.isnan(self.finished)
        if bad:
            ok[bad] = False
        return self if ok.all() else self.take(np.flatnonzero(ok))

    def extend(self, other: RequestColumns) -> None:
        for name in (*_FLOATS, *_INTS):
            setattr(self, name, np.concatenate([getattr(self, name), getattr(other, name)]))
        self.with_ids = self.with_ids and other.with_ids
        for name in _TEXTS:
            getattr(self, name).extend(getattr(other, name))
        if not self.with_ids:
            self.req_id.clear()


@dataclass
class RunRecords:
    """One records file (one engine over one attempt), or several merged."""

    config: RunConfig | None
    aggregates: Aggregates
    blocked: dict[str, int]
    requests: RequestColumns
    meta: list[dict[str, Any]] = field(default_factory=list)   # the driver's replica lines
    # the requests added up as they were read (`load(streamed=True)`: `requests` stays empty)
    figures: RequestFigures | None = None

    @property
    def empty(self) -> bool:
        return (not self.aggregates.num_steps and not len(self.requests)
                and not (self.figures is not None and self.figures.rows))

    def request_figures(self) -> RequestFigures:
        """The figures the report takes of the requests: those added up as they were read,
        and those of the columns held."""
        if self.figures is None:
            return RequestFigures.of(self.requests)
        if not len(self.requests):
            return self.figures
        both = RequestFigures()
        both.merge(self.figures)
        both.add(self.requests)
        return both


def load(path: str | Path, *, ids: bool = True, streamed: bool = False,
         keep: Callable[[RequestColumns], Sequence[int]] | None = None) -> RunRecords:
    """A records file as the report reads it (see the module text): its summary's aggregates,
    else those of its last checkpoint where that holds every step in the file (a replica's
    records: scheduler/records.py `Recorder.flush`), else one pass over its steps. `ids`:
    the requests' ids read too (RequestColumns.with_ids). `streamed`: the completed requests
    added up block by block into `figures` (report/request_figures.py), no column held: what a
    single engine's report needs, in memory that does not grow with the run. `keep` (with
    `streamed`): the rows of a block (its ids read) that count, in place of the completed
    ones (a replica's: report/replicas.py, each request once)."""
    path = Path(path)
    config, final, steps_in_file, meta = None, None, 0, []
    tables: dict[str, Any] = {}     # the checkpoints' table changes, added up
    requests = RequestColumns(with_ids=ids and not streamed)
    figures = RequestFigures() if streamed else None
    blocks = False      # (a requests block read: its rows added up, `keep` asked of them)
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if line.startswith('{"type":"steps"'):
                # (the aggregates hold what the report needs of them: only their count read)
                count = _BLOCK_COUNT.match(line)
                if count is None:
                    break   # a torn last line from a killed process, cut before its count
                steps_in_file += int(count.group(1))
                continue
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                break       # a torn last line from a killed process
            kind = obj.pop("type", None)
            if kind == "requests":
                blocks = True
                if figures is not None:
                    block = RequestColumns(with_ids=keep is not None)
                    block.add_block(obj)
                    block.done()
                    figures.add(block.completed() if keep is None else block.take(keep(block)))
                else:
                    requests.add_block(obj)
            elif kind == "config":
                config = RunConfig(**{k: v for k, v in obj.items()
                                      if k in RunConfig.__dataclass_fields__})
            elif kind == "summary" and "aggregates" in obj:
                final = obj
                final["type"] = kind
            elif kind == "checkpoint":
                Aggregates.add_tables(tables, obj.get("tables") or {})
                final = obj
                final["type"] = kind
            elif kind == "replica":
                meta.append(obj)
            elif kind == "step":
                steps_in_file += 1
    if final is not None:
        whole = final["aggregates"]
        aggregates = Aggregates.from_dict(whole if final["type"] == "summary"
                                          else {**whole, **tables})
        if final["type"] == "summary" or aggregates.num_steps == steps_in_file:
            return RunRecords(config, aggregates, dict(final.get("admission_blocked") or {}),
                              requests.done(), meta, figures)
    # (no summary, or a checkpoint short of the file's steps: the steps read again)
    counted = keep is not None and blocks
    rebuilt = _rebuild(path, (ids and not streamed) or (keep is not None and not counted))
    if streamed:
        if counted:     # (its requests' blocks added up already: `keep` marks what it took)
            rebuilt.figures = figures
        else:           # (an old file, a request a line: its columns read whole, once)
            whole = rebuilt.requests
            rebuilt.figures = RequestFigures.of(whole.completed() if keep is None
                                                else whole.take(keep(whole)))
        rebuilt.requests = RequestColumns(with_ids=False)
    return rebuilt


_BLOCK_COUNT = re.compile(r'\{"type":"steps","n":(\d+),')


def _rebuild(path: Path, ids: bool = True) -> RunRecords:
    """One pass over a file's steps: records before issue 46, or a file cut short."""
    config, steps, meta, blocked = None, [], [], None
    requests = RequestColumns(with_ids=ids)
    for kind, record in iter_records(path):
        if kind == "step":
            steps.append(record)
        elif kind == "request":
            requests.add(record)
        elif kind == "config":
            config = record
        elif kind == "summary":
            blocked = record.get("admission_blocked")
        elif kind == "replica":
            meta.append(record)
    steps.sort(key=lambda s: s.step)
    requests.done()
    kept = requests.completed()
    return RunRecords(config, aggregates_of(steps, kept, config),
                      blocked if blocked is not None else blocked_from_steps(steps), requests,
                      meta)


def aggregates_of(steps: list[StepRecord], requests: RequestColumns, config: RunConfig | None,
                  start: float | None = None) -> Aggregates:
    """The aggregates of steps in memory (in step order) with the requests that count; the
    window as report/metrics.py counts it (from `start`, default the first arrival)."""
    aggregates = Aggregates()
    arrivals = requests.arrival.tolist()
    finishes = [None if f != f else f for f in requests.finished.tolist()]
    if start is None:
        start = min(arrivals) if arrivals else min((s.t_start for s in steps), default=0.0)
    tiler = StepTiler(aggregates, system_empty_checker(arrivals, finishes),
                      config.max_num_seqs if config is not None else None, start=start)
    for step in steps:
        tiler.add(step)
    ends = [s.t_start if s.t_end is None else s.t_end for s in steps]
    end = max(start, max(ends, default=start), max((f for f in finishes if f is not None),
                                                   default=start))
    tiler.close(float(start), float(end))
    return aggregates


def concat(parts: list[RunRecords]) -> RunRecords:
    """Successive attempts of one engine (a run resumed, a replica restarted) as one: the
    aggregates add up (time per state, steps, padding), the requests join, and the window is
    their elapsed times end to end (the pause between attempts does not count)."""
    meta = [m for p in parts for m in p.meta]     # (a restart's line, its file empty or not)
    parts = [p for p in parts if not p.empty] or parts[:1]
    if len(parts) == 1:
        parts[0].meta = meta
        return parts[0]
    merged = merge(parts, config_from_last=True)
    merged.aggregates.start = 0.0
    merged.aggregates.end = sum(p.aggregates.elapsed for p in parts)
    merged.meta = meta
    return merged


def merge(parts: list[RunRecords], *, config_from_last: bool = False) -> RunRecords:
    """`parts` as one: aggregates merged, requests joined, admission blocks added; the config
    of the first part that has one (the last, for successive attempts: the latest settings)."""
    aggregates, requests = Aggregates(), RequestColumns()
    blocked: dict[str, int] = {}
    figures = RequestFigures() if any(p.figures is not None for p in parts) else None
    for part in parts:
        aggregates.merge(part.aggregates)
        if figures is not None:     # (added up as they were read: no columns to join)
            figures.merge(part.request_figures())
        else:
            requests.extend(part.requests)
        for reason, count in part.blocked.items():
            blocked[reason] = blocked.get(reason, 0) + count
    ordered = reversed(parts) if config_from_last else iter(parts)
    config = next((p.config for p in ordered if p.config is not None), None)
    return RunRecords(config, aggregates, blocked, requests, figures=figures)
