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
was waiting for admission, or max_num_seqs requests were running. The rest is time its engine
ran below capacity for want of requests: between batches if it were drained, and the unavoidable
tail at the end of the run.

Scheduler records of a request are kept once, for requests in outputs.jsonl: a request that ran
twice (a replica restarted, a driver killed between writing its output and its records) counts
once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_batch.report.metrics import summarize, time_per_state
from neuron_batch.scheduler.records import (
    BLOCK_REASONS,
    Records,
    RequestRecord,
    SchedulerState,
    StepRecord,
    concat_attempts,
    read_records,
)


@dataclass
class _Unit:
    """One engine's records over one attempt: a single engine, or one replica (its restarts
    joined)."""

    records: Records
    replica: int | None = None
    meta: list[dict[str, Any]] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0

    @property
    def elapsed(self) -> float:
        return max(self.end - self.start, 0.0)


def has_replicas(layout: dict[int, Any]) -> bool:
    return any(isinstance(entry, dict) for entry in layout.values())


def summarize_replicas(layout: dict[int, Path | dict[int, list[Path]]], *,
                       attempts: list[dict[str, Any]], done_ids: set[str], simulated: bool,
                       extra_config: dict[str, Any], total: int, skipped: int) -> dict[str, Any]:
    """The report dict (as `metrics.summarize` makes it) over every attempt's records."""
    per_attempt = _attempt_units(layout, attempts, done_ids, simulated)
    units = [unit for _, attempt_units, _ in per_attempt for unit in attempt_units]
    elapsed = run_elapsed([(attempt, seconds) for attempt, _, seconds in per_attempt],
                          _groups(per_attempt, attempts))

    merged = Records(next((u.records.config for u in units if u.records.config), None),
                     [s for u in units for s in u.records.steps],
                     [r for u in units for r in u.records.requests],
                     _sum_blocked(u.records.blocked_counts for u in units))
    report = summarize(merged, elapsed_s=elapsed, extra_config=extra_config, total=total,
                       skipped=skipped, failed=0)
    report["states"] = _sum_states(units)
    max_num_seqs = (merged.config.max_num_seqs if merged.config is not None
                    else extra_config.get("max_num_seqs", 0))
    report["replicas"] = replica_rows(units, max_num_seqs)
    return report


def _groups(per_attempt, attempts: list[dict[str, Any]]) -> dict[int, int | None]:
    """Per attempt, the `side_by_side` group it ran in (None: on its own): from attempts.json,
    else from its records' replica lines (an attempt a killed driver never wrote a line for)."""
    group = {a.get("attempt"): a.get("side_by_side") for a in attempts}
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
                    attempts: list[dict[str, Any]], done_ids: set[str], simulated: bool
                    ) -> dict[int, dict[str, Any]]:
    """Per attempt, its share of `summarize_replicas`'s figures (a --split-at part's): its
    `elapsed_s` as the run's elapsed time counts it (so the attempts' add up to the run's),
    `output_tokens` of its requests kept, and on replicas per replica its `requests`,
    `output_tokens` and `elapsed_s`."""
    figures = {}
    for attempt, units, elapsed in _attempt_units(layout, attempts, done_ids, simulated):
        done = [[r for r in u.records.requests if r.finished is not None] for u in units]
        figures[attempt] = {
            "elapsed_s": elapsed,
            "output_tokens": sum(r.num_output_tokens for rows in done for r in rows),
            "replicas": [{"replica": u.replica, "requests": len(rows),
                          "output_tokens": sum(r.num_output_tokens for r in rows),
                          "elapsed_s": u.elapsed}
                         for u, rows in zip(units, done) if u.replica is not None]}
    return figures


