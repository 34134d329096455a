"""How a split check's parts are handed out (job/check_parts.py): a part of an input in object
storage copied to a local file first, ahead of the hand-out, and each part's guess of the items
before it, counted as it is given out (`PartHand`)."""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from neuron_batch.inputs.csv_file import CsvInput
from neuron_batch.inputs.line_files import LineInput, count_items
from neuron_batch.inputs.load import ROW_READERS, CutReader
from neuron_batch.inputs.tables import DatasetInput


class Part(Protocol):
    """What the hand-out reads and sets of a part (check_parts.py `_Task`)."""

    reader: CutReader
    span: tuple[int, int]
    number: int
    base: tuple[int, int]      # (items, records) before the part, as guessed


class NoRoom(Exception):
    """No disk for a part of an object in storage (`PartHand`)."""


#: Bytes a read of a part of an object in storage (`copied`), and an object's part at most
#: (its copy is on disk from a little before the part is given out until it is taken: at most
#: three parts a process); threads that copy at most (one stream of S3 gives ~100 MB/s: a
#: 32-core host checks a trace faster than one stream feeds it).
COPY_CHUNK = 64 << 20
MAX_COPIERS = 8


class PartHand:
    """What is done to each part as it is given out, in order, and once it is taken
    (`_in_order`); a context: its copies have ended when it exits.
    - A part of an input in object storage is read from a copy in `folder` (`copied`): the
      object is read once, a ranged read or a few a part, on up to `window` threads that keep
      `window` parts ahead of the hand-out (the disk they take: the parts given out and not
      taken, and `window` more), and the part is counted on this host. Read by the parts
      themselves, a trace's 10M lines in S3 (moto) took 1.8x the local file's check: the
      store's reads, and every part's rows rewritten for want of a count. A copy is removed
      once its part is taken.
    - `counting` (the rows are spooled): its `base`, its guess of the items (and records: as
      many) before it, the items of the parts given out before it, each counted as it is given
      out (`count_items`: a 164 MB trace's lines in 0.3 s)."""

    def __init__(self, folder: Path, tasks: Sequence[Part], *, counting: bool, window: int):
        self.folder, self.counting, self.before = folder, counting, 0
        # (a table's part reads its own rows where they lie: nothing to copy)
        remote = [task for task in tasks if in_storage(task.reader)
                  and not isinstance(task.reader, ROW_READERS)]
        self.copier = (ThreadPoolExecutor(min(window, MAX_COPIERS),
                                          thread_name_prefix="neuron-batch-copy")
                       if remote else None)
        self.copies: dict[int, tuple[Path, Future]] = {}    # id(task) -> its copy
        self.queued = iter(remote)
        for task in itertools.islice(self.queued, window):
            self._copy(task)

    def __enter__(self) -> PartHand:
        return self

    def __exit__(self, *_: object) -> None:
        if self.copier is not None:
            self.copier.shutdown(cancel_futures=True)   # (waits for the copies under way)

    def _copy(self, task: Part) -> None:
        from neuron_batch.storage.urls import suffix_of

        assert self.copier is not None and not isinstance(task.reader, ROW_READERS)
        local = self.folder / f"input-{task.number}-{task.span[0]}{suffix_of(task.reader.path)}"
        self.copies[id(task)] = (local, self.copier.submit(copied, task.reader, task.span,
                                                           local))

    def give(self, task: Part) -> None:
        made = self.copies.get(id(task))
        if made is not None:
            task.reader = made[1].result()
            for following in itertools.islice(self.queued, 1):
                self._copy(following)
        if self.counting:
            task.base = (self.before, self.before)
            reader, (start, end) = task.reader, task.span
            if isinstance(reader, ROW_READERS):     # (every row an item)
                self.before += end - start
                return
            path = reader.path
            last = end >= os.path.getsize(path)     # (to its end: a last line without "\n")
            self.before += count_items(path, start, None if last else end,
                                       header=isinstance(task.reader, CsvInput))[1]

    def taken(self, task: Part) -> None:
        made = self.copies.pop(id(task), None)
        if made is not None:
            made[0].unlink(missing_ok=True)


def copied(reader: LineInput | CsvInput, span: tuple[int, int], path: Path
            ) -> LineInput | CsvInput:
    """`reader` reading `path`, a copy of `span` of its object at the object's own offsets
    (the bytes before it a hole of a sparse file: no disk), so that the part's offsets, lines
    and problems are the object's, named by its URL (its label). Read a ranged GET of
    COPY_CHUNK at a time (fewer, longer reads: an s3fs file's read-ahead took 2.3x as long
    for a 164 MB trace in moto). A store's error is raised as one pass would raise it
    (storage/urls.py StorageError); any other OSError (a full disk, say) as `NoRoom`, on
    which one pass streams the object instead."""
    from neuron_batch.storage.urls import fetch_range

    start, end = span
    try:
        with open(path, "wb") as out:
            out.seek(start)
            for chunk in fetch_range(str(reader.path), start, end, COPY_CHUNK):
                out.write(chunk)
    except OSError as error:
        raise NoRoom(str(error)) from error
    copied = copy.copy(reader)
    copied.path = path
    return copied


def in_storage(reader: CutReader) -> bool:
    """Whether the input is an object in storage (a saved data set is a local folder)."""
    from neuron_batch.storage.urls import is_url

    return not isinstance(reader, DatasetInput) and is_url(str(reader.path))
