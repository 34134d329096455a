"""Generation: feed the pending requests to the engine, write each output the moment it
finishes, stop cleanly on SIGTERM/SIGINT (job/stop.py: the run's handler, which knows the
phase) or --max-runtime."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from neuron_batch.choices import Device
from neuron_batch.engine.engine_log import ENGINE_LOG, engine_output_to
from neuron_batch.engine.sampling_params import request_spec, sim_tokenizer
from neuron_batch.errors import EXIT_FAILED, RunError
from neuron_batch.inputs.job_requests import close_reading, read_ahead
from neuron_batch.inputs.prepare import PreparedRequest
from neuron_batch.inputs.prompt_records import InputChanged
from neuron_batch.job.folder import OutputError
from neuron_batch.job.job import Job
from neuron_batch.job.stop import RUNNING, STARTING, RunSignals, deferring, enter, pause_point
from neuron_batch.report.model import Attempt, Ended, Startup
from neuron_batch.report.schema import ABSENT
from neuron_batch.settings import RunSettings

#: Requests in the engine at once, in multiples of max_num_seqs (`Feed`).
FEED_DEPTH = 4

#: Engine errors kept in attempts.json (the count is always whole).
MAX_ERRORS_KEPT = 20

#: The clock --max-runtime is measured on, read once before the first step and once per step.
#: A module attribute so that a test can drive it by steps instead of by the machine's speed.
runtime_clock = time.monotonic


def generate(job: Job, pending: Sequence[PreparedRequest], attempt: int) -> dict[str, Any]:
    """Run `pending` through one engine; returns the attempt's record for attempts.json.
    vLLM's and the kernels' own output goes to the run folder's engine.log meanwhile."""
    with engine_output_to(_engine_log(job), preload=_import_vllm):
        return _generate(job, pending, attempt)


#: What vLLM said while `prefetch_vllm` imported it, before the run folder was opened: put at
#: the head of the run's engine.log (`_engine_log`).
_prefetched: list[str] = []


def prefetch_vllm() -> None:
    """vLLM and its LLM entry point imported now, while the processes of a split check read
    the job (job/check_parts.py `meanwhile`): the run's start then waits for the longer of the
    two rather than both (the imports are ~7 s of a simulated run's start here). Their output
    goes to a file of its own, kept for the run's engine.log (not made yet: nothing is written
    to the run folder before the check passes). A failed import is left to the engine's start,
    which raises it as it always did."""
    if "vllm.entrypoints.llm" in sys.modules:
        return
    with tempfile.TemporaryDirectory(prefix="neuron-batch-vllm-") as folder:
        path = Path(folder) / ENGINE_LOG
        with contextlib.suppress(Exception):
            with engine_output_to(path, preload=_import_engine):
                pass
        if path.exists():
            _prefetched.append(path.read_text(encoding="utf-8", errors="replace"))


def _import_engine() -> None:
    _import_vllm()
    import vllm.entrypoints.llm  # noqa: F401


def _engine_log(job: Job) -> Path:
    """The run's engine.log, headed by what an earlier import of vLLM said (`prefetch_vllm`)."""
    path = job.folder.path / ENGINE_LOG
    if _prefetched:
        with open(path, "a", encoding="utf-8") as log:
            log.write("".join(_prefetched))
        _prefetched.clear()
    return path


def _import_vllm() -> None:
    # With its chatter going to engine.log, vLLM may say what it does (INFO) there. The engine
    # core runs in this process: the scheduler's records, signals and the simulated device's
    # clock all stay in one place.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # `import vllm` is lazy: name the modules that bind the log handler to the process's stdout
    # and that warn at import (Triton without a CPU backend).
    import vllm.logger  # noqa: F401
    import vllm.triton_utils  # noqa: F401


def resolved_device(job: Job) -> str:
    """The device the engine runs on, in the one word the report and every message use: the
    --device given, or for auto what vLLM's platform finds (cpu, cuda, neuron), asked once a
    run (`job.device`). vLLM is imported with its chatter going to engine.log, as `generate`
    does."""
    if job.device is None and job.settings.device == Device.AUTO:
        with engine_output_to(_engine_log(job), preload=_import_vllm):
            return _device(job)
    return _device(job)


def _device(job: Job) -> str:
    """`resolved_device` where vLLM's output already goes to engine.log."""
    if job.device is None:
        from neuron_batch.engine.engine import detect_device

        job.device = (detect_device() if job.settings.device == Device.AUTO
                      else job.settings.device)
    return job.device


