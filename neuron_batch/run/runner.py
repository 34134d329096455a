"""`neuron-batch run`: load prompts, run them through vLLM with the Neuron scheduler, write
every output as it finishes, and report. No click here: the CLI turns `RunError`s into exits.

Exit codes (also in `neuron-batch run --help` and the README):
    0  every request completed
    1  the run failed (engine or system error); finished outputs are kept
    2  bad usage or bad input; nothing was run
    3  partial: the run finished but some inputs were skipped (--on-error skip) or failed
    4  interrupted (SIGTERM, SIGINT or --max-runtime); finished outputs are kept, --resume goes on
    5  the output folder is in use by another run
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from neuron_batch.config import RunSettings
from neuron_batch.run.folder import (
    REPORT,
    OutputError,
    RunFolder,
    default_output_dir,
    input_fingerprint,
    write_json_atomic,
)
from neuron_batch.inputs.prepare import PreparedRequest, prepare_requests
from neuron_batch.inputs.prompts import InputError, InputProblem, describe_input, load_prompts

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PARTIAL, EXIT_INTERRUPTED, EXIT_BUSY = 0, 1, 2, 3, 4, 5
MAX_PROBLEMS_SHOWN = 20


class RunError(Exception):
    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class RunResult:
    exit_code: int
    output_dir: Path
    report: dict[str, Any] | None = None
    problems: list[InputProblem] = field(default_factory=list)


def say(settings: RunSettings, message: str) -> None:
    if not settings.quiet:
        print(message, file=sys.stderr, flush=True)


@dataclass
class Workload:
    """Prompts read, checked and tokenized: what a run (or every configuration of a sweep) runs."""

    model: Any
    prepared: Any
    problems: list[InputProblem]
    input_kind: str
    tokenizer: Any

    def prompt_lengths(self) -> list[int]:
        return [len(r.prompt_token_ids) for r in self.prepared.requests]


def load_workload(settings: RunSettings, log: Callable[[str], None]) -> Workload:
    """Read every input and tokenize it before anything slow happens: a bad file fails in a
    second, before any model loads."""
    try:
        loaded = load_prompts(settings.inputs, prompt_column=settings.prompt_column,
                              split=settings.split, limit=settings.limit,
                              shuffle=settings.shuffle, seed=settings.seed,
                              default_max_tokens=settings.max_tokens)
    except InputError as error:
        raise RunError(str(error)) from None
    log(describe_input(loaded))
    model, tokenizer, tokenizer_name, vocab_size = _model_and_tokenizer(settings, log)
    prepared = prepare_requests(loaded.records, tokenizer=tokenizer, tokenizer_name=tokenizer_name,
                                vocab_size=vocab_size, max_model_len=settings.max_model_len,
                                default_max_tokens=settings.max_tokens)
    problems = loaded.problems + prepared.problems
    if problems:
        _show_problems(problems, settings, log)
        if settings.on_error == "fail":
            raise RunError(f"{len(problems)} input problem(s); nothing was run. Fix them, or "
                           f"pass --on-error skip to run the rest and report them")
    if not prepared.requests:
        raise RunError("no runnable prompts in the input")
    return Workload(model, prepared, problems, loaded.kind, tokenizer)


def run(settings: RunSettings, *, log: Callable[[str], None] | None = None,
        workload: Workload | None = None) -> RunResult:
    settings = settings.validate()
    log = log or (lambda message: say(settings, message))
    workload = workload or load_workload(settings, log)
    device, model, prepared, problems = (settings.device, workload.model, workload.prepared,
                                         workload.problems)
    tokenizer = workload.tokenizer
    if device == "sim":
        _check_sim(settings, model)

    # 3. The output folder: locked, and resumed if asked.
    out_dir = Path(settings.output) if settings.output else default_output_dir(settings.inputs)
    folder = RunFolder(out_dir)
    try:
        folder.lock()
    except OutputError as error:
        raise RunError(str(error), error.exit_code) from None
    try:
        return _run_locked(settings, device, model, prepared, problems, folder, tokenizer, log,
                           workload.input_kind)
    except OutputError as error:
        raise RunError(str(error), error.exit_code) from None
    finally:
        folder.unlock()


def _run_locked(settings, device, model, prepared, problems, folder, tokenizer, log, input_kind):
    ids = [r.record.id for r in prepared.requests]
    fingerprint = input_fingerprint(ids)
    manifest = folder.read_manifest()
    if folder.has_previous_run():
        if not settings.resume:
            raise RunError(f"{folder.path} already holds a run; pass --resume to finish it, or "
                           f"choose another --output")
        if manifest is not None and manifest.get("input_fingerprint") != fingerprint:
            raise RunError(f"{folder.path} holds a run of different input (other prompts, "
                           f"--limit, --shuffle or --seed); choose another --output")
    folder.write_manifest({"settings": settings.to_dict(), "model": model.name,
                           "input_fingerprint": fingerprint, "num_requests": len(ids),
                           "num_skipped": len(problems), "input_kind": input_kind})
    folder.load_done()
    folder.open_outputs()
    pending = [r for r in prepared.requests if r.record.id not in folder.done_ids]
    attempts = folder.attempts()
    attempt = len(attempts) + 1
    if pending:
        log(f"running {len(pending):,} of {len(ids):,} requests on {device_label(settings)} "
            f"(output: {folder.path})")
        try:
            outcome = _generate(settings, model, pending, folder, attempt, tokenizer, log)
        except RunError as error:  # keep a trace of the failed attempt next to its outputs
            attempts.append({"attempt": attempt, "ended": "failed", "error": str(error)})
            folder.write_attempts(attempts)
            raise
        attempts.append(outcome)
        folder.write_attempts(attempts)
    else:
        outcome = {"ended": "nothing to do"}
        log(f"all {len(ids):,} requests already done in {folder.path}")

    report = build_report(folder, settings, model, prepared, problems)
    write_json_atomic(folder.path / REPORT, report)
    if settings.metrics_textfile:
        from neuron_batch.report.summary import prometheus_text, write_text_atomic

        write_text_atomic(settings.metrics_textfile,
                          prometheus_text(report, labels={"output": str(folder.path)}))
    if not settings.quiet:
        from neuron_batch.report.summary import format_summary

        print(format_summary(report), flush=True)
    code = EXIT_OK
    if outcome.get("ended") in ("interrupted", "deadline"):
        code = EXIT_INTERRUPTED
    elif report["requests"]["skipped"] or report["requests"]["failed"]:
        code = EXIT_PARTIAL
    return RunResult(code, folder.path, report, problems)


def device_label(settings: RunSettings) -> str:
    if settings.device == "sim":
        return f"a simulated {settings.sim.instance}"
    return f"device '{settings.device}'"


def _model_and_tokenizer(settings: RunSettings, log):
    from neuron_batch.run.models import ModelError, load_tokenizer, resolve_model

    try:
        model = resolve_model(settings.model, progress=log)
    except ModelError as error:
        raise RunError(str(error)) from None
    tokenizer = load_tokenizer(model) if model.has_tokenizer else None
    tokenizer_name = model.name if tokenizer is not None else None
    if tokenizer is None and settings.device == "sim":
        # The simulated device needs no weights, but text must still become tokens: use the
        # built-in model's tokenizer and say so in the report.
        builtin = resolve_model(None, progress=log)
        tokenizer = load_tokenizer(builtin)
        tokenizer_name = f"{builtin.name} (built-in, standing in for {model.name})"
    vocab_size = _vocab_size(model.path, tokenizer)
    return model, tokenizer, tokenizer_name, vocab_size


def _vocab_size(model_path: str, tokenizer) -> int:
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
        return int(config["vocab_size"])
    except (OSError, KeyError, ValueError):
        return len(tokenizer) if tokenizer is not None else 32_000


def _show_problems(problems: list[InputProblem], settings: RunSettings, log) -> None:
    verb = "skipped" if settings.on_error == "skip" else "found"
    log(f"{len(problems)} input problem(s) {verb}:")
    for problem in problems[:MAX_PROBLEMS_SHOWN]:
        print(f"  {problem}", file=sys.stderr)
    if len(problems) > MAX_PROBLEMS_SHOWN:
        print(f"  ... and {len(problems) - MAX_PROBLEMS_SHOWN} more", file=sys.stderr)


# -- generation ---------------------------------------------------------------------------

class _StopFlag:
    """Set by SIGTERM/SIGINT: stop admitting, abandon in-flight requests, flush, exit 4.
    The handler only sets a flag, so vLLM is never interrupted halfway through a step."""

    def __init__(self):
        self.reason: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread (e.g. under a test runner thread)
                pass
        return self

    def _handle(self, signum, frame):
        if self.reason is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: the user insists
        self.reason = "interrupted"

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def _generate(settings: RunSettings, model, pending: list[PreparedRequest], folder: RunFolder,
              attempt: int, tokenizer, log) -> dict[str, Any]:
    from neuron_batch.run.engine import Engine, detect_device, engine_kwargs

    device = settings.device if settings.device != "auto" else detect_device()
    simulated = device == "sim"
    workdir = folder.path / ".work"
    workdir.mkdir(exist_ok=True)
    kwargs = engine_kwargs(settings, device, model.path, folder.records_path(attempt), workdir,
                           has_tokenizer=model.has_tokenizer and not simulated)
    started = time.time()
    log("loading the model into vLLM" if not simulated else "starting the simulated device")
    try:
        engine = Engine(kwargs)
    except ValueError as error:  # vLLM's own configuration checks (KV cache too small, ...)
        raise RunError(f"vLLM refused the configuration: {error}") from None
    detokenize = model.has_tokenizer and not simulated
    by_id: dict[str, PreparedRequest] = {}
    for request in pending:
        record = request.record
        by_id[record.id] = request
        temperature = settings.temperature if record.temperature is None else record.temperature
        engine.add(record.id, request.prompt_token_ids, request.max_tokens, temperature,
                   record.stop, settings.seed + record.index,
                   ignore_eos=simulated or settings.ignore_eos,
                   detokenize=detokenize)
    deadline = (time.monotonic() + settings.max_runtime) if settings.max_runtime else None
    bar = _progress_bar(settings, len(pending))
    finished = output_tokens = 0
    errors: list[str] = []   # requests the engine finished with an error (e.g. too big for KV)
    ended = "completed"
    try:
        with _StopFlag() as stop:
            while engine.has_unfinished():
                if deadline is not None and time.monotonic() >= deadline:
                    stop.reason = stop.reason or "deadline"
                if stop.reason is not None:
                    ended = stop.reason
                    unfinished = [i for i in by_id if i not in folder.done_ids]
                    log(f"{'--max-runtime reached' if ended == 'deadline' else 'stopping'}: "
                        f"abandoning {len(unfinished)} unfinished request(s); rerun with --resume")
                    engine.abort(unfinished)
                    for _ in engine.step():
                        pass
                    break
                for done in engine.step():
                    if done.finish_reason == "abort":
                        continue
                    if done.finish_reason == "error":
                        errors.append(str(done.stop_reason or f"request {done.request_id} "
                                                                 f"failed in the engine"))
                        log(f"error: {errors[-1]}")
                        continue
                    request = by_id[done.request_id]
                    folder.append_output(_output_row(request, done, model.name, simulated))
                    folder.done_ids.add(done.request_id)
                    finished += 1
                    output_tokens += len(done.token_ids)
                    if bar is not None:
                        bar.update(1)
                        elapsed = max(time.time() - started, 1e-9)
                        bar.set_postfix_str(f"{output_tokens / elapsed:,.0f} out tok/s",
                                            refresh=False)
    except OutputError:
        raise
    except Exception as error:  # the engine died: keep what finished, say so, exit 1
        raise RunError(f"the engine failed after {finished} request(s): {error!r}; finished "
                       f"outputs are kept in {folder.path}; rerun with --resume",
                       exit_code=EXIT_FAILED) from error
    finally:
        if bar is not None:
            bar.close()
        engine.close()
        folder.close_outputs()
    return {"attempt": attempt, "ended": ended, "requests_finished": finished,
            "requests_failed": len(errors), "errors": errors[:MAX_PROBLEMS_SHOWN],
            "wall_time_s": round(time.time() - started, 3),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
            "device": device, "pid": os.getpid()}


def _progress_bar(settings: RunSettings, total: int):
    if settings.quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc="requests", file=sys.stderr, smoothing=0.1)


def _output_row(request: PreparedRequest, done, model_name: str, simulated: bool) -> dict:
    record = request.record
    if record.openai is not None:
        return _openai_row(request, done, model_name)
    row: dict[str, Any] = {"id": record.id, "index": record.index}
    if record.prompt is not None:
        row["prompt"] = record.prompt
    elif record.messages is not None:
        row["messages"] = record.messages
    row["num_prompt_tokens"] = len(request.prompt_token_ids)
    row["output"] = done.text
    if done.text is None and not simulated:
        row["output_token_ids"] = done.token_ids
    row["num_output_tokens"] = len(done.token_ids)
    row["finish_reason"] = done.finish_reason
    return row


def _openai_row(request: PreparedRequest, done, model_name: str) -> dict:
    """A line of the OpenAI batch output format, as `vllm run-batch` writes it."""
    record = request.record
    chat = record.openai.get("url", "").endswith("/chat/completions")
    text = done.text or ""
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": done.finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": done.finish_reason}
        obj = "text_completion"
    usage = {"prompt_tokens": len(request.prompt_token_ids),
             "completion_tokens": len(done.token_ids),
             "total_tokens": len(request.prompt_token_ids) + len(done.token_ids)}
    body = {"id": f"cmpl-{record.id}", "object": obj, "created": int(time.time()),
            "model": record.openai.get("model") or model_name, "choices": [choice],
            "usage": usage}
    return {"id": f"batch_req_{record.index}", "custom_id": record.id,
            "response": {"status_code": 200, "request_id": record.id, "body": body},
            "error": None}


# -- report -------------------------------------------------------------------------------

def build_report(folder: RunFolder, settings: RunSettings, model, prepared, problems) -> dict:
    """The report over the whole input, from every attempt's records and the outputs file."""
    from neuron_batch.report.metrics import summarize
    from neuron_batch.scheduler.records import concat_attempts, read_records

    attempts = [read_records(p) for p in folder.records_paths()]
    attempts = [a for a in attempts if a.steps or a.requests] or attempts
    if not attempts:
        raise RunError(f"{folder.path} has no scheduler records", EXIT_FAILED)
    records = concat_attempts(attempts)
    # Abandoned (aborted) or failed requests are not completed work: leave them out.
    records.requests = [r for r in records.requests if r.finish_reason not in ("abort", "error")]
    devices = [a.get("device") for a in folder.attempts() if a.get("device")]
    extra = {"model": model.name, "device": devices[-1] if devices else settings.device,
             "tokenizer": prepared.tokenizer_name, "max_tokens": settings.max_tokens,
             "temperature": settings.temperature, "inputs": list(settings.inputs)}
    if settings.device == "sim":
        extra["sim"] = _sim_description(settings, model)
        if settings.sim.architecture:  # the model simulated, not the one lending its tokenizer
            extra["model"] = f"{extra['sim']['arch']} (simulated)"
    total = len(prepared.requests) + len(problems)
    completed = len(folder.done_ids & {r.record.id for r in prepared.requests})
    report = summarize(records, extra_config=extra, total=total, skipped=len(problems),
                       failed=0)
    _tokens_from_outputs(report, folder)
    # Failed: what the last attempt could not run (a --resume tries those again).
    ran = [a for a in folder.attempts() if "requests_failed" in a]
    failed = ran[-1]["requests_failed"] if ran else 0
    report["requests"]["completed"] = completed
    report["requests"]["failed"] = failed
    report["requests"]["pending"] = len(prepared.requests) - completed - failed
    report["requests"]["max_tokens_clamped"] = sum(r.max_tokens_clamped for r in prepared.requests)
    report["attempts"] = folder.attempts()
    report["output_dir"] = str(folder.path)
    return report


