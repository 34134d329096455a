"""optimum-neuron's export on a Neuron host: what a model's compiled graphs fix, where the
plugin finds them, and this run's settings checked against them before anything loads.

What the plugin does (optimum-neuron 0.4.5, `optimum/neuron/vllm/model_loader.py`
`OptimumNeuronModel.create`, read in ../shared/vendor/): a model folder with a
`neuron_config.json` is a local export and loads as it is; otherwise it looks for artifacts
of (model, max_num_seqs, max_model_len, TP, dtype) in Hugging Face's hub cache
(`select_hub_cached_entries`) and exports with them, and with none it compiles afresh only
when `model_loader_extra_config` is "allow_non_cached_model" (else it raises). An export's
`NxDNeuronConfig` (`models/inference/backend/config.py`) fixes `batch_size`,
`sequence_length`, `tp_degree`, `torch_dtype` and `max_context_length` (default: the
sequence length); continuous batching comes with batch sizes above 1
(`llama/modeling_llama.py` `_get_neuron_config`). It never compares a local export with
vLLM's settings: the runner sizes its slots from `max_num_seqs`, the token-generation graph
has `batch_size` of them, and the context-encoding wrapper crops or pads every prompt to
`max_context_length` (`decoder_wrappers.py`). So the checks are ours, before loading.

Pure Python: the hub-cache lookup imports optimum-neuron only where it is installed.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_batch.engine.nxdi_plugin import NeuronHostError
from neuron_batch.settings import RunSettings

EXPORT_FILE = "neuron_config.json"
LOCAL = "local export"
HUB = "hub cache"
FRESH = "compiled fresh"
#: What the plugin's loader needs to export a model the hub cache does not hold.
ALLOW_FRESH = "allow_non_cached_model"


@dataclass(frozen=True)
class Export:
    """The compiled shapes a run on optimum-neuron loads, and where they come from."""

    source: str                     # LOCAL, HUB or FRESH
    where: str                      # the export's folder, or the model exported
    batch_size: int
    sequence_length: int
    max_context_length: int
    tp_degree: int | None           # None: not fixed yet (a fresh export takes the run's)
    torch_dtype: str | None = None
    continuous_batching: bool = True
    on_device_sampling: bool = True

    @property
    def compiled(self) -> bool:
        """Whether the graphs exist before the run (else the start-up compiles both)."""
        return self.source != FRESH

    def shape_words(self) -> str:
        tp = f", TP {self.tp_degree}" if self.tp_degree else ""
        dtype = f", {self.torch_dtype}" if self.torch_dtype else ""
        return (f"batch size {self.batch_size}, sequence length {self.sequence_length}, "
                f"max context length {self.max_context_length}{tp}{dtype}")

    def words(self) -> str:
        """One line for the start-up and doctor."""
        if self.source == LOCAL:
            return f"local export at {self.where} ({self.shape_words()})"
        if self.source == HUB:
            return f"hub cache artifacts for {self.where} ({self.shape_words()})"
        return (f"no export of {self.where} for {self.shape_words()}: the start-up compiles "
                f"its two graphs (minutes)")

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "where": self.where, "batch_size": self.batch_size,
                "sequence_length": self.sequence_length,
                "max_context_length": self.max_context_length, "tp_degree": self.tp_degree,
                "torch_dtype": self.torch_dtype, "compiled": self.compiled,
                "words": self.words()}


def read_export(model_path: str | Path) -> Export | None:
    """The local export in `model_path` (its neuron_config.json), None when it has none;
    NeuronHostError naming the file and field for one that cannot be read."""
    path = Path(model_path) / EXPORT_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise NeuronHostError(f"{path}: not a JSON neuron config ({error})") from None
    if not isinstance(data, dict):
        raise NeuronHostError(f"{path}: a neuron config is a JSON object")

    def number(name: str, default: int | None = None) -> int:
        value = data.get(name)
        value = default if value is None else value     # (null: as missing)
        if value is None:
            raise NeuronHostError(f"{path}: field '{name}' is missing (an optimum-neuron "
                                  f"export has it)")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise NeuronHostError(f"{path}: field '{name}' must be a positive whole number, "
                                  f"got {value!r}")
        return value

    sequence_length = number("sequence_length")
    dtype = data.get("torch_dtype")
    return Export(LOCAL, str(Path(model_path)), number("batch_size"), sequence_length,
                  number("max_context_length", sequence_length),
                  number("tp_degree", 1), None if dtype is None else str(dtype),
                  bool(data.get("continuous_batching", False)),
                  bool(data.get("on_device_sampling", False)))


#: (model, batch_size, sequence_length, tp) -> the hub cache's matching entries, None when it
#: cannot be asked here.
HubLookup = Callable[[str, int, int, int | None], list[dict] | None]


@functools.cache
def ask_hub_cache(model: str, batch_size: int, sequence_length: int,
                  tp: int | None) -> list[dict] | None:
    """optimum-neuron's own selection of hub-cache entries (what its loader asks); None when
    optimum-neuron is not installed or the hub cannot be reached. Asked once a process per
    layout: it is a network call, and the settings check, the engine and the start-up ask."""
    try:
        from optimum.neuron.cache.hub_cache import select_hub_cached_entries
    except Exception:  # noqa: BLE001 - not installed, or its Neuron packages missing
        return None
    try:
        return list(select_hub_cached_entries(
            model, task="text-generation", batch_size=batch_size,
            sequence_length=sequence_length, tensor_parallel_size=tp,
            torch_dtype=_model_dtype(model)))
    except Exception:  # noqa: BLE001 - offline, no such model: the loader will say
        return None


def _model_dtype(model: str) -> str | None:
    """The dtype vLLM gives the plugin's loader for a model folder (its config.json's; vLLM's
    "auto"), which the loader's hub-cache selection also compares; None where unknown."""
    try:
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    dtype = config.get("torch_dtype") or config.get("dtype")
    return dtype if isinstance(dtype, str) else None


