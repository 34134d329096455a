"""What the Neuron scheduler records about a run, and how the records are stored.

Pure Python (no vLLM import) so that reports, metrics and the cost-model calibration can read
records in milliseconds. The scheduler fills a `Recorder`; a run may also stream the records
to a JSON-lines file (one object a line, `"type"` says which kind):

- `{"type": "config", ...}`       first line: the scheduler settings the run used (`RunConfig`).
- `{"type": "step", ...}`         one per `schedule()` call that scheduled work (`StepRecord`).
- `{"type": "request", ...}`      one per finished request (`RequestRecord`).
- `{"type": "summary", ...}`      last line, written at shutdown: admission refusals per reason.

Times come from the recorder's clock (wall time by default, a virtual clock on the simulated
device); only differences between them mean anything.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import IO, Any

from neuron_batch.device_sampling import sample_parent, sampler_asks


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
    # The Neuron runtime whose compiled shapes the steps are padded to (runtime.py). Records
    # written before it existed were the Beta plugin's (the seed design), hence the default.
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
    # the (prefill, prefix) grid cell the step ran on (neuron_batch/prefix_grid.py).
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
    # What its sampling parameters asked (device_sampling.sampler_asks): a grammar, logprobs;
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
    return getattr(importlib.import_module(module_name), attribute)

@dataclass
class Recorder:
    """Collects step and request records in memory and, optionally, streams them to JSONL.

    `clock` is any zero-argument callable returning seconds. Lines are buffered and written in
    batches (every `flush_every` records and at `close()`), which keeps the per-step cost to a
    few microseconds.
    """

    clock: Callable[[], float] = time.monotonic
    path: Path | None = None
    flush_every: int = 256
    flush_seconds: float = 0.5
    steps: list[StepRecord] = field(default_factory=list)
    requests: dict[str, RequestRecord] = field(default_factory=dict)
    blocked_counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(BLOCK_REASONS, 0))
    config: RunConfig | None = None
    _pending: list[str] = field(default_factory=list)
    _file: IO[str] | None = None
    _unfinished_steps: list[StepRecord] = field(default_factory=list)
    _last_flush: float = field(default_factory=time.monotonic)

    def start(self, config: RunConfig) -> None:
        self.config = config
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "w", encoding="utf-8")
            self._emit("config", asdict(config))

    # -- steps -------------------------------------------------------------------------------
    def add_step(self, record: StepRecord) -> None:
        self.steps.append(record)
        self._unfinished_steps.append(record)

    def oldest_unfinished(self) -> StepRecord | None:
        """The oldest step still in flight (None: none is)."""
        return self._unfinished_steps[0] if self._unfinished_steps else None

    def finish_oldest_step(self, t_end: float | None = None, sampling_s: float = 0.0
                           ) -> StepRecord | None:
        """Stamp the oldest step still in flight with its end time (FIFO: async scheduling
        plans step N+1 before step N's output returns; `t_end` None: now) and its sampling
        charge."""
        if not self._unfinished_steps:
            return None
        record = self._unfinished_steps.pop(0)
        record.t_end = self.clock() if t_end is None else t_end
        record.sampling_s = sampling_s
        if self._file is not None:
            self._emit("step", _fields_of(record))
        return record

    # -- requests ----------------------------------------------------------------------------
    def request_arrived(self, req_id: str, num_prompt_tokens: int) -> None:
        self.requests[req_id] = RequestRecord(req_id, num_prompt_tokens, self.clock())

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
        record = self.requests.get(req_id)
        if record is None:
            return
        record.finished = now
        record.num_output_tokens = num_output_tokens
        record.finish_reason = finish_reason
        if self._file is not None:
            self._emit("request", _fields_of(record))

    # -- output ------------------------------------------------------------------------------
    def _emit(self, kind: str, payload: dict[str, Any]) -> None:
        payload["type"] = kind
        self._pending.append(json.dumps(payload, separators=(",", ":")))
        if (len(self._pending) >= self.flush_every
                or time.monotonic() - self._last_flush >= self.flush_seconds):
            self.flush()

    def flush(self) -> None:
        if self._file is not None and self._pending:
            self._file.write("\n".join(self._pending) + "\n")
            self._file.flush()
        self._pending.clear()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if self._file is None:
            return
        while self._unfinished_steps:  # steps whose output never came back (shutdown mid-step)
            self._emit("step", _fields_of(self._unfinished_steps.pop(0)))
        self._emit("summary", {"admission_blocked": dict(self.blocked_counts),
                               "num_steps": len(self.steps)})
        self.flush()
        self._file.close()
        self._file = None


@dataclass
class Records:
    """Records read back from a JSONL file (or taken from a live Recorder)."""

    config: RunConfig | None
    steps: list[StepRecord]
    requests: list[RequestRecord]
    blocked_counts: dict[str, int]

    @classmethod
    def from_recorder(cls, recorder: Recorder) -> Records:
        return cls(recorder.config, list(recorder.steps), list(recorder.requests.values()),
                   dict(recorder.blocked_counts))


def read_records(path: str | Path) -> Records:
    """Read a records file. A file cut short by a crash is read up to its last whole line;
    admission counts then come from the steps (the summary line is missing)."""
    config, steps, requests, blocked = None, [], [], None
    for obj in _iter_json_lines(Path(path)):
        kind = obj.pop("type", None)
        if kind == "config":
            config = RunConfig(**_known(RunConfig, obj))
        elif kind == "step":
            steps.append(StepRecord(**_known(StepRecord, obj)))
        elif kind == "request":
            requests.append(RequestRecord(**_known(RequestRecord, obj)))
        elif kind == "summary":
            blocked = obj.get("admission_blocked")
    if blocked is None:
        blocked = dict.fromkeys(BLOCK_REASONS, 0)
        for step in steps:
            if step.blocked:
                blocked[step.blocked] = blocked.get(step.blocked, 0) + 1
    steps.sort(key=lambda s: s.step)
    return Records(config, steps, requests, blocked)


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


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _fields_of(record: Any) -> dict[str, Any]:
    """A record as a dict, without `asdict`'s deep copy (26 us a step at 8 running, 270 us at
    256; this is about 1 us). Records hold only flat values and lists that are not changed
    after they are written."""
    cls = type(record)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return {name: getattr(record, name) for name in names}


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
