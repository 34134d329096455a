"""What a job's prompts share, over KV blocks of their token ids: the order that runs requests
sharing a prefix together (`run --order prefix`), and the prompt tokens an unbounded prefix
cache could serve (the report's `prefix_cache.bound_tokens`, counted by inputs/prefix_bound.py
as the prompts stream). Pure Python.

The order reads a trie of the prompts' blocks (vLLM's prefix cache matches whole blocks from a
prompt's start, so a prompt's cacheable prefixes are exactly its paths from the root). The trie
is compressed: a run of blocks without a branch is one edge, labelled by a slice of the prompt
that first made it, and blocks are compared as list slices. Building it costs comparisons in C
over the shared tokens and Python work per branch, not per block: scripts/bench_order.py times
the 12,031 prompts (145 M tokens) of the Mooncake trace.
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Sequence

#: The KV block of the simulated device and of the Beta plugin (vLLM's CPU default is larger;
#: a smaller block only splits groups more finely): the order's block when the run names none.
DEFAULT_BLOCK = 32


#: A node's children and terminals before it has any: one shared empty value, never written
#: (most nodes are leaves, and a dict and a list each per prompt were most of the trie's size).
_NO_CHILDREN: dict[bytes | tuple[int, ...], _Node] = {}
_NO_TERMINALS: list[int] = []


class _Node:
    """A point in the trie: the prompts whose first `depth` blocks are this path."""

    __slots__ = ("children", "depth", "longest", "src", "terminals")

    def __init__(self, src: int, depth: int):
        self.src = src              # the prompt whose tokens label the edge into this node:
                                    # the first to reach it, so the least index below it
        self.depth = depth          # blocks from the root (the last may be a partial one)
        self.children = _NO_CHILDREN    # by the next block's tokens (`_key`)
        self.terminals = _NO_TERMINALS  # prompts that end here: identical ones, by index
        self.longest = 0            # the longest request below it (order by length)

    def add_child(self, key: bytes | tuple[int, ...], child: _Node) -> None:
        if self.children is _NO_CHILDREN:
            self.children = {}
        self.children[key] = child

    def add_terminal(self, index: int) -> None:
        if self.terminals is _NO_TERMINALS:
            self.terminals = []
        self.terminals.append(index)


def _key(ids: Sequence[int], start: int, block: int) -> bytes | tuple[int, ...]:
    """A block's tokens as a dict key: 4 bytes a token (a tuple of them was 8 bytes a token
    and the tuple's own header), equal exactly where the tokens are. (A token id past 32 bits,
    which no vocabulary has, keeps the tuple: the same tokens still give the same key.)"""
    tokens = ids[start:start + block]
    try:
        return array("I", tokens).tobytes()
    except OverflowError:
        return tuple(tokens)


def _matched(a: Sequence[int], b: Sequence[int], known: int, last: int, block: int) -> int:
    """The most blocks, between `known` (already equal) and `last`, in which `a` and `b` agree
    from the start: a partial block equals only the same partial block."""
    if a[known * block:last * block] == b[known * block:last * block]:
        return last
    good, bad = known, last
    while bad - good > 1:
        mid = (good + bad) // 2
        if a[good * block:mid * block] == b[good * block:mid * block]:
            good = mid
        else:
            bad = mid
    return good


def _build(prompts: Sequence[Sequence[int]], block: int) -> _Node:
    """The compressed block trie of `prompts`, inserted in index order."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    # The slices compared are garbage at once; the collector, woken by them, would walk every
    # prompt's list each time (most of the time on a long trace). Nothing here makes cycles.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _insert_all(prompts, block)
    finally:
        if collecting:
            gc.enable()


