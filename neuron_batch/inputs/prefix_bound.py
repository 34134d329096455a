"""The prefix bound of a job of any size: `shared_prefix_tokens`' count (inputs/shared_prefix.py)
from prompts fed one at a time, in memory that does not grow with the job. Pure logic (numpy).

The bound is a sum of counts, each of which a stream can keep:

    bound = block x (whole blocks - distinct whole-block prefixes
                     - (block-aligned prompts - distinct block-aligned prompts))

(every prompt's whole blocks, less one per distinct block prefix, less the extra identical
block-aligned prompts: the trie's walk in `shared_prefix_tokens` counts exactly these). A block
prefix is named by a 64-bit hash of its blocks in order, so the two distinct counts are counts
of distinct hashes. They are kept exactly (a sorted array of the hashes) until there are
`exact_limit` of them, then estimated by a HyperLogLog of 2**16 registers (Flajolet et al.
2007): standard error 1.04 / 256 = 0.41% of each count, in 64 KiB. A job whose prompts share
little is the worst case: there the bound's error is 0.41% of its whole prompt tokens; where
they share much, the distinct prefixes are fewer and so is the error (`error_tokens`).

A prefix is named by its hash (inputs/block_hashes.py), made over arrays a prompt at a time.
On 20,000 prompts of the Mooncake trace (5,400 tokens each, blocks of 32) it takes ~65 us a
prompt, most of it reading the list of ids into an array; the block trie it replaced in the
report took ~28 us a prompt but held ~400 bytes a prompt. Prompts given together (`add_all`)
are hashed over one array: 20,000 prompts of ~160 tokens, blocks of 32, took 23.6 us a prompt
one at a time and 3.3 us together (numpy's cost a call was most of a short prompt's).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from neuron_batch.inputs.block_hashes import BlockHashes

_U64 = np.uint64
#: HyperLogLog: 2**_P registers, one byte each
_P = 16
_REGISTERS = 1 << _P
#: hashes held before they are sorted into the distinct ones (or into the registers)
_BUFFER = 1 << 17
#: tokens of prompts hashed together (`PrefixBound.add_all`): ~2 MiB of them packed, ~8 MiB as
#: the blocks' 64-bit matrix
BATCH_TOKENS = 1 << 18


def _merged(distinct: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a sorted distinct array and a batch. (np.union1d, by
    numpy 2's hash table, took ~4x as long; a stable sort merges the two sorted runs.)"""
    joined = np.concatenate([distinct, np.sort(batch)])
    joined.sort(kind="stable")
    keep: np.ndarray = np.empty(len(joined), dtype=bool)
    keep[:1] = True
    np.not_equal(joined[1:], joined[:-1], out=keep[1:])
    return joined[keep]


