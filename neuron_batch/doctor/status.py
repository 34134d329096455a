"""One line of `neuron-batch doctor`'s verdict, and its four statuses: shared by its
judgement (checks.py) and the checks it delegates (export.py). Pure."""

from __future__ import annotations

from dataclasses import dataclass

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"


@dataclass
class Check:
    name: str
    status: str          # OK | WARN | FAIL | INFO
    value: str
    detail: str | None = None
