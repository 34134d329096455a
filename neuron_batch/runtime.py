"""The two ways vLLM runs on Neuron, as one object each: what the device compiles, where the
bucket lists go, how the KV cache is laid out.

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

Sources: ../shared/notes/neuron-runtimes.md (NxDI feature guide "Bucketing", NxDI's
`autobucketing.generate_buckets`, the plugin's platform and loader, the Beta plugin's design
notes on decode context-length bucketing). Every module asks the resolved `Runtime` (and the
`Shapes` it builds for one configuration) instead of testing the runtime's name. Pure Python
(no vLLM): the CLI, the scheduler, the simulated device, bench and plan share it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from neuron_batch.buckets import (
    DECODE_CONTEXT_MULTIPLE,
    BucketError,
    bucket_for,
    default_decode_buckets,
    default_prefill_buckets,
    effective_max_prefill_tokens,
    fitting_buckets,
    nxdi_default_buckets,
    validate_buckets,
    validate_context_buckets,
)

NXDI = "nxdi"
VLLM_NEURON = "vllm-neuron"
RUNTIME_NAMES = (NXDI, VLLM_NEURON)

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

    @property
    def label(self) -> str:
        return f"{self.short} buckets"


@dataclass(frozen=True)
class Shapes:
    """The compiled shapes of one configuration: what every step is padded to."""

    runtime: Runtime
    max_num_seqs: int
    max_model_len: int
    prefill_buckets: tuple[int, ...]    # nxdi: context encoding; vllm-neuron: token buckets
    decode_buckets: tuple[int, ...]     # nxdi: (max_num_seqs,); vllm-neuron: batch buckets
    attention_buckets: tuple[int, ...]  # nxdi: token generation; vllm-neuron: decode context
                                        # lengths (may be empty: max_model_len then)

    def prefill(self, num_tokens: int) -> int:
        """The padded size of a prefill of `num_tokens` (a whole prompt under nxdi, a chunk
        under vllm-neuron)."""
        return bucket_for(num_tokens, self.prefill_buckets)

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
    def num_graphs(self) -> int:
        """Graphs the runtime compiles for this configuration."""
        return self.runtime.num_graphs(len(self.prefill_buckets), len(self.decode_buckets),
                                       len(self.attention_buckets))

    def bucket_lists(self) -> dict[str, list[int]]:
        """The lists by the runtime's own config keys (what the plugin is given)."""
        runtime = self.runtime
        lists = {runtime.prefill.key: list(self.prefill_buckets)}
        if runtime.decode is not None:
            lists[runtime.decode.key] = list(self.decode_buckets)
        if self.attention_buckets or runtime.static_kv:
            lists[runtime.attention.key] = list(self.attention_buckets)
        return lists


