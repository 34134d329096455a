"""A prompt's KV-block prefixes as 64-bit hashes, one per block, made over arrays: the one hash
the prefix bound (inputs/prefix_bound.py), the prefix order (inputs/shared_prefix.py) and the
step model's cache hits (layout/step_estimate.py) name a prefix by. Pure logic (numpy).

Prefix i's hash is `_mix` of a running sum of the hashes of blocks 0..i, each block's a random
odd linear form of its tokens mixed with its position, so equal prefixes hash alike and the
hash of prefix i + 1 needs only prefix i's sum: vectorized per prompt, a few microseconds for a
few thousand tokens (a tuple of each block's tokens hashed in Python was ~20x that). Two
different prefixes hash alike with odds about 2**-64 a pair; what holds many of them says what
that means for it.

A prompt's last, partial block (`units`) is a unit of its own, as vLLM's prefix cache never
shares it but the prefix order groups identical prompts by it: its linear form takes its
tokens and its length, so it differs from any whole block and from a partial block of another
length.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

_U64 = np.uint64
#: splitmix64's finalizer: every output bit depends on every input bit
_MIX1, _MIX2 = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)
_GOLDEN = _U64(0x9E3779B97F4A7C15)
#: what a partial block's form adds per token it lacks (odd: a length in it never cancels)
_PARTIAL = _U64(0xD6E8FEB86659FD93)


def mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> _U64(30))) * _MIX1
    x = (x ^ (x >> _U64(27))) * _MIX2
    return x ^ (x >> _U64(31))


class BlockHashes:
    """The prefix hashes of prompts in blocks of `block` tokens. The coefficients are fixed,
    not drawn per process: a resumed run and a report count as the first did."""

    def __init__(self, block: int):
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self.block = block
        rng = np.random.default_rng(0x5EED_B10C)
        self._coefficients = rng.integers(0, 1 << 63, size=block, dtype=_U64) * _U64(2) + _U64(1)

    def whole(self, ids: Sequence[int]) -> np.ndarray:
        """The hashes of the prompt's whole-block prefixes (its partial last block left out):
        what vLLM's prefix cache can serve."""
        return self._prefixes(ids, partial=False)

    def units(self, ids: Sequence[int]) -> np.ndarray:
        """The hashes of every prefix the prompt's blocks end, its partial last block too:
        equal last hashes are identical prompts."""
        return self._prefixes(ids, partial=True)

    def whole_of(self, prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """`whole` of each of `prompts` at once: (their hashes, one prompt's after another;
        how many each has). The same hashes as `whole` a prompt at a time, made over one
        array for them all: numpy's cost a call, ~20 us, was most of a short prompt's."""
        if not prompts:
            return np.empty(0, dtype=_U64), np.zeros(0, dtype=np.int64)
        block = self.block
        lengths = np.fromiter((len(ids) for ids in prompts), dtype=np.int64,
                              count=len(prompts))
        packed = array("I")
        try:
            for ids in prompts:
                packed.extend(ids)
        except OverflowError:   # a token id past 32 bits (no vocabulary has one)
            packed = array("Q")
            for ids in prompts:
                packed.extend(ids)
        tokens = np.frombuffer(packed, dtype=np.uint32 if packed.typecode == "I" else _U64)
        counts = lengths // block
        owner: np.ndarray = np.repeat(np.arange(len(prompts)), counts)     # each block's prompt
        firsts = np.cumsum(counts) - counts                     # each prompt's first block
        number = np.arange(len(owner), dtype=np.int64) - firsts[owner]     # within its prompt
        starts = (np.cumsum(lengths) - lengths)[owner] + number * block
        forms = tokens[starts[:, None] + np.arange(block)].astype(_U64) @ self._coefficients
        blocks = mix(forms + (number + 1).astype(_U64) * _GOLDEN)
        # (one running sum for all: a prompt's own is it less the sum before its first block;
        # the sums wrap at 2**64 alike, so the difference is the prompt's own sum)
        sums = np.cumsum(blocks, dtype=_U64)
        before = np.concatenate([np.zeros(1, _U64), sums])[firsts]
        return mix(sums - before[owner]), counts

    def _prefixes(self, ids: Sequence[int], *, partial: bool) -> np.ndarray:
        block = self.block
        whole, rest = divmod(len(ids), block)
        if not partial:
            rest = 0
        if not whole and not rest:
            return np.empty(0, dtype=_U64)
        try:
            packed = array("I", ids)    # (the whole list: a slice of it first costs a copy)
        except OverflowError:   # a token id past 32 bits (no vocabulary has one)
            packed = array("Q", ids)
        tokens = np.frombuffer(packed, dtype=np.uint32 if packed.typecode == "I" else _U64)
        # (a product of matrices: the products are summed as they are made, no temporary)
        forms = tokens[:whole * block].reshape(whole, block).astype(_U64) @ self._coefficients
        if rest:
            # (as one-element arrays: numpy wraps arrays silently, but warns for scalars)
            last = (tokens[whole * block:].astype(_U64) * self._coefficients[:rest]).sum(
                dtype=_U64, keepdims=True) + np.full(1, block - rest, _U64) * _PARTIAL
            forms = np.concatenate([forms, last])
        blocks = mix(forms + np.arange(1, len(forms) + 1, dtype=_U64) * _GOLDEN)
        return mix(np.cumsum(blocks, dtype=_U64))
