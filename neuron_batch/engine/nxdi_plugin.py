"""What AWS's NxDI plugin line (vllm-neuron 0.1 / 0.2 / 0.4 / 0.5) is given for its KV cache,
release by release: NxDI's contiguous layout without prefix caching, or its block layout with
prefix caching and the 2-D (prefill, prefix) grid of context-encoding graphs.

Why each setting (sources: ../shared/notes/neuron-runtimes.md, "NxDI line" and "Prefix caching
under NxDI"; the vendored plugin's platform, loader, runner and READMEs):
- Prefix caching (vLLM's default) means the block layout: `is_prefix_caching` and
  `is_block_kv_layout` in `override_neuron_config`, `pa_block_size` = vLLM's block size (NxDI
  recommends 32, the vLLM guide says 32 or 16; prefix buckets are multiples of it), and a block
  pool of `ceil(max_model_len / block_size) x max_num_seqs` usable blocks, what the loader's
  validator asserts. vLLM keeps one more block back as its null block: plugin 0.2.0 adds it to
  `num_gpu_blocks_override` itself, 0.1.0 does not, so we add it there. `pa_num_blocks` is left
  to the loader, which copies the override (0.2.0 refuses one that differs). NxDI allocates one
  block more on the device (`_NUM_EXTRA_RESERVED_BLOCK`); vLLM never hands its id out.
- Explicit context-encoding buckets need prefix buckets with them, so both lists always go
  together, NxDI's defaults when not given (runtimes/prefix_grid.py: prefill from 512, prefix 0 then
  from 512, token generation from 256).
- Without prefix caching: the contiguous layout, one block of max_model_len per slot.
- Plugin 0.2.0's README (known issue 3) says prefix caching at batch size 1 gives wrong output;
  0.1.0's README does not list it. So max_num_seqs 1 with prefix caching is refused on 0.2.x.

Pure Python (no vLLM import).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from neuron_batch.runtimes.buckets import BucketError
from neuron_batch.runtimes.prefix_grid import (
    BLOCK_SIZES,
    grid_size,
)
from neuron_batch.runtimes.runtime import Runtime
from neuron_batch.settings import RunSettings, SettingsError
from neuron_batch.versions import release

CONTIGUOUS = "contiguous"
BLOCK = "block"


class NeuronHostError(SettingsError):
    """A setting the plugin or the device cannot run; the message says what to change."""


@dataclass(frozen=True)
class PluginLine:
    """What differs between releases of the NxDI plugin line (vllm-neuron 0.x)."""

    version: str | None
    #: The platform adds 1 to num_gpu_blocks_override for vLLM's null block (0.2.0 on).
    adds_null_block: bool
    #: `on_device_sampling_config: None` samples on the CPU with vLLM's sampler (0.2.0 on;
    #: 0.1.0's model raises "CPU sampler not implemented").
    cpu_sampling: bool
    #: Its README lists wrong output with prefix caching at batch size 1 (0.2.0, known issue
    #: 3; no fix recorded for the 0.2 line). Releases whose README is not here: not assumed.
    prefix_caching_batch1_bug: bool = False


def plugin_line(version: str | None) -> PluginLine:
    """The behaviour of an installed vllm-neuron release (unknown: the newer behaviour)."""
    try:
        number = None if version is None else release(version)
    except ValueError:
        number = None
    newer = number is None or number >= (0, 2, 0)
    return PluginLine(version, adds_null_block=newer, cpu_sampling=newer,
                      prefix_caching_batch1_bug=number is not None and number[:2] == (0, 2))


@dataclass(frozen=True)
class KvLayout:
    """The KV layout and compiled prefill shapes one NxDI configuration is given."""

    name: str                           # CONTIGUOUS or BLOCK
    block_size: int
    num_gpu_blocks_override: int
    prefill_buckets: tuple[int, ...]    # context encoding
    tkg_buckets: tuple[int, ...]        # token generation
    prefix_buckets: tuple[int, ...] = ()  # the grid's prefix side (block layout only)
    #: override_neuron_config: the layout's keys and every bucket list.
    section: dict[str, Any] = field(default_factory=dict)

    @property
    def prefix_caching(self) -> bool:
        return self.name == BLOCK

    @property
    def num_graphs(self) -> int:
        """Graphs NxDI compiles: every (prefill, prefix) cell, or each context-encoding
        bucket, and each token-generation bucket."""
        prefill = (grid_size(self.prefill_buckets, self.prefix_buckets) if self.prefix_caching
                   else len(self.prefill_buckets))
        return prefill + len(self.tkg_buckets)

    @property
    def engine_kwargs(self) -> dict[str, Any]:
        return {"block_size": self.block_size, "enable_prefix_caching": self.prefix_caching,
                "num_gpu_blocks_override": self.num_gpu_blocks_override}

    def words(self) -> str:
        """One line for doctor and logs: the layout, its blocks and graph count."""
        if not self.prefix_caching:
            return (f"prefix caching off: contiguous, one block of {self.block_size} per slot; "
                    f"{len(self.prefill_buckets)} context-encoding + {len(self.tkg_buckets)} "
                    f"token-generation = {self.num_graphs} graphs")
        return (f"prefix caching on: block layout, {self.block_size}-token blocks; "
                f"{len(self.prefill_buckets)} prefill x {len(self.prefix_buckets)} prefix "
                f"buckets + {len(self.tkg_buckets)} token-generation = {self.num_graphs} graphs")

    def describe(self) -> dict[str, Any]:
        return {"layout": self.name, "prefix_caching": self.prefix_caching,
                "block_size": self.block_size,
                "num_gpu_blocks_override": self.num_gpu_blocks_override,
                "prefill_buckets": list(self.prefill_buckets),
                "prefix_buckets": list(self.prefix_buckets),
                "tkg_buckets": list(self.tkg_buckets), "num_graphs": self.num_graphs,
                "words": self.words()}


def nxdi_kv_layout(settings: RunSettings, runtime: Runtime, line: PluginLine) -> KvLayout:
    """The layout `settings` give NxDI under the plugin release `line`: the block layout with
    prefix caching (`--prefix-caching`, vLLM's default), else the contiguous one.
    NeuronHostError, before anything loads, for what that layout or release cannot run."""
    shapes = settings.shapes(runtime)
    length, seqs = settings.max_model_len, settings.max_num_seqs
    if not settings.prefix_caching:
        if settings.block_size is not None and settings.block_size != length:
            raise NeuronHostError(
                f"--block-size {settings.block_size} with --no-prefix-caching: NxDI's "
                f"contiguous layout holds one block of max_model_len ({length}) per request "
                f"slot. Smaller blocks are its block layout, which the plugin runs with prefix "
                f"caching: drop --no-prefix-caching (block size 32 or 16), or drop "
                f"--block-size")
        section = {**shapes.bucket_lists(), **dict(runtime.layout_config)}
        # vLLM's block pool keeps one block back (the null block): max_num_seqs usable.
        return KvLayout(CONTIGUOUS, length, seqs + (0 if line.adds_null_block else 1),
                        shapes.prefill_buckets, shapes.attention_buckets, section=section)
    block = settings.block_size or BLOCK_SIZES[-1]
    if block not in BLOCK_SIZES:
        raise NeuronHostError(
            f"--block-size {block}: with prefix caching NxDI keeps KV in its block layout, "
            f"whose blocks are 32 tokens (vLLM's default and NxDI's advice) or 16; give one "
            f"of them, or --no-prefix-caching for the contiguous layout (one block of "
            f"max_model_len per slot)")
    if seqs == 1 and line.prefix_caching_batch1_bug:
        raise NeuronHostError(
            f"--max-num-seqs 1 with prefix caching: vllm-neuron {line.version}'s README lists "
            f"wrong output for prefix caching at batch size 1 (known issue 3). Use "
            f"--max-num-seqs 2 or more, or --no-prefix-caching")
    section = {**shapes.bucket_lists(), "is_block_kv_layout": True, "is_prefix_caching": True,
               "pa_block_size": block}
    return KvLayout(BLOCK, block, block_layout_blocks(length, block, seqs, line),
                    shapes.prefill_buckets, shapes.attention_buckets, shapes.prefix_buckets,
                    section=section)


def block_layout_blocks(max_model_len: int, block_size: int, max_num_seqs: int,
                        line: PluginLine) -> int:
    """The num_gpu_blocks_override NxDI's block layout needs (what its validator asserts:
    ceil(max_model_len / block_size) x max_num_seqs usable blocks; 0.1.0 needs the null block
    added by us). NeuronHostError when max_model_len is not a multiple of block_size: the
    runner pads block tables to max_model_len // block_size entries, so the last block of a
    long request would not fit."""
    if max_model_len % block_size:
        raise NeuronHostError(
            f"max_model_len {max_model_len} is not a multiple of the block size "
            f"{block_size}: NxDI's block layout cannot hold a request's last block (the "
            f"plugin's block tables have max_model_len // block_size entries); give "
            f"--max-model-len {max_model_len // block_size * block_size} or "
            f"{-(-max_model_len // block_size) * block_size}, or --no-prefix-caching")
    need = math.ceil(max_model_len / block_size) * max_num_seqs
    return need + (0 if line.adds_null_block else 1)


def layout_facts(settings: RunSettings, runtime: Runtime, plugin_version: str | None
                 ) -> dict[str, Any] | None:
    """What doctor says of the KV layout a run with `settings` gets under the installed
    plugin: prefix caching on or off, the layout, the graph count, or why it cannot run; None
    where the runtime is not NxDI's (no layout choice)."""
    if runtime.host_block_size is not None or runtime.fixed_export:
        return None
    try:
        layout = nxdi_kv_layout(settings, runtime, plugin_line(plugin_version))
    except (SettingsError, BucketError) as error:
        return {"words": "cannot be configured", "error": str(error), "why": None}
    why = ("vLLM's default; --no-prefix-caching for the contiguous layout"
           if layout.prefix_caching else "--prefix-caching for NxDI's block layout and grid")
    return {**layout.describe(), "error": None, "why": why}