def _generate(job: Job, pending: Sequence[PreparedRequest], attempt: int) -> dict[str, Any]:
    """Start the engine, run the step loop, close it; the attempt's record."""
    from neuron_batch.engine.engine import RequestRefused

    settings, folder = job.settings, job.folder
    engine, device, startup, started = _start_engine(job, pending, attempt)
    progress = _Progress(started)

    def refuse(request: PreparedRequest, error: Exception) -> None:
        # What the checks at read time missed (vLLM's own, per request): under --on-error skip
        # that request's error record; else named below, with what finished kept.
        progress.errors.append(job.outputs.refused(request, error))
        job.log(f"error: {progress.errors[-1]}")

    feed = Feed(engine, pending, settings,
                on_refused=(RequestRefused, refuse) if settings.on_error == "skip" else None)
    bar = progress_bar(settings, len(pending))
    try:
        with deferring(RUNNING) as stop:
            ended = _step_loop(job, engine, feed, progress, bar, stop)
    except RequestRefused as error:
        # What the checks at read time missed (vLLM's own, per request): named; what finished
        # before it is kept.
        refused_request = feed.last     # (RequestRefused comes from adding one: this one)
        assert refused_request is not None
        raise RunError(f"{refused_request.record.source}: vLLM refused the request: {error}"
                       + (f"; {progress.finished:,} finished output(s) are kept in "
                          f"{folder.path}" if progress.finished else "")) from None
    except OutputError:
        raise
    except InputChanged as error:   # (read again as the engine took it: not what was checked)
        raise RunError(f"{error}; {progress.finished:,} finished output(s) are kept in "
                       f"{folder.path}; once the input is as it was, rerun with --resume",
                       exit_code=EXIT_FAILED) from None
    except Exception as error:  # the engine died: keep what finished, say so, exit 1
        raise RunError(f"the engine failed after {progress.finished} request(s): {error!r}; "
                       f"finished outputs are kept in {folder.path}; rerun with --resume",
                       exit_code=EXIT_FAILED) from error
    finally:
        if bar is not None:
            bar.close()
        feed.close()
        engine.close()
        folder.close_outputs()
    return Attempt(attempt=attempt, ended=Ended(ended), requests_finished=progress.finished,
                   wall_time_s=round(time.time() - started, 3),
                   started=time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
                   device=device, pid=os.getpid(), requests_failed=len(progress.errors),
                   errors=progress.errors[:MAX_ERRORS_KEPT],
                   **stopped_by(stop, ended, settings),
                   startup=Startup.from_dict(startup) if startup is not None else ABSENT
                   ).to_dict()


def _start_engine(job: Job, pending: Sequence[PreparedRequest], attempt: int):
    """(the engine, the device it runs on, the start-up's record on a Neuron device or None,
    when it began starting):
    its arguments built, the model loaded (the graphs compiled or loaded on Neuron); from the
    engine on, a first signal lets the step loop close it."""
    from neuron_batch.engine.engine import Engine, engine_kwargs

    settings, folder, log, model = job.settings, job.folder, job.log, job.workload.model
    enter(STARTING)     # (a split's second part starts its engine after the first one ran)
    device = _device(job)
    simulated = job.simulated
    workdir = folder.path / ".work"
    workdir.mkdir(exist_ok=True)
    kwargs = engine_kwargs(settings, device, model.path, folder.records_path(attempt), workdir,
                           has_tokenizer=model.has_tokenizer and not simulated, target=job.target,
                           sampling=job.workload.facts(settings).sampling,
                           tokenizer=sim_tokenizer(job), batch_arrival=True)
    started = time.time()
    on_neuron = simulated or device == "neuron"
    if on_neuron:
        from neuron_batch.job.startup import after_start, before_start, startup_words

        state = before_start(job, kwargs, folder.path / ENGINE_LOG, log)
    log("loading the model into vLLM" if not simulated else "starting the simulated device")
    pause_point(STARTING)
    try:
        engine = Engine(kwargs, quiet=settings.quiet)
    except ValueError as error:  # vLLM's own configuration checks (KV cache too small, ...)
        raise RunError(f"vLLM refused the configuration: {error}") from None
    enter(RUNNING, defer=True)  # from here a first signal lets the loop close the engine
    startup = (after_start(job, state, time.time() - started, folder.path / ENGINE_LOG)
               if on_neuron else None)
    if on_neuron and (said := startup_words(startup)):
        log(said)
    return engine, device, startup, started


class _Progress:
    """What the step loop has done so far: requests finished, output tokens, and the errors
    (requests refused, or finished with an error such as too big for the KV cache)."""

    def __init__(self, started: float):
        self.started = started
        self.finished = 0
        self.output_tokens = 0
        self.errors: list[str] = []


