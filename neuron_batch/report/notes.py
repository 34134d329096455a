"""What a run did that its figures alone would not tell, in sentences: requests a stop left
pending, input lines skipped, requests the engine failed, max_tokens cut to fit, outputs that
came back empty, what requests asked for beyond their tokens (structured outputs, n, logprobs).
The terminal summary prints them under its headline rows; `outcome_line` is the one line
`--quiet` prints when a run did not finish (exit 3 or 4), since cron mails what a run prints and
a silent exit 4 looks like a success. Pure Python; reads the report only, so
`neuron-batch report DIR` says the same again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from neuron_batch.inputs.skipped import SKIPPED
from neuron_batch.report.model import STOPPED, Ended, Report, as_report
from neuron_batch.report.schema import or_none

#: Empty outputs at or above this share of the completed ones get a hint. The built-in instruct
#: model leaves 12 of the 24 built-in prompts empty given as plain text and 1 of 24 (a question
#: answered by its end token) given as chat messages: a quarter lies well between.
EMPTY_SHARE = 0.25

__all__ = ["STOPPED", "notes", "outcome_line", "interrupted_line"]


def notes(report: Report | Mapping[str, Any]) -> list[str]:
    """Every sentence that applies, the most urgent first."""
    report = as_report(report)
    return [s for s in (stop_sentence(report), skipped_sentence(report),
                        failed_sentence(report), clamped_sentence(report),
                        empty_sentence(report), asked_sentence(report)) if s]


def outcome_line(report: Report | Mapping[str, Any]) -> str:
    """One line for a run that did not finish (exit 3 or 4): why, and how to finish it."""
    report = as_report(report)
    words = [s for s in (stop_sentence(report), skipped_sentence(report),
                         failed_sentence(report)) if s] or ["the run did not finish."]
    folder = or_none(report.output_dir)
    return "neuron-batch: " + " ".join(words) + (f" Run folder: {folder}" if folder else "")


def interrupted_line(signal: str, phase: str, *, insisted: bool, completed: int | None,
                     total: int | None, folder: Any) -> str:
    """The one line of a run a signal stopped where no report was written (job/stop.py: before
    the engine ran, or a second signal): where it stopped, what was done, how to go on."""
    why = (f"Stopped at once by a second signal after {signal}" if insisted
           else f"Stopped by {signal}")
    if total is None:
        done = "before any request ran; rerun with --resume to run them."
    elif completed is not None and completed >= total:
        done = f"all {_n(total)} requests done; rerun with --resume to write the report."
    else:
        done = (f"{_n(completed)} of {_n(total)} requests done, {_n(total - (completed or 0))} "
                f"pending; rerun with --resume to finish them.")
    return f"neuron-batch: {why} while {phase}: {done} Run folder: {folder}"


def stop_sentence(report: Report) -> str | None:
    """Requests left pending by SIGTERM/SIGINT or --max-runtime."""
    requests = report.section("requests")
    pending = requests.pending or 0
    if pending <= 0:
        return None
    attempt = next((a for a in reversed(report.attempts or []) if a.ended in STOPPED), None)
    if attempt is not None and attempt.ended == Ended.DEADLINE:
        limit = or_none(attempt.max_runtime_s)
        why = "Stopped at --max-runtime" + (f" ({limit:g} s)" if limit is not None else "")
    elif attempt is not None and attempt.signal:
        why = f"Stopped by {attempt.signal}"
    else:
        why = "Stopped before the end"
    return (f"{why}: {_n(requests.completed)} of {_n(requests.total)} requests "
            f"done, {_n(pending)} pending; rerun with --resume to finish them.")


def skipped_sentence(report: Report) -> str | None:
    skipped = report.section("requests").skipped or 0
    if not skipped:
        return None
    return (f"{_n(skipped)} input line(s) skipped (--on-error skip), each with its file, line, "
            f"field and reason in {SKIPPED}; fix them and run those lines on their own "
            f"(another --output).")


def failed_sentence(report: Report) -> str | None:
    failed = report.section("requests").failed or 0
    if not failed:
        return None
    return (f"{_n(failed)} request(s) failed in the engine (their errors are in errors.jsonl "
            f"and attempts.json); --resume runs them again.")


def clamped_sentence(report: Report) -> str | None:
    """max_tokens past the end of the context is cut (prepare.py): how many, and to what."""
    requests = report.section("requests")
    clamped = requests.max_tokens_clamped or 0
    if not clamped:
        return None
    max_model_len = or_none(report.section("config").max_model_len)
    to = requests.max_tokens_clamped_to or {}
    low, high = to.get("min"), to.get("max")
    amount = ("" if low is None else f" to {_n(low)}" if low == high
              else f" to {_n(low)}-{_n(high)}")
    return (f"{_n(clamped)} request(s) asked for more max_tokens than fit beside their prompt in "
            f"max_model_len {_n(max_model_len)}: cut{amount} tokens (vLLM would stop them there "
            f"anyway); raise --max-model-len for more.")


def empty_sentence(report: Report) -> str | None:
    """Many outputs empty: say so, and the usual cause (an instruct model given plain text)."""
    requests = report.section("requests")
    empty, completed = requests.empty_outputs or 0, requests.completed or 0
    if empty < 2 or empty < EMPTY_SHARE * completed:
        return None
    return (f"{_n(empty)} of {_n(completed)} outputs are empty: the model ended them at once. An "
            f"instruct (chat) model given plain `prompt` text often answers with its end token: "
            f"give such prompts as `messages` records (rendered with the model's chat template) "
            f"or OpenAI /v1/chat/completions lines.")


def asked_sentence(report: Report) -> str | None:
    """What the requests asked for beyond their tokens (request_paths.asked_in)."""
    asked = report.section("requests").asked
    if not asked:
        return None
    parts = []
    if asked.get("constrained"):
        parts.append(f"{_n(asked['constrained'])} constrained to a structured output")
    if asked.get("sampled_n"):
        parts.append(f"{_n(asked['sampled_n'])} sampled n times ({_n(asked.get('samples'))} "
                     f"samples in all)")
    if asked.get("logprobs"):
        parts.append(f"{_n(asked['logprobs'])} asked for logprobs")
    return f"Requests: {', '.join(parts)}." if parts else None


def _n(value: Any) -> str:
    return "-" if value is None else f"{int(value):,}"
