"""A job's records as compact columns (`JobColumns`): what each needs to be found and run again
(its input, byte offset or row, line, the digest of its bytes, id, run index, prompt length,
max_tokens), kept by the check before the run (job/check.py), read by `JobRequests`
(job_requests.py). Pure logic.

Memory is what sets how big a job fits (issue 46: 10M requests on one host), so a column keeps
what its values do not already say:
- a line number, an input's number and a record's reading order mostly go up by a fixed step
  from one record to the next: kept as their runs (`Steps`), a few bytes a job, not 4 a record;
- a job run as read (no --shuffle, no --limit) numbers its records by their position: its index
  and the run's positions are `range`s;
- an id that is its default (the record's reading order: a trace without ids) is not stored;
- lengths start at 2 bytes and widen to 4 only when a value needs it (offsets: 4, then 8).
About 18 bytes a record for a token-count trace (44 before), plus the id of a record that
gives one.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from typing import Any, overload

from neuron_batch.inputs.plain_rows import PlainRows
from neuron_batch.inputs.prepare import PreparedRequest
from neuron_batch.inputs.prompt_records import InputChanged, InputReader, PromptRecord
from neuron_batch.inputs.request_paths import asks

#: `JobColumns.asks` bits: what the report says of the requests (job_requests.py job_figures).
OPENAI, CONSTRAINED, LOGPROBS = 1, 2, 4


class Steps(Sequence[int]):
    """Integers appended one at a time that mostly go up by `step` from one to the next, kept
    as runs (where each starts, its first value): a file's line numbers (step 1, a run a blank
    or bad line) or an input's number (step 0, a run an input). Where runs come more often
    than one in DENSE values (a file of blank lines between lines), it keeps every value
    instead: never more than a plain array's 4 bytes a value, and 8 past 2**31."""

    DENSE = 4

    def __init__(self, step: int):
        self.step = step
        self._starts = array("q")
        self._firsts = array("q")
        self._dense: array | None = None
        self._count = 0
        self._last = 0

    def append(self, value: int) -> None:
        if self._dense is not None:
            self._dense = _appended(self._dense, value)
        elif not self._count or value != self._last + self.step:
            self._starts.append(self._count)
            self._firsts.append(value)
            if len(self._starts) > 64 and len(self._starts) * self.DENSE > self._count:
                dense = array("i")
                for position in range(self._count):
                    dense = _appended(dense, self[position])
                self._dense = _appended(dense, value)
                self._starts, self._firsts = array("q"), array("q")
        self._last = value
        self._count += 1

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> list[int]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError("Steps index out of range")
        if self._dense is not None:
            return self._dense[i]
        run = bisect_right(self._starts, i) - 1
        return self._firsts[run] + self.step * (i - self._starts[run])

    def take(self, positions: Sequence[int]) -> list[int]:
        """The values at `positions`: a window of consecutive ones (a `range`, a job run as
        read) run by run, anything else one at a time."""
        if self._dense is not None:
            dense = self._dense
            return [dense[p] for p in positions]
        if not isinstance(positions, range) or positions.step != 1 or not positions:
            return [self[p] for p in positions]
        if positions.start < 0 or positions.stop > self._count:
            raise IndexError("Steps index out of range")
        out: list[int] = []
        starts, firsts, step = self._starts, self._firsts, self.step
        run = bisect_right(starts, positions.start) - 1
        at = positions.start
        while at < positions.stop:
            end = min(starts[run + 1] if run + 1 < len(starts) else self._count, positions.stop)
            first = firsts[run] + step * (at - starts[run])
            out.extend(range(first, first + step * (end - at), step) if step
                       else [first] * (end - at))
            at, run = end, run + 1
        return out

    def extend(self, values: Sequence[int]) -> None:
        """`values` appended, a run at a time (a block of a trace's rows: inputs/plain_rows.py)."""
        if self._dense is not None or len(values) < 2:
            for value in values:
                self.append(value)
            return
        import numpy as np

        held = np.asarray(values, dtype=np.int64)
        starts = [0, *(np.flatnonzero(np.diff(held) != self.step) + 1).tolist(), len(held)]
        for start, end in zip(starts, starts[1:]):
            self._append_run(int(held[start]), end - start)

    def extend_shifted(self, other: Steps, shift: int) -> None:
        """`other`'s values, each plus `shift`, after these: run by run."""
        if self._dense is None and other._dense is None:
            for run, (start, first) in enumerate(zip(other._starts, other._firsts)):
                end = other._starts[run + 1] if run + 1 < len(other._starts) else len(other)
                self._append_run(first + shift, end - start)
            return
        for value in other.take(range(len(other))):
            self.append(value + shift)

    def _append_run(self, first: int, length: int) -> None:
        """`length` values from `first` on, `step` apart: the first appended (a run of its
        own where it breaks one), the rest added to the run it is in."""
        self.append(first)
        if self._dense is not None:     # (that append made it dense)
            for k in range(1, length):
                self.append(first + self.step * k)
        elif length > 1:
            self._count += length - 1
            self._last = first + self.step * (length - 1)

    @property
    def runs(self) -> int:
        """Runs kept (0 once dense): what a test of its size looks at."""
        return len(self._starts)