def find_export(settings: RunSettings, model_path: str,
                lookup: HubLookup = ask_hub_cache) -> Export:
    """Where the plugin's loader will find this run's graphs, in its own order: a local
    export, the hub cache's artifacts for the run's limits, else a fresh compile."""
    local = read_export(model_path)
    if local is not None:
        return local
    tp = settings.tensor_parallel_size
    seqs, length = settings.max_num_seqs, settings.max_model_len
    context = settings.max_context_length or length
    entries = lookup(model_path, seqs, length, tp)
    if entries:
        entry = entries[0]
        return Export(HUB, model_path, seqs, length, context,
                      entry.get("tp_degree", tp), entry.get("torch_dtype"), seqs > 1)
    return Export(FRESH, model_path, seqs, length, context, tp, None, seqs > 1)


def check_export(export: Export, settings: RunSettings) -> None:
    """NeuronHostError, before anything loads, when the run's settings differ from what the
    export compiled, naming the settings that would run it."""
    tp = settings.tensor_parallel_size
    wanted = {"--max-num-seqs": (settings.max_num_seqs, export.batch_size, "batch size"),
              "--max-model-len": (settings.max_model_len, export.sequence_length,
                                  "sequence length"),
              "--max-context-length": (settings.max_context_length, export.max_context_length,
                                       "max context length"),
              "--tensor-parallel-size": (tp, export.tp_degree, "TP")}
    wrong = {flag: v for flag, v in wanted.items()
             if v[0] is not None and v[1] is not None and v[0] != v[1]}
    if wrong:
        asked = ", ".join(f"{flag} {given}" for flag, (given, _, _) in wrong.items())
        fixed = ", ".join(f"{what} {have}" for _, have, what in wrong.values())
        would = [f"--max-num-seqs {export.batch_size}",
                 f"--max-model-len {export.sequence_length}"]
        if export.tp_degree:
            would.append(f"--tensor-parallel-size {export.tp_degree}")
        if settings.max_context_length is not None:
            would.append(f"--max-context-length {export.max_context_length}")
        raise NeuronHostError(
            f"--device neuron: the optimum-neuron {export.words()} fixes {fixed}; this run "
            f"asks {asked}. Run it with {' '.join(would)}, or export the model again for "
            f"these settings (optimum-cli export neuron --batch_size ... --sequence_length "
            f"...)")
    if export.batch_size > 1 and not export.continuous_batching:
        raise NeuronHostError(
            f"--device neuron: the optimum-neuron {export.words()} was exported without "
            f"continuous batching; its vLLM plugin runs only continuous-batching exports "
            f"(optimum/neuron/vllm/AGENTS.md). Export it again (batch sizes above 1 get it)")


def check_prompts(export: Export, requests: Sequence[Any], shown: int = 3) -> None:
    """NeuronHostError naming file, line and field of the prompts longer than the export's
    context-encoding graph (its wrapper would crop them to max_context_length)."""
    limit = export.max_context_length
    too_long = [r for r in requests if r.prompt_len > limit]
    if not too_long:
        return
    lines = []
    for request in too_long[:shown]:
        record = request.record
        field = f": field '{record.prompt_field}'" if record.prompt_field else ""
        lines.append(f"{record.source}{field}: {request.prompt_len:,} prompt tokens")
    more = f" (and {len(too_long) - shown} more)" if len(too_long) > shown else ""
    longest = max(r.prompt_len for r in too_long)
    raise NeuronHostError(
        f"--device neuron: {len(too_long)} prompt(s) longer than the optimum-neuron export's "
        f"max context length {limit:,} (its one context-encoding graph would crop them): "
        f"{'; '.join(lines)}{more}. Shorten or drop them, or export with a max context "
        f"length of {longest:,} or more (and a sequence length above it)")
