"""The pass before the run (`Scan`): every input read once, each record checked as a run would
check it (the fields its path refuses, what the engine would refuse, stop strings, the OpenAI
defaults, its tokens and lengths), CHECK_CHUNK at a time; only its place, id, lengths and
digest kept (inputs/job_columns.py `JobColumns`), every problem kept. One process reads the
whole job, or each of several reads a part and the parts are joined (job/check_parts.py):
either way `number` then gives the job its order (job/workload.py `load_workload`)."""

from __future__ import annotations

import json
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from neuron_batch.engine.sampling_params import request_spec
from neuron_batch.errors import RunError
from neuron_batch.inputs.job_columns import JobColumns
from neuron_batch.inputs.job_requests import JobRequests
from neuron_batch.inputs.load import InputScan, describe_job, job_order, prompt_token_count
from neuron_batch.inputs.plain_rows import PlainRows
from neuron_batch.inputs.prepare import prepare_requests
from neuron_batch.inputs.prompt_records import InputProblem, PromptRecord
from neuron_batch.inputs.request_fields import (
    apply_openai_defaults,
    defaults_words,
    openai_defaults,
)
from neuron_batch.inputs.request_paths import refusals, request_path, stop_refusals
from neuron_batch.inputs.skipped import name_problems
from neuron_batch.job.request_spec import spec_problems
from neuron_batch.job.resume_check import REQUEST_FIELDS, request_row
from neuron_batch.job.rows_spool import RowsSpool
from neuron_batch.settings import RunSettings

if TYPE_CHECKING:
    from neuron_batch.inputs.prefix_bound import PrefixBound

#: Records checked at once (refusals, defaults, tokenization).
CHECK_CHUNK = 2048


@dataclass(frozen=True)
class ModelSource:
    """The run's model, where its tokenizer comes from (None: a token-count job needs none
    and has none), the tokenizer's name for the report, the vocabulary size: resolved once,
    handed to each part of a split check."""

    model: Any
    source: Any
    tokenizer_name: str | None
    vocab_size: int | None


