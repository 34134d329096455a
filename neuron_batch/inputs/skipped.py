"""The input lines a run skipped (`--on-error skip`), kept in its folder as `skipped.jsonl`: one
JSON object a line, `file`, `line`, `custom_id` (the line's own id, null where it gave none or
could not be read), `field`, `reason`. The same lines are error records in errors.jsonl
(job/outputs.py), in the shape the input's format answers with.

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


def source_position(problem: InputProblem) -> tuple[str, int | str | None]:
    """(file, line) of a problem's source: `line` a number for line-based inputs, else the
    reader's words ("row 4"), None for the input as a whole."""
    file, _, where = problem.source.rpartition(":")
    if not file:                      # a source without a position names the input as a whole
        file, where = problem.source, ""
    return file, int(where) if where.isdigit() else (where or None)


def skipped_row(problem: InputProblem) -> dict:
    """A problem as a row: its source ("path:LINE", "path:row N", "path:item N") split into the
    file and where in it; `line` is a number for line-based inputs, else the reader's words."""
    file, line = source_position(problem)
    return {"file": file, "line": line, "custom_id": problem.custom_id, "field": problem.field,
            "reason": problem.message}


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


def name_problems(problems: Sequence[InputProblem], records) -> None:
    """Give each problem found after its line became a record (a prompt too long, a field the
    path refuses) that record's id, where the problem has none yet."""
    ids = {record.source: record.id for record in records}
    for problem in problems:
        if problem.custom_id is None:
            problem.custom_id = ids.get(problem.source)
