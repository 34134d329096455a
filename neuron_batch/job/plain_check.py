"""The check of a trace's plain rows (inputs/plain_rows.py), for `Scan` (job/check.py): rows
alike in their two counts are alike to every check, so each pair of counts is checked once, on
one real record of it (`PlainCheck._outcome`, with the calls `Scan.check_records` makes), and
its outcome given to every row of the pair: lengths, clamp, request row, facts. A pair with a
problem, stop strings, sampling fields or token ids is checked record by record, in its place.
A block's rows find their pair's outcome by numpy in a sorted table of the pairs known
(`_Pairs`), and take its columns a run at a time; their spooled rows are one f-string each
(`_rows`), checked against `json.dumps` of the pair's own row when the pair is first seen."""

from __future__ import annotations

import json
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from neuron_batch.engine.sampling_params import request_spec
from neuron_batch.inputs.load import prompt_token_count
from neuron_batch.inputs.plain_rows import PlainRows
from neuron_batch.inputs.prepare import prepare_requests
from neuron_batch.inputs.prompt_records import PromptRecord
from neuron_batch.inputs.request_fields import apply_openai_defaults
from neuron_batch.inputs.request_paths import refusals
from neuron_batch.job.request_spec import spec_problems
from neuron_batch.job.resume_check import request_row

if TYPE_CHECKING:
    from neuron_batch.inputs.job_columns import JobColumns
    from neuron_batch.inputs.request_paths import RequestPath
    from neuron_batch.job.rows_spool import RowsSpool
    from neuron_batch.settings import RunSettings


class ScanState(Protocol):
    """What of job/check.py's `Scan` the plain rows' check reads and adds to (a protocol:
    the check imports this module)."""

    settings: RunSettings
    path: RequestPath
    defaults: dict[str, Any]
    tokenizer_name: str | None
    graph: tuple[int, str] | None
    columns: JobColumns
    rows: RowsSpool | None
    numbered_rows: bytearray | None
    row_base: tuple[int, int]
    ok: bytearray
    known: array
    bound: Any
    longest_request: int
    longest_prompt: int
    took_defaults: int

    def check_records(self, chunk: list[PromptRecord]) -> None: ...