def _attempt_units(layout: dict[int, Path | dict[int, list[Path]]], attempts: list[dict[str, Any]],
                   done_ids: set[str], simulated: bool) -> list[tuple[int, list[_Unit], float]]:
    """(attempt, its units, its elapsed time) in attempt order: a request's records kept once
    over the whole run (in the first attempt that finished it); elapsed as the module text says
    (on the simulated device, or a single engine, the longest unit's; else `generation_s`)."""
    wall = {a.get("attempt"): a.get("generation_s") for a in attempts}
    out = []
    seen: set[str] = set()
    for attempt, entry in layout.items():
        attempt_units = []
        if isinstance(entry, dict):
            for replica, paths in sorted(entry.items()):
                parts = [read_records(p) for p in paths]
                parts = [p for p in parts if p.steps or p.requests] or parts[:1]
                attempt_units.append(_Unit(concat_attempts(parts), replica,
                                           [m for p in paths for m in _meta_lines(p)]))
        else:
            attempt_units.append(_Unit(read_records(entry)))
        for unit in attempt_units:
            unit.records.requests = _once(unit.records.requests, done_ids, seen)
            unit.start, unit.end = _window(unit.records.steps, unit.records.requests)
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
        records = concat_attempts([p.records for p in parts])
        start, end = _window(records.steps, records.requests)
        elapsed = max(end - start, 0.0)
        done = [r for r in records.requests if r.finished is not None]
        output_tokens = sum(r.num_output_tokens for r in done)
        meta = [m for p in parts for m in p.meta]
        nodes = list(dict.fromkeys(m.get("node") for m in meta if m.get("node")))
        devices = list(dict.fromkeys(m.get("device") for m in meta if m.get("device")))
        rows.append({
            "replica": replica,
            "node": ",".join(nodes) or None,
            "device": ",".join(devices) or None,
            "requests": len(done),
            "output_tokens": output_tokens,
            "elapsed_s": elapsed,
            "output_tokens_per_s": output_tokens / elapsed if elapsed > 0 else 0.0,
            "busy_fraction": _busy(parts, records, start, end, max_num_seqs),
            "restarts": sum(1 for m in meta if m.get("restart")),
        })
    return rows


def _busy(parts: list[_Unit], records: Records, start: float, end: float,
          max_num_seqs: int) -> float:
    """A replica's `busy_fraction` over its attempts; a --split-at run's parts have layouts of
    their own max_num_seqs, so there each part's share is weighted by its time."""
    def slots(unit: _Unit) -> int:
        return unit.records.config.max_num_seqs if unit.records.config else max_num_seqs

    if len({slots(unit) for unit in parts}) <= 1:
        return busy_fraction(records.steps, start, end, slots(parts[0]))
    total = sum(unit.elapsed for unit in parts)
    full = sum(busy_fraction(unit.records.steps, unit.start, unit.end, slots(unit))
               * unit.elapsed for unit in parts)
    return full / total if total > 0 else 0.0


def busy_fraction(steps: list[StepRecord], start: float, end: float, max_num_seqs: int) -> float:
    """Share of [start, end] in steps where the engine was full (see the module text). Each
    step owns the time until the next one starts, as in `metrics.time_per_state`."""
    if end <= start or not steps:
        return 0.0
    full = 0.0
    ordered = sorted(steps, key=lambda s: s.t_start)
    for step, following in zip(ordered, ordered[1:] + [None]):
        if not (step.num_waiting > 0 or step.num_running >= max_num_seqs):
            continue
        begin = min(max(step.t_start, start), end)
        stop = end if following is None else min(max(following.t_start, begin), end)
        full += stop - begin
    return min(full / (end - start), 1.0)


def _window(steps: list[StepRecord], requests: list[RequestRecord]) -> tuple[float, float]:
    """(start, end) as `metrics.summarize` counts a run: first arrival (or step) to the last
    step end or finish."""
    times = [r.arrival for r in requests] or [s.t_start for s in steps]
    if not times:
        return 0.0, 0.0
    start = min(times)
    ends = [s.t_start if s.t_end is None else s.t_end for s in steps]
    ends += [r.finished for r in requests if r.finished is not None]
    return start, max([start, *ends])


def _once(requests: list[RequestRecord], done_ids: set[str], seen: set[str]
          ) -> list[RequestRecord]:
    kept = []
    for request in requests:
        if (request.finish_reason == "abort" or request.req_id not in done_ids
                or request.req_id in seen):
            continue
        seen.add(request.req_id)
        kept.append(request)
    return kept


def _sum_blocked(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total = dict.fromkeys(BLOCK_REASONS, 0)
    for one in counts:
        for reason, count in one.items():
            total[reason] = total.get(reason, 0) + count
    return total


def _sum_states(units: list[_Unit]) -> dict[str, dict[str, float | int]]:
    table: dict[str, dict[str, float | int]] = {
        state.value: {"steps": 0, "seconds": 0.0} for state in SchedulerState}
    for unit in units:
        states = time_per_state(unit.records.steps, unit.records.requests, unit.start, unit.end)
        for state, figures in states.items():
            row = table.setdefault(state, {"steps": 0, "seconds": 0.0})
            row["steps"] += figures["steps"]
            row["seconds"] += figures["seconds"]
    return table


def _meta_lines(path: Path) -> list[dict[str, Any]]:
    """The driver's `{"type": "replica", ...}` line(s) at the top of a replica's records file."""
    found = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if '"type": "replica"' not in line and '"type":"replica"' not in line:
                break
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return found
