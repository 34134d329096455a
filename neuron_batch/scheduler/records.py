"""What the Neuron scheduler records about a run, and how the records are stored.

Pure Python (no vLLM import) so that reports, metrics and the cost-model calibration can read
records in milliseconds. The scheduler fills a `Recorder`, which keeps only the steps and
requests in flight and may stream the rest to a records file, JSON lines whose `"type"` says
what each holds:

- `{"type": "config", ...}`       first line: the scheduler settings the run used (`RunConfig`).
- `{"type": "steps", ...}`        a block of finished steps (`StepRecord`, without request ids),
                                  by column, compressed (record_blocks.py).
- `{"type": "requests", ...}`     a block of finished requests (`RequestRecord`), the same way.
- `{"type": "checkpoint", ...}`   what the summary would say now, where the replicas' actor
                                  flushes the file before shipping it (`Recorder.flush`).
- `{"type": "summary", ...}`      last line, written at shutdown: admission refusals per reason
                                  and the steps' running aggregates (aggregates.py), what the
                                  report reads instead of the steps.

Records written before issue 46 hold one `{"type": "step"}` / `{"type": "request"}` line per
record, no aggregates; the readers here read both. Times come from the recorder's clock (wall
time by default, a virtual clock on the simulated device); only differences between them mean
anything.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import IO, Any

from neuron_batch.runtimes.sampling import sample_parent, sampler_asks
from neuron_batch.scheduler.aggregates import Aggregates, InSystem, StepTiler
from neuron_batch.scheduler.record_blocks import REQUEST_COLUMNS, STEP_COLUMNS, encode, rows


class SchedulerState(str, Enum):
    """The design document's state machine; informational, no decision reads it."""

    IDLE = "IDLE"
    ACTIVE_PREFILL = "ACTIVE_PREFILL"
    ACTIVE_DECODE = "ACTIVE_DECODE"


#: Why admission refused the head of the queue, in the order `can_schedule()` checks them.
BLOCK_REASONS = ("at_capacity", "prefill_in_running", "prefill_batch_full", "kv_saturated")

#: Step kinds. "empty" is a schedule() call that scheduled no tokens.
PREFILL, DECODE, EMPTY = "prefill", "decode", "empty"