class PlainCheck:
    """A `Scan`'s plain rows, a block at a time (`block`): the outcome of each pair of counts
    seen, kept for the input being read up to _OUTCOMES pairs; `forget` tells what they asked
    to the facts' tally and lets them go (at the end of an input and of the pass)."""

    def __init__(self, scan: ScanState):
        self.scan = scan
        # a plain row's outcome by its two counts: its request's template, or None where the
        # rows of that pair go the record path (a problem, or more than counts)
        self._outcomes: dict[tuple[int, int], _Outcome | None] = {}
        self._alike: Counter[_Outcome] = Counter()    # (rows of each, for the facts' tally)
        self._pairs: _Pairs | None = None     # (`_outcomes` as arrays; None: not made yet)
        self._outcomes_of = -1                          # (the input they are of)

    def block(self, src: int, rows: PlainRows, upto: int | None) -> None:
        """A block of a trace's plain rows (inputs/plain_rows.py): each pair of counts checked
        once, on one real record of it (`_outcome`), its outcome given to every row of the
        pair (lengths, row, facts); a pair with a problem or anything more is checked record
        by record, in its place."""
        import numpy as np

        columns, start = self.scan.columns, len(self.scan.columns)
        assert start == rows.position, (start, rows.position)
        if src != self._outcomes_of:    # (an input's own: its rows' fields are its own)
            self.forget()
            self._outcomes_of = src
        columns.add_plain(src, rows)
        self.scan.ok += bytes(len(rows))
        count = len(rows) if upto is None else min(len(rows), max(upto - start, 0))
        if not count:
            return
        # Each row's pair found in the pairs known (`_Pairs`) by numpy, the block's rows
        # given their outcomes' columns a run at a time (a look-up and a few appends a row
        # were a third of the check's time; a trace's block of 4,096 rows has ~1,300 pairs,
        # too many for a look-up a pair to save much).
        keys = (np.frombuffer(rows.prompt_len, dtype=np.int64, count=count) << 32
                | np.frombuffer(rows.max_tokens, dtype=np.int64, count=count))
        outcomes = self._outcomes
        if self._pairs is None:
            self._pairs = _Pairs(outcomes)
        pairs = self._pairs
        slots = pairs.slots(keys)
        new = np.flatnonzero(slots == _NEW)
        if len(new):
            fresh, first = np.unique(keys[new], return_index=True)
            if len(outcomes) + len(fresh) > _OUTCOMES:
                # (the pairs kept would start again mid-block: a row at a time, as ever)
                self._settle()
                self._pairs = None
                self._plain_rows(rows, count)
                return
            # each new pair checked at its first row, in the order they come (as a row at a
            # time checks them: among the records checked alone, which change nothing a
            # pair's check reads)
            order = np.argsort(first)
            found = []
            for i in new[first[order]].tolist():
                outcome = self._outcome(rows.record(i))
                outcomes[rows.prompt_len[i], rows.max_tokens[i]] = outcome
                found.append(outcome)
            pairs.add(fresh[order], found)
            slots = pairs.slots(keys)
        # (a row whose pair is checked record by record ends the run of rows before it)
        after = 0
        for end in [*np.flatnonzero(slots == _ALONE).tolist(), count]:
            if end > after:
                self._took_run(rows, after, slots[after:end], pairs)
            if end < count:
                self.scan.check_records([rows.record(end)])
            after = end + 1

    def _plain_rows(self, rows: PlainRows, count: int) -> None:
        """`_plain`'s first `count` rows a row at a time, each pair's outcome found at its
        first row, kept up to _OUTCOMES pairs."""
        start, outcomes = rows.position, self._outcomes
        positions: list[int] = []
        alike: list[_Outcome] = []
        for i, pair in enumerate(zip(rows.prompt_len[:count], rows.max_tokens[:count])):
            outcome = outcomes.get(pair, _UNSEEN)
            if outcome is _UNSEEN:
                if len(outcomes) >= _OUTCOMES:
                    self._tally()
                    outcomes.clear()
                outcome = outcomes[pair] = self._outcome(rows.record(i))
            if outcome is None:
                self._took(positions, alike, rows)
                positions, alike = [], []
                self.scan.check_records([rows.record(i)])
            else:
                positions.append(start + i)
                alike.append(outcome)
        self._took(positions, alike, rows)

    def forget(self) -> None:
        """The pairs' outcomes forgotten (the rows of each told to the facts' tally first)."""
        self._tally()
        self._outcomes.clear()
        self._pairs = None

    def _tally(self) -> None:
        """What the plain rows checked so far ask, told to the rows' tally (job/facts.py)."""
        self._settle()
        if self.scan.rows is not None:
            for outcome, times in self._alike.items():
                self.scan.rows.tally.add(outcome.request, outcome.spec, times)
        self._alike.clear()

    def _settle(self) -> None:
        """The rows of each outcome `_took_run` counted, added to `_alike` (in the order the
        outcomes were made: the order their rows first came, as `_took` adds them)."""
        import numpy as np

        pairs = self._pairs
        if pairs is None or self.scan.rows is None:
            return
        used = np.flatnonzero(pairs.times)
        for k, times in zip(used.tolist(), pairs.times[used].tolist()):
            self._alike[pairs.outcomes[k]] += times
        pairs.times[:] = 0

    def _outcome(self, record: PromptRecord) -> _Outcome | None:
        """What the check makes of `record` (a plain row) on its own, where every row with its
        counts comes out alike: no problem, nothing but counts asked; else None."""
        settings = self.scan.settings
        records, refused = refusals([record], self.scan.path)
        records, unsampled = spec_problems(records, settings)
        if refused or unsampled or record.stop or record.sampling or record.openai:
            return None
        took = apply_openai_defaults(records, self.scan.defaults,
                                     run_temperature=settings.temperature,
                                     honours=self.scan.path.honours)
        prepared = prepare_requests(records, tokenizer=self.scan.columns.tokenizer,
                                    tokenizer_name=self.scan.tokenizer_name,
                                    vocab_size=self.scan.columns.vocab_size,
                                    max_model_len=settings.max_model_len,
                                    default_max_tokens=settings.max_tokens,
                                    longest_prompt_graph=self.scan.graph)
        if prepared.problems or prepared.requests[0].token_ids is not None:
            return None
        (request,) = prepared.requests
        spec = request_spec(request, settings)
        row = request_row(request, spec)
        seeded = spec["seed"] is not None
        encode = json.JSONEncoder(ensure_ascii=False).encode
        head = '", ' + ", ".join(encode(value) for value in row[1:4]) + ", "
        post = "".join(", " + encode(value) for value in row[5:]) + "]\n"
        outcome = _Outcome(request, spec, took, head, post, head + "null" + post, seeded,
                           numbering_of(record, spec),
                           request.own_prompt, request.prompt_len, request.max_tokens,
                           request.max_tokens_clamped, prompt_token_count(record) or 0)
        # (the row as `_rows` makes it, by its default id: a given id, or one JSON would
        # escape, is not a plain row's)
        if _rows(record.index, [outcome], record.read_order - record.index,
                 settings.seed) != encode(row) + "\n":
            return None
        return outcome

    def _took(self, positions: list[int], alike: list[_Outcome], rows: PlainRows) -> None:
        """Plain rows at `positions` (consecutive) checked, each with the outcome of its pair
        in `alike` (`_plain_rows`)."""
        import numpy as np

        if not positions:
            return
        counts = Counter(alike)
        self.scan.columns.prepared_plain(positions, [o.prompt_len for o in alike],
                                    [o.max_tokens for o in alike], [o.clamped for o in alike],
                                    sum(times for o, times in counts.items() if not o.own_prompt))
        at = np.asarray(positions, dtype=np.int64)
        np.frombuffer(self.scan.ok, dtype=np.uint8)[at] = 1
        self.scan.known.extend(array("i", [o.known for o in alike]))
        self.scan.longest_request = max(self.scan.longest_request,
                                   *(o.prompt_len + o.max_tokens for o in counts))
        self.scan.longest_prompt = max(self.scan.longest_prompt, *(o.prompt_len for o in counts))
        self.scan.took_defaults += sum(o.took * times for o, times in counts.items())
        self.scan.bound = None       # (a trace's synthetic tokens: not made here)
        if self.scan.rows is not None:
            items, records = self.scan.row_base
            self.scan.rows.write(_rows(positions[0], alike,
                                       rows.read_order - rows.position + items,
                                       self.scan.settings.seed + records))
            self._alike.update(counts)
            if self.scan.numbered_rows is not None:
                self.scan.numbered_rows += bytes([o.numbered for o in alike])

    def _took_run(self, rows: PlainRows, after: int, slots: Any, pairs: _Pairs) -> None:
        """`_took` of a run of a block's rows from its `after`th, each with the outcome
        `slots` numbers in `pairs`: each column's values picked from the outcomes' by numpy."""
        import numpy as np

        first_at = rows.position + after
        at = cast(Sequence[int], np.arange(first_at, first_at + len(slots), dtype=np.int64))
        self.scan.columns.prepared_plain(at, pairs.prompt_len[slots].tolist(),
                                    pairs.max_tokens[slots].tolist(),
                                    pairs.clamped[slots].tolist(),
                                    int(np.count_nonzero(pairs.not_own[slots])))
        np.frombuffer(self.scan.ok, dtype=np.uint8)[first_at:first_at + len(slots)] = 1
        self.scan.known.frombytes(pairs.known[slots].tobytes())
        self.scan.longest_request = max(self.scan.longest_request,
                                   int(pairs.request_len[slots].max()))
        self.scan.longest_prompt = max(self.scan.longest_prompt, int(pairs.prompt_len[slots].max()))
        self.scan.took_defaults += int(pairs.took[slots].sum())
        self.scan.bound = None       # (a trace's synthetic tokens: not made here)
        if self.scan.rows is not None:
            items, records = self.scan.row_base
            self.scan.rows.write(_rows(first_at, pairs.objects[slots].tolist(),
                                       rows.read_order - rows.position + items,
                                       self.scan.settings.seed + records))
            pairs.times += np.bincount(slots, minlength=len(pairs.times))
            if self.scan.numbered_rows is not None:
                self.scan.numbered_rows += pairs.numbered[slots].tobytes()


