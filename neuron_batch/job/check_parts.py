"""The check before the run split across processes, one part of the inputs' bytes each (issue
48: a 10M-line file's check took minutes on one core; an inf2.8xlarge has 32 vCPUs).

A line file (JSON lines, an OpenAI batch file, a Mooncake trace, text) or a CSV is cut into
byte ranges at line starts (inputs/line_files.py `cut_spans`), each checked by `Scan` in a
process of its own exactly as one pass would check it, but numbered from its own start: its
lines, its reading order, its positions. The parts are joined in order, each shifted by the
ones before (job/part_join.py): the columns, the problems (their line and reading order), the
prompt lengths, what the job asks, its prefix bound, the ids' hashes. Request rows carry two numbers
a part cannot know, a default id (the reading order) and the run's seed for a request that
samples without one (--seed plus its position). A part writes them from a guess of the items
before it (`PartHand`: the lines of the parts before, counted as each is given out) and marks which
rows hold them; once the parts are joined, each part's rows are compressed in the same
processes, and those numbers rewritten only where the guess was wrong (a bad line before the
part, a CR-LF blank line: a row at a time, which took a 10M-line trace's check 7 s of CPU when
every part's rows were rewritten). A part of an input in object storage is copied to a local
file first, as it is given out, and checked and counted there: one ranged read a part.
A Parquet file or a saved data set is cut by rows instead (inputs/tables.py `spans`; an
object in storage only between row groups, each part's process reading its own groups where
they lie), its rows keeping their own numbers, its parts' items known exactly from the spans.

Only where it pays and changes nothing: a job without --limit (a --shuffle's order is made
from the joined columns, as after one pass) of about MIN_LINES lines or more, on a host with
more than one core; not a JSON array (one parse) or a data set streamed from the hub, nor
tables of integer token counts only (checked as blocks about as fast as the join), nor a
CSV where a row needs the one before (a quoted value over two lines: a part that meets one
gives the job back to one pass, `Uncut`; a TIMESTAMP column whose first row gives no time
zero).
`NEURON_BATCH_CHECK_PROCESSES` sets the processes (1: never split).

A part tokenizes plain text with the model's tokenizer.json in Rust (inputs/rust_tokenizer.py:
no transformers import, ~5 s and ~450 MB a process), and the parent compares a few texts of
each part with the transformers tokenizer it loads for the run, while the parts are checked;
where they differ the job is checked again in one pass. `NEURON_BATCH_PART_TOKENIZER=full`
loads the transformers tokenizer in every part, as before (to compare the two).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import closing, contextmanager
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from neuron_batch.errors import RunError
from neuron_batch.inputs.line_files import cut_spans
from neuron_batch.inputs.load import (
    CUT_READERS,
    ROW_READERS,
    CutReader,
    InputScan,
    prompt_token_count,
)
from neuron_batch.inputs.prompt_records import InputError
from neuron_batch.job import part_hand
from neuron_batch.job.check import ModelSource, Scan
from neuron_batch.job.part_hand import PartHand
from neuron_batch.job.part_join import Disagrees, Failed, Join, Part, raised
from neuron_batch.settings import RunSettings

#: Lines (estimated from each file's first HEAD bytes) below which one process checks the job:
#: the check takes ~15 us a line, a process of the pool about a second to start.
MIN_LINES = 200_000
#: Lines a part at least; and at most PARTS_A_PROCESS parts a process, for balance.
PART_LINES = 50_000
PARTS_A_PROCESS = 4
HEAD = 1 << 16
#: Items read at most to learn a JSON file's kind (its first object decides).
KIND_ITEMS = 1000


#: Processes at most by default: each holds ~70 MB (its imports), and past a few dozen the
#: parent's joining (~1.5 us a line), not the parts (token counts: 2-15 us a line), sets the
#: time.
MAX_PROCESSES = 32
#: ... where the job's prompts are text: a part's check is then its tokenizer's, ~150 us a
#: line, which the join keeps up with to about a hundred processes (each ~85 MB with its Rust
#: tokenizer: inputs/rust_tokenizer.py). An inf2.48xlarge has 192 vCPUs, a trn1.32xlarge 128.
MAX_TEXT_PROCESSES = 96


def processes(text: bool = False) -> int:
    """Processes a split check uses: NEURON_BATCH_CHECK_PROCESSES, else the cores this
    process may run on, at most MAX_PROCESSES (MAX_TEXT_PROCESSES for `text`)."""
    given = os.environ.get("NEURON_BATCH_CHECK_PROCESSES")
    if given:
        return max(1, int(given))
    return min(cores(), MAX_TEXT_PROCESSES if text else MAX_PROCESSES)


def cores() -> int:
    """The cores this process may run on: its affinity mask, within a container's quota."""
    count = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    return min(count, _cgroup_cpus() or count)


