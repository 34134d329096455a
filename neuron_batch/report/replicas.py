"""The report of a run folder holding `--replicas` attempts: every replica's records summed into
one report, plus a `replicas` section. Pure Python (no Ray, no vLLM).

How the figures combine over N engines:
- padding, steps and admission refusals: summed over every step of every replica;
- latency: over every request (each measured on its own replica's clock);
- `states`: seconds per scheduler state summed over the replicas (replica-seconds: with N
  replicas they add up to the sum of the replicas' `elapsed_s`, not to the run's);
- throughput over the run's elapsed time: on the simulated device the longest replica's
  simulated time (every replica has its own virtual clock and they run side by side); elsewhere
  the wall time from the first replica ready to the last output (`generation_s`, measured by the
  driver). Attempts (a resumed run) add up, but for a split run's parts side by side, which
  count as the longer of the two.
- `replicas`: per replica `replica`, `node` (Ray node id), `device`, `requests`,
  `output_tokens`, `elapsed_s`, `output_tokens_per_s`, `busy_fraction`, `restarts`.

`busy_fraction` is the share of a replica's time in steps where its engine was full: a request
was waiting for admission, or max_num_seqs requests were running (each step owning the time to
the next one's start; counted as the steps go by: scheduler/aggregates.py `full_s`). The rest
is time its engine ran below capacity for want of requests: between batches if it were
drained, and the unavoidable tail at the end of the run.

Every figure comes from each replica's running aggregates (its records' summary line), merged;
no step is read again. Scheduler records of a request are kept once, for requests in
outputs.jsonl: a request that ran twice (a replica restarted, a driver killed between writing
its output and its records) counts once. Its records are added up block by block as they are
read (report/run_records.py `load(streamed=True)`), no column held; the done requests are
known by 64-bit hashes of their ids (`DoneIds`: 9 bytes a request, not a set of strings), so
two ids would have to hash alike (odds ~n^2 / 2^65: 3e-6 at 10M requests) to be counted as one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from neuron_batch.report.metrics import summarize_run
from neuron_batch.report.run_records import RequestColumns, RunRecords, concat, load, merge


class DoneIds:
    """The done requests' ids (`ids`), as sorted 64-bit hashes, each counted once a pass
    (`firsts`; `again` starts a pass)."""

    def __init__(self, ids: Iterable[str]):
        self._hashes: np.ndarray = np.unique(np.fromiter((hash(i) for i in ids),
                                                         dtype=np.int64))
        self._seen: np.ndarray = np.zeros(len(self._hashes), dtype=bool)

    def again(self) -> None:
        self._seen[:] = False

    def firsts(self, requests: RequestColumns) -> list[int]:
        """The rows of `requests` that count: not aborted, done, and not seen before in this
        pass (each then seen)."""
        hashes = np.fromiter(map(hash, requests.req_id), dtype=np.int64,
                             count=len(requests.req_id))
        at = np.asarray(np.searchsorted(self._hashes, hashes))
        inside = at < len(self._hashes)
        done: np.ndarray = np.zeros(len(hashes), dtype=bool)
        done[inside] = self._hashes[at[inside]] == hashes[inside]
        keep: list[int] = []
        seen, slots = self._seen, at.tolist()
        for row in np.flatnonzero(done).tolist():
            if requests.finish_reason[row] != "abort" and not seen[slots[row]]:
                seen[slots[row]] = True
                keep.append(row)
        return keep


@dataclass
class _Unit:
    """One engine's records over one attempt: a single engine, or one replica (its restarts
    joined)."""

    records: RunRecords
    replica: int | None = None
    meta: list[dict[str, Any]] = field(default_factory=list)

    @property
    def elapsed(self) -> float:
        return self.records.aggregates.elapsed


def has_replicas(layout: dict[int, Any]) -> bool:
    return any(isinstance(entry, dict) for entry in layout.values())


def summarize_replicas(layout: dict[int, Path | dict[int, list[Path]]], *,
                       attempts: list[dict[str, Any]], done_ids: Iterable[str] | DoneIds,
                       simulated: bool,
                       extra_config: dict[str, Any], total: int, skipped: int) -> dict[str, Any]:
    """The report dict (as `metrics.summarize_run` makes it) over every attempt's records: the
    units' aggregates merged (time per state in replica-seconds), their requests joined."""
    per_attempt = _attempt_units(layout, attempts, done_ids, simulated)
    units = [unit for _, attempt_units, _ in per_attempt for unit in attempt_units]
    elapsed = run_elapsed([(attempt, seconds) for attempt, _, seconds in per_attempt],
                          _groups(per_attempt, attempts))
    merged = merge([u.records for u in units])
    report = summarize_run(merged, elapsed_s=elapsed, extra_config=extra_config, total=total,
                           skipped=skipped, failed=0)
    max_num_seqs = (merged.config.max_num_seqs if merged.config is not None
                    else extra_config.get("max_num_seqs", 0))
    report["replicas"] = replica_rows(units, max_num_seqs)
    return report