@dataclass(frozen=True)
class Runtime:
    """One way vLLM runs on Neuron. Two instances exist: `RUNTIMES[NXDI]` and
    `RUNTIMES[VLLM_NEURON]`."""

    name: str
    summary: str
    #: Instance families that run this runtime by default.
    families: tuple[str, ...]
    #: Instance families AWS ships it for: a layout elsewhere cannot load, so the simulated
    #: device refuses to print figures for it (../shared/notes/neuron-runtimes.md: the Beta
    #: plugin is for trn2/trn3 only; NxDI runs on inf2, trn1 and trn2).
    runs_on: tuple[str, ...]
    #: Static KV (max_num_seqs x max_model_len, decode over every slot) or paged KV (capped).
    static_kv: bool
    #: Whether prefills are chunked (vllm-neuron) or whole prompts, one a step (nxdi).
    chunked_prefill: bool
    #: How a prompt is prefilled, in words (legends).
    prefill_words: str
    #: Where the bucket lists go in vLLM's `additional_config`.
    config_section: str
    prefill: BucketOption
    decode: BucketOption | None
    attention: BucketOption
    # -- on a Neuron host (engine/neuron_host.py composes these) ---------------------------------
    #: Environment its plugin needs to keep a given `scheduler_cls` (NxDI line: the platform
    #: swaps in its own scheduler unless DISABLE_NEURON_CUSTOM_SCHEDULER=1).
    scheduler_env: tuple[tuple[str, str], ...] = ()
    #: KV block size on the device: None for one block of max_model_len per slot (NxDI's
    #: contiguous layout, which the runtime's shapes describe), else the plugin's paged size.
    host_block_size: int | None = None
    #: Keys of its config section that fix the compiled KV layout to the one the shapes model.
    layout_config: tuple[tuple[str, object], ...] = ()
    #: Keys of its config section that sample on the CPU with each request's own parameters
    #: (None: the plugin already samples per request).
    cpu_sampling_config: tuple[tuple[str, object], ...] | None = None
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
        return tuple((n, o) for n, o in (("prefill", self.prefill), ("decode", self.decode),
                                         ("attention", self.attention)) if o is not None)

    def shapes(self, bucket_lists: Mapping[str, Sequence[int] | None] | None, *,
               max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
               family: str | None = None) -> Shapes:
        """The shapes for these limits and the user's lists (by config key; a missing or None
        list takes the runtime's default). BucketError, naming the flag, for a list the
        plugin would refuse or that leaves a step without a graph; for a list of the other
        runtime it says what to give instead on the instance `family` (None: unknown)."""
        given = dict(bucket_lists or {})
        unknown = {k: list(v) for k, v in sorted(given.items()) if v is not None
                   and k not in {o.key for o in self.bucket_options}}
        if unknown:
            raise BucketError(self.foreign_message(
                unknown, max_model_len=max_model_len,
                max_num_batched_tokens=max_num_batched_tokens, family=family))
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
        context = given.get(self.attention.key)
        attention = [] if context is None else validate_context_buckets(
            list(context), max_model_len, self.attention.flag)
        return Shapes(self, max_num_seqs, max_model_len, tuple(prefill), tuple(decode),
                      tuple(attention))

    @staticmethod
    def bucket_lists_in(section: Mapping[str, object] | None) -> dict[str, object]:
        """The bucket lists of a plugin config section, by key: its other keys (KV layout,
        sampling) are the plugin's. Lists of either runtime are kept, so that `shapes` still
        refuses the other runtime's."""
        keys = {o.key for runtime in RUNTIMES.values() for o in runtime.bucket_options}
        return {k: v for k, v in (section or {}).items() if k in keys}

    @staticmethod
    def _list(given: Mapping[str, Sequence[int] | None], option: BucketOption, maximum: int,
              default: list[int]) -> list[int]:
        value = given.get(option.key)
        if value is None:
            return default
        return validate_buckets(list(value), maximum, name=option.flag, max_name=option.maximum)

    def foreign_message(self, given: Mapping[str, Sequence[int]], *, max_model_len: int,
                        max_num_batched_tokens: int, family: str | None = None) -> str:
        """Why bucket lists of the other runtime (by config key) are refused here, and what
        to give instead: this runtime's list of the same role (prefill; decode attention)
        made valid from the values given, and `--runtime <other>` only where the other
        runtime runs on the instance `family` (None: unknown), so the hint never names a
        runtime that is then refused (the Beta plugin on inf2)."""
        other = next(r for r in RUNTIMES.values() if r is not self)
        theirs = {o.key: (role, o) for role in _ROLES
                  if (o := getattr(other, role)) is not None}
        named, instead = [], []
        for key, values in given.items():
            role, option = theirs.get(key, (None, None))
            named.append(option.flag if option else key)
            own = getattr(self, role) if role else None
            fitted = self._fitted(role, values, max_model_len=max_model_len,
                                  max_num_batched_tokens=max_num_batched_tokens)
            if option and own is None:
                instead.append(f"drop {option.flag} ({self.name} decodes every max_num_seqs "
                               f"slot: --max-num-seqs is its one decode batch)")
            elif option and fitted:
                instead.append(f"use {own.flag} {_csv(fitted)} ({own.what})")
            elif option:
                instead.append(f"drop {option.flag} ({own.flag} is opt-in and none of these "
                               f"values is below max_model_len {max_model_len})")
        text = (f"{', '.join(named)} belong(s) to the {other.name} runtime "
                f"({other.summary}); this run uses {self.name} ({self.summary}). Instead: "
                f"{'; '.join(instead)}")
        if family is None or family in other.runs_on:
            return text + f"; or keep them with --runtime {other.name}"
        return text + (f"; {other.name} itself does not run on {family} (AWS ships it for "
                       f"{'/'.join(other.runs_on)} only)")

    def _fitted(self, role: str | None, values: Sequence[int], *, max_model_len: int,
                max_num_batched_tokens: int) -> list[int]:
        """`values` made a valid list of this runtime's `role` option (empty: none is)."""
        if role == "prefill" and not self.static_kv:
            return fitting_buckets(values, effective_max_prefill_tokens(
                max_num_batched_tokens, max_model_len))
        if role == "attention" and not self.static_kv:   # opt-in multiples of 128 below it
            rounded = {-(-v // DECODE_CONTEXT_MULTIPLE) * DECODE_CONTEXT_MULTIPLE
                       for v in values if v > 0}
            return sorted(v for v in rounded if v < max_model_len)
        if role in ("prefill", "attention"):
            return fitting_buckets(values, max_model_len)
        return []

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

    def not_shipped_for(self, instance: str, family: str) -> str | None:
        """Why none of this runtime's layouts loads on `instance` (of `family`): AWS does not
        ship it there (`runs_on`); None when it does. The simulated device and `plan` refuse
        such figures with this."""
        if family in self.runs_on:
            return None
        usual = get_runtime(None, family=family)
        return (f"--runtime {self.name} does not run on {instance}: AWS ships it for "
                f"{'/'.join(self.runs_on)} only, so none of its layouts loads there; use "
                f"--runtime {usual.name} ({family}'s) or a {'/'.join(self.runs_on)} instance")

    def num_graphs(self, num_prefill: int, num_decode: int, num_attention: int) -> int:
        """Graphs compiled for bucket lists of these lengths: NxDI one per context-encoding
        and one per token-generation bucket; the Beta plugin each decode batch bucket once per
        decode context-length bucket and once at max_model_len."""
        if self.static_kv:
            return num_prefill + num_attention
        return num_prefill + num_decode * (num_attention + 1)

    def engine_limits(self, *, max_model_len: int, max_num_seqs: int,
                      max_num_batched_tokens: int) -> dict[str, object]:
        """vLLM's chunking and token budget for this runtime. Whole prompts (nxdi): chunked
        prefill off and a budget of at least max_model_len, so vLLM never splits a prompt
        (NxDI's runner feeds a new request's whole prompt whatever the step says)."""
        if self.chunked_prefill:
            return {"enable_chunked_prefill": True,
                    "max_num_batched_tokens": max_num_batched_tokens}
        return {"enable_chunked_prefill": False,
                "max_num_batched_tokens": max(max_model_len, max_num_seqs)}

    def bucket_words(self, prefill: Sequence[int] | None, decode: Sequence[int] | None,
                     attention: Sequence[int] | None) -> str:
        """The three lists in this runtime's own words, for tables and verdicts."""
        def join(buckets):
            return ",".join(str(b) for b in buckets or []) or "default"

        if self.static_kv:
            return f"context encoding {join(prefill)} / token generation {join(attention)}"
        text = f"prefill {join(prefill)} / decode {join(decode)}"
        return text + (f" / decode context {join(attention)}" if attention else "")

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "summary": self.summary, "static_kv": self.static_kv,
                "chunked_prefill": self.chunked_prefill,
                "bucket_flags": [o.flag for o in self.bucket_options]}


