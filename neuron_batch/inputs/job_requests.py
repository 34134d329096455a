"""A job's requests without the job in memory: what each request needs to be found and run
again in compact columns (job_columns.py `JobColumns`, ~18 bytes a request of a token-count
trace); the records themselves read again from their inputs a window at a time, as the engine
takes them (`JobRequests`, a Sequence of `PreparedRequest`s made as they are reached), their
text tokenized a window at a time.

The check before the run (job/check.py) reads every input once, keeping no prompt. What it
read is what runs: each input's size and time, and each line's digest, are compared as the
line is read again; a difference stops the run (`InputChanged`), naming the input and line,
before a request nobody checked reaches the engine.
"""

from __future__ import annotations

import queue
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, cast, overload

from neuron_batch.inputs.job_columns import CONSTRAINED, LOGPROBS, OPENAI, JobColumns
from neuron_batch.inputs.prepare import (
    TEXT_BATCH,
    PreparedRequest,
    SyntheticTokens,
    synthetic_tokens,
)
from neuron_batch.inputs.prompt_records import InputChanged, InputProblem
from neuron_batch.inputs.request_paths import asked_in, asks


class DoneSet(Protocol):
    """What `pending_of` asks of the requests done (job/done.py `DoneRequests`, a stage
    above: named here by what it does)."""

    @property
    def by_id(self) -> bool: ...

    @property
    def bits(self) -> bytes | bytearray: ...

    def has(self, index: int | None, request_id: str | None = None) -> bool: ...

#: Requests read again at once: their lines are read in file order, their texts tokenized in
#: batches of TEXT_BATCH.
WINDOW = 1024