def _cgroup_cpus(path: str = "/sys/fs/cgroup/cpu.max") -> int | None:
    """The CPUs a container's quota allows (cgroup v2 `cpu.max`: "QUOTA PERIOD", or "max"),
    which the affinity mask does not show; None where there is no quota."""
    try:
        with open(path) as handle:
            quota, period = handle.read().split()[:2]
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


@dataclass
class _Task:
    settings: RunSettings
    model: ModelSource
    spool: bool
    block: int | None
    reader: CutReader
    spec: str
    number: int
    span: tuple[int, int]
    rows_path: Path | None
    base: tuple[int, int] = (0, 0)  # (items, records) before the part, as guessed


def read_in_parts(settings: RunSettings, model: ModelSource, inputs: InputScan, *,
                  spool: bool, block: int | None,
                  meanwhile: Callable[[], None] | None = None,
                  progress: Callable[[int], None] | None = None,
                  sizes: list[tuple[int, int]] | None = None) -> Scan | None:
    """The job checked in parts, one a process, joined (`Scan.read`'s result, as one pass
    would leave it); None where it is not split (module docstring). `meanwhile`: called once
    the first parts are given to the processes, while this one would only wait for them
    (job/generate.py `prefetch_vllm`). `progress`: told of each part's items as it is joined.
    `sizes`: `job_sizes`, where the caller read them already (the check's bar)."""
    from neuron_batch.storage.urls import is_url

    # (--shuffle: its order is made once the parts are joined, as after one pass; --limit
    # without it leaves the records past the limit unchecked, which a part cannot place)
    if (processes(text=True) < 2 or settings.limit is not None
            or not all(isinstance(r, CUT_READERS) for r in inputs.readers)):
        return None
    readers: list[CutReader] = list(inputs.readers)  # type: ignore[arg-type]
    if all(isinstance(reader, ROW_READERS) and reader.counts_only() for reader in readers):
        return None     # (1M Parquet trace rows: 1.7 s in one process, 2.7 s in two here)
    if sizes is None:
        sizes = [size_and_lines(reader) for reader in readers]
    total = sum(lines for _, lines in sizes)
    if total < MIN_LINES:
        return None
    looks = [_first_look(reader) for reader in readers]
    if None in looks or not all(reader.cuttable() for reader in readers):
        return None     # (a JSON array, a CSV whose rows need the one before: one pass)
    count = processes(text=any(looks))
    tasks_spans: list[tuple[int, tuple[int, int]]] = []
    for number, (reader, (size, lines)) in enumerate(zip(readers, sizes)):
        parts = max(1, min(math.ceil(lines / PART_LINES),
                           math.ceil(PARTS_A_PROCESS * count * lines / total)))
        if isinstance(reader, ROW_READERS):    # (rows; in storage, whole row groups)
            spans = reader.spans(parts, whole_groups=part_hand.in_storage(reader))
        else:
            if is_url(str(reader.path)):    # (its parts are copied to disk: `PartHand`)
                parts = max(parts, math.ceil(size / part_hand.COPY_CHUNK))
            spans = cut_spans(reader.path, reader.label, parts) if parts > 1 else [(0, size)]
        tasks_spans += [(number, span) for span in spans]
    if len(tasks_spans) < 2:
        return None     # (one Parquet file of one row group in storage, say)
    base = Scan(settings, model, readers=readers)
    model = dataclasses.replace(model, vocab_size=base.columns.vocab_size)
    with tempfile.TemporaryDirectory(prefix="neuron-batch-check-") as folder, \
            _pool(min(count, len(tasks_spans))) as pool:
        tasks = [_Task(settings, model, spool, block, readers[number], inputs.specs[number],
                       number, span, Path(folder) / f"rows-{k}.jsonl" if spool else None)
                 for k, (number, span) in enumerate(tasks_spans)]
        # (with `meanwhile` importing vLLM, which imports transformers: the tokenizer loads
        # after it, not beside it, as two threads importing one package may not)
        join = Join(base, inputs, block, pool, load_beside=meanwhile is None)
        try:
            # (closed before anything is raised or said: `meanwhile` has ended by then)
            with PartHand(Path(folder), tasks, counting=spool, window=count) as hand, \
                    closing(_in_order(pool, tasks, 2 * count, meanwhile, hand)) as checked:
                for task, part in checked:
                    if isinstance(part, Failed) and part.exit_code is None:
                        # (a part's input problem, say a CSV value over two lines: one pass
                        # reads the job again and names it as it names any, by its line)
                        return None
                    joined = raised(part)
                    join.add(task, joined)
                    if progress is not None:
                        progress(joined.items)
            join.done()
        except BrokenProcessPool:   # (a process killed, say by the kernel for memory)
            return None
        except Disagrees:      # (the parts' Rust tokenizer is not the model's: one pass)
            return None
        except part_hand.NoRoom:    # (no disk for a part of an object: one pass streams it)
            return None
        finally:    # (a pass after this one loads its own: not while this import goes on)
            join.settle()
    return base


