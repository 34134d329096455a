"""The run report as data: `report.json`'s sections as dataclasses, read and written by
report/schema.py (the one place a report becomes JSON and back).

Every field is declared in the order `report.json` has always written it, so a report the
program builds comes out as before; every field may be ABSENT, so a report of an older version
(no `schema_version`, no `prefix_cache`, no `attempts`...) still reads. Sections kept as plain
JSON (`config.sim`, `sampling`, `prefix_caching`, `split`, `verdict`, `replicas`) are
descriptions other modules own the shape of (device/target.py, run/folder_report.py,
run/verdict.py); they are typed where a reader needs it.

Plain fields are typed `Any` (mypy, issue 49): each holds its JSON value as the file had it (an
older or newer version's included, a number where a string was expected kept as it is) or
ABSENT, so no narrower type would be true; readers go through `or_none`/`present`. Nested
sections are typed; `section(name)` gives each its own type.

Pure Python: `neuron-batch report DIR` and the readers in bench and plan take a `Report`
without vLLM.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast, overload

from neuron_batch.report.schema import ABSENT, Section, or_none, section_field, typed

#: The version of `report.json`'s layout, written as its first key. 1: the first typed report
#: (the layout before it, which had no version, reads as version 0).
SCHEMA_VERSION = 1


class Ended(str, enum.Enum):
    """How an attempt ended (its line in attempts.json). A str, so `attempt.ended ==
    "completed"` and JSON both see the word."""

    COMPLETED = "completed"
    INTERRUPTED = "interrupted"     # a signal
    DEADLINE = "deadline"           # --max-runtime reached
    FAILED = "failed"               # the engine failed; finished outputs kept
    NOTHING_TO_DO = "nothing to do"
    KILLED = "killed"               # left records but no line (kill -9): a resume writes it


#: The ends that stopped a run early: its report counts pending requests, the exit is 4.
STOPPED = (Ended.INTERRUPTED, Ended.DEADLINE)


@dataclass
class ReportConfig(Section):
    """What ran: the scheduler's configuration and the run's settings (`config`)."""

    model: Any = section_field()
    device: Any = section_field()
    runtime: Any = section_field()
    scheduler_cls: Any = section_field()
    max_num_seqs: Any = section_field()
    max_num_batched_tokens: Any = section_field()
    max_model_len: Any = section_field()
    block_size: Any = section_field()
    num_kv_blocks: Any = section_field()
    max_kv_concurrent: Any = section_field()
    kv_reserve: Any = section_field()
    enable_prefix_caching: Any = section_field()
    prefill_buckets: Any = section_field()
    decode_buckets: Any = section_field()
    attention_buckets: Any = section_field()
    prefix_buckets: Any = section_field()
    tokenizer: Any = section_field()
    max_tokens: Any = section_field()
    temperature: Any = section_field()
    inputs: Any = section_field()
    order: Any = section_field()
    #: the simulated target's description (device/target.py describe): kept as its JSON
    sim: Any = section_field()
    replicas: Any = section_field()
    ray: Any = section_field()
    compiled_graphs: Any = section_field()


@dataclass
class Requests(Section):
    """Request counts (`requests`): of the whole input, across attempts."""

    total: Any = section_field()
    completed: Any = section_field()
    failed: Any = section_field()
    skipped: Any = section_field()
    empty_outputs: Any = section_field()
    pending: Any = section_field()
    max_tokens_clamped: Any = section_field()
    #: what requests asked beyond their prompt (inputs/request_paths.py asked_counts)
    asked: Any = section_field()
    #: {"min", "max"} of the max_tokens clamped requests were cut to, or None
    max_tokens_clamped_to: Any = section_field()


@dataclass
class Throughput(Section):
    elapsed_s: Any = section_field()
    requests_per_s: Any = section_field()
    input_tokens_per_s: Any = section_field()
    output_tokens_per_s: Any = section_field()
    total_tokens_per_s: Any = section_field()


@dataclass
class Tokens(Section):
    input: Any = section_field()
    output: Any = section_field()
    total: Any = section_field()


@dataclass
class BucketRow(Section):
    """One bucket's (or one (prefill, prefix) grid cell's) row of a padding table. Which count
    and which token keys a row has depends on its phase (`PaddingPhase.KINDS`)."""

    chunks: Any = section_field()
    steps: Any = section_field()
    actual_tokens: Any = section_field()
    padded_tokens: Any = section_field()
    actual_seqs: Any = section_field()
    padded_seqs: Any = section_field()
    kv_held_tokens: Any = section_field()
    kv_attended_tokens: Any = section_field()
    recomputed_tokens: Any = section_field()
    prefill_bucket: Any = section_field()
    prefix_bucket: Any = section_field()

    def figures(self, count_key: str, actual_key: str, padded_key: str) -> tuple[int, int, int]:
        """(count, actual, padded) of the row, 0 where absent."""
        count, actual, padded = (or_none(getattr(self, key)) or 0
                                 for key in (count_key, actual_key, padded_key))
        return count, actual, padded


@dataclass
class PaddingPhase(Section):
    """Real versus padded work of one phase, in total and per bucket (`padding.<phase>`)."""

    #: phase -> (count key, actual key, padded key), as report/metrics.py writes them
    KINDS: ClassVar[dict[str, tuple[str, str, str]]] = {
        "prefill": ("chunks", "actual_tokens", "padded_tokens"),
        "decode": ("steps", "actual_seqs", "padded_seqs"),
        "attention": ("steps", "kv_held_tokens", "kv_attended_tokens")}

    actual_tokens: Any = section_field()
    padded_tokens: Any = section_field()
    actual_seqs: Any = section_field()
    padded_seqs: Any = section_field()
    kv_held_tokens: Any = section_field()
    kv_attended_tokens: Any = section_field()
    waste_fraction: Any = section_field()
    #: what a row is keyed by, where not the phase's bucket ("prefill x prefix")
    by: Any = section_field()
    by_bucket: dict[str, BucketRow] = typed(BucketRow, of="dict")

    def totals(self, phase: str) -> tuple[int, int]:
        """(actual, padded) of the phase, 0 where absent."""
        _, actual, padded = self.KINDS[phase]
        return or_none(getattr(self, actual)) or 0, or_none(getattr(self, padded)) or 0

    def rows(self) -> dict[str, BucketRow]:
        return self.by_bucket or {}


@dataclass
class Padding(Section):
    prefill: PaddingPhase = typed(PaddingPhase)
    decode: PaddingPhase = typed(PaddingPhase)
    #: decode's attended KV (only where a step recorded its attended length)
    attention: PaddingPhase = typed(PaddingPhase)

    def phase(self, name: str) -> PaddingPhase:
        """The phase's table; an empty one where the report has none."""
        value = getattr(self, name)
        return value if isinstance(value, PaddingPhase) else PaddingPhase()


