"""What a job's prompts share, over KV blocks of their token ids: the order that runs requests
sharing a prefix together (`run --order prefix`), and the prompt tokens an unbounded prefix
cache could serve (the report's `prefix_cache.bound_tokens`, counted by inputs/prefix_bound.py
as the prompts stream). Pure logic (numpy).

The order reads a trie of the prompts' blocks (vLLM's prefix cache matches whole blocks from a
prompt's start, so a prompt's cacheable prefixes are exactly its paths from the root). The trie
is compressed: a run of blocks without a branch is one edge, labelled by the prompt that first
made it. A path is named by its 64-bit hash (inputs/block_hashes.py), so each prompt is read
once, in order, and hashed over arrays: a node's children are keyed by the hash one block
further, and a prompt that reaches the end of an edge with the edge's own hash follows it
without reading the edge's prompt again. Only a prompt that parts from an edge inside it reads
the edge's prompt's hashes (kept for the last `RECENT` prompts; a streamed job's record is
sought again past them). Tokens were compared before, the edge's prompt read again for every
prompt that passed it: a streamed job of 100k prompts sharing an instruction spent ~25 s
there. Two paths under one node would have to hash alike to be taken for one: odds about
n**2 / 2**65 for n children (3e-6 at 10M), where a prompt would then be grouped with the
other's branch, which changes the order and never the outputs. scripts/bench_order.py times
the 12,031 prompts (145 M tokens) of the Mooncake trace.
"""

from __future__ import annotations

import gc
from array import array
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from neuron_batch.inputs.block_hashes import BlockHashes
from neuron_batch.inputs.prefix_bound import PrefixBound, prefix_bound

#: The KV block of the simulated device and of the Beta plugin (vLLM's CPU default is larger;
#: a smaller block only splits groups more finely): the order's block when the run names none.
DEFAULT_BLOCK = 32


#: A node's children and terminals before it has any: one shared empty value, never written
#: (most nodes are leaves, and a dict and a list each per prompt were most of the trie's size).
_NO_CHILDREN: dict[int, _Node | int] = {}
_NO_TERMINALS: list[int] = []


class _Node:
    """A point in the trie: the prompts whose first `depth` blocks are this path."""

    __slots__ = ("children", "depth", "end", "longest", "src", "terminals")

    def __init__(self, src: int, depth: int, end: int):
        self.src = src              # the prompt whose blocks label the edge into this node:
                                    # the first to reach it, so the least index below it
        self.depth = depth          # blocks from the root (the last may be a partial one)
        self.end = end              # the hash of this path (block_hashes.py `units`)
        self.children = _NO_CHILDREN    # by the hash of the path one block further (a leaf
                                        # of one prompt: its index, `_insert_all`)
        self.terminals = _NO_TERMINALS  # prompts that end here: identical ones, by index
        self.longest = 0            # the longest request below it (order by length)

    def add_child(self, key: int, child: _Node | int) -> None:
        if self.children is _NO_CHILDREN:
            self.children = {}
        self.children[key] = child

    def add_terminal(self, index: int) -> None:
        if self.terminals is _NO_TERMINALS:
            self.terminals = []
        self.terminals.append(index)


def _matched(a: np.ndarray, b: np.ndarray, known: int, last: int) -> int:
    """The most blocks, between `known` (already equal) and `last`, in which the prompts of
    path hashes `a` and `b` agree from the start: the last depth whose hashes are equal (a
    prefix equal to a depth is equal to every depth before it)."""
    if a[last - 1] == b[last - 1]:
        return last
    good, bad = known, last
    while bad - good > 1:
        mid = (good + bad) // 2
        if a[mid - 1] == b[mid - 1]:
            good = mid
        else:
            bad = mid
    return good


class _Recent:
    """The path hashes of the prompts read last, by index: an edge's prompt is read again
    (`prompts[i]`: a streamed job's record sought in its file) only when a later prompt parts
    from it inside the edge and it has left these."""

    def __init__(self, prompts: Sequence[Sequence[int]], hashes: BlockHashes, size: int):
        self._prompts, self._hashes, self._size = prompts, hashes, size
        self._held: OrderedDict[int, np.ndarray] = OrderedDict()

    def keep(self, index: int, units: np.ndarray) -> None:
        self._held[index] = units
        if len(self._held) > self._size:
            self._held.popitem(last=False)

    def __getitem__(self, index: int) -> np.ndarray:
        units = self._held.get(index)
        if units is None:
            units = self._hashes.units(self._prompts[index])
            self.keep(index, units)
        else:
            self._held.move_to_end(index)
        return units


#: Prompts whose path hashes `_Recent` holds (a few KB each at most).
RECENT = 4096


