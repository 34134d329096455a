"""The three ways vLLM runs on Neuron, as one object each: what the device compiles, where
the bucket lists go, how the KV cache is laid out.

- `nxdi`: AWS's vLLM plugin on NxD Inference (vllm-neuron 0.1/0.2 on vLLM 0.10/0.11, 0.4.x on
  0.13, 0.5.x on 0.16), what inf2 and trn1 hosts run. A prefill step is one whole prompt padded
  to a *context-encoding bucket*; a decode step runs all `max_num_seqs` slots, attending a
  *token-generation bucket* (the smallest >= the longest position + 1 in the batch). The KV
  cache is static: `max_num_seqs` slots of `max_model_len`, so it must fit in HBM beside the
  weights, and it never limits admission.
- `vllm-neuron`: AWS's vLLM Neuron (Beta) plugin (trn2/trn3 only), whose scheduler the seed
  design describes: prefill chunks padded to token buckets, decode batches padded to batch-size
  buckets, a paged KV cache under a budget cap, and each padded decode request reading a whole
  `max_model_len` of KV (or the smallest decode context-length bucket above the batch's longest
  position) where the kernel cannot skip unused blocks.
- `optimum-neuron`: Hugging Face's optimum-neuron vLLM plugin (0.4.5 on vLLM 0.11, inf2/trn1),
  on its own NxD backend. It keeps vLLM's scheduler, turns prefix caching off and sets
  `block_size = max_model_len`; an export fixes batch size (= max_num_seqs), sequence length
  (= max_model_len), TP and dtype, and compiles exactly two graphs, no buckets: context
  encoding at batch 1 over `max_context_length` tokens (every prompt padded to it) and token
  generation at `batch_size` x `sequence_length` (every decode: every slot, whole length). Its
  runner decodes the running requests, then the new prompts, in one step. KV static as nxdi's.

Sources: ../shared/notes/neuron-runtimes.md (NxDI feature guide "Bucketing", NxDI's
`autobucketing.generate_buckets`, the plugin's platform and loader, the Beta plugin's design
notes on decode context-length bucketing); optimum-neuron 0.4.5's wheel
(../shared/vendor/): `optimum/neuron/vllm/platform.py` `check_and_update_config`, `runner.py`
`execute_model`, `models/inference/backend/config.py` (ctx_batch_size 1 under continuous
batching, max_context_length defaulting to sequence_length), `modules/decoder/
modeling_decoder.py` (the two graph builders) and `decoder_wrappers.py` (prompts padded to
max_context_length, batches to batch_size). Every module asks the resolved `Runtime` (and the
`Shapes` it builds for one configuration, runtimes/shapes.py) instead of testing the runtime's
name. Pure Python (no vLLM): the CLI, the scheduler, the sim, bench and plan share it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neuron_batch.runtimes import prefix_grid
from neuron_batch.runtimes import sampling as device_sampling
from neuron_batch.runtimes.buckets import (
    BucketError,
    default_decode_buckets,
    default_prefill_buckets,
    effective_max_prefill_tokens,
    nxdi_default_buckets,
    validate_buckets,
    validate_context_buckets,
)
from neuron_batch.runtimes.hints import ROLES, bucket_words, foreign_message
from neuron_batch.runtimes.sampling import SamplingPath
from neuron_batch.runtimes.shapes import BucketOption, Shapes

__all__ = ["BucketOption", "Shapes", "Runtime", "RUNTIMES", "RUNTIME_NAMES", "NXDI", "VLLM_NEURON",
           "OPTIMUM_NEURON", "KV_SEGMENT_SIZE", "RuntimeNameError", "default_runtime",
           "get_runtime", "runtime_of", "nxdi_default_buckets"]

NXDI = "nxdi"
VLLM_NEURON = "vllm-neuron"
OPTIMUM_NEURON = "optimum-neuron"
RUNTIME_NAMES = (NXDI, VLLM_NEURON, OPTIMUM_NEURON)
#: The Beta plugin's segmented-prefill kernel reads prior KV in segments of this many tokens:
#: the smallest `kv_segment_size` it takes (../shared/notes/neuron-runtimes.md, Beta plugin
#: prefix caching). An assumption: the plugin ties it to the token buckets, not one size.
KV_SEGMENT_SIZE = 512


#: The KV block a runtime's shapes assume where none is given (the largest NxDI takes).
_DEFAULT_BLOCK_SIZE = prefix_grid.BLOCK_SIZES[-1]


@dataclass(frozen=True)
class Runtime:
    """One way vLLM runs on Neuron; three exist: `RUNTIMES[NXDI]`, `RUNTIMES[VLLM_NEURON]`,
    `RUNTIMES[OPTIMUM_NEURON]`."""

    name: str
    summary: str
    #: Instance families that run this runtime by default (none: only by --runtime or its
    #: installed plugin).
    families: tuple[str, ...]
    #: Instance families AWS ships it for: a layout elsewhere cannot load, so the simulated
    #: device refuses to print figures for it (../shared/notes/neuron-runtimes.md: the Beta
    #: plugin is for trn2/trn3 only; NxDI runs on inf2, trn1 and trn2).
    runs_on: tuple[str, ...]
    #: Static KV (max_num_seqs x max_model_len, decode over every slot) or paged KV (capped).
    static_kv: bool
    #: Whether prefills are chunked (vllm-neuron) or whole prompts (nxdi, optimum-neuron).
    chunked_prefill: bool
    #: Whether prefix caching compiles NxDI's block layout and 2-D (prefill, prefix) grid
    #: (runtimes/prefix_grid.py); else (the Beta plugin) a hit is a segmented prefill of the new
    #: tokens.
    prefix_grid: bool
    #: How a prompt is prefilled, in words (legends).
    prefill_words: str
    #: Where the bucket lists go in vLLM's `additional_config`.
    config_section: str
    prefill: BucketOption
    decode: BucketOption | None     # None: every decode runs all max_num_seqs slots
    attention: BucketOption | None  # None: one token-generation graph over max_model_len
    #: Whether it runs with vLLM's prefix cache; False: its platform turns it off
    #: (optimum-neuron's `check_and_update_config`), so a run asking for it is refused.
    prefix_caching: bool = True
    #: A step runs the running requests' decode, then the new prompts' context encoding (two
    #: graph calls, optimum-neuron's runner `execute_model`); False: a step holds one or the
    #: other (nxdi's runner turns decodes beside a new prompt into fake prefills).
    decode_then_prefill: bool = False
    #: An export (or compile) fixes batch size = max_num_seqs, sequence length = max_model_len,
    #: TP and dtype (optimum-neuron: vLLM's max_num_seqs / max_model_len must equal its
    #: export's, model_loader.py); False: the plugin compiles what vLLM's settings say.
    fixed_export: bool = False
    #: Why a list role it has no option for cannot be given, by role (foreign_message).
    fixed_words: tuple[tuple[str, str], ...] = (
        ("decode", "decodes every max_num_seqs slot: --max-num-seqs is its one decode batch"),)
    # -- on a Neuron host (engine/neuron_host.py composes these) ---------------------------------
    #: Environment its plugin needs to keep a given `scheduler_cls` (NxDI line: the platform
    #: swaps in its own scheduler unless DISABLE_NEURON_CUSTOM_SCHEDULER=1).
    scheduler_env: tuple[tuple[str, str], ...] = ()
    #: KV block size on the device: None for one block of max_model_len per slot (NxDI's
    #: contiguous layout, which the runtime's shapes describe), else the plugin's paged size.
    host_block_size: int | None = None
    #: Keys of its config section that fix the compiled KV layout to the one the shapes model.
    layout_config: tuple[tuple[str, object], ...] = ()
    #: How its plugin samples: on the device, or the logits to the host (runtimes/sampling.py).
    sampling: SamplingPath = device_sampling.DEVICE_SAMPLING
    #: The distribution its plugin's model loader imports (NxDI), for doctor; None: in-plugin.
    loader_distribution: str | None = None
    parallel_compile: bool = False  # graphs compiled in a pool (NxDI), else in turn (Beta)

    # -- bucket lists --------------------------------------------------------------------------
    @property
    def bucket_options(self) -> tuple[BucketOption, ...]:
        return tuple(o for o in (self.prefill, self.decode, self.attention) if o is not None)

    @property
    def dimensions(self) -> tuple[tuple[str, BucketOption], ...]:
        """(`Shapes` list name: prefill / decode / attention, its option) of each list it
        compiles; nxdi has no decode list (every step runs all max_num_seqs slots)."""
        return tuple((n, getattr(self, n)) for n in ROLES if getattr(self, n) is not None)

    def shapes(self, bucket_lists: Mapping[str, Sequence[int] | None] | None, *,
               max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
               family: str | None = None, prefix_caching: bool = False,
               block_size: int = _DEFAULT_BLOCK_SIZE) -> Shapes:
        """The shapes for these limits and the user's lists (by config key; a missing or None
        list takes the runtime's default). BucketError, naming the flag, for a list the
        plugin would refuse or that leaves a step without a graph; for a list of the other
        runtime it says what to give instead on the instance `family` (None: unknown).
        `prefix_caching` under nxdi: the grid's shapes (runtimes/prefix_grid.py; KV blocks of
        `block_size`)."""
        given = dict(bucket_lists or {})
        prefixes = given.pop(prefix_grid.PREFIX_BUCKETS_KEY, None)
        unknown = {k: list(v) for k, v in sorted(given.items()) if v is not None
                   and k not in {o.key for o in self.bucket_options}}
        if unknown:
            raise BucketError(self.foreign_message(
                unknown, max_model_len=max_model_len,
                max_num_batched_tokens=max_num_batched_tokens, family=family))
        if prefixes is not None and not (self.prefix_grid and prefix_caching):
            raise BucketError("--prefix-buckets shape NxDI's prefix-caching grid; this run " + (
                "has --no-prefix-caching: drop --prefix-buckets, or turn prefix caching on"
                if self.prefix_grid else f"runs {self.name}, which has none: drop them"))
        if self.attention is None:
            # One context-encoding graph over max_context_length (default: the export's
            # sequence length, as optimum-neuron's NxDNeuronConfig falls back to) and one
            # token-generation graph of max_num_seqs x max_model_len.
            context = self._list(given, self.prefill, max_model_len, [max_model_len])
            return Shapes(self, max_num_seqs, max_model_len, tuple(context), (max_num_seqs,),
                          (max_model_len,))
        if self.prefix_grid and prefix_caching:
            return Shapes(self, max_num_seqs, max_model_len, tuple(self._list(
                given, self.prefill, max_model_len,
                prefix_grid.default_prefill_buckets(max_model_len))), (max_num_seqs,),
                tuple(self._list(given, self.attention, max_model_len,
                                 prefix_grid.default_tkg_buckets(max_model_len))),
                tuple(prefix_grid.default_prefix_buckets(max_model_len) if prefixes is None
                      else prefix_grid.validate_prefix_buckets(list(prefixes), max_model_len,
                                                               block_size)))
        if self.static_kv:
            prefill = self._list(given, self.prefill, max_model_len,
                                 nxdi_default_buckets(max_model_len))
            attention = self._list(given, self.attention, max_model_len,
                                   nxdi_default_buckets(max_model_len))
            return Shapes(self, max_num_seqs, max_model_len, tuple(prefill), (max_num_seqs,),
                          tuple(attention))
        prefill_max = effective_max_prefill_tokens(max_num_batched_tokens, max_model_len)
        prefill = self._list(given, self.prefill, prefill_max,
                             default_prefill_buckets(max_num_batched_tokens, max_model_len))
        decode = self._list(given, self.decode, max_num_seqs,
                            default_decode_buckets(max_num_seqs))
        given_context = given.get(self.attention.key)
        attention = [] if given_context is None else validate_context_buckets(
            list(given_context), max_model_len, self.attention.flag)
        return Shapes(self, max_num_seqs, max_model_len, tuple(prefill), tuple(decode),
                      tuple(attention))

    @staticmethod
    def bucket_lists_in(section: Mapping[str, Any] | None) -> dict[str, Any]:
        """The bucket lists of a plugin config section, by key: its other keys (KV layout,
        sampling) are the plugin's. Lists of either runtime are kept, so that `shapes` still
        refuses the other runtime's."""
        keys = {o.key for runtime in RUNTIMES.values() for o in runtime.bucket_options}
        keys.add(prefix_grid.PREFIX_BUCKETS_KEY)
        return {k: v for k, v in (section or {}).items() if k in keys}

    @staticmethod
    def _list(given: Mapping[str, Sequence[int] | None], option: BucketOption | None,
              maximum: int, default: list[int]) -> list[int]:
        value = None if option is None else given.get(option.key)
        if value is None:
            return default
        assert option is not None
        if option.single:
            return option.one_value(list(value), maximum)
        return validate_buckets(list(value), maximum, name=option.flag, max_name=option.maximum)

    def foreign_message(self, given: Mapping[str, Sequence[int]], *, max_model_len: int,
                        max_num_batched_tokens: int, family: str | None = None) -> str:
        """Why bucket lists of another runtime (by config key) are refused here, and what
        to give instead (runtimes.hints.foreign_message), one sentence per runtime they are of."""
        texts = []
        for other in RUNTIMES.values():
            keys = {o.key for o in other.bucket_options}
            theirs = {k: v for k, v in given.items() if k in keys}
            if other is not self and theirs:
                texts.append(foreign_message(self, other, theirs, max_model_len=max_model_len,
                                             max_num_batched_tokens=max_num_batched_tokens,
                                             family=family))
        unknown = [k for k in given if not any(k in {o.key for o in r.bucket_options}
                                               for r in RUNTIMES.values())]
        if unknown:
            texts.append(f"{', '.join(unknown)}: no runtime compiles such a list")
        return ". ".join(texts)

    # -- decode KV traffic -------------------------------------------------------------------
    def decode_kv_tokens(self, padded_seqs: int, attended: int, held: int, *, head_dim: int,
                         kv_dtype: str = "bf16") -> int:
        """KV tokens a decode step reads: the compiled shape (every padded slot reads its
        attended length) where the kernel cannot skip unused blocks, else what the requests
        hold. NxDI attends its token-generation bucket in every slot. The Beta plugin's DMA
        skips the -1 entries of a block table on its dma_copy path but not on the
        dma_transpose path it takes for head_dim 128 without FP8 KV (e.g. Llama 3 in bf16)."""
        if self.static_kv or (head_dim == 128 and kv_dtype not in ("fp8", "int8")):
            return padded_seqs * attended
        return held

    def prefill_kv_read(self, held: int) -> int:
        """KV tokens a 1-D prefill's attention reads after `held` tokens: NxDI's contiguous
        prefill reads what is held; the Beta plugin's segmented kernel whole segments."""
        if self.chunked_prefill:
            return -(-held // KV_SEGMENT_SIZE) * KV_SEGMENT_SIZE
        return held

    def gathers_block_kv(self, prefix_caching: bool, core_generation: int) -> bool:
        """Whether a decode step first gathers block KV into a flat layout: NxDI's block
        layout on NeuronCore-v2 (inf2, trn1), whose decode has no block-attention kernel
        (trn2's NeuronCore-v3 has one)."""
        return self.prefix_grid and prefix_caching and core_generation < 3

    def not_shipped_for(self, instance: str, family: str) -> str | None:
        """Why none of this runtime's layouts loads on `instance` (of `family`): AWS does not
        ship it there (`runs_on`); None when it does. The simulated device and `plan` refuse
        such figures with this."""
        if family in self.runs_on:
            return None
        usual = default_runtime(family)
        return (f"--runtime {self.name} does not run on {instance}: AWS ships it for "
                f"{'/'.join(self.runs_on)} only, so none of its layouts loads there; use "
                f"--runtime {usual.name} ({family}'s) or a {'/'.join(self.runs_on)} instance")

    def num_graphs(self, num_prefill: int, num_decode: int, num_attention: int,
                   num_prefix: int = 0) -> int:
        """Graphs compiled for bucket lists of these lengths: NxDI one per context-encoding
        bucket (per (prefill, prefix) pair with `num_prefix` prefix buckets) and one per
        token-generation bucket; the Beta plugin each decode batch bucket once per decode
        context-length bucket and once at max_model_len."""
        if self.static_kv:
            return num_prefill * max(num_prefix, 1) + num_attention
        return num_prefill + num_decode * (num_attention + 1)

    def engine_limits(self, *, max_model_len: int, max_num_seqs: int,
                      max_num_batched_tokens: int) -> dict[str, object]:
        """vLLM's chunking and token budget for this runtime. Whole prompts (nxdi): chunked
        prefill off and a budget of at least max_model_len, so vLLM never splits a prompt
        (NxDI's runner feeds a new request's whole prompt whatever the step says); beside
        every decode where a step decodes first (optimum-neuron)."""
        if self.chunked_prefill:
            return {"enable_chunked_prefill": True,
                    "max_num_batched_tokens": max_num_batched_tokens}
        return {"enable_chunked_prefill": False, "max_num_batched_tokens": (
            max_model_len + max_num_seqs if self.decode_then_prefill
            else max(max_model_len, max_num_seqs))}

    #: bucket_words(prefill, decode, attention): the three lists in its words (tables, verdicts)
    bucket_words = bucket_words


RUNTIMES: dict[str, Runtime] = {
    NXDI: Runtime(
        name=NXDI,
        summary="vLLM on NxD Inference, inf2/trn1 (plugin 0.1/0.2/0.4/0.5)",
        families=("inf2", "trn1"),
        runs_on=("inf2", "trn1", "trn2"),
        static_kv=True,
        chunked_prefill=False,
        prefix_grid=True,
        prefill_words="each prompt is prefilled whole, one a step, never in chunks",
        config_section="override_neuron_config",
        prefill=BucketOption("--context-encoding-buckets", "context_encoding_buckets",
                             "prefill buckets over whole prompt lengths", "max_model_len",
                             "ctx", "prefill", "prompt tokens padded to the bucket"),
        decode=None,
        attention=BucketOption("--token-generation-buckets", "token_generation_buckets",
                               "decode attention lengths over sequence length",
                               "max_model_len", "tkg", "attention",
                               "KV attended but not held: all max_num_seqs slots attend it"),
        scheduler_env=(("DISABLE_NEURON_CUSTOM_SCHEDULER", "1"),),
        host_block_size=None,
        # Contiguous KV without prefix caching: prefix caching switches NxDI to the block layout
        # and a 2-D prefill grid (prefill x prefix buckets) that these shapes do not describe.
        layout_config=(("is_block_kv_layout", False), ("is_prefix_caching", False)),
        sampling=device_sampling.NXDI_SAMPLING,
        loader_distribution="neuronx-distributed-inference",
        parallel_compile=True,
    ),
    VLLM_NEURON: Runtime(
        name=VLLM_NEURON,
        summary="AWS's vLLM Neuron (Beta) plugin, trn2/trn3",
        families=("trn2", "trn3"),
        runs_on=("trn2", "trn3"),
        static_kv=False,
        chunked_prefill=True,
        prefix_grid=False,
        prefill_words="longer prompts are prefilled in chunks",
        config_section="neuron_config",
        prefill=BucketOption("--prefill-buckets", "num_batched_tokens_buckets",
                             "prefill chunk token buckets",
                             "min(max_num_batched_tokens, max_model_len)", "prefill",
                             "prefill", "chunk tokens padded to the bucket"),
        decode=BucketOption("--decode-buckets", "num_seqs_buckets", "decode batch-size buckets",
                            "max_num_seqs", "decode", "decode",
                            "sequence slots padded to the bucket"),
        attention=BucketOption("--decode-context-buckets", "decode_context_length_buckets",
                               "decode KV context lengths (opt-in)", "below max_model_len",
                               "ctx len", "attention", "KV read but not held: max_model_len, "
                               "or the bucket, per padded request"),
        host_block_size=32,
    ),
    OPTIMUM_NEURON: Runtime(
        name=OPTIMUM_NEURON,
        summary="Hugging Face's optimum-neuron vLLM plugin, inf2/trn1 (0.4.5 on vLLM 0.11)",
        families=(),            # nxdi stays inf2/trn1's default; --runtime or its plugin
        runs_on=("inf2", "trn1"),
        static_kv=True,         # batch_size x sequence_length, contiguous (block = the length)
        chunked_prefill=False,
        prefix_grid=False,
        prefill_words="each prompt is prefilled whole at batch 1, padded to max_context_length",
        # optimum-neuron reads nothing of additional_config: the section only carries the
        # simulated export's max_context_length to our scheduler and the simulated device.
        config_section="optimum_neuron",
        prefill=BucketOption("--max-context-length", "max_context_length",
                             "the export's one context-encoding length (batch 1)",
                             "max_model_len", "ctx", "prefill",
                             "prompt tokens padded to max_context_length", single=True),
        decode=None,
        attention=None,
        prefix_caching=False,
        sampling=device_sampling.OPTIMUM_SAMPLING,
        decode_then_prefill=True,
        fixed_export=True,
        fixed_words=(
            ("decode", "its export decodes every batch_size slot: --max-num-seqs is it"),
            ("attention", "its one token-generation graph attends the export's sequence "
                          "length: --max-model-len is it")),
        host_block_size=None,   # platform.py sets block_size = max_model_len
        # NxD's ModelBuilder compiles its graphs in a pool, as nxdi's (backend/
        # pretrained_model.py get_builder)
        parallel_compile=True,
    ),
}


class RuntimeNameError(ValueError):
    """An unknown runtime name; the message lists the known ones."""


def default_runtime(family: str | None = None) -> Runtime:
    """The runtime of instance `family`: nxdi on inf2/trn1, else vllm-neuron (the seed's)."""
    return next((r for r in RUNTIMES.values() if family in r.families), RUNTIMES[VLLM_NEURON])


def get_runtime(name: str) -> Runtime:
    """The runtime called `name`, where a name enters (--runtime, `runtime_of`)."""
    key = str(name).strip().lower().replace("_", "-")
    if key not in RUNTIMES:
        raise RuntimeNameError(f"--runtime must be one of {', '.join(RUNTIME_NAMES)}, got {name!r}")
    return RUNTIMES[key]


def runtime_of(record: Mapping[str, object] | None) -> Runtime:
    """The runtime a record names in "runtime" (a report's config, a sweep or plan row, the
    scheduler's config section, a serialised Target; none: `default_runtime()`)."""
    name = (record or {}).get("runtime")
    return get_runtime(str(name)) if name else default_runtime()