@dataclass
class PrefixCache(Section):
    """What the prefix cache served (`prefix_cache`, report/prefix_cache.py)."""

    enabled: Any = section_field()
    prompt_tokens: Any = section_field()
    hit_tokens: Any = section_field()
    hit_fraction: Any = section_field()
    recomputed_tokens: Any = section_field()
    computed_tokens: Any = section_field()
    #: what an unbounded cache could serve (None: not known)
    bound_tokens: Any = section_field()
    bound_fraction: Any = section_field()
    #: one standard error of `bound_tokens` where it was estimated (a job past
    #: inputs/prefix_bound.py's exact count); absent where it was counted exactly
    bound_error_tokens: Any = section_field()

    def with_bound(self, bound_tokens: int | None, error_tokens: int = 0) -> None:
        """Set the bound and its share of the prompt tokens (None: unknown), and its standard
        error where it was estimated; the run's folder knows the prompts' tokens where the
        records do not (run/folder_report.py)."""
        prompt = or_none(self.prompt_tokens) or 0
        self.bound_tokens = bound_tokens
        self.bound_fraction = (bound_tokens / prompt if bound_tokens is not None and prompt
                               else None)
        self.bound_error_tokens = error_tokens if error_tokens else ABSENT


@dataclass
class StateTime(Section):
    steps: Any = section_field()
    seconds: Any = section_field()


@dataclass
class Admission(Section):
    """Refusals of the queue head by reason (`admission_blocked`); reasons this version does
    not know are kept, in order, in `extra`."""

    at_capacity: Any = section_field()
    kv_saturated: Any = section_field()
    prefill_batch_full: Any = section_field()
    prefill_in_running: Any = section_field()

    def counts(self) -> dict[str, int]:
        """Every reason and its count, in the report's order."""
        return self.to_dict()


@dataclass
class KvFigures(Section):
    num_blocks: Any = section_field()
    peak_reserved_blocks: Any = section_field()
    peak_used_blocks: Any = section_field()
    mean_used_fraction: Any = section_field()


@dataclass
class Distribution(Section):
    """Mean and percentiles of a latency, in seconds (None: nothing to describe)."""

    mean: Any = section_field()
    p50: Any = section_field()
    p90: Any = section_field()
    p99: Any = section_field()


@dataclass
class Latency(Section):
    ttft_s: Distribution = typed(Distribution)
    tpot_s: Distribution = typed(Distribution)
    e2e_s: Distribution = typed(Distribution)


@dataclass
class StepCounts(Section):
    total: Any = section_field()
    prefill: Any = section_field()
    decode: Any = section_field()
    empty: Any = section_field()


@dataclass
class Cost(Section):
    """What the run cost (`cost`, report/cost.py run_cost)."""

    instance: Any = section_field()
    num_instances: Any = section_field()
    pricing: Any = section_field()
    price_per_hour_usd: Any = section_field()
    price_source: Any = section_field()
    hours: Any = section_field()
    usd: Any = section_field()
    usd_per_million_output_tokens: Any = section_field()
    usd_per_million_total_tokens: Any = section_field()


