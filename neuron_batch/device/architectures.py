"""Model shapes: what the cost model needs to cost a step and size the KV cache.

The built-in figures are those of each model's public Hugging Face `config.json`. Parameter
counts are derived from the shapes (llama-style decoder), not typed in, so a config read with
`from_config_json` gets the same treatment as a built-in one.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_batch.errors import did_you_mean

#: Bytes per stored element for each supported weight / KV dtype.
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


class ArchitectureError(ValueError):
    """Unknown model name or unusable config; the message lists the choices."""


@dataclass(frozen=True, slots=True)
class Architecture:
    """A llama-style decoder (llama, mistral, qwen2)."""

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    attention_bias: bool = False    # qwen2 has biases on q/k/v

    # -- parameter counts ----------------------------------------------------------------------
    @property
    def attention_params_per_layer(self) -> int:
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        weights = self.hidden_size * (q + 2 * kv) + q * self.hidden_size   # q, k, v, o
        bias = (q + 2 * kv) if self.attention_bias else 0
        return weights + bias

    @property
    def mlp_params_per_layer(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size                 # gate, up, down

    @property
    def decoder_linear_params(self) -> int:
        """Weights of all decoder-layer matmuls: what int8/fp8 quantization shrinks."""
        return self.num_layers * (self.attention_params_per_layer + self.mlp_params_per_layer)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Logical lm_head size (tied or not, every decode step multiplies by it)."""
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Stored parameters: embeddings, layers (with 2 RMSNorms each), final norm, lm_head
        unless tied."""
        norms = (2 * self.num_layers + 1) * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.embedding_params + self.decoder_linear_params + norms + lm_head

    # -- bytes ---------------------------------------------------------------------------------
    def weight_bytes(self, weight_dtype: str = "bf16") -> int:
        """Stored weight bytes. With int8/fp8 only the decoder-layer matmuls are quantized;
        embeddings, lm_head and norms stay bf16 (the usual Neuron quantization scope)."""
        wbytes = dtype_bytes(weight_dtype)
        unquantized = self.num_params - self.decoder_linear_params
        return self.decoder_linear_params * wbytes + unquantized * 2

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> int:
        """Logical KV bytes per token: 2 (K and V) * layers * kv_heads * head_dim * dtype."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes(kv_dtype)

    def kv_heads_per_core(self, tp: int) -> int:
        """KV heads each core holds: heads are split over TP, and replicated when TP exceeds
        them (GQA with 8 KV heads at TP 24 keeps one head per core, 3 copies of each)."""
        return -(-self.num_kv_heads // tp)

    def q_heads_per_core(self, tp: int) -> int:
        """Query heads each core computes: heads that do not divide over TP are padded (32
        heads at TP 24 run as 48, two a core), so every core does the same work."""
        return -(-self.num_attention_heads // tp)

    def decoder_params_per_core(self, tp: int) -> int:
        """Decoder-layer matmul weights one core holds and streams each step: its padded share
        of the q/o projections, the k/v projections of the KV heads it holds (replicated when
        TP exceeds them, see kv_heads_per_core) and 1/tp of the MLP."""
        q, kv = self.q_heads_per_core(tp), self.kv_heads_per_core(tp)
        attention = self.hidden_size * self.head_dim * (2 * q + 2 * kv)
        if self.attention_bias:
            attention += (q + 2 * kv) * self.head_dim
        mlp = -(-self.mlp_params_per_layer // tp)
        return self.num_layers * (attention + mlp)


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ArchitectureError(f"unknown dtype {dtype!r}; "
                                f"choose one of {list(DTYPE_BYTES)}") from None


def _arch(name: str, layers: int, hidden: int, inter: int, heads: int, kv: int, vocab: int,
          max_pos: int, *, tie: bool = False, head_dim: int | None = None,
          bias: bool = False) -> Architecture:
    return Architecture(name, layers, hidden, inter, heads, kv, head_dim or hidden // heads,
                        vocab, tie, max_pos, bias)


#: Built-in catalogue (values from each model's config.json on the Hugging Face Hub).
ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    _arch("Llama-2-7B", 32, 4096, 11008, 32, 32, 32000, 4096),
    _arch("Llama-2-13B", 40, 5120, 13824, 40, 40, 32000, 4096),
    _arch("Llama-2-70B", 80, 8192, 28672, 64, 8, 32000, 4096),
    _arch("Llama-3-8B", 32, 4096, 14336, 32, 8, 128256, 8192),
    _arch("Llama-3.1-8B", 32, 4096, 14336, 32, 8, 128256, 131072),
    _arch("Llama-3-70B", 80, 8192, 28672, 64, 8, 128256, 8192),
    _arch("Llama-3.1-70B", 80, 8192, 28672, 64, 8, 128256, 131072),
    _arch("Mistral-7B", 32, 4096, 14336, 32, 8, 32000, 32768),              # v0.1
    _arch("Qwen2.5-7B", 28, 3584, 18944, 28, 4, 152064, 131072, bias=True),
    _arch("TinyLlama-1.1B", 22, 2048, 5632, 32, 4, 32000, 2048),
    _arch("SmolLM2-135M", 30, 576, 1536, 9, 3, 49152, 8192, tie=True),
)}

#: Extra spellings (already normalized, see _normalize) -> catalogue name.
_ALIASES = {
    "mistral-7b-v0.1": "Mistral-7B",
    "mistral-7b-instruct-v0.1": "Mistral-7B",
    "mistral-7b-v0.2": "Mistral-7B",                # v0.2: same shapes, no sliding window
    "mistral-7b-instruct-v0.2": "Mistral-7B",
    "tinyllama-1.1b-chat-v1.0": "TinyLlama-1.1B",
    "tinyllama-1.1b-intermediate-step-1431k-3t": "TinyLlama-1.1B",
    "llama-3.3-70b": "Llama-3.1-70B",           # same shapes as 3.1-70B
    "qwen2.5-7b": "Qwen2.5-7B",
}


def _normalize(name: str) -> str:
    """'meta-llama/Meta-Llama-3-8B-Instruct' -> 'llama-3-8b';
    'Llama2_7b-chat-hf' -> 'llama-2-7b'."""
    key = name.strip().lower().rsplit("/", 1)[-1].replace("_", "-")
    key = key.removeprefix("meta-")
    key = re.sub(r"^llama(\d)", r"llama-\1", key)
    for suffix in ("-hf", "-chat", "-instruct"):
        key = key.removesuffix(suffix)
    return key


_LOOKUP = {_normalize(n): n for n in ARCHITECTURES} | _ALIASES


@functools.lru_cache(maxsize=256)
def _lookup(name: str) -> Architecture:
    key = _normalize(name)
    if key not in _LOOKUP:
        hint = did_you_mean(key, _LOOKUP) or ";"
        raise ArchitectureError(f"unknown model {name!r}{hint} built-in architectures: "
                                f"{', '.join(ARCHITECTURES)} (or pass a config.json path)")
    return ARCHITECTURES[_LOOKUP[key]]


def get_architecture(name: str) -> Architecture:
    """Find a built-in architecture by name or alias, case-insensitively."""
    return _lookup(name)


def from_config_json(source: str | Path | dict[str, Any], name: str | None = None) -> Architecture:
    """Build an Architecture from a Hugging Face config.json (a path, a directory holding one,
    or the parsed dict). Reads the llama / mistral / qwen2 keys."""
    if isinstance(source, dict):
        config = source
    else:
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        config = json.loads(path.read_text(encoding="utf-8"))
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        arch = Architecture(
            name=name or config.get("_name_or_path") or config.get("model_type", "custom"),
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_attention_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            attention_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
        )
    except KeyError as missing:
        raise ArchitectureError(f"config.json lacks {missing}; a llama/mistral/qwen2 config "
                                f"needs hidden_size, intermediate_size, num_hidden_layers, "
                                f"num_attention_heads and vocab_size") from None
    return arch


def resolve_architecture(spec: str | Path | dict[str, Any]) -> Architecture:
    """The Architecture of a built-in name/alias, a config.json (path or directory) or a config
    dict: called where a model's name enters the program; everything below takes the object."""
    if isinstance(spec, dict):
        return from_config_json(spec)
    path = Path(spec)
    if path.suffix == ".json" or (path.is_dir() and (path / "config.json").exists()):
        return from_config_json(path)
    return get_architecture(str(spec))


def context_hint(arch: Architecture, max_model_len: int) -> str:
    """What to give when `max_model_len` is past `arch`'s context, as flags: a lower
    --max-model-len, or a catalogue architecture of the same shapes (so the same figures)
    whose context holds it."""
    longer = [a.name for a in ARCHITECTURES.values()   # (names are looked up in any case)
              if a.max_position_embeddings >= max_model_len and same_shape(a, arch)]
    same = (f", or --architecture {longer[0]} (the same shapes, a longer context)"
            if longer else ", or a model with a longer context")
    return f"give --max-model-len {arch.max_position_embeddings} or less{same}"


def same_shape(a: Architecture, b: Architecture) -> bool:
    """Whether two architectures have the same shapes (so the same figures)."""
    return (a.num_layers, a.hidden_size, a.intermediate_size, a.num_attention_heads,
            a.num_kv_heads, a.head_dim, a.vocab_size) == (
        b.num_layers, b.hidden_size, b.intermediate_size, b.num_attention_heads,
        b.num_kv_heads, b.head_dim, b.vocab_size)