class Scan:
    """One pass over inputs (`read`), then the job numbered (`number`). `spool`: the request
    rows are made as each request is checked (job/rows_spool.py; at `rows_path` for a part of
    a split check); `block`: the job's prefix bound is counted as its prompts are tokenized."""

    def __init__(self, settings: RunSettings, model: ModelSource, *, spool: bool = False,
                 block: int | None = None, rows_path: Path | None = None,
                 readers: Sequence[Any] = ()):
        self.settings = settings
        self.rows = (RowsSpool(None if rows_path else ["id", *REQUEST_FIELDS], path=rows_path)
                     if spool else None)
        # (rows whose id or seed is the part's numbering: shifted once the parts are joined)
        self.numbered_rows = bytearray() if rows_path is not None else None
        self.path = request_path(str(settings.device), settings.resolve_runtime())
        self.model, self._source = model.model, model.source
        self.tokenizer_name = model.tokenizer_name
        # The job's prefix bound (inputs/prefix_bound.py), counted as each prompt's tokens are
        # made here: auto's decision and the report then tokenize no text again for it (a
        # text job's start took twice its tokenizing). Given up at the first prompt whose
        # tokens are not made here (a trace's synthetic ones: their own pass, or none where
        # they share nothing); only for a job in input order (the check's requests are then
        # the job's).
        self.bound: PrefixBound | None = None
        if block is not None:
            from neuron_batch.inputs.prefix_bound import PrefixBound

            self.bound = PrefixBound(block)
        self.columns = columns = JobColumns(readers)
        self.tokenizer_asked = False
        vocab_size = model.vocab_size
        if vocab_size is None:      # (no config.json with it: the tokenizer's, else Llama's)
            tokenizer = self.tokenizer()
            vocab_size = len(tokenizer) if tokenizer is not None else 32_000
        columns.vocab_size = vocab_size
        self._defaults, self._defaults_from = openai_defaults(self.model.path)
        if settings.temperature is not None:
            self._defaults = {k: v for k, v in self._defaults.items() if k != "temperature"}
        self.took_defaults = 0
        self.longest_request = self.longest_prompt = 0
        self._graph = longest_prompt_graph(settings)
        self.parse_problems: list[InputProblem] = []
        self.checked: list[tuple[int, InputProblem]] = []  # (position, problem) by the checks
        self.ok = bytearray()
        self.known = array("i")         # prompt lengths known without a tokenizer
        self.early: list[int] = []      # positions of problems found before tokenizing
        self.facts: Any = None
        # a plain row's outcome by its two counts (`_plain`): its request's template, or None
        # where the rows of that pair go the record path (a problem, or more than counts)
        self._outcomes: dict[tuple[int, int], _Outcome | None] = {}
        self._alike: Counter[_Outcome] = Counter()    # (rows of each, for the facts' tally)
        self._pairs: _Pairs | None = None     # (`_outcomes` as arrays; None: not made yet)
        self._outcomes_of = -1                          # (the input they are of)

    def read(self, inputs: InputScan) -> None:
        """Every item of `inputs` read, checked CHECK_CHUNK records at a time."""
        columns, settings = self.columns, self.settings
        # --limit without --shuffle: the records past it are not the job's (their lines are
        # still read, so that a malformed one is named)
        upto = settings.limit if settings.limit is not None and not settings.shuffle else None
        chunk: list[PromptRecord] = []
        for src, where, line, digest, item in inputs:
            if isinstance(item, PlainRows):
                self._check(chunk)      # (rows are spooled in input order)
                chunk = []
                self._plain(src, item, upto)
                continue
            if isinstance(item, InputProblem):
                self.parse_problems.append(item)
                continue
            columns.add(src, where, line, digest, None if item.default_id else item.id,
                        item.read_order)
            self.ok.append(0)
            if upto is not None and item.index >= upto:
                continue
            chunk.append(item)
            if len(chunk) >= CHECK_CHUNK:
                self._check(chunk)
                chunk = []
        self._check(chunk)
        self._forget()              # (what only the check needed: not held while the job runs)
        self.facts = self.rows.close() if self.rows is not None else None

    def number(self, inputs: InputScan, log: Callable[[str], None]) -> None:
        """The job read: its order (--shuffle, --limit), its requests, its problems in line
        order, what it is said to be."""
        settings, columns = self.settings, self.columns
        self.kind = inputs.kind
        order = job_order(len(columns), shuffle=settings.shuffle, seed=settings.seed,
                          limit=settings.limit)
        self.requests = JobRequests(columns, columns.number(order, self.ok))
        chosen = [(p, problem) for p, problem in self.checked if columns.index[p] >= 0]
        early = sum(1 for p in self.early if columns.index[p] >= 0)
        count = (len(columns) if order is None else len(order)) - early
        log(describe_job(count, self.kind, inputs.specs, _sorted(self.known),
                         len(self.parse_problems) + early))
        if self.took_defaults:
            log(f"{self.took_defaults:,} OpenAI batch line(s) run with "
                f"{defaults_words(self._defaults, self._defaults_from)} where they give none")
        self.problems = sorted(self.parse_problems + [problem for _, problem in chosen],
                               key=lambda problem: problem.read_order)
        columns.finish = self._finish
        self._inputs = inputs
        # (what only the check needed: not held while the job runs)
        inputs.id_hashes = array("q")
        self.ok, self.known, self.early, self.checked = bytearray(), array("i"), [], []

    def drop_rows(self) -> None:
        """This pass's rows are not the job's (a pass with every id held reads it again)."""
        if self.rows is not None:
            self.rows.discard()
            self.rows = None

    def _finish(self, record: PromptRecord, position: int, index: int) -> None:
        """A record read again, given what the check gave it."""
        self._inputs.finish(record, position, self.columns.id_of(position))
        record.index = index
        apply_openai_defaults([record], self._defaults, run_temperature=self.settings.temperature,
                              honours=self.path.honours)

    def tokenizer(self) -> Any:
        """The tokenizer, loaded the first time a record needs it (a token-count job: never)."""
        from neuron_batch.engine.models import load_tokenizer

        if not self.tokenizer_asked:
            self.tokenizer_asked = True
            if self._source is not None:
                self.columns.tokenizer = load_tokenizer(self._source)
            if self.columns.tokenizer is None:
                self.tokenizer_name = None
            self.columns.tokenizer_name = self.tokenizer_name
        return self.columns.tokenizer

    def _check(self, chunk: list[PromptRecord]) -> None:
        if not chunk:
            return
        settings, columns = self.settings, self.columns
        position_of = {record.read_order: record.index for record in chunk}
        records, refused = refusals(chunk, self.path)
        records, unsampled = spec_problems(records, settings)
        self.early += [position_of[p.read_order] for p in refused + unsampled]
        self.known.extend(n for r in records if (n := prompt_token_count(r)) is not None)
        # (where a request has stop strings: they are matched in the detokenized text)
        if any((r.prompt_token_ids is None and r.prompt_len is None) or r.stop for r in records):
            self.tokenizer()
        records, unmatched = stop_refusals(
            records, has_tokenizer=columns.tokenizer is not None, simulated=settings.simulated,
            on_ray=settings.uses_ray)
        self.took_defaults += apply_openai_defaults(
            records, self._defaults, run_temperature=settings.temperature,
            honours=self.path.honours)
        prepared = prepare_requests(records, tokenizer=columns.tokenizer,
                                    tokenizer_name=self.tokenizer_name,
                                    vocab_size=columns.vocab_size,
                                    max_model_len=settings.max_model_len,
                                    default_max_tokens=settings.max_tokens,
                                    longest_prompt_graph=self._graph)
        name_problems(prepared.problems, chunk)
        self.longest_request = max(self.longest_request, prepared.longest_request)
        self.longest_prompt = max(self.longest_prompt, prepared.longest_prompt)
        rows, numbered = self.rows, self.numbered_rows
        for request in prepared.requests:
            position = request.record.index
            columns.prepared(position, request)
            self.ok[position] = 1
            if rows is not None:
                spec = request_spec(request, settings)
                rows.add(request_row(request, spec), request, spec)
                if numbered is not None:
                    numbered.append(_numbered(request.record, spec))
            if self.bound is not None:
                if request.token_ids is None:
                    self.bound = None   # (synthetic tokens: not made here)
                else:
                    self.bound.add(request.token_ids)
        self.checked += [(position_of[p.read_order], p)
                         for p in refused + unsampled + unmatched + prepared.problems]

    def _plain(self, src: int, rows: PlainRows, upto: int | None) -> None:
        """A block of a trace's plain rows (inputs/plain_rows.py): each pair of counts checked
        once, on one real record of it (`_outcome`), its outcome given to every row of the
        pair (lengths, row, facts); a pair with a problem or anything more is checked record
        by record, in its place."""
        import numpy as np

        columns, start = self.columns, len(self.columns)
        assert start == rows.position, (start, rows.position)
        if src != self._outcomes_of:    # (an input's own: its rows' fields are its own)
            self._forget()
            self._outcomes_of = src
        columns.add_plain(src, rows)
        self.ok += bytes(len(rows))
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
                self._check([rows.record(end)])
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
                self._check([rows.record(i)])
            else:
                positions.append(start + i)
                alike.append(outcome)
        self._took(positions, alike, rows)

    def _forget(self) -> None:
        """The pairs' outcomes forgotten (the rows of each told to the facts' tally first)."""
        self._tally()
        self._outcomes.clear()
        self._pairs = None

    def _tally(self) -> None:
        """What the plain rows checked so far ask, told to the rows' tally (job/facts.py)."""
        self._settle()
        if self.rows is not None:
            for outcome, times in self._alike.items():
                self.rows.tally.add(outcome.request, outcome.spec, times)
        self._alike.clear()

    def _settle(self) -> None:
        """The rows of each outcome `_took_run` counted, added to `_alike` (in the order the
        outcomes were made: the order their rows first came, as `_took` adds them)."""
        import numpy as np

        pairs = self._pairs
        if pairs is None or self.rows is None:
            return
        used = np.flatnonzero(pairs.times)
        for k, times in zip(used.tolist(), pairs.times[used].tolist()):
            self._alike[pairs.outcomes[k]] += times
        pairs.times[:] = 0

    def _outcome(self, record: PromptRecord) -> _Outcome | None:
        """What the check makes of `record` (a plain row) on its own, where every row with its
        counts comes out alike: no problem, nothing but counts asked; else None."""
        settings = self.settings
        records, refused = refusals([record], self.path)
        records, unsampled = spec_problems(records, settings)
        if refused or unsampled or record.stop or record.sampling or record.openai:
            return None
        took = apply_openai_defaults(records, self._defaults,
                                     run_temperature=settings.temperature,
                                     honours=self.path.honours)
        prepared = prepare_requests(records, tokenizer=self.columns.tokenizer,
                                    tokenizer_name=self.tokenizer_name,
                                    vocab_size=self.columns.vocab_size,
                                    max_model_len=settings.max_model_len,
                                    default_max_tokens=settings.max_tokens,
                                    longest_prompt_graph=self._graph)
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
                           _numbered(record, spec),
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
        self.columns.prepared_plain(positions, [o.prompt_len for o in alike],
                                    [o.max_tokens for o in alike], [o.clamped for o in alike],
                                    sum(times for o, times in counts.items() if not o.own_prompt))
        at = np.asarray(positions, dtype=np.int64)
        np.frombuffer(self.ok, dtype=np.uint8)[at] = 1
        self.known.extend(array("i", [o.known for o in alike]))
        self.longest_request = max(self.longest_request,
                                   *(o.prompt_len + o.max_tokens for o in counts))
        self.longest_prompt = max(self.longest_prompt, *(o.prompt_len for o in counts))
        self.took_defaults += sum(o.took * times for o, times in counts.items())
        self.bound = None       # (a trace's synthetic tokens: not made here)
        if self.rows is not None:
            self.rows.write(_rows(positions[0], alike, rows.read_order - rows.position,
                                  self.settings.seed))
            self._alike.update(counts)
            if self.numbered_rows is not None:
                self.numbered_rows += bytes([o.numbered for o in alike])

    def _took_run(self, rows: PlainRows, after: int, slots: Any, pairs: _Pairs) -> None:
        """`_took` of a run of a block's rows from its `after`th, each with the outcome
        `slots` numbers in `pairs`: each column's values picked from the outcomes' by numpy."""
        import numpy as np

        first_at = rows.position + after
        at = cast(Sequence[int], np.arange(first_at, first_at + len(slots), dtype=np.int64))
        self.columns.prepared_plain(at, pairs.prompt_len[slots].tolist(),
                                    pairs.max_tokens[slots].tolist(),
                                    pairs.clamped[slots].tolist(),
                                    int(np.count_nonzero(pairs.not_own[slots])))
        np.frombuffer(self.ok, dtype=np.uint8)[first_at:first_at + len(slots)] = 1
        self.known.frombytes(pairs.known[slots].tobytes())
        self.longest_request = max(self.longest_request,
                                   int(pairs.request_len[slots].max()))
        self.longest_prompt = max(self.longest_prompt, int(pairs.prompt_len[slots].max()))
        self.took_defaults += int(pairs.took[slots].sum())
        self.bound = None       # (a trace's synthetic tokens: not made here)
        if self.rows is not None:
            self.rows.write(_rows(first_at, pairs.objects[slots].tolist(),
                                  rows.read_order - rows.position, self.settings.seed))
            pairs.times += np.bincount(slots, minlength=len(pairs.times))
            if self.numbered_rows is not None:
                self.numbered_rows += pairs.numbered[slots].tobytes()