@dataclass
class Startup(Section):
    """An engine's start-up (an attempt's `startup`): compiled before or not; measured on a
    Neuron host."""

    compiled_before: Any = section_field()
    simulated: Any = section_field()
    measured_s: Any = section_field()
    cached_graphs: Any = section_field()
    compiled_graphs: Any = section_field()
    artifacts_reused: Any = section_field()


@dataclass
class Attempt(Section):
    """One attempt's line of attempts.json, as every writer builds it (the engine loop, Ray's
    pool, a signal before the engine, a failed or killed attempt) and as the report repeats it
    (`attempts`); `to_dict` is the line."""

    attempt: Any = section_field()
    ended: Ended | str = typed(Ended)
    #: a signal's attempt that stopped before its engine ran: the phase, and a second signal
    phase: Any = section_field()
    insisted: Any = section_field()
    requests_finished: Any = section_field()
    wall_time_s: Any = section_field()
    started: Any = section_field()
    device: Any = section_field()
    pid: Any = section_field()
    requests_failed: Any = section_field()
    errors: Any = section_field()
    signal: Any = section_field()
    #: the --max-runtime a "deadline" attempt reached
    max_runtime_s: Any = section_field()
    error: Any = section_field()
    startup: Startup = typed(Startup)
    #: a --split-at attempt's part and layout (run/split_parts.py)
    part: Any = section_field()
    #: a --replicas attempt: Ray's address, the generation's seconds, each replica's figures
    ray: Any = section_field()
    generation_s: Any = section_field()
    replicas: Any = section_field()


@dataclass
class Report(Section):
    """The report of a run (`report.json`)."""

    schema_version: Any = section_field()
    # The fields `vllm bench throughput --output-json` writes, so its dashboards read us.
    elapsed_time: Any = section_field()
    num_requests: Any = section_field()
    total_num_tokens: Any = section_field()
    requests_per_second: Any = section_field()
    tokens_per_second: Any = section_field()
    config: ReportConfig = typed(ReportConfig)
    requests: Requests = typed(Requests)
    throughput: Throughput = typed(Throughput)
    tokens: Tokens = typed(Tokens)
    padding: Padding = typed(Padding)
    prefix_cache: PrefixCache = typed(PrefixCache)
    states: dict[str, StateTime] = typed(StateTime, of="dict")
    admission_blocked: Admission = typed(Admission)
    preemptions: Any = section_field()
    kv: KvFigures = typed(KvFigures)
    latency: Latency = typed(Latency)
    steps: StepCounts = typed(StepCounts)
    sampling: Any = section_field()
    #: per replica's row (--replicas, report/replicas.py)
    replicas: Any = section_field()
    #: the prefix-caching decision (layout/prefix_decision.py), or None
    prefix_caching: Any = section_field()
    cost: Cost = typed(Cost)
    cost_missing: Any = section_field()
    attempts: list[Attempt] = typed(Attempt, of="list")
    split: Any = section_field()
    output_dir: Any = section_field()
    verdict: Any = section_field()

    @classmethod
    def new(cls, figures: Mapping[str, Any]) -> Report:
        """A new run's report from `metrics.summarize()`'s figures: stamped with this
        version, written first."""
        return cls.from_dict({"schema_version": SCHEMA_VERSION, **figures})

    @property
    def version(self) -> int:
        """The layout's version; 0 for a report written before versions."""
        return 0 if self.schema_version is ABSENT else int(self.schema_version)

    # (one overload per section, so a reader gets its section's type without a cast)
    @overload
    def section(self, name: Literal["config"]) -> ReportConfig: ...
    @overload
    def section(self, name: Literal["requests"]) -> Requests: ...
    @overload
    def section(self, name: Literal["throughput"]) -> Throughput: ...
    @overload
    def section(self, name: Literal["tokens"]) -> Tokens: ...
    @overload
    def section(self, name: Literal["padding"]) -> Padding: ...
    @overload
    def section(self, name: Literal["prefix_cache"]) -> PrefixCache: ...
    @overload
    def section(self, name: Literal["admission_blocked"]) -> Admission: ...
    @overload
    def section(self, name: Literal["kv"]) -> KvFigures: ...
    @overload
    def section(self, name: Literal["latency"]) -> Latency: ...
    @overload
    def section(self, name: Literal["steps"]) -> StepCounts: ...
    @overload
    def section(self, name: Literal["cost"]) -> Cost: ...
    @overload
    def section(self, name: str) -> Section: ...

    def section(self, name: str) -> Section:
        """A typed section, an empty one where the report lacks it (readers of older reports
        then see ABSENT fields instead of checking for the section)."""
        value = getattr(self, name)
        if isinstance(value, Section):
            return value
        kind = type(self).__dataclass_fields__[name].metadata.get("kind")
        # (a typed field's kind is a Section class; a plain field's value is its JSON, which
        # no overload names: Any either way)
        return cast(Section, kind() if kind is not None else value)


def as_report(report: Report | Mapping[str, Any]) -> Report:
    """A `Report` from either form: the readers' one entry (a JSON-read dict is typed here)."""
    return report if isinstance(report, Report) else Report.from_dict(dict(report))