#: A Runtime's bucket-option attributes: a list of one runtime maps to the other's of a role.
_ROLES = ("prefill", "decode", "attention")


def _csv(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


RUNTIMES: dict[str, Runtime] = {
    NXDI: Runtime(
        name=NXDI,
        summary="vLLM on NxD Inference, inf2/trn1 (plugin 0.1/0.2/0.4/0.5)",
        families=("inf2", "trn1"),
        runs_on=("inf2", "trn1", "trn2"),
        static_kv=True,
        chunked_prefill=False,
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
        # On-device sampling takes its parameters in the runner's request-table order, not the
        # scheduled batch's (runner get_nxd_sampling_params); the CPU sampler reads the batch's.
        cpu_sampling_config=(("on_device_sampling_config", None),),
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
}


class RuntimeNameError(ValueError):
    """An unknown runtime name; the message lists the known ones."""


def get_runtime(name: str | Runtime | None, *, family: str | None = None) -> Runtime:
    """The runtime called `name`; None: the default of the instance `family` (inf2/trn1 ->
    nxdi, trn2/trn3 -> vllm-neuron), and vllm-neuron (the seed design) when that is unknown."""
    if isinstance(name, Runtime):
        return name
    if name is None or name == "":
        if family is not None:
            for runtime in RUNTIMES.values():
                if family in runtime.families:
                    return runtime
        return RUNTIMES[VLLM_NEURON]
    key = str(name).strip().lower().replace("_", "-")
    if key not in RUNTIMES:
        raise RuntimeNameError(f"--runtime must be one of {', '.join(RUNTIME_NAMES)}, got {name!r}")
    return RUNTIMES[key]