#: `_Pairs.slots` of a pair not known yet, and of one whose rows are checked record by record.
_NEW, _ALONE = -2, -1


class _Pairs:
    """`PlainCheck._outcomes` as arrays: each pair's key (its counts as one int64, both below
    2**31: the readers' counts are below 10**9) in order, its slot (its outcome's number in
    `outcomes`, in the order they were made; _ALONE: none), and what each outcome gives its
    rows, picked by slot; `times`: the rows of each taken since `PlainCheck._settle`."""

    # (numpy arrays: numpy is imported where it is used, as elsewhere in the check)
    keys: Any
    slot_of: Any
    objects: Any
    prompt_len: Any
    max_tokens: Any
    request_len: Any
    took: Any
    times: Any
    clamped: Any
    numbered: Any
    not_own: Any
    known: Any

    def __init__(self, known: dict[tuple[int, int], _Outcome | None]) -> None:
        import numpy as np

        self.keys = np.zeros(0, dtype=np.int64)
        self.slot_of = np.zeros(0, dtype=np.int64)
        self.outcomes: list[_Outcome] = []
        self.objects = np.zeros(0, dtype=object)
        self.prompt_len = self.max_tokens = self.request_len = self.took = self.times = \
            np.zeros(0, dtype=np.int64)
        self.clamped = self.numbered = np.zeros(0, dtype=np.uint8)
        self.not_own = np.zeros(0, dtype=bool)
        self.known = np.zeros(0, dtype=np.intc)     # (Scan.known's items: array "i")
        self.add([prompt << 32 | most for prompt, most in known], list(known.values()))

    def slots(self, keys: Any) -> Any:
        """Each key's slot; _NEW where it is not known."""
        import numpy as np

        if not len(self.keys):
            return np.full(len(keys), _NEW, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.where(self.keys[at] == keys, self.slot_of[at], _NEW)

    def add(self, keys: Any, found: Sequence[_Outcome | None]) -> None:
        """Pairs not known yet (their keys), each with its outcome."""
        import numpy as np

        taken = [o for o in found if o is not None]
        slots, slot = [], len(self.outcomes)
        for outcome in found:
            slots.append(_ALONE if outcome is None else slot)
            slot += outcome is not None
        keys = np.concatenate([self.keys, np.asarray(keys, dtype=np.int64)])
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.slot_of = np.concatenate([self.slot_of, np.array(slots, dtype=np.int64)])[order]
        self.outcomes += taken
        objects: Any = np.empty(len(taken), dtype=object)
        objects[:] = taken

        def grown(column: Any, values: list[Any]) -> Any:
            return np.concatenate([column, np.array(values, dtype=column.dtype)])

        self.objects = np.concatenate([self.objects, objects])
        self.prompt_len = grown(self.prompt_len, [o.prompt_len for o in taken])
        self.max_tokens = grown(self.max_tokens, [o.max_tokens for o in taken])
        self.request_len = self.prompt_len + self.max_tokens
        self.took = grown(self.took, [o.took for o in taken])
        self.times = grown(self.times, [0] * len(taken))
        self.clamped = grown(self.clamped, [o.clamped for o in taken])
        self.numbered = grown(self.numbered, [o.numbered for o in taken])
        self.not_own = grown(self.not_own, [not o.own_prompt for o in taken])
        self.known = grown(self.known, [o.known for o in taken])


_UNSEEN: Any = object()
#: Pairs of counts whose outcome `PlainCheck.block` keeps (past them it starts again).
_OUTCOMES = 1 << 14


@dataclass(eq=False, slots=True)
class _Outcome:
    """A plain row's check (`PlainCheck._outcome`): the request standing for its pair's rows, its
    spec, the OpenAI defaults it took, its row's JSON but for its id and seed."""

    request: Any
    spec: dict[str, Any]
    took: int
    head: str               # (the row's JSON after the id's digits, up to its seed)
    post: str               # (and after the seed, to the line's end)
    rest: str               # (after the id's digits, where its seed is null: not `seeded`)
    seeded: bool            # its seed is the run's --seed plus its position
    numbered: int           # `numbering_of`
    # (the request's, read a row at a time)
    own_prompt: bool
    prompt_len: int
    max_tokens: int
    clamped: bool
    known: int              # (load.prompt_token_count of its record)


def _rows(first: int, alike: Sequence[_Outcome], shift: int, seed: int) -> str:
    """The rows (job/resume_check.py `request_row`, as the spool writes them) of the plain
    rows at consecutive positions from `first`, each of its outcome in `alike`: its default
    id (its position plus `shift`, its reading order) and, where its pair samples, its seed
    (--seed plus its position). One comprehension of one f-string a row, of the fewest parts
    (a call a row was a fifth of a block's time; the id, seed and the JSON between them as
    five parts, twice the time of two)."""
    seed -= shift           # (a row's seed: its id less `shift`, plus --seed)
    return "".join([f'["{p}{o.head}{p + seed}{o.post}' if o.seeded else f'["{p}{o.rest}'
                    for p, o in zip(range(first + shift, first + shift + len(alike)), alike)])


#: `Scan.numbered_rows` bits: a row whose id is its default (its reading order), whose seed is
#: the run's seed plus its position.
DEFAULT_ID, RUN_SEED = 1, 2


def based_row(row: list[Any], mark: int, items: int, records: int) -> list[Any]:
    """A request's row (job/resume_check.py `request_row`) with what `mark` says is a part's
    numbering moved on: its default id by `items`, its run seed by `records`."""
    row = list(row)
    if mark & DEFAULT_ID:
        row[0] = str(int(row[0]) + items)
    if mark & RUN_SEED:
        row[4] += records
    return row


def numbering_of(record: PromptRecord, spec: dict[str, Any]) -> int:
    """What of a request's row a part's numbering wrote (`DEFAULT_ID`, `RUN_SEED`)."""
    own_seed = record.sampling is not None and "seed" in record.sampling
    return ((DEFAULT_ID if record.default_id else 0)
            | (RUN_SEED if spec["seed"] is not None and not own_seed else 0))
