"""A sweep's machine-readable files: `sweep.csv` (hyperfine-style `param_<name>` columns) and
`sweep.json`. Pure Python.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from neuron_batch.bench.ranking import (
    COST_COMPILE_S,
    COST_USD,
    COST_USD_WITH_COMPILE,
    STATES,
    configured_buckets,
    rank,
)
from neuron_batch.scheduler.records import BLOCK_REASONS

#: The cost columns of a sweep CSV (empty where the instance has no price).
COST_COLUMNS = (COST_USD, COST_USD_WITH_COMPILE, "usd_per_million_output_tokens")
#: The KV admission figures of a row, as CSV columns.
KV_COLUMNS = ("kv_reserve", "preemptions", "kv_peak_reserved_fraction", "kv_peak_used_fraction",
              "kv_mean_used_fraction")

# -- files ------------------------------------------------------------------------------------

def param_names(entries: Iterable[Mapping[str, Any]]) -> list[str]:
    """Swept setting names, in order of first appearance."""
    names: dict[str, None] = {}
    for entry in entries:
        for name in entry.get("params") or {}:
            names.setdefault(str(name), None)
    return list(names)


def csv_rows(entries: Sequence[Mapping[str, Any]], by: str = "throughput"
             ) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, rows) of the sweep CSV: one row per configuration, done or failed; `rank` as
    `rank(entries, by)` numbers them."""
    entries = list(entries)
    ranked = {row["name"]: row for row in rank(entries, by)}
    params = param_names(entries)
    reasons = list(BLOCK_REASONS)
    for row in ranked.values():
        reasons += [r for r in row["admission_blocked"] if r not in reasons]
    columns = (["name", "rank"] + [f"param_{name}" for name in params]
               + ["output_tokens_per_s", "total_tokens_per_s", "throughput_per_graph",
                  "elapsed_s", "prefill_waste", "decode_waste", "attention_waste"]
               + [f"seconds_{state}" for state in STATES]
               + [f"share_{state}" for state in STATES]
               + [f"blocked_{reason}" for reason in reasons]
               + ["ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s"]
               + list(KV_COLUMNS)
               + ["prefill_buckets", "decode_buckets", "attention_buckets", "compiled_graphs",
                  COST_COMPILE_S, *COST_COLUMNS, "command", "status", "error"])
    out = []
    for entry in entries:
        entry_params = entry.get("params") or {}
        record: dict[str, Any] = dict.fromkeys(columns, "")
        record["name"] = entry.get("name")
        record["status"] = entry.get("status")
        record["error"] = entry.get("error") or ""
        record["command"] = entry.get("command") or ""
        for name in params:
            record[f"param_{name}"] = _csv_value(entry_params.get(name))
        done = ranked.get(str(entry.get("name"))) if entry.get("status") == "done" else None
        if done is not None:
            row = done
            record.update({key: _csv_value(row.get(key)) for key in (
                "rank", "output_tokens_per_s", "total_tokens_per_s", "throughput_per_graph",
                "elapsed_s", "prefill_waste", "decode_waste", "attention_waste", "ttft_p50_s",
                "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", *KV_COLUMNS, "prefill_buckets",
                "decode_buckets", "attention_buckets", "compiled_graphs", COST_COMPILE_S,
                *COST_COLUMNS)})
            for state in STATES:
                record[f"seconds_{state}"] = _csv_value(row["state_seconds"].get(state))
                record[f"share_{state}"] = _csv_value(row["state_shares"].get(state))
            for reason in reasons:
                record[f"blocked_{reason}"] = row["admission_blocked"].get(reason, 0)
        else:   # what the settings alone say: the graphs it would have compiled
            try:
                prefill = configured_buckets(None, entry_params.get("prefill_buckets"))
                decode = configured_buckets(None, entry_params.get("decode_buckets"))
            except (TypeError, ValueError):
                prefill = decode = []
            if prefill or decode:
                record["prefill_buckets"] = _csv_value(prefill)
                record["decode_buckets"] = _csv_value(decode)
                record["compiled_graphs"] = len(prefill) + len(decode)
        out.append(record)
    return columns, out


def write_csv(entries: Sequence[Mapping[str, Any]], path: str | os.PathLike[str],
              by: str = "throughput") -> Path:
    """The sweep as CSV: one row per configuration (failed ones too), `param_<name>` columns
    for the swept settings, then the flattened metrics, status and error."""
    columns, records = csv_rows(entries, by)
    path = Path(path)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(records)
    return path


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, Mapping):
        return ";".join(f"{k}={v}" for k, v in value.items())
    return value


def sweep_json(entries: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]],
               recommendation: Mapping[str, Any], meta: Mapping[str, Any] | None) -> dict:
    """The sweep as one JSON-ready dict: {"meta", "configurations" (the entries, each with its
    full report), "ranking" (the rows), "recommendation"}."""
    return {"meta": _jsonable(dict(meta or {})),
            "configurations": _jsonable(list(entries)),
            "ranking": _jsonable(list(rows)),
            "recommendation": _jsonable(dict(recommendation))}


def _jsonable(value: Any) -> Any:
    """A copy json.dumps accepts: Paths and other objects as text, tuples and sets as lists,
    keys as text, NaN and infinities as None (strict JSON has none)."""
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return [_jsonable(item) for item in sorted(value, key=str)]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)