def _tokens_from_outputs(report: dict, folder: RunFolder) -> None:
    """Token totals and rates from outputs.jsonl, the record of what finished: scheduler records
    of an attempt killed with -9 may lack its last fraction of a second."""
    input_tokens = output_tokens = 0
    for row in folder.read_outputs():
        usage = (row.get("response") or {}).get("body", {}).get("usage")
        if usage is not None:
            input_tokens += usage["prompt_tokens"]
            output_tokens += usage["completion_tokens"]
        else:
            input_tokens += row["num_prompt_tokens"]
            output_tokens += row["num_output_tokens"]
    total = input_tokens + output_tokens
    report["tokens"] = {"input": input_tokens, "output": output_tokens, "total": total}
    elapsed = report["throughput"]["elapsed_s"]
    rate = (lambda amount: amount / elapsed if elapsed > 0 else 0.0)
    report["throughput"].update(input_tokens_per_s=rate(input_tokens),
                                output_tokens_per_s=rate(output_tokens),
                                total_tokens_per_s=rate(total))
    report["total_num_tokens"] = total
    report["tokens_per_second"] = rate(total)


def _check_sim(settings: RunSettings, model) -> None:
    """Instance, architecture, TP, context length and KV capacity: fail before any set-up."""
    import tempfile

    from neuron_batch.run.engine import engine_kwargs

    try:
        _sim_description(settings, model)
        with tempfile.TemporaryDirectory() as tmp:
            engine_kwargs(settings, "sim", model.path, Path(tmp) / "records.jsonl", Path(tmp),
                          has_tokenizer=False)
    except (ValueError, FileNotFoundError) as error:
        raise RunError(f"--device sim: {error}") from None


def _sim_description(settings: RunSettings, model) -> dict:
    from neuron_batch.device.sim import SimSettings, describe_sim

    prefill, decode = settings.buckets()
    sim = settings.sim
    return describe_sim(SimSettings(instance=sim.instance, arch=sim.architecture or model.path,
                                    tp_degree=sim.tensor_parallel_size,
                                    weight_dtype=sim.weight_dtype, profile=sim.cost_profile),
                        max_model_len=settings.max_model_len, num_prefill_buckets=len(prefill),
                        num_decode_buckets=len(decode), kv_reserve=settings.kv_reserve)


def rerender(path: Path) -> str:
    """`neuron-batch report DIR`: the summary of a finished run again, from its files."""
    from neuron_batch.report.summary import format_summary

    report_path = path / REPORT if path.is_dir() else path
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunError(f"{report_path}: no report here; is {path} a neuron-batch run folder?")
    return format_summary(report)