@dataclass(slots=True)
class RunConfig:
    """The scheduler settings behind a set of records."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_kv_blocks: int
    max_kv_concurrent: int          # requests the KV cache holds at max_model_len each
    prefill_buckets: list[int]      # num_batched_tokens_buckets
    decode_buckets: list[int]       # num_seqs_buckets
    scheduler_cls: str
    enable_prefix_caching: bool = False
    # The KV admission rule (kv_reserve.py). Records written before it existed used the seed
    # design's rule, hence the default.
    kv_reserve: str = "max_model_len"
    # The Neuron runtime whose compiled shapes the steps are padded to (runtimes/runtime.py).
    # Records written before it existed were the Beta plugin's (the seed design), hence the default.
    runtime: str = "vllm-neuron"
    # nxdi: token-generation buckets; vllm-neuron: decode context-length buckets ([]: every
    # decode attends max_model_len).
    attention_buckets: list[int] = field(default_factory=list)
    # nxdi with prefix caching: the prefix buckets of its (prefill, prefix) grid ([]: 1-D).
    prefix_buckets: list[int] = field(default_factory=list)


@dataclass(slots=True)
class StepRecord:
    """One scheduler step: what was scheduled, how it was padded, and when it ran.

    Prefill steps carry one request (max_prefills_per_batch = 1): `num_tokens` is its chunk,
    `num_tokens_padded` the prefill bucket it was padded to, `num_seqs` = `num_seqs_padded` = 1.
    Decode steps carry one token per request: `num_tokens` = `num_tokens_padded` = `num_seqs`,
    and `num_seqs_padded` is the decode batch bucket (under nxdi: every slot, `max_num_seqs`);
    `attended_len` the KV length each padded slot attends (nxdi: the token-generation bucket;
    vllm-neuron: the decode context-length bucket, else max_model_len), `longest_len` the
    longest request's length it pads. `bucket` is the prefill bucket or the decode batch bucket.
    `context_tokens` is the KV already held by the scheduled requests before the step (prior
    chunks for a prefill, prompt + generated tokens for decodes): what the step's attention
    reads. `t_end` is set when the step's model output comes back.
    `kv_reserved_blocks` is what the running requests reserved under the KV admission rule when
    the step was planned (`kv_usage` is what they really held); `num_preempted` the requests
    vLLM preempted while planning it (Neuron cannot preempt: always 0 with this scheduler).
    """

    step: int                       # 0-based index among recorded steps
    state: str                      # SchedulerState value after this step
    kind: str                       # PREFILL | DECODE | EMPTY
    req_ids: list[str]
    num_tokens: int                 # actual tokens scheduled
    num_tokens_padded: int          # tokens after sequence padding
    num_seqs: int                   # requests scheduled
    num_seqs_padded: int            # requests after batch padding
    bucket: int | None              # prefill bucket or decode batch bucket
    context_tokens: int             # KV tokens the scheduled requests held before the step
    blocked: str | None             # admission refusal reason this step (BLOCK_REASONS) or None
    num_waiting: int                # requests waiting for admission when the step was planned
    num_running: int                # requests running after the step was planned
    kv_usage: float                 # fraction of KV blocks in use after planning
    t_start: float
    t_end: float | None = None
    kv_reserved_blocks: int = 0     # blocks reserved by the running requests (kv_reserve rule)
    num_preempted: int = 0          # requests vLLM preempted while planning this step
    attended_len: int | None = None  # decode: KV length each padded slot attends (the
                                     # token-generation / context-length bucket)
    longest_len: int | None = None   # decode: the longest request's length after the step
                                     # (its position + 1): what the attention buckets pad
    # Prefills with prefix caching: the prompt tokens vLLM's prefix cache served (`num_tokens`
    # is then only the new ones), those of them the device computes again anyway (nxdi moves
    # cached tokens into the prefill bucket's spare room), and under nxdi the prefix bucket of
    # the (prefill, prefix) grid cell the step ran on (neuron_batch/runtimes/prefix_grid.py).
    cached_tokens: int = 0
    recomputed_tokens: int = 0
    prefix_bucket: int | None = None
    # Seconds the step's sampling added on the simulated device (device/sampling_cost.py): the
    # logits to the host and vLLM's CPU sampler under NxDI, the on-device mask under Beta/GA.
    sampling_s: float = 0.0


@dataclass(slots=True)
class RequestRecord:
    """One request's life. Times are None until the event happens."""

    req_id: str
    num_prompt_tokens: int
    arrival: float
    admitted: float | None = None       # first scheduled
    first_token: float | None = None    # end of the step that produced its first output token
    finished: float | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0          # prompt tokens served from the prefix cache
    finish_reason: str | None = None
    # What its sampling parameters asked (runtimes.sampling.sampler_asks): a grammar, logprobs;
    # `sample_of`: the request vLLM fanned it out of for n > 1 (its child id), else None.
    constrained: bool = False
    logprobs: bool = False
    sample_of: str | None = None



def resolve_clock(spec: str | Callable[[], float] | None) -> Callable[[], float]:
    """The recorder's clock: wall time by default, else a 'module:attribute' callable (the
    simulated device's virtual clock lives in the engine-core process, so it is named, not
    passed)."""
    if spec is None:
        return time.monotonic
    if callable(spec):
        return spec
    module_name, _, attribute = spec.partition(":")
    clock: Callable[[], float] = getattr(importlib.import_module(module_name), attribute)
    return clock    # (what the spec names is taken on trust: the engine's own setting)

