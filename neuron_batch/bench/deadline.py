"""`plan --deadline`: a duration (`6h`, `90m`, `1h30m`, `2d`, `1.5h`) or a moment (`06:00`,
`2026-12-01T06:00`), turned into hours from now. Pure Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

_UNIT_HOURS = {"d": 24.0, "h": 1.0, "m": 1 / 60, "s": 1 / 3600}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([dhms])")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})")
_EXAMPLES = "6h, 90m, 1h30m, 2d, 06:00 (the next 6 a.m.) or 2026-12-01T06:00"


class DeadlineError(ValueError):
    """A deadline that does not parse or lies in the past; the message shows what works."""


@dataclass(frozen=True)
class Deadline:
    text: str           # as the user wrote it
    hours: float        # from `now` to the deadline
    at: str | None      # the moment, ISO 8601, when the user gave one

    def to_dict(self) -> dict:
        return {"text": self.text, "hours": self.hours, "at": self.at}


def parse_deadline(text: str, now: datetime | None = None) -> Deadline:
    """Hours until the deadline `text`; DeadlineError if it does not parse or has passed."""
    raw = str(text).strip()
    compact = raw.lower().replace(" ", "")
    if not compact:
        raise DeadlineError(f"--deadline is empty; write it like {_EXAMPLES}")
    hours = _duration_hours(compact)
    if hours is not None:
        if hours <= 0:
            raise DeadlineError(f"--deadline {raw!r} is no time at all; write it like {_EXAMPLES}")
        return Deadline(raw, hours, None)
    now = now or datetime.now()
    moment = _moment(raw, now)
    if moment is None:
        raise DeadlineError(f"--deadline {raw!r} is neither a duration nor a date and time; "
                            f"write it like {_EXAMPLES}")
    if moment.tzinfo is not None and now.tzinfo is None:
        now = now.astimezone()
    elif moment.tzinfo is None and now.tzinfo is not None:
        moment = moment.replace(tzinfo=now.tzinfo)
    hours = (moment - now).total_seconds() / 3600
    if hours <= 0:
        raise DeadlineError(f"--deadline {raw!r} ({moment.isoformat(timespec='minutes')}) has "
                            f"already passed (now {now.isoformat(timespec='minutes')})")
    return Deadline(raw, hours, moment.isoformat(timespec="minutes"))


def _duration_hours(text: str) -> float | None:
    """`1h30m` -> 1.5; None when `text` is not wholly a sequence of number+unit parts."""
    parts = list(_DURATION.finditer(text))
    if not parts or "".join(p.group(0) for p in parts) != text:
        return None
    units = [p.group(2) for p in parts]
    if len(set(units)) != len(units):
        return None
    return sum(float(p.group(1)) * _UNIT_HOURS[p.group(2)] for p in parts)


def _moment(text: str, now: datetime) -> datetime | None:
    clock = _CLOCK.fullmatch(text)
    if clock:
        hour, minute = int(clock.group(1)), int(clock.group(2))
        if hour > 23 or minute > 59:
            return None
        moment = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
        return moment if moment > now else moment + timedelta(days=1)
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def format_hours(hours: float) -> str:
    """1.5 -> '1 h 30 min', 0.25 -> '15 min', 30 -> '30 h'."""
    minutes = round(hours * 60)
    h, m = divmod(minutes, 60)
    if h and m:
        return f"{h} h {m} min"
    return f"{h} h" if h else f"{m} min"