class JobRequests(Sequence[PreparedRequest]):
    """The job's requests in run order (`positions` into `JobColumns`), made as they are
    reached: iterating reads WINDOW of them at a time from their inputs."""

    def __init__(self, columns: JobColumns, positions: Sequence[int]):
        self.columns = columns
        self.positions = positions      # (an array, or a range: a job run as read)

    def __len__(self) -> int:
        return len(self.positions)

    @overload
    def __getitem__(self, i: int) -> PreparedRequest: ...

    @overload
    def __getitem__(self, i: slice) -> JobRequests: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return JobRequests(self.columns, self.positions[i])
        return self._read(self.positions[i:i + 1] if i != -1 else self.positions[-1:])[0]

    def __iter__(self) -> Iterator[PreparedRequest]:
        for start in range(0, len(self.positions), WINDOW):
            yield from self._read(self.positions[start:start + WINDOW])

    def windows(self) -> Iterator[list[PreparedRequest]]:
        """The requests WINDOW at a time, each window's text tokenized (what the engine takes
        next, made whole: `ReadAhead` makes them on a thread of its own)."""
        for start in range(0, len(self.positions), WINDOW):
            made = self._read(self.positions[start:start + WINDOW])
            for window in {id(r.window): r.window for r in made if r.window is not None}.values():
                window.tokenize()
            yield made

    # Views, from the arrays alone (nothing read)

    def ids(self) -> Sequence[str]:
        return _Ids(self.columns, self.positions)

    def ids_by_index(self) -> Sequence[str | None]:
        """The ids at their index in the job (None where a line was left out), each decoded as
        it is asked for (a list of 10M ids would take ~700 MB)."""
        return _IdsByIndex(self.columns, self.positions)

    def prompt_lengths(self) -> array:
        """Every prompt's length, from the arrays (4 bytes each)."""
        return self.columns.taken("prompt_len", self.positions)

    def request_lengths(self) -> array:
        """Every request's prompt + max_tokens (`PreparedRequest.length`), from the arrays."""
        prompts, outputs = (self.columns.taken(name, self.positions)
                            for name in ("prompt_len", "max_tokens"))
        import numpy as np

        both = np.frombuffer(prompts, dtype=np.int32) + np.frombuffer(outputs, dtype=np.int32)
        return array("i", both.tobytes())

    def own_prompts(self) -> tuple[SyntheticTokens, int] | None:
        """(their maker, the highest request index) where every prompt is its own synthetic
        tokens (`PreparedRequest.own_prompt`), from the arrays; None where one is not."""
        columns = self.columns
        if columns.not_own or not len(self.positions):
            return None
        return synthetic_tokens(columns.vocab_size), columns.indexed - 1

    def where(self, keep: Callable[[int], bool]) -> JobRequests:
        """The requests whose position (in `columns`) `keep` keeps, in this order."""
        return JobRequests(self.columns, array("i", (p for p in self.positions if keep(p))))

    def where_done(self, bits: bytes | bytearray, want: bool) -> JobRequests:
        """The requests whose index's bit in `bits` (job/done.py: bit i of byte i // 8) is
        `want`, in this order; itself where that is all of them (a fresh run's pending). Over
        arrays: a call a request was ~1 s a million before a run's first step."""
        import numpy as np

        positions = np.asarray(self.positions, dtype=np.int64)
        index = self.columns.index
        at = positions if isinstance(index, range) else np.asarray(index, dtype=np.int64)[
            positions]
        flags = np.unpackbits(np.frombuffer(bytes(bits), dtype=np.uint8), bitorder="little")
        finished: np.ndarray = np.zeros(len(at), dtype=bool)
        inside = (at >= 0) & (at < len(flags))
        finished[inside] = flags[at[inside]].astype(bool)
        keep = finished if want else ~finished
        if keep.all():
            return self
        return JobRequests(self.columns, array("i", positions[keep].astype(np.int32).tobytes()))

    def longest_first(self) -> JobRequests:
        """--order length: prompt + max_tokens, longest first, ties in this order."""
        columns = self.columns
        return JobRequests(columns, array("i", sorted(
            self.positions, key=lambda p: -(columns.prompt_len[p] + columns.max_tokens[p]))))

    def reordered(self, order: Iterable[int]) -> JobRequests:
        """These requests in `order` (indices into this sequence)."""
        return JobRequests(self.columns, array("i", (self.positions[i] for i in order)))

    # Reading again

    def _read(self, positions: Sequence[int]) -> list[PreparedRequest]:
        columns = self.columns
        columns.check_stamps()
        srcs, lines = columns.src.take(positions), columns.line.take(positions)
        wheres = [columns.where[p] for p in positions]
        # Each input's lines in file order (a seek only where lines are not consecutive).
        by_place = sorted(range(len(positions)), key=lambda k: (srcs[k], wheres[k]))
        made: list[PreparedRequest | None] = [None] * len(positions)
        window = _Window(columns)
        k = 0
        while k < len(by_place):
            src = srcs[by_place[k]]
            group = []
            while k < len(by_place) and srcs[by_place[k]] == src:
                group.append(by_place[k])
                k += 1
            spots = [(wheres[j], lines[j]) for j in group]
            for j, (digest, item) in zip(group, columns.readers[src].read(spots)):
                made[j] = self._request(positions[j], digest, item, window)
        return cast(list[PreparedRequest], made)     # (every one made above)

    def _request(self, position: int, digest: int, item, window: _Window) -> PreparedRequest:
        columns = self.columns
        if (digest & 0xFFFFFFFF) != columns.digest[position] or item is None or isinstance(
                item, InputProblem):
            reader = columns.readers[columns.src[position]]
            where = f"{getattr(reader, 'label', reader)}:{columns.line[position]}"
            raise InputChanged(f"{where}: the input changed while the job ran (this line is not "
                               f"what the check before the run read): stopped before running "
                               f"a request nobody checked")
        record, _ = item
        columns.finish(record, position, columns.index[position])
        prompt_len = columns.prompt_len[position]
        request = PreparedRequest(record, record.prompt_token_ids, columns.max_tokens[position],
                                  bool(columns.clamped[position]), None, prompt_len)
        if record.prompt_len is not None:
            request.synthetic = synthetic_tokens(columns.vocab_size)
        elif record.prompt_token_ids is None:
            window.add(request)
        return request


#: Windows a `ReadAhead` makes before the engine asks for them.
AHEAD = 2
_END = object()