def _build(prompts: Sequence[Sequence[int]], block: int, bound: PrefixBound | None) -> _Node:
    """The compressed block trie of `prompts`, inserted in index order."""
    hashes = BlockHashes(block)     # (raises for a block < 1)
    # Nothing here makes cycles; the collector, woken by the nodes made, would walk them all
    # again and again (most of the time on a long trace).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _insert_all(prompts, hashes, bound)
    finally:
        if collecting:
            gc.enable()


def _insert_all(prompts: Sequence[Sequence[int]], hashes: BlockHashes,
                bound: PrefixBound | None) -> _Node:
    """Each prompt, read once in index order (a streamed job's a window at a time), down the
    trie by its path hashes: a node is entered when the prompt's hash at the node's depth is
    the node's own, so only a prompt that parts from an edge's prompt inside the edge needs
    that prompt's hashes (`_Recent`). Each one's whole-block hashes go to `bound` too.

    A prompt no other has reached yet is a leaf held as its index alone (its depth and path
    hash in two arrays, 12 bytes a prompt): a node with its keys was ~300 bytes, and most
    prompts of a job end on a leaf of their own. It becomes a `_Node` when a later prompt goes
    down through it."""
    root = _Node(-1, 0, 0)
    recent = _Recent(prompts, hashes, RECENT)
    block = hashes.block
    depth_of, end_of = array("i"), array("Q")      # (a leaf's, by its prompt's index)
    for index, ids in enumerate(prompts):
        units = hashes.units(ids)
        recent.keep(index, units)
        if bound is not None:
            bound.add_prefixes(units[:len(ids) // block], aligned=not len(ids) % block)
        count = len(units)
        depth_of.append(count)
        end_of.append(int(units[-1]) if count else 0)
        node: _Node | None = root
        depth = 0
        while depth < count:
            assert node is not None
            key = int(units[depth])
            child = node.children.get(key)
            if child is None:
                node.add_child(key, index)      # (a leaf: the prompt's own, ending it)
                node = None
                break
            if isinstance(child, int):
                src, edge, end = child, depth_of[child], end_of[child]
            else:
                src, edge, end = child.src, child.depth, child.end
            last = min(edge, count)
            if last == edge and int(units[last - 1]) == end:
                matched = last                  # (the whole edge: the common case)
            else:
                other = recent[src]
                matched = _matched(units, other, depth + 1, last)
                if matched < edge:          # they part inside the edge: split it there
                    middle = _Node(src, matched, int(other[matched - 1]))
                    node.children[key] = middle
                    middle.add_child(int(other[matched]), child)
                    node, depth = middle, matched
                    continue
            if isinstance(child, int):      # through a leaf: a node now, its prompt ending there
                child = _Node(src, edge, end)
                child.add_terminal(src)
                node.children[key] = child
            node, depth = child, matched
        if node is not None:
            node.add_terminal(index)
    return root


def _preorder(root: _Node) -> list[_Node]:
    nodes, stack = [], [root]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(child for child in node.children.values() if not isinstance(child, int))
    return nodes


def prefix_order(prompts: Sequence[Sequence[int]], block: int = DEFAULT_BLOCK,
                 lengths: Sequence[int] | None = None, bound: PrefixBound | None = None
                 ) -> list[int]:
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

    `bound`: a prefix bound of `block` (inputs/prefix_bound.py) that counts the prompts on the
    way, from the hashes the trie makes (auto prefix caching asks for both: one pass over a
    streamed job's prompts, not two).
    """
    if bound is not None and bound.block != block:
        raise ValueError(f"a bound of blocks of {bound.block} for an order of {block}")
    root = _build(prompts, block, bound)
    if lengths is not None:
        for node in reversed(_preorder(root)):     # children before their parents
            node.longest = max([lengths[i] for i in node.terminals]
                               + [lengths[child] if isinstance(child, int) else child.longest
                                  for child in node.children.values()], default=0)

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
            (rank(child, lengths[child] if lengths is not None else 0), [child])
            if isinstance(child, int) else (rank(child.src, child.longest), child)
            for child in item.children.values()]
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
    trie keys a partial block by its tokens (their hash): identical short prompts are one
    branch, empty ones end at the root. Ranked as `prefix_order` ranks branches: input order,
    or with `lengths` (prompt + max_tokens) the longest first, ties by input order."""
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
    hashes = BlockHashes(block)
    same: dict[int | None, list[int]] = {}
    for i in index[short].tolist():
        # (a short prompt's one partial block: the trie's key for it; an empty one, the root)
        same.setdefault(int(hashes.units(prompts[i])[0]) if prompt_lengths[i] else None,
                        []).append(i)
    branches = []
    for key, members in same.items():
        if longest is None:
            branches.append(((0, members[0]), members))
            continue
        members = sorted(members, key=lambda i: -longest[i])    # (stable: then by index)
        top = max(longest[i] for i in members)
        # (a node's rank is its first prompt's index; the root's own ends, its longest's)
        branches.append(((-int(top), members[0] if key is None else min(members)), members))
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
    return prefix_bound(prompts, block).tokens()
