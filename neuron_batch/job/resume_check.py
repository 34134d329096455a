"""What a run folder was made from, and what changed since: `--resume` finishes a run only when
every request and every setting that shapes its outputs or figures is what the folder holds.

A folder keeps, per request in input order, a short digest of what it asks for (REQUEST_FIELDS,
in requests.jsonl.gz) and, in run.json, the settings declared `checked` (settings/groups.py). A
resume compares both with this job before anything runs or is written: any difference is refused
(exit 2), naming the requests and settings that changed, unless `--restart` moves the old run
aside (folder.py `move_aside`).

Settings declared unchecked, on purpose:
- per-request ones (--max-tokens, --temperature, --seed; --limit, --shuffle, --prompt-column,
  --split, the input files): what they do to a request is in its digest, so they are checked
  there, where the message can name the requests;
- how the work is spread (--replicas, --ray, --num-instances, --split-placement): outputs are the
  same, each attempt's line in attempts.json says how it ran, and resuming with fewer replicas
  after a lost node is how such a run is finished;
- prices (--pricing, --price-per-hour): applied to the whole run each time the report is built,
  so a new price re-prices it all and cannot mix;
- how it is watched or stopped (--output, --resume, --restart, --quiet, --max-runtime,
  --metrics-textfile, --on-error, --compiled-artifacts: a cache of the same graphs).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from neuron_batch.engine.sampling_params import request_spec
from neuron_batch.errors import RunError
from neuron_batch.job.facts import FactsTally
from neuron_batch.job.folder import RunFolder, input_fingerprint
from neuron_batch.settings import DECLARED

#: A request digest row (requests.jsonl.gz): the id, then these. prompt, stop and sampling
#: are digests (the prompt as given: text, messages, token ids or prompt_len with what it
#: shares (a Mooncake line's block ids, a prefix), with an OpenAI batch line's url and model;
#: sampling: every other field of the engine's spec, job/request_spec.py, None when the
#: request asks for none); the numbers are the values the engine gets (max_tokens after the
#: default and the clamp to max_model_len; the seed only where the request samples). A row
#: written before `sampling` existed reads as None there.
REQUEST_FIELDS = ("prompt", "max_tokens", "temperature", "seed", "stop", "sampling")
#: The spec's keys with a column of their own (the rest are digested into `sampling`).
_OWN_COLUMNS = ("max_tokens", "temperature", "seed", "stop", "ignore_eos")

SHOWN = 5           # requests named in a message; the rest are counted


def iter_request_rows(requests, settings, learn=None) -> Iterator[list[Any]]:
    """Each prepared request's row (id + REQUEST_FIELDS), in input order, one at a time (a
    job's rows are never held: written as they are made, compared as they come). `learn`: the
    job's Workload, told what the job asks beyond its tokens (job/facts.py) once every row
    was made: the pass that reads the job for its rows spares one of their own."""
    tally = FactsTally() if learn is not None else None
    for request in requests:
        spec = request_spec(request, settings)
        if tally is not None:
            tally.add(request, spec)
        yield request_row(request, spec)
    if tally is not None:
        learn.learnt(settings, tally.result())


def request_row(request, spec: dict[str, Any]) -> list[Any]:
    """One prepared request's row (id + REQUEST_FIELDS), of its spec (`request_spec`)."""
    record = request.record
    rest = {key: value for key, value in spec.items() if key not in _OWN_COLUMNS}
    if record.sampling and "ignore_eos" in record.sampling:  # (asked, not the run's)
        rest["ignore_eos"] = record.sampling["ignore_eos"]
    return [record.id, _prompt_digest(record), request.max_tokens,
            spec["temperature"], spec["seed"],
            _digest(json.dumps(record.stop).encode()) if record.stop else None,
            _digest(json.dumps(rest, sort_keys=True).encode()) if rest else None]


def _prompt_digest(record) -> str:
    if record.prompt_token_ids is not None:
        ids = record.prompt_token_ids     # (packed: the fastest way to bytes of a long list)
        given = b"ids" + struct.pack(f"<{len(ids)}q", *ids)
    elif record.messages is not None:
        given = b"messages" + json.dumps(record.messages, sort_keys=True).encode()
    elif record.prompt_len is not None:
        given = b"len%d" % record.prompt_len
        # what it shares is part of what it asks (a plain prompt_len's digest stays as it was)
        if record.hash_ids is not None:
            given += b"blocks" + struct.pack(f"<{len(record.hash_ids)}q", *record.hash_ids)
        if record.prefix_id is not None:
            given += b"prefix%d:" % record.prefix_len + record.prefix_id.encode(
                "utf-8", "surrogatepass")
    else:
        given = b"text" + record.prompt.encode("utf-8", "surrogatepass")
    if record.openai:
        given += json.dumps(record.openai, sort_keys=True).encode()
    return _digest(given)