class ReadAhead(Iterator[PreparedRequest]):
    """A job's requests in order, read from their inputs and their text tokenized on a thread
    of its own, at most AHEAD windows ahead of the caller: a fast tokenizer's batch encoding
    lets go of the GIL, so the next windows' tokens are made on another core while the engine
    steps (inline, a window's tokens were made between two of its steps). What goes wrong in a
    window (the input changed) is raised where the caller reaches it; what came before it was
    handed over. `close` stops the thread (a run that ends early)."""

    def __init__(self, requests: JobRequests, depth: int = AHEAD):
        self._made: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._current: Iterator[PreparedRequest] = iter(())
        self._thread = threading.Thread(target=self._make, args=(requests,),
                                        name="neuron-batch-read-ahead", daemon=True)
        self._thread.start()

    def _make(self, requests: JobRequests) -> None:
        try:
            for window in requests.windows():
                if not self._hand(window):
                    return
        except BaseException as error:      # (raised in the caller's thread, in its place)
            self._hand(error)
            return
        self._hand(_END)

    def _hand(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._made.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def __next__(self) -> PreparedRequest:
        while True:
            request = next(self._current, None)
            if request is not None:
                return request
            item = self._made.get()
            if item is _END:
                self._made.put(_END)        # (asked again: still the end)
                raise StopIteration
            if isinstance(item, BaseException):
                raise item
            self._current = iter(item)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def read_ahead(requests: Sequence[PreparedRequest]) -> Iterator[PreparedRequest]:
    """`requests` in order, for an engine to take one by one: a streamed job whose prompts are
    text, read and tokenized ahead on a thread (`ReadAhead`); anything else as it iterates
    (a token-count job's reading is Python's own work, which a thread would only share the
    GIL with)."""
    if isinstance(requests, JobRequests) and requests.columns.tokenizer is not None:
        return ReadAhead(requests)
    return iter(requests)


def close_reading(requests: Iterator[PreparedRequest]) -> None:
    """Stop what `read_ahead` started (nothing, for a plain iterator)."""
    if isinstance(requests, ReadAhead):
        requests.close()


class _Window:
    """The text prompts of one window, tokenized together when the first of them is asked
    for (`PreparedRequest.prompt_token_ids`): a pass that does not look at tokens (ids, the
    sampling asked) tokenizes nothing."""

    def __init__(self, columns: JobColumns):
        self.columns = columns
        self.waiting: list[PreparedRequest] = []

    def add(self, request: PreparedRequest) -> None:
        request.window = self
        self.waiting.append(request)

    def tokenize(self) -> None:
        from neuron_batch.inputs.prepare import batch_token_ids

        waiting, self.waiting = self.waiting, []
        tokenizer = self.columns.tokenizer
        for start in range(0, len(waiting), TEXT_BATCH):
            batch = waiting[start:start + TEXT_BATCH]
            for request, ids in zip(batch, batch_token_ids([r.record for r in batch], tokenizer,
                                                           self.columns.tokenizer_name)):
                request.token_ids = array("I", ids)
                request.window = None
                if len(ids) != request.prompt_len:
                    raise InputChanged(f"{request.record.source}: the input changed while the "
                                       f"job ran ({len(ids):,} prompt tokens now, "
                                       f"{request.prompt_len:,} when checked)")


class _Ids(Sequence[str]):
    """A job's ids in order, each decoded from the arrays as it is asked for."""

    def __init__(self, columns: JobColumns, positions: Sequence[int]):
        self._columns, self._positions = columns, positions

    def __len__(self) -> int:
        return len(self._positions)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._columns.id_of(p) for p in self._positions[i]]
        return self._columns.id_of(self._positions[i])

    def __iter__(self) -> Iterator[str]:
        positions, columns = self._positions, self._columns
        for start in range(0, len(positions), _IDS_AT_ONCE):   # (a batch at a time)
            yield from columns.ids_of(positions[start:start + _IDS_AT_ONCE])


#: Ids `_Ids` decodes at once.
_IDS_AT_ONCE = 65536


class _IdsByIndex(Sequence[str | None]):
    """A job's ids by their index in the job: a position a slot (4 bytes; -1 where a line was
    left out; none for a job run as read, whose index is its position), the id decoded from the
    arrays as it is asked for."""

    def __init__(self, columns: JobColumns, positions: Sequence[int]):
        self._columns = columns
        self._at: Sequence[int]
        if isinstance(positions, range) and columns.index == positions:
            self._at = positions    # (a job run as read: each at its own position)
            return
        size = max((columns.index[p] for p in positions), default=-1) + 1
        at = array("i", [-1]) * size
        for p in positions:
            at[columns.index[p]] = p
        self._at = at

    def __len__(self) -> int:
        return len(self._at)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        position = self._at[i]
        return None if position < 0 else self._columns.id_of(position)


@dataclass
class JobFigures:
    """What the report says of a job's requests as they were read: whether any is an OpenAI
    batch line, how many had max_tokens cut to fit max_model_len (and to what), and what they
    asked beyond their tokens (request_paths.asked_in)."""

    openai: bool
    clamped: list[int]      # the max_tokens of each request cut (its min and max are said)
    asked: dict[str, int] | None


