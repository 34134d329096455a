"""The summary's lines on what the run chose for itself: prefix caching (auto's decision or
the one asked, layout/prefix_decision.py) and the verdict after the run (run/verdict.py: an
order, caching choice or max_num_seqs the step model says would have been faster or cheaper,
with the command). Pure Python; they read the report only."""

from __future__ import annotations

import textwrap

from neuron_batch.report.model import Report

INDENT = 12


def caching_lines(report: Report, width: int) -> list[str]:
    """"Caching     auto: off, the prompts share no KV block ..." (nothing for an older
    report)."""
    decision = report.prefix_caching
    if not isinstance(decision, dict) or "enable" not in decision:
        return []
    state = "on" if decision["enable"] else "off"
    words = ((f"auto: {state}" if decision.get("asked") == "auto" else state)
             + (f", {decision['reason']}" if decision.get("reason") else "")
             + (f"; {decision['gather']}" if decision.get("gather") else ""))
    return _wrapped("Caching", words, width)


def verdict_lines(report: Report, width: int) -> list[str]:
    """The verdict's sentences and commands (the summary's last lines); nothing when no
    alternative beats the run by more than noise."""
    verdict = report.verdict
    if not isinstance(verdict, dict) or not verdict.get("lines"):
        return []
    out = []
    for index, item in enumerate(verdict["lines"]):
        out += _wrapped("Verdict" if index == 0 else "", item["text"], width)
        if item.get("command"):
            out += [" " * INDENT + line for line in _command_lines(item["command"],
                                                                   width - INDENT)]
    return out


def _wrapped(title: str, words: str, width: int) -> list[str]:
    return textwrap.wrap(words, width, initial_indent=f"{title:<{INDENT}}",
                         subsequent_indent=" " * INDENT, break_on_hyphens=False,
                         break_long_words=False)


def _command_lines(command: str, width: int) -> list[str]:
    """A command broken between words with a trailing backslash, so that it pastes whole."""
    lines, current = [], ""
    for word in command.split(" "):
        if current and len(current) + 1 + len(word) + 2 > width:
            lines.append(current + " \\")
            current = "    " + word
        else:
            current = f"{current} {word}" if current else word
    return lines + [current]