def _as_read(record: PromptRecord, position: int, index: int) -> None:
    """A record read again before the check numbered the job: nothing more to give it."""


def _joined(values: array, more: array) -> array:
    """`values` then `more`, in the wider of their two sizes."""
    if more.itemsize > values.itemsize:
        values = array(more.typecode, values)
    elif more.typecode != values.typecode:
        more = array(values.typecode, more)
    values.extend(more)
    return values


def _appended(values: array, value: int) -> array:
    """`values` with `value` appended, widened first where it does not fit (`widened`)."""
    try:
        values.append(value)
        return values
    except OverflowError:
        return widened(values, value)


def _stored(values: array, position: int, value: int) -> array:
    """`values` with `value` at `position`, widened first where it does not fit."""
    try:
        values[position] = value
        return values
    except OverflowError:
        wide = array("i" if values.typecode == "H" else "q", values)
        wide[position] = value
        return wide


def widened(values: array, value: int) -> array:
    """`values` one size up (2 -> 4 -> 8 bytes), `value` appended: a column whose next value
    does not fit (a file offset past 4 GiB, ids past 4 GB, a line past 2**31)."""
    wide = array("q" if values.itemsize >= 4 else "i", values)
    return _appended(wide, value)


class JobColumns:
    """Every record the check numbered (by its position), as columns; and the inputs."""

    def __init__(self, readers: Sequence[InputReader]):
        self.readers = list(readers)
        self.stamps = [reader.stamp() for reader in self.readers]
        self.src = Steps(0)
        self.where = array("I")     # (4 bytes each while they fit, 8 past that: `widened`)
        self.line = Steps(1)
        self.read_order = Steps(1)  # (what a default id is: PromptRecord.id)
        self.digest = array("I")
        # the run's index (after --shuffle, --limit; -1 none) once `number` gave it; `indexed`
        # indices were given, 0 to indexed - 1
        self.index: Sequence[int] = range(0)
        self.indexed = 0
        self.prompt_len = array("H")
        self.max_tokens = array("H")
        self.clamped = bytearray()
        # what the report says of the requests (`job_figures`), kept as the check reads them
        # so that the report does not read the job again: OPENAI | CONSTRAINED | LOGPROBS,
        # and n where a request asks for more than one sample
        self.asks = bytearray()
        self.samples: dict[int, int] = {}
        # records whose prompt is not a token count's own synthetic tokens (text, token ids,
        # Mooncake block ids, a named prefix): none, and the job's prompts share nothing
        # whatever their number (`own_prompts`), which the prefix bound need not walk
        self.not_own = 0
        # ids given by the lines, end to end; None while every id so far is its default
        self._id_bytes = bytearray()
        self._id_ends: array | None = None
        # made by the caller: what numbering gives a record read again (its default id and
        # max_tokens, the OpenAI defaults) at (position, index)
        self.finish: Callable[[PromptRecord, int, int], None] = _as_read
        self.tokenizer: Any = None
        self.tokenizer_name: str | None = None
        self.vocab_size = 32_000

    def add(self, src: int, where: int, line: int, digest: int, record_id: str | None,
            read_order: int) -> None:
        """The next position's record, as scanned (`read_order`: PromptRecord.read_order;
        `record_id` None where its id is the default, str(read_order))."""
        position = len(self.digest)
        self.src.append(src)
        self.where = _appended(self.where, where)
        self.line.append(line)
        self.read_order.append(read_order)
        self.digest.append(digest & 0xFFFFFFFF)
        self.prompt_len.append(0)
        self.max_tokens.append(0)
        self.clamped.append(0)
        self.asks.append(0)
        if self._id_ends is None:
            if record_id is None:
                return
            self._id_ends = array("I", [0]) * position     # (every one before: its default)
        if record_id is not None:
            self._id_bytes += record_id.encode("utf-8", "surrogatepass")
        self._id_ends = _appended(self._id_ends, len(self._id_bytes))

    def add_plain(self, src: int, rows: PlainRows) -> None:
        """A block of plain rows (inputs/plain_rows.py), as `add` adds each: their ids their
        default ones, nothing prepared yet (`prepared_plain`)."""
        count = len(rows)
        self.src.extend([src] * count)
        if len(self.where) and self.where.typecode == "I" and max(rows.where) >= 1 << 32:
            self.where = widened(self.where, rows.where[0])
            self.where.pop()
        self.where.extend(array(self.where.typecode, rows.where))
        self.line.extend(rows.line)
        self.read_order.extend(range(rows.read_order, rows.read_order + count))
        self.digest.extend(rows.digest)
        for column in (self.prompt_len, self.max_tokens):
            column.frombytes(bytes(count * column.itemsize))
        self.clamped += bytes(count)
        self.asks += bytes(count)
        if self._id_ends is not None:
            self._id_ends = _joined(self._id_ends, array("I", [len(self._id_bytes)]) * count)

    def prepared_plain(self, positions: Sequence[int], prompt_len: Sequence[int],
                       max_tokens: Sequence[int], clamped: Sequence[int], not_own: int) -> None:
        """`prepared` for plain rows (inputs/plain_rows.py) at `positions`: their requests'
        lengths and clamps; `not_own` of them not their own synthetic prompts. (Such a row
        asks nothing the report counts: no OpenAI line, no sampling fields.)"""
        import numpy as np

        at = np.asarray(positions, dtype=np.int64)
        for name, values in (("prompt_len", prompt_len), ("max_tokens", max_tokens)):
            column = getattr(self, name)
            top = max(values, default=0)
            if top > np.iinfo(np.dtype(column.typecode)).max:     # (widened first)
                column = widened(column, top)
                column.pop()
                setattr(self, name, column)
            np.frombuffer(column, dtype=column.typecode)[at] = values
        np.frombuffer(self.clamped, dtype=np.uint8)[at] = clamped
        self.not_own += not_own

    def extend(self, part: JobColumns, items: int, lines: int) -> None:
        """`part`'s records after these (a part of a check split across processes,
        job/check_parts.py, numbered from its own start): its reading order shifted by
        `items` (the items read before it), its lines by `lines` where it comes from the
        same input as the last record here."""
        count = len(self)
        self.src.extend_shifted(part.src, 0)
        self.where = _joined(self.where, part.where)
        self.line.extend_shifted(part.line, lines)
        self.read_order.extend_shifted(part.read_order, items)
        self.digest.extend(part.digest)
        self.prompt_len = _joined(self.prompt_len, part.prompt_len)
        self.max_tokens = _joined(self.max_tokens, part.max_tokens)
        self.clamped += part.clamped
        self.asks += part.asks
        self.samples.update((count + position, n) for position, n in part.samples.items())
        self.not_own += part.not_own
        if part._id_ends is not None:
            if self._id_ends is None:
                self._id_ends = array("I", [0]) * count
            base = len(self._id_bytes)
            self._id_bytes += part._id_bytes
            top = base + (part._id_ends[-1] if len(part._id_ends) else 0)
            self._id_ends = _joined(self._id_ends, array(
                "I" if top < 1 << 32 else "q", (base + end for end in part._id_ends)))
        elif self._id_ends is not None:
            self._id_ends = _joined(self._id_ends, array("I", [len(self._id_bytes)]) * len(part))

    def prepared(self, position: int, request: PreparedRequest) -> None:
        """The check's request at `position`: its lengths, and what the report counts of it."""
        self.prompt_len = _stored(self.prompt_len, position, request.prompt_len)
        self.max_tokens = _stored(self.max_tokens, position, request.max_tokens)
        self.clamped[position] = request.max_tokens_clamped
        constrained, n, logprobs = asks(request.record)
        self.asks[position] = ((OPENAI if request.record.openai is not None else 0)
                               | (CONSTRAINED if constrained else 0)
                               | (LOGPROBS if logprobs else 0))
        if n > 1:
            self.samples[position] = n
        self.not_own += not request.own_prompt

    def number(self, order: Iterable[int] | None, ok: bytearray) -> Sequence[int]:
        """Give the records their run index in `order` (positions; None: all, as read), and
        return the positions that run (`ok`), in that order: `range`s for a job run as read."""
        count = len(self)
        if order is None:
            self.index, self.indexed = range(count), count
            if ok.count(0) == 0:
                return range(count)
            return array("i", (position for position in range(count) if ok[position]))
        index = array("i", [-1]) * count
        positions = array("i")
        indexed = 0
        for indexed, position in enumerate(order, 1):
            index[position] = indexed - 1
            if ok[position]:
                positions.append(position)
        self.index, self.indexed = index, indexed
        return positions

    def __len__(self) -> int:
        return len(self.digest)

    def id_of(self, position: int) -> str:
        ends = self._id_ends
        if ends is not None:
            start = ends[position - 1] if position else 0
            if ends[position] > start:
                return self._id_bytes[start:ends[position]].decode("utf-8", "surrogatepass")
        return str(self.read_order[position])

    def taken(self, name: str, positions: Sequence[int]) -> array:
        """Column `name` ("prompt_len", "max_tokens") at `positions`, as 4-byte integers: at
        once, over the array (a value at a time was ~0.3 s a million)."""
        import numpy as np

        column = getattr(self, name)
        values = np.frombuffer(column, dtype=column.typecode)
        if isinstance(positions, range) and positions.step == 1:
            picked = values[positions.start:positions.stop]
        else:
            picked = values[np.asarray(positions, dtype=np.int64)]
        return array("i", picked.astype(np.int32).tobytes())

    def ids_of(self, positions: Sequence[int]) -> list[str]:
        """`id_of` each of `positions`: a job whose every id is its default, from its reading
        order's runs (a call an id was ~1 s a million)."""
        if self._id_ends is None:
            return list(map(str, self.read_order.take(positions)))
        return [self.id_of(p) for p in positions]

    def check_stamps(self) -> None:
        for reader, stamp in zip(self.readers, self.stamps):
            now = reader.stamp()
            if now != stamp:
                raise InputChanged(
                    f"{getattr(reader, 'label', reader)}: the input changed while the job ran "
                    f"(its size or modification time is not what the check before the run "
                    f"read): stopped before running a request nobody checked")