def job_figures(requests: Sequence[PreparedRequest]) -> JobFigures:
    """`JobFigures` of `requests`: from a `JobRequests`' arrays (the job not read again: three
    passes over the inputs were most of the report's time), else from the requests."""
    if isinstance(requests, JobRequests):
        columns, positions = requests.columns, requests.positions
        flags = columns.asks    # (read by position as they go: no list a request long)
        return JobFigures(
            openai=any(flags[p] & OPENAI for p in positions),
            clamped=[columns.max_tokens[p] for p in positions if columns.clamped[p]],
            asked=asked_in((bool(flags[p] & CONSTRAINED), columns.samples.get(p, 1),
                            bool(flags[p] & LOGPROBS)) for p in positions))
    return JobFigures(openai=any(r.record.openai is not None for r in requests),
                      clamped=[r.max_tokens for r in requests if r.max_tokens_clamped],
                      asked=asked_in(asks(r.record) for r in requests))


def done_of(requests: Sequence[PreparedRequest], done: DoneSet,
            ) -> Sequence[PreparedRequest]:
    """The requests `done` has, in order (a `JobRequests`' view: nothing read)."""
    return _where_done(requests, done, True)


def pending_of(requests: Sequence[PreparedRequest], done: DoneSet
               ) -> Sequence[PreparedRequest]:
    """The requests `done` lacks, in order: a view of a `JobRequests` (nothing read), a list
    of anything else."""
    return _where_done(requests, done, False)


def _where_done(requests: Sequence[PreparedRequest], done: DoneSet, want: bool
                ) -> Sequence[PreparedRequest]:
    if isinstance(requests, JobRequests):
        if not done.by_id:      # (by index alone: the bits against the job's indices)
            return requests.where_done(done.bits, want)
        columns = requests.columns
        by_id = done.by_id      # (the ids decoded only where some done line has no index)
        return requests.where(lambda p: done.has(
            columns.index[p] if columns.index[p] >= 0 else None,
            columns.id_of(p) if by_id else None) == want)
    return [r for r in requests if done.has(r.record.index, r.record.id) == want]


def ids_by_index(requests: Sequence[PreparedRequest]) -> Sequence[str | None]:
    """The job's request ids at their index in the job (`PromptRecord.index`; None where a
    line was left out): how outputs.index names a request (job/folder.py `load_done`)."""
    if isinstance(requests, JobRequests):   # (a streamed job's, from its arrays)
        return requests.ids_by_index()
    ids: list[str | None] = [None] * (max((r.record.index for r in requests), default=-1) + 1)
    for request in requests:
        ids[request.record.index] = request.record.id
    return ids


def lengths_of(requests: Sequence[PreparedRequest]) -> tuple[Sequence[int], Sequence[int]]:
    """(prompt lengths, max_tokens) of the requests, in order: a `JobRequests`' from its
    arrays (a layout weighs many cuts of a job: reading it again for each took a pass each)."""
    if isinstance(requests, JobRequests):
        columns, positions = requests.columns, requests.positions
        return columns.taken("prompt_len", positions), columns.taken("max_tokens", positions)
    return [r.prompt_len for r in requests], [r.max_tokens for r in requests]


def split_by_length(requests: Sequence[PreparedRequest], cut: int
                    ) -> tuple[Sequence[PreparedRequest], Sequence[PreparedRequest]]:
    """(the requests whose prompt + max_tokens is at most `cut`, the rest), each in order:
    views of a `JobRequests` (nothing read, nothing held but positions), lists otherwise."""
    if isinstance(requests, JobRequests):
        columns = requests.columns

        def short(p: int) -> bool:
            return columns.prompt_len[p] + columns.max_tokens[p] <= cut

        return requests.where(short), requests.where(lambda p: not short(p))
    return [r for r in requests if r.length <= cut], [r for r in requests if r.length > cut]


def over_length(requests: Sequence[PreparedRequest], limit: int) -> Sequence[PreparedRequest]:
    """The requests that reach past `limit` tokens (prompt + max_tokens) or whose max_tokens
    the check cut to fit: a `JobRequests`' view (only those read when walked)."""
    if isinstance(requests, JobRequests):
        columns = requests.columns
        return requests.where(lambda p: bool(columns.clamped[p])
                              or columns.prompt_len[p] + columns.max_tokens[p] > limit)
    return [r for r in requests if r.max_tokens_clamped or r.length > limit]


def job_ids(requests: Sequence[PreparedRequest]) -> Sequence[str]:
    """The requests' ids in order, from a `JobRequests`' arrays (nothing read again)."""
    if isinstance(requests, JobRequests):
        return requests.ids()
    return [r.record.id for r in requests]
