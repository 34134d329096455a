"""Choose bucket lists that waste as little padding (or modelled time) as possible.

On Neuron every bucket is a separately compiled graph, so a deployment can only afford a few.
Given a histogram of the sizes a workload produces (prefill chunk lengths in tokens, or decode
batch sizes in sequences), this module finds the bucket list of at most K entries, the last one
fixed at the step maximum, that minimises

    sum over sizes s of  count(s) * cost(bucket_for(s, buckets))

where cost(b) = b by default (padded tokens / padded sequences) or any per-step cost model the
caller passes (e.g. modelled prefill step time of bucket b). Pure Python, no numpy or vLLM.

The problem
-----------
Let s_1 < ... < s_n be the distinct sizes with counts c_i, and v_1 < ... < v_m = maximum the
candidate bucket values. A bucket list is a subset of the candidates ending at v_m; sizes in
(previous bucket, v_j] are padded to v_j. With W_j = total count of sizes <= v_j (W_0 = 0 for
"no previous bucket"), a bucket v_j whose predecessor is v_i costs

    C(i, j) = (W_j - W_i) * cost(v_j),

so the objective is a sum of C over consecutive pairs, which is a textbook 1-D segmentation DP.

Which candidate values suffice (why the DP only looks at observed sizes)
-----------------------------------------------------------------------
Split the integers 1..maximum into the gaps [s_i, s_{i+1}) (with s_{n+1} = maximum) plus the
fixed last bucket `maximum`. Values below s_1 serve no size. Every bucket b in the gap
[s_i, s_{i+1}) serves exactly the sizes in (previous bucket, s_i] -- there is no size in
(s_i, b] -- so *where* in its gap a bucket sits changes only the price cost(b) it charges, never
which sizes it serves. Two buckets in one gap are never useful (the upper one serves nothing
and can be dropped at no cost). Hence, for ANY cost function, an optimal plan only needs, per
gap, the value of minimum cost in that gap (the smallest such value on ties), and `maximum`.

* Padded-tokens objective (cost(b) = b), and more generally any cost that is non-decreasing:
  the cheapest value of the gap [s_i, s_{i+1}) is its left end s_i, an observed size. So
  restricting candidates to the observed sizes plus `maximum` loses nothing; with a strictly
  increasing cost (cost(b) = b) every optimal plan consists of observed sizes only.
* Arbitrary (non-monotone) cost: a value strictly inside a gap can be cheaper than the
  observed size at its left end (e.g. a shape the compiler happens to handle well), and then
  it beats it. The optimiser cannot know such values without being told: pass them as
  `candidates=` (passing `range(1, maximum + 1)` makes the result exact over all integers).
  Whatever is passed, the candidates are first reduced to the cheapest one per gap, so the DP
  never has more than n + 1 candidates however many extra values are given.

Algorithms and complexity
-------------------------
``G_k[i]`` = least cost of covering all sizes above v_i with exactly k more buckets, the last
being `maximum`:  G_1[i] = C(i, m),  G_k[i] = min_{i < j <= m-k+1} C(i, j) + G_{k-1}[j].
The DP runs from the top so that the plan can be rebuilt from the smallest bucket upwards,
taking the *leftmost* minimiser at each step: that yields the lexicographically smallest
optimal list. One pass gives the best plan for every k = 1..K.

* Plain DP: O(K * m^2) cost evaluations, m = number of candidates (<= distinct sizes + 1).
  Valid for any cost. Inner loops run through ``map`` over list slices (about 5 M evaluations
  per second): m = 2,300 with K = 8 takes about 4 s, m = 14,000 about 2.5 minutes.
* Divide and conquer (below) on the same data: about 0.1 s and 1 s.
* Divide and conquer: O(K * m log m). Valid when cost(v_j) is non-decreasing over the
  candidates (always for the default cost). Proof that the leftmost minimiser opt(i) is
  non-decreasing in i: for rows i < i' and columns j < j' with i' < j,
      C(i, j) + C(i', j') - C(i, j') - C(i', j) = (W_i' - W_i) * (cost(v_j) - cost(v_j')) <= 0
  because W is non-decreasing and cost is non-decreasing: the quadrangle (Monge) inequality.
  The G_{k-1}[j] terms are per column and cancel. If the leftmost minimisers had j' = opt(i')
  < j = opt(i), then A[i][j'] > A[i][j] and A[i'][j'] <= A[i'][j], while the Monge inequality on
  rows i < i', columns j' < j gives A[i][j'] + A[i'][j] <= A[i][j] + A[i'][j'] -- a
  contradiction (all four entries are finite because i < i' < j' < j). So each row's optimum
  can be searched between its neighbours' optima, and D&C needs O(m log m) evaluations per k.
  With integer costs (the default) the arithmetic is exact and D&C returns exactly the plain
  DP's plan; with float costs both are exact up to rounding in near-ties.

``method="auto"`` (the default) uses D&C whenever the candidate costs are non-decreasing and
the plain DP otherwise; ``"plain"`` and ``"dc"`` force one (``"dc"`` refuses a cost that is not
monotone, because its answer could then be wrong).

Ties are broken deterministically: lower cost, then fewer buckets, then the lexicographically
smallest bucket list.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add, mul, sub
from typing import Literal

from neuron_batch.runtimes.buckets import (
    bucket_for,
    validate_buckets,
)

Cost = Callable[[int], float]
Method = Literal["auto", "plain", "dc"]

__all__ = [
    "BucketPlan",
    "evaluate",
    "optimal_buckets",
    "plans_for_each_k",
    "prefill_chunk_lengths",
    "size_histogram",
]


@dataclass(frozen=True)
class BucketPlan:
    """A bucket list and what it costs on a workload.

    actual: sum of size * count (real tokens or sequences); padded: sum of bucket * count;
    cost: sum of count * cost(bucket) (equal to padded when no cost model is given; an int
    whenever the cost model returns ints, so comparisons are exact).
    """

    buckets: tuple[int, ...]
    actual: int
    padded: int
    cost: float

    @property
    def waste_fraction(self) -> float:
        """Share of the padded work that is padding: (padded - actual) / padded, 0.0 if idle."""
        if self.padded == 0:
            return 0.0
        return (self.padded - self.actual) / self.padded


# ----------------------------------------------------------------------------- input checking

def _as_int(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{what} must be a whole number, got {value!r}") from None


def _positive(value: object, name: str) -> int:
    number = _as_int(value, name)
    if number < 1:
        raise ValueError(f"{name} must be at least 1, got {number}")
    return number


def size_histogram(counts: Mapping[int, int], maximum: int | None) -> list[tuple[int, int]]:
    """Sorted (size, count) pairs with count > 0. Size 0 (an empty step) is dropped: it runs
    no graph (bucket_for(0) == 0) and costs nothing. Sizes above `maximum` are an error."""
    merged: dict[int, int] = {}
    for raw_size, raw_count in counts.items():
        size = _as_int(raw_size, "a size")
        count = _as_int(raw_count, f"the count of size {size}")
        if size < 0:
            raise ValueError(f"sizes must not be negative, got {size}")
        if count < 0:
            raise ValueError(f"counts must not be negative, got {count} for size {size}")
        if size == 0 or count == 0:
            continue
        if maximum is not None and size > maximum:
            raise ValueError(f"size {size} is above the largest bucket {maximum}; no bucket "
                             f"can hold it")
        merged[size] = merged.get(size, 0) + count
    return sorted(merged.items())


def _cost_table(cost: Cost | None) -> Callable[[int], float]:
    """cost(b), checked to be a finite number and evaluated once per value."""
    if cost is None:
        return lambda bucket: bucket
    cache: dict[int, float] = {}

    def lookup(bucket: int) -> float:
        try:
            return cache[bucket]
        except KeyError:
            pass
        value = cost(bucket)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:
                value = float(value)  # e.g. numpy scalars, Fraction, Decimal
            except (TypeError, ValueError):
                raise ValueError(f"cost({bucket}) returned {value!r}, not a number") from None
        if not math.isfinite(value):
            raise ValueError(f"cost({bucket}) returned {value!r}; costs must be finite")
        cache[bucket] = value
        return value

    return lookup


def _total(terms: list) -> float:
    """Exact sum for ints, correctly rounded (order-independent) sum for floats."""
    if all(type(term) is int for term in terms):
        return sum(terms)
    return math.fsum(terms)


def _plan(hist: list[tuple[int, int]], buckets: Sequence[int], price: Callable[[int], float]
          ) -> BucketPlan:
    actual = padded = 0
    terms = []
    for size, count in hist:
        bucket = bucket_for(size, buckets)
        actual += size * count
        padded += bucket * count
        terms.append(count * price(bucket))
    return BucketPlan(tuple(buckets), actual, padded, _total(terms))


# ----------------------------------------------------------------------------- chunking

def prefill_chunk_lengths(prompt_lengths: Iterable[int], max_num_batched_tokens: int,
                          max_model_len: int) -> Counter[int]:
    """Histogram of prefill chunk sizes: chunk size -> how many chunks of that size.

    A prompt of L tokens is prefilled in ceil(L / M) chunks (M = max_num_batched_tokens): all of
    M tokens but the last, which has L - (k-1) * M. A prompt longer than max_model_len cannot
    be served and is an error; so is an empty or negative one.
    """
    step = _positive(max_num_batched_tokens, "max_num_batched_tokens")
    limit = _positive(max_model_len, "max_model_len")
    per_length = Counter(_as_int(length, "a prompt length") for length in prompt_lengths)
    chunks: Counter[int] = Counter()
    for length, times in per_length.items():
        if length < 1:
            raise ValueError(f"prompt length {length} is not a valid prompt (needs >= 1 token)")
        if length > limit:
            raise ValueError(f"prompt length {length} is longer than max_model_len = {limit}")
        full, rest = divmod(length, step)
        if full:
            chunks[step] += full * times
        if rest:
            chunks[rest] += times
    return chunks


# ----------------------------------------------------------------------------- the DP

def _candidates(sizes: list[int], maximum: int, price: Callable[[int], float],
                extra: Iterable[int] | None) -> list[int]:
    """The cheapest value of each gap [s_i, s_{i+1}) (smallest on ties), then `maximum`.

    See the module docstring for why this loses nothing for any cost function.
    """
    gap_ends = [size for size in sizes if size < maximum] + [maximum]
    best = list(gap_ends[:-1])  # observed sizes are always candidates
    if extra is not None:
        for raw in extra:
            value = _as_int(raw, "a candidate bucket")
            if not 1 <= value <= maximum:
                raise ValueError(f"candidate bucket {value} is outside 1..{maximum}")
            gap = bisect_right(gap_ends, value) - 1  # gap_ends[gap] <= value < gap_ends[gap+1]
            if gap < 0 or gap == len(best):
                continue  # below the smallest size (serves nothing) or the maximum itself
            current = best[gap]
            cheaper = price(value) < price(current)
            if cheaper or (price(value) == price(current) and value < current):
                best[gap] = value
    return best + [maximum]


def _rows_plain(W: list[int], c: list[float], prev: list[float], rows: int, col_hi: int
                ) -> tuple[list[float], list[int]]:
    values: list[float] = []
    opt: list[int] = []
    for i in range(rows):
        lo = i + 1
        Wi = W[i]
        costs = list(map(add, prev[lo:col_hi + 1],
                         map(mul, map(sub, W[lo:col_hi + 1], repeat(Wi)), c[lo:col_hi + 1])))
        best = min(costs)
        values.append(best)
        opt.append(lo + costs.index(best))
    return values, opt


def _rows_dc(W: list[int], c: list[float], prev: list[float], rows: int, col_hi: int
             ) -> tuple[list[float], list[int]]:
    values: list[float] = [0] * rows
    opt = [0] * rows
    stack = [(0, rows - 1, 1, col_hi)]
    while stack:
        lo, hi, opt_lo, opt_hi = stack.pop()
        if lo > hi:
            continue
        mid = (lo + hi) // 2
        first = max(opt_lo, mid + 1)
        Wi = W[mid]
        costs = list(map(add, prev[first:opt_hi + 1],
                         map(mul, map(sub, W[first:opt_hi + 1], repeat(Wi)), c[first:opt_hi + 1])))
        best = min(costs)
        j = first + costs.index(best)
        values[mid] = best
        opt[mid] = j
        stack.append((lo, mid - 1, opt_lo, j))
        stack.append((mid + 1, hi, j, opt_hi))
    return values, opt


def _solve(counts: Mapping[int, int], max_buckets: int, maximum: int, cost: Cost | None,
           candidates: Iterable[int] | None, method: Method) -> list[BucketPlan]:
    """Best plan with at most k buckets, for k = 1..max_buckets, from one DP pass."""
    max_buckets = _positive(max_buckets, "max_buckets")
    maximum = _positive(maximum, "the largest bucket (maximum)")
    if method not in ("auto", "plain", "dc"):
        raise ValueError(f"method must be 'auto', 'plain' or 'dc', got {method!r}")
    hist = size_histogram(counts, maximum)
    price = _cost_table(cost)
    sizes = [size for size, _ in hist]
    values = _candidates(sizes, maximum, price, candidates)
    m = len(values)

    # W[j] = total count of sizes <= values[j-1]; W[0] = 0 is "no previous bucket".
    cumulative = list(accumulate(count for _, count in hist))
    W = [0]
    for v in values:
        covered = bisect_right(sizes, v)
        W.append(cumulative[covered - 1] if covered else 0)
    c = [0] + [price(v) for v in values]

    monotone = all(c[j] <= c[j + 1] for j in range(1, m))
    if method == "dc" and not monotone:
        raise ValueError("method='dc' needs a cost that is non-decreasing over the candidate "
                         "buckets; use method='plain' (or 'auto') for this cost")
    rows_for = _rows_dc if (method == "dc" or (method == "auto" and monotone)) else _rows_plain

    kmax = min(max_buckets, m)
    total = W[m]
    G = [(total - W[i]) * c[m] for i in range(m)]  # k = 1: rows i = 0..m-1
    exact_opts: list[list[int]] = [[], []]           # exact_opts[k][i], k >= 2
    exact_values = [G[0]]
    for k in range(2, kmax + 1):
        G, opt = rows_for(W, c, G, m - k + 1, m - k + 1)
        exact_opts.append(opt)
        exact_values.append(G[0])

    def rebuild(k: int) -> tuple[int, ...]:
        chosen = []
        i = 0
        for remaining in range(k, 1, -1):
            i = exact_opts[remaining][i]
            chosen.append(values[i - 1])
        chosen.append(maximum)
        return tuple(chosen)

    plans: list[BucketPlan] = []
    best: BucketPlan | None = None
    for k in range(1, max_buckets + 1):
        if k <= kmax:
            candidate = _plan(hist, rebuild(k), price)
            # Strictly better only: on a tie keep the plan with fewer buckets.
            if best is None or candidate.cost < best.cost:
                best = candidate
        plans.append(best)  # type: ignore[arg-type]
    return plans


def plans_for_each_k(counts: Mapping[int, int], max_buckets: int, maximum: int, *,
                     cost: Cost | None = None, candidates: Iterable[int] | None = None,
                     method: Method = "auto") -> list[BucketPlan]:
    """The best plan with at most k buckets for each k = 1..max_buckets (one DP pass).

    Entry k-1 is what optimal_buckets(counts, k, maximum) returns, so costs never increase
    with k; when k exceeds the number of useful candidates the plan stops changing.
    """
    return _solve(counts, max_buckets, maximum, cost, candidates, method)


def optimal_buckets(counts: Mapping[int, int], max_buckets: int, maximum: int, *,
                    cost: Cost | None = None, candidates: Iterable[int] | None = None,
                    method: Method = "auto") -> BucketPlan:
    """The bucket list of at most max_buckets entries, ending at `maximum`, of least cost.

    counts: size -> how many steps have that size (sizes above `maximum` are an error, size 0
    is ignored). cost: price of one step padded to bucket b (default: b itself, i.e. minimise
    padded tokens or sequences); it need not be monotone. candidates: extra bucket values the
    optimiser may use besides the observed sizes; only matters for a non-monotone cost (see
    the module docstring). Exact: O(K m log m) for a non-decreasing cost, O(K m^2) otherwise,
    m <= distinct sizes + 1. Ties: fewer buckets, then the lexicographically smallest list.
    Empty counts give the plan (maximum,).
    """
    return _solve(counts, max_buckets, maximum, cost, candidates, method)[-1]


def evaluate(counts: Mapping[int, int], buckets: Sequence[int], *, cost: Cost | None = None
             ) -> BucketPlan:
    """Padding (and cost) of a given bucket list, e.g. the defaults, on a size histogram."""
    buckets = list(buckets)
    largest = buckets[-1] if buckets else 1
    validate_buckets(buckets, largest, name="buckets", max_name="its largest bucket")
    hist = size_histogram(counts, largest)
    return _plan(hist, buckets, _cost_table(cost))
