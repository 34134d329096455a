"""Generation over N engines on Ray: the driver side of a `--replicas` run.

The pending requests go to the replicas in batches, one Ray Data row and block per batch
(`from_items` of batch keys, each traded at the driver's store for a batch made as the replicas
drain: feed.py) and flow through `map_batches(ReplicaWorker, ...)` with a fixed pool of N
actors, one engine each. Each actor
takes several batches at once, so its engine is never drained between batches. Ray Data
restarts an actor whose process dies and retries its unfinished batches there (its defaults:
`max_restarts=-1`, `max_task_retries=-1`).

The driver is the only writer of the run folder: it appends every finished request to
outputs.jsonl (once: a request that comes back twice, from a retried batch, is dropped) and
writes each replica's scheduler records to records-<attempt>-r<k>.jsonl, a new file after each
restart of that replica's process (a new engine, a new clock). Replica numbers k follow the order
in which the replicas first deliver. SIGTERM/SIGINT and --max-runtime stop as on one engine:
stop taking results, keep what was written, exit 4.

Ray itself is imported here only inside functions, so importing this module costs nothing.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_batch.engine.engine_log import ENGINE_LOG, engine_output_to
from neuron_batch.engine.sampling_params import request_spec
from neuron_batch.errors import EXIT_FAILED, RunError
from neuron_batch.inputs.prepare import PreparedRequest
from neuron_batch.inputs.prompt_records import InputChanged
from neuron_batch.job.generate import MAX_ERRORS_KEPT, progress_bar, stopped_by
from neuron_batch.job.job import Job
from neuron_batch.job.stop import RUNNING, RunSignals, deferring
from neuron_batch.replicas.actor import BATCH_COLUMN, ReplicaSpec, ReplicaWorker, encode_tokens
from neuron_batch.replicas.feed import ROUNDS_AHEAD, BatchFeed
from neuron_batch.replicas.results import ResultStream, ResultWriter
from neuron_batch.report.model import Attempt, Ended

#: Seconds between checks that no node was lost for good.
NODE_CHECK_S = 2.0
#: Environment variables the replicas get from the driver (a cluster's workers start from the
#: raylet's environment, not the driver's).
FORWARDED_ENV_PREFIXES = ("NEURON_BATCH_", "VLLM_", "HF_", "TRANSFORMERS_", "TOKENIZERS_")


#: Batches each replica should get over a run (more: a fairer share at the end of the run;
#: fewer: less of Ray Data's work per request), and the bounds on a batch's size.
BATCHES_PER_REPLICA = 64
MIN_BATCH, MAX_BATCH = 16, 256


def batching(pending: int, replicas: int, max_num_seqs: int,
             simulated: bool = True) -> tuple[int, int]:
    """(requests per batch, batches in flight per replica).

    Each batch costs the replica a fixed amount of Ray Data's work (a task: receiving and
    unpacking it, profiling its memory, building and serializing its result block), done in
    the actor's process beside the engine. With batches of 16, that work (and the GIL it held)
    slowed one replica's engine by half against the plain path; so batches are as large as the
    end of the run allows: about BATCHES_PER_REPLICA per replica, so that when the input runs
    out the replicas are left with nearly equal work (at most one batch apart), between
    MIN_BATCH and MAX_BATCH requests. A batch comes back when its last request finishes, so
    several are in flight per replica: sixteen engines' worth of requests (at least four
    batches), which keeps the engine's waiting queue full while a batch's slowest request
    finishes and while Ray brings the next one. Measured on the whole conversation trace, one
    simulated replica (19,366 requests, max_num_seqs 32): generation took 96 s with batches of
    16, 79 s of 128 and 76 s of 512, against 62 s on the plain path.

    That is the simulated device, whose steps take microseconds of real time. A real device
    (the CPU, Neuron) takes milliseconds to seconds per step, which dwarfs Ray Data's few
    milliseconds per batch; there batches stay at MIN_BATCH, so outputs come back (to the
    progress bar, and to outputs.jsonl, safe from a driver that dies) as soon as a few finish."""
    small = max(1, min(MIN_BATCH, max_num_seqs // 2))
    share = -(-max(1, pending) // (max(1, replicas) * BATCHES_PER_REPLICA))
    size = max(small, min(MAX_BATCH if simulated else MIN_BATCH, share))
    in_flight = max(4, min(256, -(-16 * max_num_seqs // size)))
    return size, in_flight


def generate_replicas(job: Job, pending: Sequence[PreparedRequest], attempt: int) -> dict[str, Any]:
    """Run `pending` through the replicas; returns the attempt's record for attempts.json.
    What Ray itself writes to the driver's terminal (its C++ core's log lines) goes to the run
    folder's engine.log meanwhile, as vLLM's does on one engine."""
    return generate_side_by_side([(job, pending, attempt)])[0]


def generate_side_by_side(flows: list[tuple[Job, Sequence[PreparedRequest], int]]
                          ) -> list[dict[str, Any]]:
    """Several pools of replicas at once on one cluster (a --split-at run's parts side by
    side): each (job, pending, attempt) its own Ray Data pipeline of `job.settings.replicas`
    actors with the job's own settings (its layout), records under its own attempt number;
    one driver loop writes what any of them sends back, so outputs.jsonl keeps one writer.
    Returns an attempts.json record per flow, in order."""
    with engine_output_to(flows[0][0].folder.path / ENGINE_LOG):
        return _generate(flows)


@dataclass
class _Flow:
    """One pipeline: a pool of replicas serving one list of requests."""

    job: Job
    attempt: int
    feed: BatchFeed
    stream: ResultStream
    writer: ResultWriter
    done: bool = False


def _start(job: Job, pending: Sequence[PreparedRequest], attempt: int,
           sim_devices: list[str] | None, first_replica: int, side_by_side: int | None
           ) -> _Flow:
    import ray.data
    from ray.data import ActorPoolStrategy

    settings, placement = job.settings, job.cluster.placement
    size, in_flight = batching(len(pending), settings.replicas, settings.max_num_seqs,
                               simulated=job.simulated)
    feed = BatchFeed(pending, size, ROUNDS_AHEAD * settings.replicas * in_flight,
                     lambda request: _request_item(request, settings))
    dataset = ray.data.from_items([{BATCH_COLUMN: key} for key in range(feed.batches)],
                                  override_num_blocks=max(1, feed.batches))
    results = dataset.map_batches(
        ReplicaWorker,
        fn_constructor_kwargs={"spec": ReplicaSpec(
            settings, placement.device, job.target,
            sampling=job.workload.facts(settings).sampling,
            store=feed.store)},
        batch_size=1, batch_format="pyarrow",
        compute=ActorPoolStrategy(size=settings.replicas,
                                  max_tasks_in_flight_per_actor=in_flight,
                                  max_concurrent_calls_per_actor=in_flight),
        num_cpus=placement.num_cpus, resources=placement.resources or None,
        runtime_env={"env_vars": _worker_env()})
    job.log(f"{settings.replicas} replica(s) on Ray ({placement.describe()} each), batches of "
            f"{size}, {in_flight} in flight per replica")
    writer = ResultWriter(job, attempt, feed, sim_devices, first_replica, side_by_side)
    return _Flow(job, attempt, feed, ResultStream(results).start(), writer)


def _sim_devices(job: Job, firsts: list[int], total: int) -> list[list[str] | None]:
    """Each flow's simulated device labels (flows starting at replica `firsts[i]`, `total`
    in all): the replicas of all flows fill the instances in flow order (a side-by-side
    split's short replicas first)."""
    if not job.simulated:
        return [None] * len(firsts)
    from neuron_batch.device.replica_layout import replica_devices

    assert job.target is not None   # (simulated: there is one)
    labels = replica_devices(job.target.instance, job.target.tp, total,
                             job.settings.num_instances)
    return [labels[first:end] for first, end in zip(firsts, [*firsts[1:], total])]


def _generate(flow_specs: list[tuple[Job, Sequence[PreparedRequest], int]]
              ) -> list[dict[str, Any]]:
    job = flow_specs[0][0]
    settings, folder, log, cluster = job.settings, job.folder, job.log, job.cluster
    sizes = [flow_job.settings.replicas for flow_job, _, _ in flow_specs]
    firsts = [sum(sizes[:i]) for i in range(len(sizes))]
    group = flow_specs[0][2] if len(flow_specs) > 1 else None
    flows = [_start(flow_job, pending, attempt, devices, first, group)
             for (flow_job, pending, attempt), devices, first
             in zip(flow_specs, _sim_devices(job, firsts, sum(sizes)), firsts)]
    started = time.time()
    bar = progress_bar(settings, sum(flow.feed.total for flow in flows))

    def write(flow: _Flow, table) -> None:
        added, _ = flow.writer.write(table, flow.job.log)
        if bar is not None and added:
            bar.update(added)
            elapsed = max(time.time() - started, 1e-9)
            tokens = sum(f.writer.output_tokens for f in flows)
            bar.set_postfix_str(f"{tokens / elapsed:,.0f} out tok/s", refresh=False)

    try:
        with deferring(RUNNING) as stop:
            ended, lost, failed = _drain(flows, settings, cluster, stop, write)
        # Stopping early: what already came back is kept. Ray Data's threads end before Ray
        # shuts down (results.py says why).
        stopped_cleanly = all([flow.stream.stop() for flow in flows])
        for flow in flows:
            for table in flow.stream.received():
                write(flow, table)
    finally:
        if bar is not None:
            bar.close()
        for flow in flows:
            flow.writer.close()
        folder.close_outputs()
        for flow in flows:
            flow.stream.stop()
            flow.feed.stop()
        cluster.shutdown()   # stops the replicas (they belong to this driver's job)
    finished = sum(flow.writer.finished for flow in flows)
    if not stopped_cleanly:
        log("warning: Ray Data's result thread did not end after its execution was shut down")
    if lost is not None:
        raise RunError(f"{lost}; {finished} request(s) finished and are kept in "
                       f"{folder.path}; rerun with --resume when the cluster can hold the "
                       f"replicas (or with fewer --replicas)", EXIT_FAILED)
    if isinstance(failed, InputChanged):    # (read again as a batch was made: not as checked)
        raise RunError(f"{failed}; {finished:,} finished output(s) are kept in {folder.path}; "
                       f"once the input is as it was, rerun with --resume", EXIT_FAILED)
    if failed is not None:
        raise _replica_failure(failed, finished, folder.path)
    return [_outcome(flow, ended, started, stop) for flow in flows]


def _drain(flows: list[_Flow], settings, cluster, stop: RunSignals,
           write: Callable[[_Flow, Any], None]
           ) -> tuple[str, str | None, BaseException | None]:
    """Write each flow's results as they come back until every flow is done or the run must
    end: (how it ended, why the cluster cannot go on or None, what a replica or reading the
    job raised or None)."""
    deadline = (time.monotonic() + settings.max_runtime) if settings.max_runtime else None
    next_node_check = time.monotonic() + NODE_CHECK_S
    failed: BaseException | None = None
    while failed is None and not all(flow.done for flow in flows):
        if deadline is not None and time.monotonic() >= deadline:
            stop.reason = stop.reason or "deadline"
        if stop.reason is not None:
            return stop.reason, None, None
        if time.monotonic() >= next_node_check:
            next_node_check = time.monotonic() + NODE_CHECK_S
            lost = cluster.lost_node_message()
            if lost is not None:
                return "completed", lost, None
        active = [flow for flow in flows if not flow.done]
        failed = next((f.feed.error for f in active if f.feed.error is not None), None)
        for flow in active if failed is None else ():
            got = flow.stream.get(timeout=0.25 / len(active))
            if got is None:
                continue
            kind, value = got
            if kind == "done":
                flow.done = True
            elif kind == "error":
                failed = value
                break
            else:
                write(flow, value)
    return "completed", None, failed


def _outcome(flow: _Flow, ended: str, started: float, stop: RunSignals) -> dict[str, Any]:
    """The flow's attempts.json record: a flow whose results had all come back completed,
    even if the run was stopped while another one still ran."""
    writer, job = flow.writer, flow.job
    if flow.done:
        ended = "completed"
    if ended != "completed":
        left = flow.feed.total - writer.finished - len(writer.errors)
        job.log(f"{'--max-runtime reached' if ended == 'deadline' else 'stopping'}: "
                f"abandoning {left} unfinished request(s); rerun with --resume")
    missing = flow.feed.total - writer.finished - len(writer.errors)
    if flow.done and missing > 0:   # (a guard: feed.py's store gives every batch one row)
        job.log(f"warning: {missing:,} request(s) did not come back from the replicas; they "
                f"are not in outputs.jsonl: rerun with --resume to run them")
    if writer.duplicates:
        job.log(f"{writer.duplicates} request(s) came back twice (a replica restarted) and "
                f"were written once")
    return Attempt(attempt=flow.attempt, ended=Ended(ended), requests_finished=writer.finished,
                   wall_time_s=round(time.time() - started, 3),
                   started=time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
                   device=job.cluster.placement.device, pid=os.getpid(),
                   requests_failed=len(writer.errors), errors=writer.errors[:MAX_ERRORS_KEPT],
                   ray=job.cluster.address, generation_s=writer.generation_s(),
                   replicas=writer.replica_info(), **stopped_by(stop, ended, job.settings)
                   ).to_dict()


def _replica_failure(error: BaseException, finished: int, path) -> RunError:
    cause = _root_cause(error)
    if _failed_to_start(error) and cause.startswith("ValueError: "):
        # vLLM's own configuration checks, as on one engine: a usage error
        return RunError(f"vLLM refused the configuration (in a replica): "
                        f"{cause.removeprefix('ValueError: ')}")
    return RunError(f"a replica failed after {finished} request(s): {cause}; finished "
                    f"outputs are kept in {path}; rerun with --resume", EXIT_FAILED)


def _request_item(request: PreparedRequest, settings) -> dict[str, Any]:
    # (the spec as JSON text: one string cell, whatever fields the request asks for). A
    # synthetic prompt travels as what makes it, a few numbers, not its tokens: the driver
    # does not hold a trace's tokens, and the replica makes them as it adds the request.
    item: dict[str, Any] = {"id": request.record.id,
                            "spec": json.dumps(request_spec(request, settings))}
    recipe = request.recipe()
    if recipe is not None:
        item["recipe"] = recipe
    else:
        item["tokens"] = encode_tokens(request.prompt_token_ids)
    return item


def _worker_env() -> dict[str, str]:
    env = {name: value for name, value in os.environ.items()
           if name.startswith(FORWARDED_ENV_PREFIXES)}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


#: "SomeError: message" lines of a traceback, and Ray's own wrapper names to look past.
_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(\w*(?:Error|Exception)): (\S.*)$")
_RAY_WRAPPERS = ("SystemException", "UserCodeException", "RayTaskError", "ActorDiedError",
                 "RayActorError", "ActorUnavailableError", "RaySystemError")


def _root_cause(error: BaseException) -> str:
    """The replica's own error out of Ray's wrappers: Ray Data's SystemException around an
    ActorDiedError whose text carries the replica's traceback, ending in what went wrong."""
    chain, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = (getattr(current, "cause", None) or current.__cause__
                   or current.__context__)
    found = None
    for item in chain:
        for line in str(item).splitlines():
            match = _ERROR_LINE.match(line.strip())
            if match and match[1] not in _RAY_WRAPPERS:
                found = f"{match[1]}: {match[2]}"
    if found is not None:
        return found
    text = str(chain[-1]).strip().splitlines()
    return f"{type(chain[-1]).__name__}: {text[-1] if text else ''}".rstrip(": ")


def _failed_to_start(error: BaseException) -> bool:
    """Whether a replica died building its engine (an error in the actor's creation task)."""
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if "error raised in its creation task" in str(current):
            return True
        current = (getattr(current, "cause", None) or current.__cause__
                   or current.__context__)
    return False