#: `_Pairs.slots` of a pair not known yet, and of one whose rows are checked record by record.
_NEW, _ALONE = -2, -1


class _Pairs:
    """`Scan._outcomes` as arrays: each pair's key (its counts as one int64, both below
    2**31: the readers' counts are below 10**9) in order, its slot (its outcome's number in
    `outcomes`, in the order they were made; _ALONE: none), and what each outcome gives its
    rows, picked by slot; `times`: the rows of each taken since `Scan._settle`."""

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
#: Pairs of counts whose outcome `Scan._plain` keeps (past them it starts again).
_OUTCOMES = 1 << 14


@dataclass(eq=False, slots=True)
class _Outcome:
    """A plain row's check (`Scan._outcome`): the request standing for its pair's rows, its
    spec, the OpenAI defaults it took, its row's JSON but for its id and seed."""

    request: Any
    spec: dict[str, Any]
    took: int
    head: str               # (the row's JSON after the id's digits, up to its seed)
    post: str               # (and after the seed, to the line's end)
    rest: str               # (after the id's digits, where its seed is null: not `seeded`)
    seeded: bool            # its seed is the run's --seed plus its position
    numbered: int           # `_numbered`
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


def _numbered(record: PromptRecord, spec: dict[str, Any]) -> int:
    """What of a request's row a part's numbering wrote (`DEFAULT_ID`, `RUN_SEED`)."""
    own_seed = record.sampling is not None and "seed" in record.sampling
    return ((DEFAULT_ID if record.default_id else 0)
            | (RUN_SEED if spec["seed"] is not None and not own_seed else 0))


