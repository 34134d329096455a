"""The input lines a run skipped (`--on-error skip`), kept in its folder as `skipped.jsonl`: one
JSON object a line, `file`, `line`, `field`, `reason`.

Without it the only copy was what the terminal showed, which under cron is a mail that --quiet
leaves without its heading. The file is rewritten at every attempt (and removed when nothing
is skipped), so after a --resume it says what this input skips now, not what an older one did.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from neuron_batch.inputs.prompt_records import InputProblem

SKIPPED = "skipped.jsonl"


def skipped_row(problem: InputProblem) -> dict:
    """A problem as a row: its source ("path:LINE", "path:row N", "path:item N") split into the
    file and where in it; `line` is a number for line-based inputs, else the reader's words."""
    file, _, where = problem.source.rpartition(":")
    if not file:                      # a source without a position names the input as a whole
        file, where = problem.source, ""
    line: int | str | None = int(where) if where.isdigit() else (where or None)
    return {"file": file, "line": line, "field": problem.field, "reason": problem.message}


def write_skipped(folder: Path, problems: Sequence[InputProblem]) -> Path | None:
    """`skipped.jsonl` in `folder` holding `problems` (atomically); none: the file is removed.
    Returns its path, or None when nothing was skipped."""
    path = folder / SKIPPED
    if not problems:
        path.unlink(missing_ok=True)
        return None
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(skipped_row(p), ensure_ascii=False) + "\n"
                           for p in problems), encoding="utf-8")
    os.replace(tmp, path)
    return path
