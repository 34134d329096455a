"""The model a simulated device's vLLM engine loads: a directory holding only a config.json (no
weights: `load_format="dummy"`), and the architecture that config describes.

`architecture_of` is where `Target.resolve` turns an architecture's spelling (a catalogue name,
a config.json path or directory, a config dict) into the `Architecture` and the config.json the
directory holds, reading a model's own file once: a catalogue architecture travels as its name
(`Target.to_dict`), a model's own as that config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from neuron_batch.device.architectures import (
    ARCHITECTURES,
    Architecture,
    resolve_architecture,
)


def architecture_of(spec: str | Path | dict | Architecture
                    ) -> tuple[Architecture, str, dict[str, Any]]:
    """(the architecture, its catalogue name or "" for a model's own config, the config.json a
    simulated model directory holds: the model's own, read once here, or the catalogue's).
    A model's own config travels as the config (`to_dict`), a catalogue one as its name."""
    if isinstance(spec, Architecture):
        catalogue = ARCHITECTURES.get(spec.name) == spec
        return spec, spec.name if catalogue else "", _model_config(arch_config_json(spec))
    own = None
    if isinstance(spec, dict):
        own = dict(spec)
    else:
        path = Path(spec)
        if path.suffix == ".json" or (path.is_dir() and (path / "config.json").exists()):
            own = json.loads((path / "config.json" if path.is_dir() else path)
                             .read_text(encoding="utf-8"))
    arch = resolve_architecture(own if own is not None else spec)
    if own is None:
        return arch, arch.name, _model_config(arch_config_json(arch))
    return arch, "", _model_config(own)


def _model_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with what vLLM needs to pick a model class (a llama one unless it says)."""
    config.setdefault("architectures", ["LlamaForCausalLM"])
    config.setdefault("model_type", "llama")
    return config


def arch_config_json(arch: Architecture) -> dict[str, Any]:
    """A Hugging Face config.json for a catalogue architecture (enough for vLLM's ModelConfig;
    no weights are ever loaded)."""
    qwen = arch.attention_bias
    return {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen else "llama",
        "_name_or_path": arch.name,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "num_hidden_layers": arch.num_layers,
        "vocab_size": arch.vocab_size,
        "max_position_embeddings": arch.max_position_embeddings,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def write_model_dir(config: dict[str, Any], arch: Architecture, workdir: Path) -> Path:
    """workdir/sim-model-<name>/config.json: `config` (the target's model_config)."""
    slug = "".join(c if c.isalnum() or c in ".-" else "-" for c in arch.name.lower())
    model_dir = workdir / f"sim-model-{slug}"
    model_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    target = model_dir / "config.json"
    if not target.exists() or target.read_text(encoding="utf-8") != text:
        target.write_text(text, encoding="utf-8")
    return model_dir