def _insert_all(prompts: Sequence[Sequence[int]], block: int) -> _Node:
    root = _Node(-1, 0)
    for index, ids in enumerate(prompts):
        units = -(-len(ids) // block)
        node, depth = root, 0
        while depth < units:
            start = depth * block
            key = _key(ids, start, block)
            child = node.children.get(key)
            if child is None:
                child = _Node(index, units)
                node.add_child(key, child)
                depth = units
                node = child
                break
            other = prompts[child.src]
            matched = _matched(ids, other, depth + 1, min(child.depth, units), block)
            if matched < child.depth:       # they part inside the edge: split it there
                middle = _Node(child.src, matched)
                node.children[key] = middle
                middle.add_child(_key(other, matched * block, block), child)
                child = middle
            node, depth = child, matched
        node.add_terminal(index)
    return root


def _preorder(root: _Node) -> list[_Node]:
    nodes, stack = [], [root]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    return nodes


def prefix_order(prompts: Sequence[Sequence[int]], block: int = DEFAULT_BLOCK,
                 lengths: Sequence[int] | None = None) -> list[int]:
    """The indices of `prompts` in prefix order: a depth-first walk of their block trie, so
    requests that share a prefix of whole `block`-token blocks are adjacent, those sharing the
    longest prefixes closest, and identical prompts next to each other. A group runs while its
    blocks are still in the cache, whatever the cache's size.

    Where the walk has a choice (the branches below a shared prefix, and the prompts that end
    there), it goes by input order (the first prompt of each branch), or with `lengths` (each
    request's prompt + max_tokens) longest branch first: a branch is ranked by its longest
    request, ties by input order. Under NxDI every decode step attends the bucket of the
    longest running request, so like lengths should run together; ranking whole branches
    (rather than sorting within groups) keeps each group whole and, where nothing is shared,
    gives exactly `--order length`, as without sharing it gives the input order.
    """
    root = _build(prompts, block)
    if lengths is not None:
        for node in reversed(_preorder(root)):     # children before their parents
            node.longest = max([lengths[i] for i in node.terminals]
                               + [child.longest for child in node.children.values()], default=0)

        def rank(first: int, longest: int) -> tuple[int, int]:
            return -longest, first
    else:
        def rank(first: int, longest: int) -> tuple[int, int]:
            return 0, first

    out: list[int] = []
    stack: list[_Node | list[int]] = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            out.extend(item)
            continue
        branches: list[tuple[tuple[int, int], _Node | list[int]]] = [
            (rank(child.src, child.longest), child) for child in item.children.values()]
        if item.terminals:
            same = item.terminals
            if lengths is not None:
                same = sorted(same, key=lambda i: -lengths[i])    # (stable: then by index)
                branches.append((rank(same[0], lengths[same[0]]), same))
            else:
                branches.append((rank(same[0], 0), same))
        branches.sort(key=lambda branch: branch[0])     # ranks are unique: no ties to break
        stack.extend(branch for _, branch in reversed(branches))
    return out


def prefix_order_alone(prompts: Sequence[Sequence[int]], prompt_lengths: Sequence[int],
                       block: int, lengths: Sequence[int] | None = None) -> Sequence[int]:
    """`prefix_order` of prompts no two of which begin with the same whole block (a
    token-count trace's own synthetic prompts: inputs/prepare.py `PromptTokens.share_nothing`),
    without the trie: it held a node for every prompt, and at 10M requests the job's memory is
    the point (issue 46). Each prompt of a whole block or more is then a branch of its own,
    ranked from its length alone; only the shorter ones are made (`prompts[i]`), since the
    trie keys a partial block by its tokens: identical short prompts are one branch, empty
    ones end at the root. Ranked as `prefix_order` ranks branches: input order, or with
    `lengths` (prompt + max_tokens) the longest first, ties by input order."""
    import numpy as np

    count = len(prompt_lengths)
    index: np.ndarray = np.arange(count, dtype=np.int64)
    short = np.asarray(prompt_lengths, dtype=np.int64) < block
    alone = index[~short]
    longest = np.asarray(lengths, dtype=np.int64) if lengths is not None else None
    if longest is not None:
        alone = alone[np.lexsort((alone, -longest[alone]))]
    if not short.any():
        return alone if longest is not None else range(count)
    # the short prompts' branches, as the trie's root holds them: (rank, members)
    same: dict[bytes | tuple[int, ...], list[int]] = {}
    for i in index[short].tolist():
        same.setdefault(_key(prompts[i], 0, block) if prompt_lengths[i] else b"", []).append(i)
    branches = []
    for key, members in same.items():
        if longest is None:
            branches.append(((0, members[0]), members))
            continue
        members = sorted(members, key=lambda i: -longest[i])    # (stable: then by index)
        top = max(longest[i] for i in members)
        # (a node's rank is its first prompt's index; the root's own ends, its longest's)
        branches.append(((-int(top), members[0] if not key else min(members)), members))
    branches.sort(key=lambda branch: branch[0])
    # each group's place among the prompts alone, whose (rank, index) keys are sorted: one
    # number each, rank * (count + 1) + index, in the same order
    keys = (-longest[alone] if longest is not None else np.zeros(len(alone), np.int64)
            ) * (count + 1) + alone
    out: list[np.ndarray] = []
    done = 0
    for (first, second), members in branches:
        at = int(np.searchsorted(keys, first * (count + 1) + second))
        out += [alone[done:at], np.asarray(members, dtype=np.int64)]
        done = at
    out.append(alone[done:])
    return np.concatenate(out)


def shared_prefix_tokens(prompts: Sequence[Sequence[int]], block: int) -> int:
    """The prompt tokens an unbounded prefix cache of `block`-token blocks serves `prompts` at
    most, in the best order: every shared whole block computed once.

    A request is served its leading whole blocks that an earlier request computed, but never
    its last token (vLLM computes at least one token of a prompt, so a prompt of exactly n
    blocks is served at most n - 1). Per block-prefix held by `a` prompts, `e` of which end
    exactly there, that is a - max(e, 1) hits (the bound is reached when a prompt that ends
    there runs first, as in shortest-first order). Summed: every prompt's whole blocks, less
    one per distinct block-prefix, less the extra identical block-aligned prompts. In input
    order the count differs from this only where a block-aligned prompt is a prefix of an
    earlier, longer one. Counted as the prompts stream, in bounded memory (exact to
    inputs/prefix_bound.py's limit, estimated past it): `prefix_bound` for whether it was.
    """
    from neuron_batch.inputs.prefix_bound import prefix_bound

    return prefix_bound(prompts, block).tokens()