def _step_loop(job: Job, engine, feed: Feed, progress: _Progress, bar, stop: RunSignals
               ) -> str:
    """Step the engine until every request is done or the run stops (a signal, --max-runtime:
    the requests in flight abandoned); returns how the attempt ended."""
    settings = job.settings
    deadline = (runtime_clock() + settings.max_runtime) if settings.max_runtime else None
    feed.refill()
    while engine.has_unfinished():
        if deadline is not None and runtime_clock() >= deadline:
            stop.reason = stop.reason or "deadline"
        if stop.reason is not None:
            job.log(f"{'--max-runtime reached' if stop.reason == 'deadline' else 'stopping'}: "
                    f"abandoning {feed.unfinished():,} unfinished request(s); rerun with "
                    f"--resume")
            engine.abort(list(feed.in_flight))
            for _ in engine.step():
                pass
            return stop.reason
        for done in engine.step():
            _take_output(job, feed, done, progress, bar)
        feed.refill()
    return "completed"


def _take_output(job: Job, feed: Feed, done, progress: _Progress, bar) -> None:
    """One finished request: its output line (or its error record), the progress bar."""
    if done.finish_reason == "abort":
        return
    request = feed.in_flight.pop(done.request_id, None)
    if done.finish_reason == "error":
        progress.errors.append(job.outputs.failed(request, done))
        job.log(f"error: {progress.errors[-1]}")
        return
    job.outputs.response(request, done)
    job.folder.done.add(request.record.index if request is not None else None, done.request_id)
    progress.finished += 1
    if progress.finished == 1:
        pause_point(RUNNING)
    progress.output_tokens += len(done.token_ids)
    if bar is not None:
        bar.update(1)
        elapsed = max(time.time() - progress.started, 1e-9)
        bar.set_postfix_str(f"{progress.output_tokens / elapsed:,.0f} out tok/s", refresh=False)


class Feed:
    """The job's requests handed to the engine as its scheduler drains them: at most
    FEED_DEPTH x max_num_seqs added and unfinished at once. vLLM keeps each added request's
    state (about 13 KiB) until it finishes; a job handed over whole would hold all of them
    before the first step. The scheduler runs max_num_seqs at once and takes the next ones
    from its waiting queue in the order given, so a queue a few times that deep keeps every
    step as full as the whole job would, and keeps --order's order."""

    def __init__(self, engine, pending: Sequence[PreparedRequest], settings: RunSettings,
                 on_refused: tuple[type[Exception], Callable[[PreparedRequest, Exception], None]]
                 | None = None):
        self._engine, self._settings = engine, settings
        # (the engine's refusal and its handler under --on-error skip; None: a refusal raises)
        self._on_refused = on_refused
        self._next = read_ahead(pending)    # (text: tokenized on a thread, ahead of the engine)
        self._left = len(pending)
        self.limit = FEED_DEPTH * settings.max_num_seqs
        self.in_flight: dict[str, PreparedRequest] = {}     # added, not finished
        self.last: PreparedRequest | None = None            # the one added last

    def refill(self) -> None:
        """Add requests until FEED_DEPTH x max_num_seqs are in the engine or none is left
        (RequestRefused from the engine: `last` is the request it refused; under --on-error
        skip it goes to `on_refused` instead and the next one is added)."""
        while len(self.in_flight) < self.limit and self._left:
            request = self.last = next(self._next)
            self._left -= 1
            try:
                self._engine.add(request.record.id, request.prompt_token_ids,
                                 request_spec(request, self._settings))
            except Exception as error:
                if self._on_refused is None or not isinstance(error, self._on_refused[0]):
                    raise
                self._on_refused[1](request, error)
                continue
            self.in_flight[request.record.id] = request

    def close(self) -> None:
        close_reading(self._next)

    def unfinished(self) -> int:
        """Requests not finished: those in the engine and those not handed to it yet."""
        return len(self.in_flight) + self._left


def stopped_by(stop: RunSignals, ended: str, settings: RunSettings) -> dict[str, Any]:
    """What stopped an attempt early, for the summary's words (nothing when it ran to the end):
    the signal's name, or the --max-runtime it reached."""
    if ended == "interrupted" and stop.signal:
        return {"signal": stop.signal}
    if ended == "deadline":
        return {"max_runtime_s": settings.max_runtime}
    return {}


def progress_bar(settings: RunSettings, total: int):
    if settings.quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc="requests", file=sys.stderr, smoothing=0.1)