@dataclass
class Recorder:
    """Takes the scheduler's step and request records as they happen, keeps only those in
    flight, and streams the rest to a records file in compact blocks (record_blocks.py) while
    the step figures the report needs accumulate in `aggregates` (aggregates.py). Memory is set
    by the work in flight, not by the run's length.

    `clock` is any zero-argument callable returning seconds. Blocks are written every
    `flush_every` records or `flush_seconds`, which keeps the per-step cost to a few
    microseconds, each with a checkpoint line after it: a run killed -9 leaves a file whose
    last checkpoint holds every step in it, so its report reads no step again (a file with
    no checkpoint after its last steps block is read by one pass over its steps, which holds
    them all: ~0.4 GiB for 50k requests' steps). 10 s: a block of a real device's steps
    (tens of ms each) is a few hundred, which compress well, and a kill loses at most that.
    `keep` (default: the environment's KEEP_RECORDS_ENV set to 1, which the tests set) also
    keeps every step in `steps` and finished requests in `requests`, for tests and tools that
    inspect a small run in memory.
    """

    clock: Callable[[], float] = time.monotonic
    path: Path | None = None
    flush_every: int = 4096
    flush_seconds: float = 10.0
    keep: bool = field(default_factory=lambda: os.environ.get(KEEP_RECORDS_ENV) == "1")
    #: Requests in flight (arrived, not finished), by id; with `keep`, finished ones too.
    requests: dict[str, RequestRecord] = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)   # only with `keep`
    blocked_counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BLOCK_REASONS, 0))
    config: RunConfig | None = None
    aggregates: Aggregates = field(default_factory=Aggregates)
    num_steps: int = 0                  # steps recorded so far (the next step's number)
    last_step: StepRecord | None = None  # the latest step recorded, while it is in flight
    _steps_out: list[StepRecord] = field(default_factory=list)
    _requests_out: list[RequestRecord] = field(default_factory=list)
    _file: IO[str] | None = None
    _unfinished_steps: deque[StepRecord] = field(default_factory=deque)
    _last_flush: float = field(default_factory=time.monotonic)
    _in_system: InSystem = field(default_factory=InSystem)
    _tiler: StepTiler | None = None
    _finished_step: StepRecord | None = None    # the latest finished step, not yet tiled
    _first_arrival: float | None = None
    _last_finish: float | None = None
    _closed: bool = False
    _checkpointed: int = 0                      # finished steps the last checkpoint held
    _tables_checkpointed: dict[str, Any] = field(default_factory=dict)    # its tables

    def start(self, config: RunConfig) -> None:
        self.config = config
        self._tiler = StepTiler(self.aggregates, self._in_system.empty_at, config.max_num_seqs,
                                fold=self._in_system.fold)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "w", encoding="utf-8")
            self._file.write(json.dumps({**asdict(config), "type": "config"},
                                        separators=(",", ":")) + "\n")
            self._file.flush()

    # -- steps -------------------------------------------------------------------------------
    def add_step(self, record: StepRecord) -> None:
        self.num_steps += 1
        self.last_step = record
        if self.keep:
            self.steps.append(record)
        self._unfinished_steps.append(record)

    def oldest_unfinished(self) -> StepRecord | None:
        """The oldest step still in flight (None: none is)."""
        return self._unfinished_steps[0] if self._unfinished_steps else None

    def finish_oldest_step(self, t_end: float | None = None, sampling_s: float = 0.0
                           ) -> StepRecord | None:
        """Stamp the oldest step still in flight with its end time (FIFO: async scheduling
        plans step N+1 before step N's output returns; `t_end` None: now) and its sampling
        charge. The step stays readable until the next step finishes (its following step's
        start may still move: decode_first.py)."""
        if not self._unfinished_steps:
            return None
        record = self._unfinished_steps.popleft()
        record.t_end = self.clock() if t_end is None else t_end
        record.sampling_s = sampling_s
        self._step_done(record)
        return record

    def _step_done(self, record: StepRecord) -> None:
        # The step before this one is final now: its following step (this one) has started
        # where it will stay, and the requests it finished are counted.
        if self._tiler is None:     # (a recorder never started: no settings to read)
            self._tiler = StepTiler(self.aggregates, self._in_system.empty_at,
                                    fold=self._in_system.fold)
        if self._finished_step is not None:
            self._tiler.add(self._finished_step)
        self._finished_step = record
        if self._file is not None:
            self._steps_out.append(record)
            self._maybe_flush()

    # -- requests ----------------------------------------------------------------------------
    def request_arrived(self, req_id: str, num_prompt_tokens: int) -> None:
        now = self.clock()
        self.requests[req_id] = RequestRecord(req_id, num_prompt_tokens, now)
        self._in_system.arrive(now)
        if self._first_arrival is None or now < self._first_arrival:
            self._first_arrival = now

    def request_asks(self, req_id: str, sampling_params: Any) -> None:
        """Note what a request's SamplingParams ask of the sampler (nothing for most)."""
        record = self.requests.get(req_id)
        if record is None or sampling_params is None:
            return
        asks = sampler_asks(sampling_params)
        record.constrained, record.logprobs = asks.constrained, asks.logprobs
        record.sample_of = sample_parent(req_id)

    def request_finished(self, req_id: str, num_output_tokens: int, finish_reason: str | None,
                         now: float) -> None:
        record = self.requests.get(req_id) if self.keep else self.requests.pop(req_id, None)
        if record is None:
            return
        if record.finished is not None:     # (kept in memory: finished already)
            return
        record.finished = now
        record.num_output_tokens = num_output_tokens
        record.finish_reason = finish_reason
        self._in_system.finish(max(now, record.arrival))
        if finish_reason not in NOT_COMPLETED:   # (the report's window ends with completed work)
            self._last_finish = now if self._last_finish is None else max(self._last_finish, now)
        if self._file is not None:
            self._requests_out.append(record)
            self._maybe_flush()

    # -- output ------------------------------------------------------------------------------
    def _maybe_flush(self) -> None:
        if (len(self._steps_out) + len(self._requests_out) >= self.flush_every
                or time.monotonic() - self._last_flush >= self.flush_seconds):
            self.flush()

    def flush_requests(self) -> None:
        """Write the finished requests waiting for their block (their steps keep waiting)."""
        if self._file is not None and self._requests_out:
            self._file.write(requests_block(self._requests_out) + "\n")
            self._file.flush()
        self._requests_out.clear()

    def flush(self) -> None:
        """Write the records waiting for their block, and where steps finished since the last
        call a `checkpoint` line: the aggregates as a summary would hold them now. The
        replicas' actor calls this before it reads the file and ships what it holds; the
        scheduler's own summary line, written at shutdown, never reaches the driver, so a
        replica's records end with the checkpoint of its last finished request. The recorder
        calls it itself whenever blocks are due (`_maybe_flush`), so a file killed -9 ends with
        a checkpoint that holds its steps."""
        self._write_blocks()
        if self._file is None or self._tiler is None:
            return
        finished = self.aggregates.num_steps + (self._finished_step is not None)
        if finished == self._checkpointed:
            return
        self._checkpointed = finished
        closed = self._closed_copy()
        # (the tables as their changes since the last checkpoint, which the reader adds up:
        # a checkpoint costs a few rows, not every bucket's)
        whole = {k: v for k, v in closed.to_dict().items() if k not in Aggregates.TABLES}
        change = closed.tables_since(self._tables_checkpointed)
        self._tables_checkpointed = closed.tables()
        self._file.write(json.dumps({"type": "checkpoint",
                                     "admission_blocked": dict(self.blocked_counts),
                                     "num_steps": self.num_steps, "aggregates": whole,
                                     "tables": change},
                                    separators=(",", ":")) + "\n")
        self._file.flush()

    def _closed_copy(self) -> Aggregates:
        """The aggregates as `close` would leave them if the run ended now (steps in flight
        left out: a later checkpoint or the summary has them)."""
        copy = Aggregates.from_dict(self.aggregates.to_dict())
        assert self._tiler is not None  # (flush, the one caller, returns before a tiler exists)
        tiler = self._tiler.copy_onto(copy, self._in_system.copy())
        if self._finished_step is not None:
            tiler.add(self._finished_step)
        start, end = self._window_of(copy)
        tiler.close(start, end)
        return copy

    def _write_blocks(self) -> None:
        if self._file is not None:
            lines = []
            if self._steps_out:
                lines.append(encode("steps", STEP_COLUMNS, self._steps_out))
            if self._requests_out:
                lines.append(requests_block(self._requests_out))
            if lines:
                self._file.write("\n".join(lines) + "\n")
                self._file.flush()
        self._steps_out.clear()
        self._requests_out.clear()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        """Shut down: steps whose output never came back are kept as such, the last span is
        closed at the run's end and the summary line (admission counts, aggregates) written."""
        if self._closed:
            return
        self._closed = True
        while self._unfinished_steps:  # steps whose output never came back (shutdown mid-step)
            self._step_done(self._unfinished_steps.popleft())
        if self._tiler is None:      # (never started, no step)
            self._tiler = StepTiler(self.aggregates, self._in_system.empty_at)
        if self._finished_step is not None:
            self._tiler.add(self._finished_step)
            self._finished_step = None
        start, end = self.window()
        self._tiler.close(start, end)
        if self._file is None:
            return
        self._write_blocks()
        self._file.write(json.dumps({"type": "summary",
                                     "admission_blocked": dict(self.blocked_counts),
                                     "num_steps": self.num_steps,
                                     "aggregates": self.aggregates.to_dict()},
                                    separators=(",", ":")) + "\n")
        self._file.close()
        self._file = None

    def window(self) -> tuple[float, float]:
        """(start, end) of the run as the report counts it: the first request's arrival (else
        the first step) to the last step end or completed request's finish."""
        return self._window_of(self.aggregates)

    def _window_of(self, agg: Aggregates) -> tuple[float, float]:
        start = self._first_arrival
        if start is None:
            start = agg.first_start if agg.first_start is not None else 0.0
        end = max(start, agg.last_end if agg.last_end is not None else start,
                  self._last_finish if self._last_finish is not None else start)
        return float(start), float(end)