def _in_order(pool: Executor, tasks: list[_Task], ahead: int,
              meanwhile: Callable[[], None] | None = None, hand: PartHand | None = None
              ) -> Generator[tuple[_Task, Part | Failed], None, None]:
    """Each task's part, in order, with at most `ahead` parts given to the pool and not yet
    taken: a part's rows are made whole (`rows_part`, given to the pool as it is taken)
    before all the parts are checked, so the plain rows on disk, and the parts waiting in
    memory, are a few parts', not the job's. `hand`: what is done to each task as it is given
    out and once its part is taken (`PartHand`). `meanwhile` runs on a thread of its own once
    the first parts are out, while this one goes on giving parts out as parts come back:
    run here, it left the processes idle from the end of those first parts until it returned
    (on 32 cores, a 10M-line job's first 64 parts of 128 take a fraction of a second; vLLM's
    import, `meanwhile` in a run, ~7 s). It has ended when this generator ends or is closed:
    what it does may hold the terminal's descriptors."""
    waiting: deque[tuple[_Task, Future]] = deque()
    queued = iter(tasks)

    def give(task: _Task) -> None:
        if hand is not None:
            hand.give(task)
        waiting.append((task, pool.submit(_check_part, task)))

    for task in itertools.islice(queued, ahead):
        give(task)
    beside = None
    if meanwhile is not None:   # (the processes are started: they were spawned as given work)
        beside = threading.Thread(target=meanwhile, name="neuron-batch-meanwhile", daemon=True)
        beside.start()
    try:
        while waiting:
            task, future = waiting.popleft()
            part = future.result()
            if hand is not None:
                hand.taken(task)
            for following in itertools.islice(queued, 1):
                give(following)
            yield task, part
    finally:
        if beside is not None:
            beside.join()


#: The tokenizer a process of the pool loaded for its first part that needed one, kept for
#: its later parts (up to PARTS_A_PROCESS): a load took ~0.5 s a part. A pool lives for one
#: check, so one job.
_TOKENIZERS: dict[str, Any] = {}


def _part_tokenizer(source: Any) -> Any:
    """A part's tokenizer: the model's tokenizer.json in Rust where it is on disk (no
    transformers import: inputs/rust_tokenizer.py), else the transformers one."""
    from neuron_batch.engine.models import load_tokenizer

    rust = None
    if source.source != "hub" and os.environ.get("NEURON_BATCH_PART_TOKENIZER") != "full":
        from neuron_batch.inputs.rust_tokenizer import RustTokenizer

        rust = RustTokenizer.of(source.path, lambda: load_tokenizer(source))
    return rust if rust is not None else load_tokenizer(source)