def longest_prompt_graph(settings: RunSettings) -> tuple[int, str] | None:
    """(the longest prompt the runtime's context-encoding graphs take, the flag that sets it)
    where that is below max_model_len (an optimum-neuron export's max_context_length), else
    None: the max_model_len check covers it."""
    shapes = settings.shapes()
    if shapes.longest_prompt >= settings.max_model_len:
        return None
    return shapes.longest_prompt, shapes.runtime.prefill.flag


def _sorted(values: array) -> Sequence[int]:
    import numpy as np

    # (in place, in the array's own buffer: a sorted copy was 4 bytes a request more at the
    # check's peak; nothing reads them in their order after)
    held = np.frombuffer(values, dtype=np.int32)
    held.sort()
    return cast(Sequence[int], held)


def model_source(settings: RunSettings, log) -> ModelSource:
    """The model, where its tokenizer comes from (loaded only once a record's prompt is text
    or messages: a token-count trace needs none, and loading one takes seconds), the
    tokenizer's name for the report, and the vocabulary size from its config.json (None: the
    tokenizer's)."""
    from neuron_batch.engine.models import ModelError, resolve_model

    try:
        model = resolve_model(settings.model, progress=log)
    except ModelError as error:
        raise RunError(str(error)) from None
    source = model if model.has_tokenizer else None
    tokenizer_name = model.name if source is not None else None
    if source is None and settings.simulated:
        # The simulated device needs no weights, but text must still become tokens: use the
        # built-in model's tokenizer and say so in the report.
        builtin = resolve_model(None, progress=log)
        source = builtin
        tokenizer_name = f"{builtin.name} (built-in, standing in for {model.name})"
    return ModelSource(model, source, tokenizer_name, _vocab_size(model.path))


def _vocab_size(model_path: str) -> int | None:
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
        return int(config["vocab_size"])
    except (OSError, KeyError, ValueError):
        return None