#: Finish reasons of requests that are not completed work (the report leaves them out).
NOT_COMPLETED = ("abort", "error")

#: Set to 1, every Recorder keeps its records in memory too (`Recorder.keep`).
KEEP_RECORDS_ENV = "NEURON_BATCH_RECORDS_IN_MEMORY"


@dataclass
class Records:
    """Records read back into memory (small runs, tests; the report reads `RecordsFile`)."""

    config: RunConfig | None
    steps: list[StepRecord]
    requests: list[RequestRecord]
    blocked_counts: dict[str, int]

    @classmethod
    def from_recorder(cls, recorder: Recorder) -> Records:
        """A Recorder's records (it must `keep` them)."""
        if not recorder.keep:
            raise ValueError("this Recorder keeps no records in memory (Recorder.keep)")
        return cls(recorder.config, list(recorder.steps), list(recorder.requests.values()),
                   dict(recorder.blocked_counts))


def iter_records(path: str | Path) -> Iterator[tuple[str, Any]]:
    """A records file as it is written, one record at a time: ("config", RunConfig),
    ("step", StepRecord), ("request", RequestRecord), ("summary", dict), ("replica", dict);
    both forms (JSON lines of the records before issue 46, and blocks). A file cut short by a
    crash is read up to its last whole line."""
    step_defaults: dict[str, Any] = {"t_end": None, "sampling_s": 0.0, "req_ids": []}
    for obj in _iter_json_lines(Path(path)):
        kind = obj.pop("type", None)
        if kind == "steps":
            for row in rows(obj, STEP_COLUMNS, step_defaults):
                yield "step", StepRecord(**_known(StepRecord, row))
        elif kind == "requests":
            for record in requests_of_block(obj):
                yield "request", record
        elif kind == "config":
            yield "config", RunConfig(**_known(RunConfig, obj))
        elif kind == "step":
            yield "step", StepRecord(**_known(StepRecord, obj))
        elif kind == "request":
            yield "request", RequestRecord(**_known(RequestRecord, obj))
        elif kind in ("summary", "replica"):
            yield kind, obj