def _digest(data: bytes) -> str:
    # 48 bits: rows are compared id by id, so a collision would have to hit one request's own
    # old value (odds 2^-48), not any of the job's.
    return hashlib.blake2b(data, digest_size=6).hexdigest()


def checked_settings(settings: dict[str, Any], runtime: str | None) -> dict[str, Any]:
    """The checked settings of a RunSettings.to_dict() (JSON values), the runtime as given. A
    setting declared in a table (the simulated target's `sim`) is compared on --device sim only,
    as `sim.<key>`; one the dict lacks (run.json written before it existed) is left out."""
    values: dict[str, Any] = {}
    for d in DECLARED:
        table = d.setting.table
        if not d.setting.checked or (table and settings.get("device") != "sim"):
            continue
        where = (settings.get(table) or {}) if table else settings
        if d.key in where:
            values[f"{table}.{d.key}" if table else d.key] = where[d.key]
    if values.get("max_context_length") is None:    # (unset: as in folders made before it)
        values.pop("max_context_length", None)
    values["runtime"] = runtime
    return json.loads(json.dumps(values))


@dataclass
class Changes:
    """How this job differs from the run in a folder; empty when it may resume."""

    total: int = 0                                   # requests in the folder's run
    changed: list[tuple[str, list[str]]] = field(default_factory=list)   # (id, what changed)
    num_changed: int = 0        # (`changed` keeps the first SHOWN: a message names no more)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    reordered: bool = False
    ids_differ: bool = False                         # an old folder: only its id fingerprint
    settings: list[str] = field(default_factory=list)     # "--max-model-len 2048 -> 4096"
    reasons: list[str] = field(default_factory=list)      # selecting settings that changed

    def __bool__(self) -> bool:
        return bool(self.num_changed or self.added or self.removed or self.reordered
                    or self.ids_differ or self.settings)

    def describe(self) -> str:
        parts = []
        if self.num_changed:
            shown = "; ".join(f"{rid}: {', '.join(what)}" for rid, what in self.changed)
            more = self.num_changed - len(self.changed)
            parts.append(f"{self.num_changed:,} of {self.total:,} requests changed ({shown}"
                         + (f"; and {more:,} more)" if more > 0 else ")"))
        if self.added:
            parts.append(f"{_requests(self.added)} added ({_ids(self.added)})")
        if self.removed:
            parts.append(f"{_requests(self.removed)} left out ({_ids(self.removed)})")
        if self.reordered:
            parts.append("the same requests in another order")
        if self.ids_differ:
            parts.append("other request ids or order")
        if self.reasons:
            parts[-1] += f", as {', '.join(self.reasons)} chose"
        if self.settings:
            parts.append(f"settings changed: {', '.join(self.settings)}")
        return "; ".join(parts)


def _requests(ids: list[str]) -> str:
    return f"{len(ids):,} request" + ("" if len(ids) == 1 else "s")


def _ids(ids: list[str]) -> str:
    more = len(ids) - SHOWN
    return ", ".join(ids[:SHOWN]) + (f", and {more:,} more" if more > 0 else "")


def compare(folder: RunFolder, manifest: dict[str, Any] | None,
            rows: Callable[[], Iterable[list[Any]]], settings, runtime: str
            ) -> tuple[Changes, bool]:
    """(what differs between the folder's run and this job, whether its content could be
    checked: False for a folder written before the request digests, whose ids alone are
    compared). `rows()` gives this job's rows, in input order, each time it is called."""
    manifest = manifest or {}
    changes = Changes()
    stored = folder.iter_requests()
    if stored is not None:
        _compare_requests(changes, stored, rows())
    elif manifest.get("input_fingerprint") not in (None,
                                                    input_fingerprint(r[0] for r in rows())):
        changes.ids_differ = True
    old_settings = manifest.get("settings") or {}
    now = settings.to_dict()
    if "checked_settings" in manifest:
        before, after = manifest["checked_settings"], checked_settings(now, runtime)
    else:       # an older run.json: its settings as given (runtime unresolved) against ours
        before = checked_settings(old_settings, old_settings.get("runtime"))
        after = checked_settings(now, now.get("runtime"))
    changes.settings = [f"{_option(name)} {_shown(before[name])} -> {_shown(after.get(name))}"
                        for name in after if name in before and before[name] != after[name]]
    if changes.added or changes.removed or changes.reordered or changes.ids_differ:
        now_json = json.loads(json.dumps(now))
        changes.reasons = [f"{_option(name)} {_shown(old_settings[name])} -> "
                           f"{_shown(now_json[name])}" for name in _SELECTING
                           if name in old_settings and old_settings[name] != now_json[name]]
    return changes, stored is not None