def _groups(per_attempt: list[tuple[int, list[_Unit], float]],
            attempts: list[dict[str, Any]]) -> dict[int, int | None]:
    """Per attempt, the `side_by_side` group it ran in (None: on its own): from attempts.json,
    else from its records' replica lines (an attempt a killed driver never wrote a line for)."""
    # (attempts.json's lines as JSON: each holds its attempt's number and group, ints or null)
    group = cast(dict[int, int | None],
                 {a.get("attempt"): a.get("side_by_side") for a in attempts})
    for attempt, units, _ in per_attempt:
        if group.get(attempt) is None:
            group[attempt] = next((m["side_by_side"] for u in units for m in u.meta
                                   if m.get("side_by_side") is not None), None)
    return group


def run_elapsed(elapsed: list[tuple[int, float]], group: dict[int, int | None]) -> float:
    """The run's elapsed time from its attempts': attempts run one after the other add up;
    those that ran at the same time (a --split-at run's parts side by side: the same
    `side_by_side` group) count as the longest of them."""
    together: dict[int, float] = {}
    total = 0.0
    for attempt, seconds in elapsed:
        key = group.get(attempt)
        if key is None:
            total += seconds
        else:
            together[key] = max(together.get(key, 0.0), seconds)
    return total + sum(together.values())


def attempt_figures(layout: dict[int, Path | dict[int, list[Path]]], *,
                    attempts: list[dict[str, Any]], done_ids: Iterable[str] | DoneIds,
                    simulated: bool) -> dict[int, dict[str, Any]]:
    """Per attempt, its share of `summarize_replicas`'s figures (a --split-at part's): its
    `elapsed_s` as the run's elapsed time counts it (so the attempts' add up to the run's),
    `output_tokens` of its requests kept, and on replicas per replica its `requests`,
    `output_tokens` and `elapsed_s`."""
    figures = {}
    for attempt, units, elapsed in _attempt_units(layout, attempts, done_ids, simulated):
        done = [_done(u.records) for u in units]
        figures[attempt] = {
            "elapsed_s": elapsed,
            "output_tokens": sum(tokens for _, tokens in done),
            "replicas": [{"replica": u.replica, "requests": count, "output_tokens": tokens,
                          "elapsed_s": u.elapsed}
                         for u, (count, tokens) in zip(units, done) if u.replica is not None]}
    return figures


def _done(records: RunRecords) -> tuple[int, int]:
    """(finished requests, their output tokens)."""
    figures = records.request_figures()
    return figures.completed, figures.output_tokens


def _attempt_units(layout: dict[int, Path | dict[int, list[Path]]], attempts: list[dict[str, Any]],
                   done_ids: Iterable[str] | DoneIds, simulated: bool
                   ) -> list[tuple[int, list[_Unit], float]]:
    """(attempt, its units, its elapsed time) in attempt order: a request's records kept once
    over the whole run (in the first attempt that finished it); elapsed as the module text says
    (on the simulated device, or a single engine, the longest unit's; else `generation_s`)."""
    wall = {a.get("attempt"): a.get("generation_s") for a in attempts}
    out = []
    done = done_ids if isinstance(done_ids, DoneIds) else DoneIds(done_ids)
    done.again()
    for attempt, entry in layout.items():
        attempt_units = []
        if isinstance(entry, dict):
            for replica, paths in sorted(entry.items()):
                records = concat([load(p, streamed=True, keep=done.firsts) for p in paths])
                attempt_units.append(_Unit(records, replica, records.meta))
        else:
            attempt_units.append(_Unit(load(entry, streamed=True, keep=done.firsts)))
        longest = max((u.elapsed for u in attempt_units), default=0.0)
        measured = wall.get(attempt)
        elapsed = longest if simulated or not isinstance(entry, dict) or measured is None \
            else float(measured)
        out.append((attempt, attempt_units, elapsed))
    return out


def replica_rows(units: list[_Unit], max_num_seqs: int) -> list[dict[str, Any]]:
    """The `replicas` section: per replica number, its units over every attempt joined."""
    by_replica: dict[int, list[_Unit]] = {}
    for unit in units:
        if unit.replica is not None:
            by_replica.setdefault(unit.replica, []).append(unit)
    rows = []
    for replica, parts in sorted(by_replica.items()):
        elapsed = sum(p.elapsed for p in parts)
        count = output_tokens = 0
        for part in parts:
            done, tokens = _done(part.records)
            count, output_tokens = count + done, output_tokens + tokens
        meta = [m for p in parts for m in p.meta]
        # (the replica lines' node and device: strings, the missing and empty left out)
        nodes = cast(list[str], list(dict.fromkeys(m.get("node") for m in meta if m.get("node"))))
        devices = cast(list[str],
                       list(dict.fromkeys(m.get("device") for m in meta if m.get("device"))))
        full = sum(p.records.aggregates.full_s for p in parts)
        rows.append({
            "replica": replica,
            "node": ",".join(nodes) or None,
            "device": ",".join(devices) or None,
            "requests": count,
            "output_tokens": output_tokens,
            "elapsed_s": elapsed,
            "output_tokens_per_s": output_tokens / elapsed if elapsed > 0 else 0.0,
            "busy_fraction": min(full / elapsed, 1.0) if elapsed > 0 else 0.0,
            "restarts": sum(1 for m in meta if m.get("restart")),
        })
    return rows
