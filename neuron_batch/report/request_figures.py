"""What the report needs of a run's finished requests, added up as their columns are read: counts
and token sums (exact), what they asked of the sampler, and their latency distributions
(report/quantiles.py: exact percentiles to 131,072 requests, within 0.5% past them). A
single engine's records are read a block at a time into these (report/run_records.py `load`,
`streamed`), so the report holds no column of a whole run. Pure logic (numpy).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from neuron_batch.report.quantiles import Quantiles


class RequestColumns(Protocol):
    """Requests by column, as report/run_records.py `RequestColumns` holds them (named here by
    what is read, since run_records builds these figures)."""

    arrival: np.ndarray
    first_token: np.ndarray
    finished: np.ndarray
    num_prompt_tokens: np.ndarray
    num_output_tokens: np.ndarray
    num_cached_tokens: np.ndarray
    constrained: np.ndarray
    logprobs: np.ndarray

    @property
    def sample_of(self) -> Sequence[str | None]: ...

    def __len__(self) -> int: ...


@dataclass
class RequestFigures:
    rows: int = 0               # every request row added (empty records: none)
    completed: int = 0          # those finished
    prompt_tokens: int = 0      # of the finished
    output_tokens: int = 0
    cached_tokens: int = 0
    constrained: int = 0        # of every row: what they asked (report/sampling.py)
    logprobs: int = 0
    samples: Counter[str] = field(default_factory=Counter)     # parent id -> samples run
    ttft: Quantiles = field(default_factory=Quantiles)
    tpot: Quantiles = field(default_factory=Quantiles)
    e2e: Quantiles = field(default_factory=Quantiles)

    @classmethod
    def of(cls, columns: RequestColumns) -> RequestFigures:
        figures = cls()
        figures.add(columns)
        return figures

    def add(self, columns: RequestColumns) -> None:
        """Add the rows of `columns` (the caller chose which count: report/run_records.py
        `RequestColumns.completed`)."""
        finished = columns.finished
        done = ~np.isnan(finished)
        outputs = columns.num_output_tokens[done]
        self.rows += len(columns)
        self.completed += int(done.sum())
        self.prompt_tokens += int(columns.num_prompt_tokens[done].sum())
        self.output_tokens += int(outputs.sum())
        self.cached_tokens += int(columns.num_cached_tokens[done].sum())
        self.constrained += int(columns.constrained.astype(bool).sum())
        self.logprobs += int(columns.logprobs.astype(bool).sum())
        self.samples.update(p for p in columns.sample_of if p is not None)
        arrival, finished = columns.arrival[done], finished[done]
        first = columns.first_token[done]
        has_first = ~np.isnan(first)
        # TPOT leaves out the first token, whose time is TTFT; one-token requests have none
        many = has_first & (outputs >= 2)
        self.ttft.add(first[has_first] - arrival[has_first])
        self.tpot.add((finished[many] - first[many]) / (outputs[many] - 1))
        self.e2e.add(finished - arrival)

    def merge(self, other: RequestFigures) -> None:
        for name in ("rows", "completed", "prompt_tokens", "output_tokens", "cached_tokens",
                     "constrained", "logprobs"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.samples.update(other.samples)
        self.ttft.merge(other.ttft)
        self.tpot.merge(other.tpot)
        self.e2e.merge(other.e2e)

    def latency(self) -> dict[str, dict[str, float | None]]:
        """The report's `latency` section."""
        return {"ttft_s": self.ttft.describe(), "tpot_s": self.tpot.describe(),
                "e2e_s": self.e2e.describe()}
