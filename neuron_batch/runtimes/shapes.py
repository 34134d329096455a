"""What one configuration of a Neuron runtime compiles (`Shapes`), and the command-line
options of its bucket lists (`BucketOption`): the shapes every step is padded to.

Split from runtimes/runtime.py, which defines the runtimes themselves: a `Shapes` asks its runtime
(`Shapes.runtime`, a `runtime.Runtime`) how its kernels read KV and how many graphs a list
compiles, so this module imports none of it. Pure Python (no vLLM).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from neuron_batch.runtimes import prefix_grid
from neuron_batch.runtimes.buckets import BucketError, bucket_for


def _smallest_at_least(value: int, buckets: Sequence[int], fallback: int) -> int:
    index = bisect_left(buckets, value)
    return buckets[index] if index < len(buckets) else fallback


@dataclass(frozen=True)
class BucketOption:
    """One bucket list a runtime compiles: its command-line flag, its key in the plugin's
    config, and what its largest entry must equal."""

    flag: str               # "--context-encoding-buckets"
    key: str                # "context_encoding_buckets"
    what: str               # "prefill token buckets over whole prompts"
    maximum: str            # "max_model_len"
    short: str = ""         # "ctx": its name in tables and plots ("ctx buckets")
    padding: str = ""       # "prefill": the report's padding section the list pads
    waste: str = ""         # what that section's waste is, in words
    #: One value, not a list (optimum-neuron's --max-context-length: its export compiles one
    #: context-encoding graph of that length): it is kept as a list of one entry.
    single: bool = False

    @property
    def label(self) -> str:
        return f"{self.short} buckets"

    def one_value(self, values: list[int], maximum: int) -> list[int]:
        """`values` when they are the one length a `single` option takes (1..`maximum`), else
        BucketError saying what would work."""
        ints = values and all(isinstance(v, int) and not isinstance(v, bool) for v in values)
        if len(values) == 1 and ints and 0 < values[0] <= maximum:
            return values
        longer = ints and max(values) > maximum
        raise BucketError(
            f"{self.flag} takes one length from 1 to {self.maximum} ({maximum:,}): "
            f"{self.what}; got {','.join(map(str, values)) or 'nothing'}"
            + (f"; give --max-model-len {max(values):,} for a longer one" if longer else ""))


@dataclass(frozen=True)
class Shapes:
    """The compiled shapes of one configuration: what every step is padded to."""

    runtime: Any            # the runtime.Runtime these shapes are of
    max_num_seqs: int
    max_model_len: int
    prefill_buckets: tuple[int, ...]    # nxdi: context encoding; vllm-neuron: token buckets;
                                        # optimum-neuron: (max_context_length,)
    decode_buckets: tuple[int, ...]     # nxdi, optimum-neuron: (max_num_seqs,); vllm-neuron:
                                        # batch buckets
    attention_buckets: tuple[int, ...]  # nxdi: token generation; vllm-neuron: decode context
                                        # lengths (may be empty: max_model_len then);
                                        # optimum-neuron: (max_model_len,)
    #: nxdi with prefix caching: the grid's prefix buckets, 0 first; empty: 1-D prefills.
    prefix_buckets: tuple[int, ...] = ()

    def prefill(self, num_tokens: int) -> int:
        """The padded size of a prefill of `num_tokens` (a whole prompt under nxdi, a chunk
        under vllm-neuron)."""
        return bucket_for(num_tokens, self.prefill_buckets)

    def prefill_step(self, new_tokens: int, held: int) -> tuple[int, int, int | None, int]:
        """(padded tokens, held tokens computed again, prefix bucket or None, KV tokens its
        attention reads) of a prefill of `new_tokens` after `held` tokens of KV (prefix-cache
        hits, or prior chunks). On the grid: NxDI's cell (prefix_grid.grid_cell); else the new
        tokens padded to a bucket, the held KV read as the runtime's kernel reads it."""
        if self.prefix_buckets:
            cell = prefix_grid.grid_cell(new_tokens, held, self.prefill_buckets,
                                         self.prefix_buckets)
            return cell.prefill_bucket, cell.recomputed, cell.prefix_bucket, cell.prefix_bucket
        return (bucket_for(new_tokens, self.prefill_buckets), 0, None,
                self.runtime.prefill_kv_read(held))

    def decode(self, num_seqs: int, longest_position: int) -> tuple[int, int]:
        """(padded batch, attended length per slot) of a decode step of `num_seqs` requests
        whose longest one writes position `longest_position` (its tokens so far)."""
        if self.runtime.static_kv:
            return self.max_num_seqs, _smallest_at_least(longest_position + 1,
                                                         self.attention_buckets,
                                                         self.max_model_len)
        return (bucket_for(num_seqs, self.decode_buckets),
                _smallest_at_least(longest_position + 1, self.attention_buckets,
                                   self.max_model_len))

    @property
    def longest_prompt(self) -> int:
        """The longest prompt a graph takes whole: the largest context-encoding shape where
        prompts are prefilled whole (nxdi: max_model_len; optimum-neuron: its export's
        max_context_length), else max_model_len (chunks)."""
        if self.runtime.chunked_prefill:
            return self.max_model_len
        return self.prefill_buckets[-1]

    @property
    def num_graphs(self) -> int:
        """Graphs the runtime compiles for this configuration."""
        return self.runtime.num_graphs(len(self.prefill_buckets), len(self.decode_buckets),
                                       len(self.attention_buckets), len(self.prefix_buckets))

    def bucket_lists(self) -> dict[str, list[int]]:
        """The lists by the runtime's own config keys (what the plugin is given)."""
        runtime = self.runtime
        lists = {runtime.prefill.key: list(self.prefill_buckets)}
        if runtime.decode is not None:
            lists[runtime.decode.key] = list(self.decode_buckets)
        if runtime.attention is not None and (self.attention_buckets or runtime.static_kv):
            lists[runtime.attention.key] = list(self.attention_buckets)
        if self.prefix_buckets:
            lists[prefix_grid.PREFIX_BUCKETS_KEY] = list(self.prefix_buckets)
        return lists
