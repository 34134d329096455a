"""NxD Inference (NxDI), faked at its import boundary only, for running AWS's vLLM plugin
(vllm-neuron 0.1.0 / 0.2.0) on the CPU: the plugin's platform, loader, worker and model runner
and vLLM's engine and scheduler are the real ones. As the plugin's own tests do
(`test/unit/conftest.py`: NxDI modules put in `sys.modules`), but with behaviour:

- `NeuronConfig` keeps the keyword arguments the plugin's loader built (the loader contract);
- the NxDI model keeps a KV store per slot and position (the contiguous layout: one slot per
  `batch_size`), checks that slots and positions stay inside what was compiled, pads each call
  the way NxDI does (a prompt to the smallest context-encoding bucket at batch 1; a decode to
  `batch_size` slots attending the smallest token-generation bucket above its longest
  position), derives each next token from the context it can see, and logs every call;
- with prefix caching (`is_block_kv_layout`), KV is kept by block id and offset: a prefill
  reads its first `computed_context_lens` tokens from the blocks of its block table (never from
  the prompt it is also given), writes only the new tokens, to their slots (never a slot of -1,
  never vLLM's null block 0), and runs on the (prefill, prefix) cell of NxDI's rule
  (neuron_batch/runtimes/prefix_grid.py); a decode reads its whole context through its block table.
  A lost or wrong prefix is then a wrong token;
- sampling on the device returns that token; with `on_device_sampling_config` None it returns
  fp32 logits (as NxDI's `NeuronBaseModel.forward` does), peaked on it over a spread that
  also depends on the context (`logits_for`), so a grammar bitmask that masks the peak leaves
  a well-defined best allowed token, for vLLM's CPU sampler.

Test support, not a test. NxDI's own keys and semantics: aws-neuron/neuronx-distributed-inference
`models/config.py` (NeuronConfig) and its bucketing docs; see ../shared/notes/neuron-runtimes.md.
"""

from __future__ import annotations

import json
import sys
import types
import zlib
from bisect import bisect_left
from pathlib import Path
from types import SimpleNamespace

import torch

#: What the loader passed to NeuronConfig, and what the model saw, per process.
CAPTURED: dict = {"neuron_config": None, "compiled": [], "loaded": []}
CALLS: list[dict] = []
#: Peak logit for the token the context selects (CPU sampling).
PEAK = 10.0
FIRST_TOKEN = 3          # tokens 0-2 are pad, BOS and EOS in the tiny model
#: What a read of a KV slot nothing was written to gives (a lost prefix).
UNWRITTEN = -1


def next_token(context, vocab: int) -> int:
    """A token that depends on the whole context the model can see."""
    data = ",".join(str(int(t)) for t in context).encode()
    return FIRST_TOKEN + zlib.crc32(data) % (vocab - FIRST_TOKEN)


def logits_for(token: int, vocab: int) -> torch.Tensor:
    """One row of logits: `token` (the context's next token) at PEAK above a spread in [0, 1)
    seeded by it, so every context has its own order of the other tokens."""
    generator = torch.Generator().manual_seed(token)
    row = torch.rand(vocab, generator=generator)
    row[token] = PEAK
    return row


def _smallest_at_least(value: int, buckets) -> int:
    index = bisect_left(sorted(buckets), value)
    if index == len(buckets):
        raise AssertionError(f"NxDI has no graph for {value}: buckets {sorted(buckets)}")
    return sorted(buckets)[index]


class NeuronConfig:
    """Keeps what the plugin passed; the attributes the plugin's runner reads back."""

    def __init__(self, **kwargs):
        CAPTURED["neuron_config"] = dict(kwargs)
        self.__dict__.update(kwargs)
        self.tkg_batch_size = kwargs.get("batch_size", 1)
        for name in ("attn_tkg_nki_kernel_enabled", "attn_block_tkg_nki_kernel_enabled",
                     "enable_fused_speculation", "is_chunked_prefill"):
            self.__dict__.setdefault(name, False)
        self.__dict__.setdefault("chunked_prefill_config", None)
        self.__dict__.setdefault("on_device_sampling_config", None)
        if isinstance(self.on_device_sampling_config, dict):   # as NxDI reads it back
            self.on_device_sampling_config = OnDeviceSamplingConfig(
                **{k: v for k, v in self.on_device_sampling_config.items()
                   if k != "global_topk"})