def _check_part(task: _Task) -> Part | Failed:
    """One part checked (in a process of the pool)."""
    try:
        scan = Scan(task.settings, task.model, spool=task.spool, block=task.block,
                    rows_path=task.rows_path, tokenizers=_TOKENIZERS, loader=_part_tokenizer)
        scan.row_base = task.base
        inputs = InputScan.of_span(task.reader, task.spec, task.number, task.span,
                                   default_max_tokens=task.settings.max_tokens, plain=True)
        scan.read(inputs)
    except InputError as error:
        return Failed(str(error), None)
    except RunError as error:
        return Failed(str(error), error.exit_code)
    except OSError as error:    # (the part's rows: a full disk)
        return Failed(f"{task.rows_path}: cannot write the check's rows: "
                       f"{error.strerror or error}", 1)
    tally = None
    if scan.rows is not None:
        tally = scan.rows.tally
        scan.rows.release()
        scan.rows = None
    taken = getattr(scan.columns.tokenizer, "taken_samples", None)
    samples = taken() if taken is not None else []
    chat = scan.columns.tokenizer.chat_used if taken is not None else None
    scan.columns.tokenizer = None       # (the parent loads its own where the job needs one)
    return Part(scan.columns, scan.parse_problems, scan.checked, scan.early, scan.ok,
                 scan.known, scan.took_defaults, (scan.longest_request, scan.longest_prompt),
                 scan.bound, scan.tokenizer_asked, scan.numbered_rows, inputs.items,
                 inputs.records, task.reader.span_lines, inputs.id_hashes, inputs.numeric_ids,
                 inputs.default_ids, tally, samples, chat)


def size_and_lines(reader: CutReader) -> tuple[int, int]:
    """A file's bytes, and its lines as its first HEAD bytes' lines say (a table cut by rows:
    no bytes, its rows: a Parquet file's footer counts them)."""
    from neuron_batch.storage.urls import open_binary

    if isinstance(reader, ROW_READERS):
        return 0, sum(reader.group_rows())

    try:
        with open_binary(reader.path) as handle:
            head = handle.read(HEAD)
            size = handle.seek(0, 2)
    except OSError as exc:
        raise InputError(f"{reader.label}: cannot read: {exc.strerror or exc}") from exc
    if len(head) == size:
        return size, head.count(b"\n") + 1
    return size, size * max(head.count(b"\n"), 1) // len(head)


def job_sizes(readers: Sequence[Any]) -> list[tuple[int, int]] | None:
    """Each input's (bytes, lines) as `size_and_lines` estimates them, (0, 0) for one that
    is not cut (a JSON array, a data set streamed from the hub); None where one cannot be
    read (the check names it as it reads)."""
    try:
        return [size_and_lines(reader) if isinstance(reader, CUT_READERS) else (0, 0)
                for reader in readers]
    except InputError:
        return None


def _first_look(reader: CutReader) -> bool | None:
    """The file's first items, read once (at most KIND_ITEMS): None where its kind is still
    not known (its first object decides: every part must read it as that); else whether its
    first record is one the check tokenizes (text or messages, not token ids or a count)."""
    text = None
    for read, (*_, item) in enumerate(reader.scan(), 1):
        if text is None and isinstance(item, tuple):    # (the record, its id's field)
            text = prompt_token_count(item[0]) is None
        if (text is not None and reader.kind is not None) or read >= KIND_ITEMS:
            break
    return None if reader.kind is None else bool(text)


#: The pool's processes' environment: one string hash among them (the ids' hashes of every
#: part are compared; hash() is salted per process), and a tokenizer of one thread in each (a
#: process a core already: a fast tokenizer's own threads in each would be cores squared).
_POOL_ENV = {"PYTHONHASHSEED": "0", "TOKENIZERS_PARALLELISM": "false"}


@contextmanager
def _pool(count: int) -> Iterator[Executor]:
    """`count` processes, started fresh (a fork would copy a tokenizer's threads), in
    `_POOL_ENV` (set while the pool lives: its processes start as work is given to them)."""
    saved = {key: os.environ.get(key) for key in _POOL_ENV}
    os.environ.update(_POOL_ENV)
    pool = ProcessPoolExecutor(count, mp_context=get_context("spawn"))
    try:
        yield pool
    finally:
        pool.shutdown(cancel_futures=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