class _Distinct:
    """A count of distinct 64-bit hashes: exact (a sorted array) to `limit`, then a
    HyperLogLog estimate."""

    def __init__(self, limit: int):
        self.limit = limit
        self.sorted: np.ndarray = np.zeros(0, _U64)
        self.registers: np.ndarray | None = None
        # hashes not yet counted, copied into one buffer (a list of each prompt's arrays
        # was ~150 bytes of header an array, and a view kept its whole prompt's array)
        self._buffer: np.ndarray = np.empty(_BUFFER, _U64)
        self._held = 0

    @property
    def exact(self) -> bool:
        return self.registers is None

    def __getstate__(self) -> dict:
        """Counted, without the buffer (1 MiB of room): what a part of a split check sends."""
        self._settle()
        return {key: value for key, value in self.__dict__.items() if key != "_buffer"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._buffer = np.empty(_BUFFER, _U64)

    def add(self, hashes: np.ndarray) -> None:
        if self._held + len(hashes) > _BUFFER:
            self._settle()
            if len(hashes) > _BUFFER:
                self._count(hashes)
                return
        self._buffer[self._held:self._held + len(hashes)] = hashes
        self._held += len(hashes)

    def _settle(self) -> None:
        if self._held:
            held, self._held = self._held, 0
            self._count(self._buffer[:held])

    def _count(self, batch: np.ndarray) -> None:
        if self.registers is None:
            self.sorted = _merged(self.sorted, batch)
            if len(self.sorted) <= self.limit:
                return
            self._estimated()
            return
        self._register(batch)

    def _estimated(self) -> None:
        """From the exact count to the estimate: the held hashes into the registers."""
        held, self.sorted = self.sorted, np.zeros(0, _U64)
        self.registers = np.zeros(_REGISTERS, np.uint8)
        # (a buffer at a time: the whole held array at once took five times its size)
        for start in range(0, len(held), _BUFFER):
            self._register(held[start:start + _BUFFER])

    def merge(self, other: _Distinct) -> None:
        """`other`'s hashes counted here too (the count of both together)."""
        other._settle()
        if other.registers is None:
            for start in range(0, len(other.sorted), _BUFFER):
                self._settle()
                self._count(other.sorted[start:start + _BUFFER])
            return
        self._settle()
        if self.registers is None:
            self._estimated()
        assert self.registers is not None
        np.maximum(self.registers, other.registers, out=self.registers)

    def _register(self, batch: np.ndarray) -> None:
        assert self.registers is not None
        index = (batch >> _U64(64 - _P)).astype(np.intp)
        rest = batch << _U64(_P)
        # rank: the position of the first 1 bit of what is left (its leading zeros + 1), from
        # the exponent of its float value (rounding can only touch ranks past 2**-53)
        _, exponent = np.frexp(rest.astype(np.float64))
        rank = np.where(rest == 0, 64 - _P + 1, 65 - exponent).astype(np.uint8)
        np.maximum.at(self.registers, index, rank)

    def count(self) -> float:
        self._settle()
        if self.registers is None:
            return float(len(self.sorted))
        m = float(_REGISTERS)
        estimate = 0.7213 / (1 + 1.079 / m) * m * m / float(
            np.sum(np.ldexp(1.0, -self.registers.astype(np.int64))))
        zeros = int(np.count_nonzero(self.registers == 0))
        if estimate <= 2.5 * m and zeros:       # small counts: linear counting
            return m * math.log(m / zeros)
        return estimate


class PrefixBound:
    """`shared_prefix_tokens(prompts, block)` of the prompts given to `add`, one at a time:
    `tokens()` the bound, `exact` whether it was counted (else estimated: `error_tokens`)."""

    #: distinct prefixes counted exactly (8 bytes each): 4 MiB, some 10,000 prompts of the
    #: Mooncake trace (about 50 new blocks of 32 tokens each)
    EXACT_LIMIT = 1 << 19

    def __init__(self, block: int, exact_limit: int = EXACT_LIMIT):
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self.block = block
        self._hashes = BlockHashes(block)
        self._prefixes = _Distinct(exact_limit)
        self._aligned_ends = _Distinct(exact_limit)
        self.whole_blocks = 0
        self.aligned = 0

    def add(self, ids: Sequence[int]) -> None:
        if len(ids) >= self.block:  # (no whole block: nothing to share, nothing served)
            self.add_prefixes(self._hashes.whole(ids), aligned=not len(ids) % self.block)

    def add_all(self, prompts: Iterable[Sequence[int]]) -> None:
        """`add` of each of `prompts`, their hashes made over arrays of about BATCH_TOKENS
        tokens at a time (block_hashes.py `whole_of`): a short prompt's took ~24 us alone,
        ~3 us so (a text job's check hashes every prompt)."""
        batch: list[Sequence[int]] = []
        tokens = 0
        for ids in prompts:
            if len(ids) < self.block:
                continue
            batch.append(ids)
            tokens += len(ids)
            if tokens >= BATCH_TOKENS:
                self._add_batch(batch)
                batch, tokens = [], 0
        self._add_batch(batch)

    def _add_batch(self, prompts: Sequence[Sequence[int]]) -> None:
        if not prompts:
            return
        hashes, counts = self._hashes.whole_of(prompts)
        self.whole_blocks += len(hashes)
        self._prefixes.add(hashes)
        aligned = np.fromiter((not len(ids) % self.block for ids in prompts), dtype=bool,
                              count=len(prompts))
        if aligned.any():
            self.aligned += int(aligned.sum())
            self._aligned_ends.add(hashes[np.cumsum(counts)[aligned] - 1])

    def add_prefixes(self, prefixes: np.ndarray, *, aligned: bool) -> None:
        """A prompt by the hashes of its whole-block prefixes (block_hashes.py; a pass that
        made them for something else: inputs/shared_prefix.py), `aligned` where it ends on a
        block's end."""
        if not len(prefixes):
            return
        self.whole_blocks += len(prefixes)
        self._prefixes.add(prefixes)
        if aligned:
            self.aligned += 1
            self._aligned_ends.add(prefixes[-1:])

    def merge(self, other: PrefixBound) -> None:
        """`other`'s prompts counted here too (a part of a check split across processes):
        the bound of both together, as one pass over all of them would count it."""
        if other.block != self.block:
            raise ValueError(f"bounds of blocks {self.block} and {other.block} do not add up")
        self.whole_blocks += other.whole_blocks
        self.aligned += other.aligned
        self._prefixes.merge(other._prefixes)
        self._aligned_ends.merge(other._aligned_ends)

    @property
    def exact(self) -> bool:
        return self._prefixes.exact and self._aligned_ends.exact

    def tokens(self) -> int:
        distinct = self._prefixes.count()
        ends = self._aligned_ends.count()
        served = self.whole_blocks - distinct - (self.aligned - ends)
        # (an estimate may stray past what can be: clamp it to the possible)
        return max(0, min(round(served), self.whole_blocks)) * self.block

    def error_tokens(self) -> int:
        """One standard error of `tokens()` (0 when exact): each estimated count's."""
        error = sum(counter.count() * 1.04 / math.sqrt(_REGISTERS)
                    for counter in (self._prefixes, self._aligned_ends) if not counter.exact)
        return round(error * self.block)


def prefix_bound(prompts: Sequence[Sequence[int]], block: int,
                 exact_limit: int = PrefixBound.EXACT_LIMIT) -> PrefixBound:
    """The bound of `prompts`, each read once as they iterate; none read where they say they
    share nothing (inputs/prepare.py `PromptTokens.share_nothing`: a token-count trace's own
    synthetic prompts), whose bound is 0, exactly, at any size."""
    bound = PrefixBound(block, exact_limit)
    share_nothing = getattr(prompts, "share_nothing", None)
    if share_nothing is not None and share_nothing(block):
        return bound
    bound.add_all(prompts)
    return bound