def requests_of_block(obj: dict[str, Any]) -> list[RequestRecord]:
    """A requests block (its JSON line parsed) as its records."""
    return [RequestRecord(**_known(RequestRecord, row)) for row in rows(obj, REQUEST_COLUMNS, {})]


def requests_block(records: Sequence[RequestRecord]) -> str:
    """Requests as one block line (what the recorder writes; the replicas' driver too)."""
    return encode("requests", REQUEST_COLUMNS, records)


def iter_steps(path: str | Path) -> Iterator[StepRecord]:
    """The steps of a records file in the order written, never all in memory (calibration,
    bench's histograms)."""
    for kind, record in iter_records(path):
        if kind == "step":
            yield record


def read_records(path: str | Path) -> Records:
    """Read a whole records file into memory. Admission counts come from the summary line, or
    for a file cut short (no summary), from the steps."""
    config, steps, requests, blocked = None, [], [], None
    for kind, record in iter_records(path):
        if kind == "config":
            config = record
        elif kind == "step":
            steps.append(record)
        elif kind == "request":
            requests.append(record)
        elif kind == "summary":
            blocked = record.get("admission_blocked")
    if blocked is None:
        blocked = blocked_from_steps(steps)
    steps.sort(key=lambda s: s.step)
    return Records(config, steps, requests, blocked)


