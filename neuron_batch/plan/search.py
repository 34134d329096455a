"""Which option `plan` recommends, and which it may leave unsimulated. Pure Python.

The recommendation is the option with the smallest `objective_key`: the cheapest that meets
the deadline (then the faster), or, when none does, the fastest (then the cheaper). An option
is pruned when even its lower bounds (layout/bounds.py) cannot give a smaller key than the best
option simulated so far. The key of the bounds is never above the key of the real figures
(see `bound_key`), so pruning never drops the option an unpruned plan would recommend, and it
covers the issue's rule too: an option that cannot beat the best on either time or cost
cannot beat it on this key.

`Search` hands out options in order of their bounds (the most promising first, so the best is
found early and prunes the most) and leaves the running to its caller.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterable, Sequence
from typing import Any

#: While simulations run, an option is started beside them only if it could beat what they
#: would give were they to take this much longer than their bounds; otherwise its core waits
#: for them (on a shared machine a simulation likely to be pruned is CPU taken from the one
#: that matters). Only the order changes: what is finally pruned still depends on real figures.
SPECULATION_SLACK = 1.05
#: Relative slack on the bounds when comparing with a simulated figure: floating-point sums of
#: the same step times in another order may differ in the last digits.
BOUND_SLACK = 1e-9


def objective_key(hours: float, usd: float, deadline_h: float) -> tuple[Any, ...]:
    """Smaller is better: meeting the deadline first, then cost and time (or time and cost)."""
    if hours <= deadline_h:
        return (0, usd, hours)
    return (1, hours, usd)


def bound_key(hours_lb: float, usd_lb: float, deadline_h: float) -> tuple[Any, ...]:
    """The smallest key an option with these lower bounds could reach. If its real figures
    meet the deadline, so does the bound, and (0, usd_lb, hours_lb) <= (0, usd, hours); if not,
    the bound key is (0, ...) or (1, hours_lb, usd_lb), both <= (1, hours, usd)."""
    return objective_key(hours_lb * (1 - BOUND_SLACK), usd_lb * (1 - BOUND_SLACK), deadline_h)


def cannot_beat(hours_lb: float, usd_lb: float, best: tuple[Any, ...] | None,
                deadline_h: float) -> bool:
    """True when an option bounded below by (hours_lb, usd_lb) cannot do better than `best`
    (an objective key; None: nothing simulated yet)."""
    return best is not None and bound_key(hours_lb, usd_lb, deadline_h) >= best


class Search:
    """Best-first over options with bounds; the caller runs what `next()` returns and reports
    with `done()`. Options sharing a simulation key are simulated once."""

    def __init__(self, options: Iterable[Any], deadline_h: float, *, prune: bool = True,
                 tighten: Callable[[Any], bool] | None = None):
        self.deadline_h = deadline_h
        self.prune = prune          # False: simulate everything (to check what pruning drops)
        self.speculate = prune      # hold options back that the running ones would likely prune
        # option -> whether its bound rose (plan/tighten.py): asked of each option each time
        # it heads the queue unpruned, until it says no, before it is simulated
        self.tighten = tighten
        self.queue = sorted((o for o in options if o.skip_reason is None), key=self._key)
        self.results: dict[tuple[Any, ...], dict[str, Any]] = {}     # sim_key -> result
        self.running: dict[tuple[Any, ...], list[Any]] = {}   # sim_key -> options waiting on it
        self.best: tuple[Any, ...] | None = None
        self.best_option: Any = None
        self.pruned: list[Any] = []

    def next(self) -> Any | None:
        """The next option to simulate, or None when nothing is left that could beat the best
        or when the next one had better wait for the running ones (options whose simulation
        is running or done are resolved on the way)."""
        while self.queue:
            option = self.queue[0]
            if option.sim_key in self.results:      # simulated already: its figures are free
                while self.tighten is not None and self.tighten(option):
                    pass                            # (its own bound, reported beside them)
                self._settle(self.queue.pop(0), self.results[option.sim_key])
                continue
            if self.prune and cannot_beat(option.hours_bound, option.usd_bound, self.best,
                                          self.deadline_h):
                option.pruned_by = self.best_option.name
                self.pruned.append(self.queue.pop(0))
                continue
            if self.tighten is not None and self.tighten(option):
                insort(self.queue, self.queue.pop(0), key=self._key)     # back in line
                continue
            if option.sim_key in self.running:
                self.running[option.sim_key].append(self.queue.pop(0))
                continue
            if self.speculate and self.running and cannot_beat(
                    option.hours_bound, option.usd_bound, self._hoped_best(), self.deadline_h):
                return None     # the queue is in bound order: the rest would wait too
            self.running[option.sim_key] = [self.queue.pop(0)]
            return option
        return None

    def _key(self, option: Any) -> tuple[Any, ...]:
        return bound_key(option.hours_bound, option.usd_bound, self.deadline_h), option.name

    def _hoped_best(self) -> tuple[Any, ...] | None:
        """The best key once the running simulations end, if they take SPECULATION_SLACK
        times their bounds."""
        hoped = [self.best] if self.best is not None else []
        for waiting in self.running.values():
            option = waiting[0]
            seconds = option.bound_s * SPECULATION_SLACK
            hoped.append(objective_key(option.hours_for(seconds), option.usd_for(seconds),
                                       self.deadline_h))
        return min(hoped) if hoped else None

    def done(self, option: Any, result: dict[str, Any]) -> list[Any]:
        """Record `option`'s simulation; returns every option it settled."""
        waiting = self.running.pop(option.sim_key, [option])
        self.results[option.sim_key] = result
        for other in waiting:
            self._settle(other, result)
        return waiting

    def _settle(self, option: Any, result: dict[str, Any]) -> None:
        option.result = result
        if result.get("replica_s") is None:
            return
        key = objective_key(option.hours_for(result["replica_s"]),
                            option.usd_for(result["replica_s"]), self.deadline_h)
        if self.best is None or key < self.best:
            self.best, self.best_option = key, option

    @property
    def busy(self) -> bool:
        return bool(self.running)


def dry_run(options: Sequence[Any], deadline_h: float, *,
            slack: float | Callable[[Any], float] = 1.1,
            tighten: Callable[[Any], bool] | None = None) -> list[Any]:
    """The options a search would simulate if every run took `slack` times its bound (a
    callable: the option's own): the basis of the estimate `plan` states before starting.
    Leaves the options untouched but for `tighten`ing the bounds of those it reaches (they
    stay lower bounds)."""
    slack_of = slack if callable(slack) else (lambda option, value=slack: value)
    class _Shadow:
        def __init__(self, option: Any) -> None:
            self.option, self.name, self.sim_key = option, option.name, option.sim_key
            self.skip_reason, self.result = option.skip_reason, None
            self.hours_for, self.usd_for = option.hours_for, option.usd_for

        # (read through: tightening raises the option's own bound)
        hours_bound = property(lambda self: self.option.hours_bound)
        usd_bound = property(lambda self: self.option.usd_bound)
        bound_s = property(lambda self: self.option.bound_s)

    search = Search([_Shadow(o) for o in options], deadline_h,
                    tighten=None if tighten is None else lambda shadow: tighten(shadow.option))
    simulated = []
    while (shadow := search.next()) is not None:
        simulated.append(shadow.option)
        search.done(shadow, {"replica_s": shadow.option.bound_s * slack_of(shadow.option)})
    return simulated
