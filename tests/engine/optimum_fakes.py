"""Hugging Face's optimum-neuron (0.4.5) with its model faked, for running its vLLM plugin on
the CPU: the plugin's platform, worker, model runner and model loader, optimum-neuron's own
`NeuronConfig` (it reads an export's neuron_config.json) and its hub-cache selection, and
vLLM's engine and scheduler are the real ones. Faked at the boundaries
../shared/vendor/README.md names, and no further than importing needs:

- `optimum.neuron.models.inference.modeling_utils`: the exported model. `from_pretrained`
  loads a local export (its neuron_config.json read by optimum's real `NeuronConfig`),
  `get_neuron_config` / `export` build one as llama's `_get_neuron_config` does (on-device
  sampling, continuous batching from batch 2). The model keeps a KV store per slot and runs
  the two graphs the NxD backend compiles (`modules/decoder/modeling_decoder.py` and
  `decoder_wrappers.py`): context encoding one prompt at a time (ctx_batch_size 1) padded
  to `max_context_length`, token generation at `batch_size` slots over `sequence_length`.
  It chooses a graph as the backend does (more than one token at position 0: context
  encoding), checks every slot and position against the export, derives each next token
  from the context it holds, samples on the device from the [top_k, top_p, temperature]
  rows the runner sends (top_k 1: that token; else a draw), and logs every graph call;
- `utils.version_utils.get_neuronxcc_version` and `utils.system.get_available_cores`: the
  compiler's version and the NeuronCores of the faked device;
- `cache.hub_cache.get_hub_cached_entries`: the hub cache's registry (a network call),
  read from a JSON list instead; `select_hub_cached_entries`, which filters it, stays real;
- modules that import only for training or CPU sampling and pull in neuronx-distributed
  (`models.training`, `backend.modules.generation.sampling`): stubs that refuse use.

Test support, not a test. Sources: the wheel's own files (named above and in
tests/engine/optimum_driver.py).
"""

from __future__ import annotations

import json
import sys
import types
import zlib
from pathlib import Path
from types import SimpleNamespace

import torch

#: What the loader did and what the model saw, per process.
CAPTURED: dict = {"loaded": [], "exported": [], "neuron_config": None}
CALLS: list[dict] = []
PEAK = 10.0
FIRST_TOKEN = 3          # tokens 0-2 are pad, BOS and EOS in the tiny model
NEURONXCC_VERSION = "2.21.33363.0"   # the compiler optimum-neuron 0.4.5 pins (its METADATA)
#: NeuronCores the faked host shows (an inf2.8xlarge: one device of two cores).
FAKE_CORES = 2


def next_token(context, vocab: int) -> int:
    """A token that depends on the whole context the model can see (as nxdi_fakes's)."""
    data = ",".join(str(int(t)) for t in context).encode()
    return FIRST_TOKEN + zlib.crc32(data) % (vocab - FIRST_TOKEN)


def _model_config(model_path) -> SimpleNamespace:
    config = json.loads((Path(model_path) / "config.json").read_text())
    return SimpleNamespace(**config)


class FakeExportedModel:
    """An optimum-neuron NxD causal LM as the plugin's `OptimumNeuronModelForCausalLM` drives
    it: `model(input_ids, position_ids=, seq_ids=, sampling_params=)`."""

    def __init__(self, model_path, neuron_config):
        self.config = _model_config(model_path)
        self.neuron_config = neuron_config
        self.kv: dict[int, list[int]] = {}
        CAPTURED["neuron_config"] = {k: str(v) if isinstance(v, torch.dtype) else v
                                     for k, v in vars(neuron_config).items()}

    def __call__(self, input_ids, position_ids=None, seq_ids=None, sampling_params=None):
        nc = self.neuron_config
        slots = [int(s) for s in seq_ids.flatten()]
        assert all(0 <= s < nc.batch_size for s in slots), (slots, nc.batch_size)
        assert len(set(slots)) == len(slots), slots
        if input_ids.shape[-1] > 1 and not int(position_ids.min()):
            tokens = [self._context_encoding(row, slot, input_ids, position_ids)
                      for row, slot in enumerate(slots)]
        else:
            tokens = self._token_generation(slots, input_ids, position_ids)
        return self._sampled(tokens, sampling_params, input_ids.shape)

    def _context_encoding(self, row, slot, input_ids, position_ids) -> int:
        # The wrapper runs ctx_batch_size (1 under continuous batching) rows a graph call,
        # each padded to max_context_length (decoder_wrappers.py `pad_to_max_context_length`).
        nc = self.neuron_config
        length = int(position_ids[row].max()) + 1
        assert length <= nc.max_context_length, (
            f"a prompt of {length} tokens on a context-encoding graph of "
            f"{nc.max_context_length}: the backend would crop it")
        prompt = [int(t) for t in input_ids[row, :length]]
        self.kv[slot] = list(prompt)
        CALLS.append({"phase": "prefill", "slots": [slot], "num_tokens": length,
                      "padded": nc.max_context_length, "batch": 1,
                      "padded_batch": nc.ctx_batch_size, "attended": None})
        return next_token(prompt, self.config.vocab_size)

    def _token_generation(self, slots, input_ids, position_ids) -> list[int]:
        nc = self.neuron_config
        assert len(slots) <= nc.batch_size
        tokens = []
        for row, slot in enumerate(slots):
            held = self.kv[slot]
            position = int(position_ids[row, 0])
            # The token written at `position` follows exactly what the slot holds.
            assert position == len(held), (slot, position, len(held))
            assert position < nc.sequence_length, (position, nc.sequence_length)
            held.append(int(input_ids[row, 0]))
            tokens.append(next_token(held, self.config.vocab_size))
        CALLS.append({"phase": "decode", "slots": slots, "num_tokens": len(slots),
                      "padded": None, "batch": len(slots), "padded_batch": nc.batch_size,
                      "attended": nc.sequence_length})
        return tokens

    def _sampled(self, tokens, sampling_params, shape):
        vocab = self.config.vocab_size
        if not self.neuron_config.on_device_sampling:
            logits = torch.zeros(shape[0], shape[1], vocab)
            for row, token in enumerate(tokens):
                logits[row, -1, token] = PEAK
            return logits
        chosen = []
        for token, (top_k, top_p, temperature) in zip(tokens, sampling_params.tolist()):
            if int(top_k) == 1:
                # Greedy, as the runner sends it for temperature 0 (runner.py
                # OptimumNeuronCachedRequest: top_k 1, top_p 1, temperature 1).
                assert (top_p, temperature) == (1.0, 1.0), (top_k, top_p, temperature)
                chosen.append(token)
                continue
            logits = torch.zeros(vocab)
            logits[token] = PEAK
            logits = logits / max(float(temperature), 1e-6)
            keep = torch.topk(logits, min(int(top_k), vocab)).indices
            probs = torch.softmax(logits[keep], dim=0)
            draw = torch.Generator().manual_seed(token * 7919 + len(CALLS))
            chosen.append(int(keep[torch.multinomial(probs, 1, generator=draw)]))
        return torch.tensor(chosen, dtype=torch.long)


