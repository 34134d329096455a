"""What batch.json and the report sum over outputs.jsonl (completed requests, prompt, completion
and cached tokens, blank outputs), kept as each line is written and saved beside the file
(outputs.tally.json: the sums and how far into outputs.jsonl they reach), so that neither a
resume's batch.json nor the report reads every output again: only the lines past the last save
(a run killed -9 since), whatever the job's size (issue 46: at 10M requests that read took
about a minute at the report and as long again at each resume).

The saved sums are taken only where they still describe the file: their end within it and the
CRC-32 of the 64 KiB before that end unchanged (a folder moved aside by --restart, outputs
rebuilt from a bucket differently); else every line is read, as a folder written before the
tally existed is.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from neuron_batch.storage.lines import tail_crc

OUTPUTS_TALLY = "outputs.tally.json"
#: Output lines between two saves: what a run killed -9 leaves for the next reader to add.
SAVE_EVERY = 65_536


@dataclass
class OutputsTally:
    completed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    empty: int = 0          # outputs whose text is blank (text only: the simulated device's none)
    end: int = 0            # bytes of outputs.jsonl summed

    def add(self, row: dict[str, Any], size: int) -> None:
        """One output line of `size` bytes."""
        text = output_text(row)
        self.empty += text is not None and not text.strip()
        prompt, completion, cached = row_usage(row)     # (of each shape a response line has)
        self.completed += 1
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.cached_tokens += cached
        self.end += size

    def skip(self, size: int) -> None:
        """A blank line of `size` bytes: summed past, nothing counted."""
        self.end += size


def row_usage(row: dict[str, Any]) -> tuple[int, int, int]:
    """(prompt, completion, cached) tokens of one outputs.jsonl line, of either shape."""
    response = row.get("response")
    if isinstance(response, dict):
        usage = (response.get("body") or {}).get("usage") or {}
        if "input_tokens" in usage:         # a Responses API body
            details = usage.get("input_tokens_details") or {}
            return (usage.get("input_tokens", 0), usage.get("output_tokens", 0),
                    details.get("cached_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        return (usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0),
                details.get("cached_tokens") or 0)
    completion = (row["usage"]["completion_tokens"] if "usage" in row
                  else row.get("num_output_tokens", 0))
    return row.get("num_prompt_tokens", 0), completion, row.get("num_cached_tokens", 0)


def output_text(row: dict[str, Any]) -> str | None:
    """An outputs.jsonl line's generated text: `output`, or the OpenAI batch format's choice."""
    if "response" not in row:
        return row.get("output")
    body = (row.get("response") or {}).get("body") or {}
    if body.get("object") == "response":     # the Responses API's: its message's text
        parts = [part for item in body.get("output") or [] for part in item.get("content") or []]
        return "".join(part.get("text") or "" for part in parts) if parts else None
    choices = ((row.get("response") or {}).get("body") or {}).get("choices") or [{}]
    choice = choices[0]
    return (choice.get("message") or {}).get("content") if "message" in choice \
        else choice.get("text")


def load_tally(folder: Path, outputs: str = "outputs.jsonl") -> OutputsTally:
    """The sums over `folder`'s outputs as the file is now: the saved tally where it still
    describes the file, the whole lines past its end read and added."""
    path = folder / outputs
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return OutputsTally()
    tally = _saved(folder / OUTPUTS_TALLY, path, size) or OutputsTally()
    if tally.end < size:
        with open(path, "rb") as handle:
            handle.seek(tally.end)
            for line in handle:
                if not line.endswith(b"\n"):
                    break       # (a torn last line: not an output)
                if line.strip():
                    tally.add(json.loads(line), len(line))
                else:
                    tally.skip(len(line))
    return tally


def save_tally(folder: Path, tally: OutputsTally, outputs: str = "outputs.jsonl") -> None:
    """Write `tally` beside the outputs it sums (atomically: a reader finds the old or the new).
    A disk too full to take it leaves the old one: a reader adds what it lacks."""
    try:
        crc = tail_crc(folder / outputs, tally.end)
    except FileNotFoundError:
        return      # (no outputs to sum: nothing to save)
    data = {**asdict(tally), "tail_crc": crc}
    tmp = folder / f".{OUTPUTS_TALLY}.tmp"
    try:
        tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
        os.replace(tmp, folder / OUTPUTS_TALLY)
    except OSError:
        tmp.unlink(missing_ok=True)


def _saved(tally_path: Path, outputs: Path, size: int) -> OutputsTally | None:
    try:
        data = json.loads(tally_path.read_text(encoding="utf-8"))
        tally = OutputsTally(**{key: int(data[key]) for key in OutputsTally.__dataclass_fields__})
        crc = int(data["tail_crc"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not 0 <= tally.end <= size or tail_crc(outputs, tally.end) != crc:
        return None
    return tally