def _compare_requests(changes: Changes, stored: Iterable[list[Any]],
                      rows: Iterable[list[Any]]) -> None:
    """The two lists of rows walked side by side while their ids agree (a resume's case: it
    holds one row at a time, whatever the job's size); from the first id that differs, what
    is left of both is compared by id (a refusal's case: it holds what is left)."""
    stored_rows, new_rows = iter(stored), iter(rows)
    for old, new in itertools.zip_longest(stored_rows, new_rows):
        if old is None or new is None or old[0] != new[0]:
            rest_stored = [old, *stored_rows] if old is not None else list(stored_rows)
            rest_new = [new, *new_rows] if new is not None else list(new_rows)
            _compare_rest(changes, rest_stored, rest_new)
            return
        changes.total += 1
        _compare_row(changes, old, new)


def _compare_row(changes: Changes, old: list[Any], new: list[Any]) -> None:
    width = len(REQUEST_FIELDS)     # (an older row lacks the last columns: None there)
    was_values = old[1:] + [None] * (width - len(old) + 1)
    if was_values == new[1:]:
        return
    what = []
    for name, was, now in zip(REQUEST_FIELDS, was_values, new[1:]):
        if was == now or (name == "seed" and None in (was, now)):
            continue        # (a seed appearing or going: the temperature says why)
        what.append(name if name in ("prompt", "stop", "sampling") else f"{name} {was} -> {now}")
    if what:
        changes.num_changed += 1
        if len(changes.changed) < SHOWN:
            changes.changed.append((new[0], what))


def _compare_rest(changes: Changes, stored: list[list[Any]], rows: list[list[Any]]) -> None:
    before = {row[0]: row for row in stored}
    after = {row[0]: row for row in rows}
    changes.total += len(stored)
    changes.added = [row[0] for row in rows if row[0] not in before]
    changes.removed = [row[0] for row in stored if row[0] not in after]
    for rid, new in after.items():
        if rid in before:
            _compare_row(changes, before[rid], new)
    if not (changes.added or changes.removed):
        changes.reordered = [row[0] for row in stored] != [row[0] for row in rows]


#: Named beside changed ids: the settings declared to choose which requests a job holds, and in
#: what order (their effect is what is checked, so they are reasons, not checks).
_SELECTING = tuple(d.key for d in DECLARED if d.setting.selects)


def _option(key: str) -> str:
    return "--" + key.rpartition(".")[2].replace("_", "-")


def _shown(value: Any) -> str:
    if value is None:
        return "default"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def refusal(folder: RunFolder, changes: Changes) -> RunError:
    """The error a resume onto a run of other input stops with (exit 2, nothing written)."""
    return RunError(f"{folder.path} holds a run of other input: {changes.describe()}. Keep them "
                    f"apart: --output another folder, or --restart to move the old run aside "
                    f"(into {folder.path}/previous-<time>/) and start anew")


@dataclass
class Start:
    """How this job takes the folder: its rows and checked settings (to record), whether it
    starts a run anew (and then writes the request digests), and, with --restart, what the run moved
    aside differed in (None: nothing is moved)."""

    rows: Iterable[list[Any]]       # (made as the request digests are written)
    checked: dict[str, Any]
    fresh: bool
    moved: Changes | None = None


def take_folder(job, runtime: str) -> Start:
    """Resume, start anew, or refuse (RunError, exit 2) before anything runs or is written."""
    settings, folder = job.settings, job.folder
    checked = checked_settings(settings.to_dict(), runtime)
    spool = job.workload.rows_spool     # (made by the check, where the order is the input's)

    def rows() -> Iterator[list[Any]]:
        if spool is not None:
            return iter(spool)
        return iter_request_rows(job.workload.prepared.requests, settings, learn=job.workload)

    if not folder.has_previous_run():
        return Start(spool if spool is not None else rows(), checked, fresh=True)

    changes, content_checked = compare(folder, folder.read_manifest(), rows, settings, runtime)
    # --restart with --resume moves a run aside only when it could not be resumed as is: one
    # cron line then continues an interrupted night and never mixes two.
    if settings.restart and (changes or not content_checked or not settings.resume):
        return Start(rows(), checked, fresh=True, moved=changes)
    if changes:
        raise refusal(folder, changes)
    if not settings.resume:
        raise RunError(f"{folder.path} already holds a run; pass --resume to finish it, "
                       f"--restart to move it aside and start anew, or choose another --output")
    if not content_checked:
        job.log(f"warning: {folder.path} was written by an older neuron-batch, which kept no "
                f"digest of each request: only the request ids and settings are checked, not "
                f"the prompts; --restart moves that run aside to start anew")
    return Start((), checked, fresh=False)