def blocked_from_steps(steps: Iterable[StepRecord]) -> dict[str, int]:
    blocked = dict.fromkeys(BLOCK_REASONS, 0)
    for step in steps:
        if step.blocked:
            blocked[step.blocked] = blocked.get(step.blocked, 0) + 1
    return blocked


def _iter_json_lines(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                return  # a torn last line from a killed process


def _known(cls: type, obj: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in obj.items() if k in names}


def concat_attempts(attempts: list[Records]) -> Records:
    """Join the records of successive attempts of one run (a run resumed after a crash) into
    one timeline: each attempt's times are shifted to start where the previous one ended, so
    time per state and throughput cover the whole input without counting the pause between."""
    if len(attempts) == 1:
        return attempts[0]
    steps: list[StepRecord] = []
    requests: list[RequestRecord] = []
    blocked = dict.fromkeys(BLOCK_REASONS, 0)
    offset = 0.0
    for records in attempts:
        times = [s.t_start for s in records.steps] + [r.arrival for r in records.requests]
        if not times:
            continue
        shift = offset - min(times)
        for step in records.steps:
            t_end = None if step.t_end is None else step.t_end + shift
            steps.append(StepRecord(**{**asdict(step), "step": len(steps),
                                       "t_start": step.t_start + shift, "t_end": t_end}))
        for request in records.requests:
            moved = {k: (v + shift if k in _REQUEST_TIMES and v is not None else v)
                     for k, v in asdict(request).items()}
            requests.append(RequestRecord(**moved))
        for reason, count in records.blocked_counts.items():
            blocked[reason] = blocked.get(reason, 0) + count
        ends = [s.t_end for s in records.steps if s.t_end is not None]
        ends += [r.finished for r in records.requests if r.finished is not None]
        offset = max(ends, default=max(times)) + shift
    config = next((r.config for r in reversed(attempts) if r.config is not None), None)
    return Records(config, steps, requests, blocked)


_REQUEST_TIMES = ("arrival", "admitted", "first_token", "finished")