class OnDeviceSamplingConfig(SimpleNamespace):
    def __init__(self, **kwargs):
        super().__init__(global_topk=256, **kwargs)


class InferenceConfig:
    def __init__(self, neuron_config, load_config=None, **kwargs):
        self.neuron_config = neuron_config
        if load_config is not None:
            load_config(self)

    def to_json_string(self) -> str:
        return json.dumps(self.neuron_config.__dict__, sort_keys=True, default=str)


def load_pretrained_config(model_path):
    def load(config):
        for key, value in json.loads((Path(model_path) / "config.json").read_text()).items():
            setattr(config, key, value)
    return load


class FakeNxDIModel:
    """NxDI's causal-LM application, as the plugin's loader and runner drive it."""

    @classmethod
    def get_neuron_config_cls(cls):
        return NeuronConfig

    @classmethod
    def get_config_cls(cls):
        return InferenceConfig

    def __init__(self, model_path, config=None):
        self.model_path, self.config = str(model_path), config
        self.kv: dict[int, list[int]] = {}
        self.blocks: dict[int, int] = {}    # block layout: slot (block id x size + offset)

    def compile(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "fake-compiled.json").write_text(json.dumps(
            {"model_path": self.model_path, "neuron_config": self.config.neuron_config.__dict__},
            default=vars))
        CAPTURED["compiled"].append(str(path))

    def load(self, path):
        marker = Path(path) / "fake-compiled.json"
        if not marker.exists():
            raise FileNotFoundError(f"no compiled artifacts in {path}")
        if self.config is None:   # loading what an earlier process compiled
            saved = json.loads(marker.read_text())
            self.config = InferenceConfig(NeuronConfig(**saved["neuron_config"]),
                                          load_pretrained_config(saved["model_path"]))
        CAPTURED["loaded"].append(str(path))

    def __call__(self, input_ids, attention_mask=None, seq_ids=None, block_table=None,
                 position_ids=None, **kwargs):
        nc = self.config.neuron_config
        vocab = self.config.vocab_size
        slots = [int(s) for s in seq_ids.flatten()]
        assert all(0 <= s < nc.batch_size for s in slots), (slots, nc.batch_size)
        if block_table is not None and block_table.numel():
            assert int(block_table.max()) < nc.pa_num_blocks, "block id past the compiled cache"
        batch, width = input_ids.shape
        prefill = width > 1 or int(position_ids.max()) == 0
        tokens: list[int] = []
        if getattr(nc, "is_block_kv_layout", False):
            tokens = self._block_layout(nc, prefill, input_ids, position_ids, slots,
                                        block_table, kwargs)
        elif prefill:
            # Context encoding is compiled for one request a step (ctx_batch_size 1).
            assert batch == nc.ctx_batch_size == 1, (batch, nc.ctx_batch_size)
            lengths = [int(n) for n in kwargs["full_context_lens"].flatten()]
            prompt = [int(t) for t in input_ids[0, :lengths[0]]]
            self.kv[slots[0]] = list(prompt)
            tokens.append(next_token(prompt, vocab))
            CALLS.append({"phase": "prefill", "slots": slots, "num_tokens": lengths[0],
                          "padded": _smallest_at_least(lengths[0],
                                                       nc.context_encoding_buckets),
                          "batch": 1, "padded_batch": 1, "attended": None})
        else:
            positions = [int(p) for p in position_ids[:, 0]]
            for slot, position, token in zip(slots, positions, input_ids[:, 0]):
                held = self.kv[slot]
                # The token written at `position` follows exactly what the slot holds.
                assert position == len(held), (slot, position, len(held))
                assert position < nc.seq_len, (position, nc.seq_len)
                held.append(int(token))
                tokens.append(next_token(held, vocab))
            CALLS.append({"phase": "decode", "slots": slots, "num_tokens": batch,
                          "padded": None, "batch": batch, "padded_batch": nc.batch_size,
                          "attended": _smallest_at_least(max(positions) + 1,
                                                         nc.token_generation_buckets)})
        return self._sampled(nc, tokens, batch, width, vocab)

    def _block_layout(self, nc, prefill, input_ids, position_ids, slots, block_table,
                      kwargs) -> list[int]:
        """NxDI's block layout with prefix caching: KV by block id and offset."""
        from neuron_batch.runtimes.prefix_grid import grid_cell

        size, vocab = nc.pa_block_size, self.config.vocab_size
        mapping = kwargs["slot_mapping"]

        def slot_of(table, position):
            return int(table[position // size]) * size + position % size

        def read(table, length):
            return [self.blocks.get(slot_of(table, p), UNWRITTEN) for p in range(length)]

        def write(slot, token):
            assert slot != -1 and slot // size != 0, f"write to slot {slot}"  # -1, null block
            self.blocks[slot] = token

        if prefill:
            assert input_ids.shape[0] == nc.ctx_batch_size == 1
            length = int(kwargs["full_context_lens"].flatten()[0])
            cached = int(kwargs["computed_context_lens"].flatten()[0])
            prompt = [int(t) for t in input_ids[0, :length]]
            table, new_slots = block_table[0], [int(s) for s in mapping[0]]
            context = read(table, cached)          # the prefix: from the cache, never the prompt
            for i, position in enumerate(range(cached, length)):
                assert new_slots[i] == slot_of(table, position), (position, new_slots[i])
                write(new_slots[i], prompt[position])
            assert all(s == -1 for s in new_slots[length - cached:]), "padding slot written"
            cell = grid_cell(length - cached, cached, nc.context_encoding_buckets,
                             nc.prefix_buckets)
            CALLS.append({"phase": "prefill", "slots": slots, "num_tokens": length - cached,
                          "cached": cached, "prompt_len": length,
                          "unwritten": context.count(UNWRITTEN), "padded": cell.prefill_bucket,
                          "prefix_bucket": cell.prefix_bucket, "recomputed": cell.recomputed,
                          "batch": 1, "padded_batch": 1, "attended": None})
            return [next_token(context + prompt[cached:], vocab)]
        tokens, positions = [], [int(p) for p in position_ids[:, 0]]
        for row, (position, token) in enumerate(zip(positions, input_ids[:, 0])):
            assert position < nc.seq_len, (position, nc.seq_len)
            assert int(mapping[row][0]) == slot_of(block_table[row], position)
            context = read(block_table[row], position) + [int(token)]
            write(int(mapping[row][0]), int(token))
            tokens.append(next_token(context, vocab))
        CALLS.append({"phase": "decode", "slots": slots, "num_tokens": len(positions),
                      "padded": None, "batch": len(positions), "padded_batch": nc.batch_size,
                      "attended": _smallest_at_least(max(positions) + 1,
                                                     nc.token_generation_buckets)})
        return tokens

    @staticmethod
    def _sampled(nc, tokens, batch, width, vocab):
        if nc.on_device_sampling_config:
            return SimpleNamespace(hidden_states=torch.tensor(tokens, dtype=torch.long))
        logits = torch.zeros(batch, width, vocab)
        for row, token in enumerate(tokens):
            logits[row, -1] = logits_for(token, vocab)
        return SimpleNamespace(logits=logits)


def prepare_sampling_params(batch_size, top_k, top_p, temperature):
    return torch.tensor([[k, p, t] for k, p, t in zip(top_k, top_p, temperature)],
                        dtype=torch.float32).reshape(batch_size, 3)


def install() -> None:
    """Put the fake NxDI package into sys.modules (before the plugin's worker imports it)."""
    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules[name] = mod
        return mod

    root = "neuronx_distributed_inference"
    module(root, __path__=[])
    module(f"{root}.models", __path__=[])
    module(f"{root}.models.config", NeuronConfig=NeuronConfig, InferenceConfig=InferenceConfig,
           OnDeviceSamplingConfig=OnDeviceSamplingConfig, ChunkedPrefillConfig=SimpleNamespace,
           FusedSpecNeuronConfig=SimpleNamespace)
    module(f"{root}.modules", __path__=[])
    module(f"{root}.modules.lora_serving", LoraServingConfig=SimpleNamespace)
    module(f"{root}.modules.generation", __path__=[])
    module(f"{root}.modules.generation.sampling",
           prepare_sampling_params=prepare_sampling_params)
    module(f"{root}.modules.padding", pad_tensor=lambda *a, **k: (_ for _ in ()).throw(
        NotImplementedError("multimodal padding is not faked")))
    module(f"{root}.utils", __path__=[])
    module(f"{root}.utils.constants", MODEL_TYPES={"llama": {"causal-lm": FakeNxDIModel}})
    module(f"{root}.utils.hf_adapter", load_pretrained_config=load_pretrained_config)


def fake_neuron_devices() -> None:
    """The plugin registers its platform only where /dev/neuron* exists: say it does."""
    import vllm_neuron

    vllm_neuron._is_neuron_dev = lambda: True