class NeuronPreTrainedModel:
    """The base of optimum-neuron's inference models (the loader names it in a type hint)."""


class NeuronModelForCausalLM(NeuronPreTrainedModel):
    @classmethod
    def from_pretrained(cls, model_name_or_path, revision=None, token=None, **kwargs):
        from optimum.neuron.configuration_utils import NeuronConfig

        config = NeuronConfig.from_pretrained(model_name_or_path, revision=revision or "main",
                                              token=token)
        CAPTURED["loaded"].append(str(model_name_or_path))
        return FakeExportedModel(model_name_or_path, config)

    @classmethod
    def get_neuron_config(cls, model_name_or_path, config=None, token=None, revision=None,
                          instance_type=None, batch_size=None, sequence_length=None,
                          tensor_parallel_size=None):
        from optimum.neuron.models.inference.backend.config import NxDNeuronConfig

        # As llama's `_get_neuron_config` (models/inference/llama/modeling_llama.py).
        return NxDNeuronConfig(batch_size=batch_size, sequence_length=sequence_length,
                               tp_degree=tensor_parallel_size, on_device_sampling=True,
                               continuous_batching=bool(batch_size and batch_size > 1))

    @classmethod
    def export(cls, model_name_or_path, neuron_config=None, token=None, revision=None,
               load_weights=False, **kwargs):
        CAPTURED["exported"].append(str(model_name_or_path))
        return FakeExportedModel(model_name_or_path, neuron_config)


class NeuronModelForEmbedding(NeuronPreTrainedModel):
    pass


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise NotImplementedError(f"{what} is not faked (it needs neuronx-distributed)")
    return refuse


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def write_export(model_dir: Path, *, batch_size: int, sequence_length: int, tp_degree: int,
                 max_context_length: int | None = None, on_device_sampling: bool = True,
                 torch_dtype: str = "bfloat16") -> Path:
    """A local export's neuron_config.json, as optimum-neuron's `to_json_file` writes one
    (the keys `from_dict` requires, then NxDNeuronConfig's arguments)."""
    config = {"_serialized_key": "NxDNeuronConfig", "optimum_neuron_version": "0.4.5",
              "neuronxcc_version": NEURONXCC_VERSION, "batch_size": batch_size,
              "sequence_length": sequence_length, "tp_degree": tp_degree,
              "torch_dtype": torch_dtype, "continuous_batching": batch_size > 1,
              "on_device_sampling": on_device_sampling, "max_topk": 256}
    if max_context_length is not None:
        config["max_context_length"] = max_context_length
    path = model_dir / "neuron_config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def install(hub_entries: list[dict] | None = None) -> None:
    """Put the fakes in place, before the plugin's model loader is imported."""
    import optimum.neuron.utils.system as system
    import optimum.neuron.utils.version_utils as version_utils

    version_utils.get_neuronxcc_version = lambda: NEURONXCC_VERSION
    system.get_available_cores = lambda: FAKE_CORES
    root = "optimum.neuron.models"
    _module(f"{root}.training", __path__=[])
    _module(f"{root}.training.config", TrainingNeuronConfig=type("TrainingNeuronConfig", (), {}))
    _module(f"{root}.inference.backend.modules.generation.sampling",
            Sampler=_refuse("optimum-neuron's CPU sampler"))
    _module(f"{root}.inference.modeling_utils", NeuronPreTrainedModel=NeuronPreTrainedModel,
            NeuronModelForCausalLM=NeuronModelForCausalLM,
            NeuronModelForEmbedding=NeuronModelForEmbedding)
    import optimum.neuron.cache.hub_cache as hub_cache

    entries = list(hub_entries or [])
    hub_cache.get_hub_cached_entries = lambda model_id, task=None, cache_repo_id=None: entries
