"""Build vLLM's engine with the Neuron scheduler for a device, and stream finished requests.

The only module besides the scheduler and the simulated device that imports vLLM (lazily, so
`neuron-batch --help` stays fast). Every device runs the same engine path: LLM -> engine core
-> NeuronScheduler -> an executor (vLLM's own on cpu/cuda/neuron, the simulated Neuron device
for `sim`).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_batch.device.target import TARGET_KEY
from neuron_batch.inputs.tool_calls import parser_for
from neuron_batch.runtimes.sampling import HOST_SAMPLING_KEY
from neuron_batch.scheduler import SCHEDULER_CLS
from neuron_batch.scheduler.kv_reserve import parse_kv_reserve
from neuron_batch.settings import RunSettings, SettingsError
from neuron_batch.versions import (
    installed_vllm_version,
    neuron_plugin_missing_message,
    untested_warning,
)

if TYPE_CHECKING:
    from neuron_batch.device.target import Target
    from neuron_batch.runtimes.sampling import JobSampling

CPU_KV_CACHE_BYTES = 2 << 30

_warned_versions: set[str] = set()


def warn_if_untested_vllm(emit=None) -> str | None:
    """Warn once per process (per version) when the installed vLLM is not a tested release
    (`neuron_batch.versions.TESTED_VLLM`); the message names the tested ones. Reads package
    metadata only. Returns the message when it warned."""
    version = installed_vllm_version()
    message = untested_warning(version)
    if message is None or version in _warned_versions:
        return None
    assert version is not None      # (untested_warning has no message for no version)
    _warned_versions.add(version)
    (emit or _to_stderr)(message)
    return message


def _to_stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


class UntestedVllmWarning(UserWarning):
    """The installed vLLM is not a release neuron-batch is tested on."""


def _as_warning(message: str) -> None:
    warnings.warn(message, UntestedVllmWarning, stacklevel=3)


def check_device_available(device: str) -> None:
    """SettingsError, before anything loads, when the device cannot work on this host
    (`--device neuron` without AWS's Neuron plugin)."""
    if device == "neuron":
        message = neuron_plugin_missing_message()
        if message is not None:
            raise SettingsError(message)


@dataclass
class Finished:
    """One finished request as the engine reports it."""

    request_id: str
    token_ids: list[int]
    text: str | None
    finish_reason: str | None
    num_prompt_tokens: int
    stop_reason: str | int | None = None   # with finish_reason "error": why (e.g. too big)
    # Every completion as plain data (engine/sampling_params.py plain_choices) where a request asked
    # for n > 1 or logprobs; None: the fields above are its one completion.
    choices: list[dict[str, Any]] | None = None
    num_cached_tokens: int = 0      # the prompt's tokens vLLM's prefix cache held
    embedding: list[float] | None = None    # an embeddings request's vector (no tokens made)
    tool_calls: list[dict[str, Any]] | None = None   # a tools request's calls, read from it


def detect_device() -> str:
    """What vLLM's platform found: 'cpu', 'cuda' or 'neuron'. The NxDI plugin's platform says
    device_type "cpu", so Neuron is recognised by the platform's class and module."""
    from vllm.platforms import current_platform

    from neuron_batch.engine.neuron_host import is_neuron_platform

    device = getattr(current_platform, "device_type", "") or "cpu"
    cls = type(current_platform)
    if is_neuron_platform(cls.__name__, cls.__module__, device):
        return "neuron"
    return device


#: vLLM's own KV block size where a run sets none and its device has no Target: 128 on the
#: CPU (vllm/platforms/cpu.py `check_and_update_config`), CacheConfig.DEFAULT_BLOCK_SIZE (16)
#: on a GPU. The engine is given it (engine_kwargs), so what the run reasons with is what runs.
VLLM_BLOCK_SIZE = {"cpu": 128, "cuda": 16}


def run_block_size(settings: RunSettings, target: Target | None, device: str | None = None
                   ) -> int:
    """THE KV block size of a run's engine: --block-size, else its device's (the Target's:
    the simulated device, a known Neuron host), else vLLM's own on `device` (default: the
    run's; `auto` and an unknown Neuron host: the prefix trie's finest, 32). What the
    prefix-caching decision, --order prefix, the verdict and the report's prefix bound read."""
    from neuron_batch.inputs.shared_prefix import DEFAULT_BLOCK

    if settings.block_size:
        return int(settings.block_size)
    if target is not None:
        return int(target.block_size)
    return VLLM_BLOCK_SIZE.get(device or str(settings.device), DEFAULT_BLOCK)


def engine_kwargs(settings: RunSettings, device: str, model_path: str, records_path: Path,
                  workdir: Path, has_tokenizer: bool,
                  target: Target | None = None, sampling: JobSampling | None = None,
                  tokenizer: str | None = None, batch_arrival: bool = False
                  ) -> dict[str, Any]:
    """Keyword arguments for vllm.LLM for this run and device (`target`: the run's device,
    resolved once by the runner (job.resolve_target); required when device is "sim", where
    it is the simulated one; `sampling`: what the job's requests ask of the sampler, which
    decides whether a Neuron device samples on the host; `tokenizer`: the tokenizer the
    simulated device detokenizes its tokens with, where a request asks for stop strings, which
    vLLM matches in the text; `batch_arrival`: the requests are one batch job fed as the
    scheduler drains, recorded as arriving together: scheduler/neuron.py
    BATCH_ARRIVAL_KEY). On Neuron,
    `additional_config["neuron_batch"]["process_env"]` is environment `Engine` sets before
    vLLM starts."""
    runtime = target.runtime if target is not None else settings.resolve_runtime()
    simulated = target is not None and target.simulated
    if settings.simulated and not simulated:
        raise ValueError("device 'sim' needs the resolved simulated Target")
    neuron_batch = _neuron_batch_section(settings, runtime, records_path, sampling,
                                         batch_arrival)
    kwargs: dict[str, Any] = dict(
        model=model_path,
        max_model_len=settings.max_model_len,
        max_num_seqs=settings.max_num_seqs,
        **runtime.engine_limits(max_model_len=settings.max_model_len,
                                max_num_seqs=settings.max_num_seqs,
                                max_num_batched_tokens=settings.max_num_batched_tokens),
        scheduler_cls=SCHEDULER_CLS,
        seed=settings.seed,
        skip_tokenizer_init=not has_tokenizer,
    )
    kwargs.update(_tools_and_pooling(settings, model_path, sampling, neuron_batch))
    if simulated:
        assert target is not None   # (simulated: there is one)
        kwargs.update(_sim_kwargs(settings, target, workdir, tokenizer, neuron_batch))
    else:
        kwargs.update(_vllm_kwargs(settings, device, model_path))
    if settings.block_size is not None or (not simulated and device in VLLM_BLOCK_SIZE):
        kwargs["block_size"] = run_block_size(settings, None, device)
    # The bucket lists go where the runtime's plugin reads them (the scheduler reads them
    # there too).
    section: dict[str, Any] = settings.bucket_lists()
    if device == "neuron":
        section = _neuron_host_kwargs(settings, runtime, model_path, sampling, kwargs,
                                      neuron_batch)
    kwargs["additional_config"] = {runtime.config_section: section,
                                   "neuron_batch": neuron_batch}
    return kwargs


def _neuron_batch_section(settings: RunSettings, runtime, records_path: Path,
                          sampling: JobSampling | None, batch_arrival: bool) -> dict[str, Any]:
    """What our scheduler and executor read from vLLM's `additional_config["neuron_batch"]`:
    where the records go, the KV rule, the runtime, batch arrival, host sampling."""
    section: dict[str, Any] = {"records_path": str(records_path),
                               # (vLLM's config: plain data)
                               "kv_reserve": parse_kv_reserve(settings.kv_reserve).value,
                               "runtime": runtime.name}
    if batch_arrival:
        section["batch_arrival"] = True
    if sampling is not None and runtime.sampling.host_reasons(sampling):
        # The whole model samples on the host (the simulated device charges it per step).
        section[HOST_SAMPLING_KEY] = True
    return section


def _tools_and_pooling(settings: RunSettings, model_path: str, sampling: JobSampling | None,
                       neuron_batch: dict[str, Any]) -> dict[str, Any]:
    """What the job's kind of request asks of the engine: the tool-call parser that reads chat
    lines' tool calls (engine/tool_calls.py; lines with tools and no parser were refused
    before: job/request_spec.py tool_problems), set in `neuron_batch`; for embeddings, vLLM's
    pooling runner (a generation model converted to embed, as vLLM does for `--runner
    pooling`; a run is all embeddings or none: job/request_spec.py one_kind; only vLLM's own
    engine runs them: inputs/request_paths.py)."""
    if settings.tool_call_parser is not None:
        from neuron_batch.engine.tool_calls import known_parsers

        if settings.tool_call_parser not in known_parsers():
            raise SettingsError(f"--tool-call-parser {settings.tool_call_parser}: not one of "
                                f"vLLM's tool-call parsers ({', '.join(known_parsers())})")
    parser = parser_for(settings.tool_call_parser, model_path)
    if parser is not None and sampling is not None and sampling.tool_requests:
        neuron_batch["tool_call_parser"] = parser
    if sampling is not None and sampling.embed_requests:
        return {"runner": "pooling"}
    return {}


def _sim_kwargs(settings: RunSettings, target: Target, workdir: Path, tokenizer: str | None,
                neuron_batch: dict[str, Any]) -> dict[str, Any]:
    """The simulated device's engine arguments (its layout is the run's: the target was
    resolved with these settings' limits); its part of our section goes into `neuron_batch`."""
    kwargs = target.engine_kwargs(max_num_batched_tokens=settings.max_num_batched_tokens,
                                  workdir=workdir)
    neuron_batch.update(kwargs.pop("additional_config", {}).get("neuron_batch", {}))
    kwargs["skip_tokenizer_init"] = tokenizer is None
    if tokenizer is not None:
        kwargs["tokenizer"] = tokenizer
    return kwargs


def _vllm_kwargs(settings: RunSettings, device: str, model_path: str) -> dict[str, Any]:
    """vLLM's own engine (and a Neuron host's before its plugin's own): prefix caching, the
    CPU's eager float32 and fixed KV cache, no weight-loading bar, dummy weights."""
    # vLLM's prefix cache, on by default as vLLM has it (the simulated device sets its own;
    # a Neuron host's contiguous KV turns it off: engine/neuron_host.py).
    kwargs: dict[str, Any] = {"enable_prefix_caching": bool(settings.prefix_caching)}
    if device == "cpu":
        kwargs.update(enforce_eager=True, dtype="float32")
        if "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
            # vLLM's CPU default reserves 92% of the machine's memory and refuses to start
            # when other processes hold some; a fixed KV cache starts anywhere.
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
    # vLLM's weight-loading bar writes to sys.stderr, which is our terminal (the rest of its
    # output goes to engine.log): our own progress bar is the one to show.
    kwargs["use_tqdm_on_load"] = False
    if _has_no_weights(model_path):
        # A directory with only a config.json: random weights, for trying the pipeline and
        # for tests (the output is noise, the scheduling is real).
        kwargs["load_format"] = "dummy"
    return kwargs


def _neuron_host_kwargs(settings: RunSettings, runtime, model_path: str,
                        sampling: JobSampling | None, kwargs: dict[str, Any],
                        neuron_batch: dict[str, Any]) -> dict[str, Any]:
    """Everything AWS's plugin needs for our scheduler to run with the shapes it records
    (neuron_host.py says why each setting): all bucket lists, the KV layout, TP, sampling,
    the plugin's switches and the compiled-artifacts folder, into `kwargs` and
    `neuron_batch`; returns the plugin's config section."""
    check_device_available("neuron")
    from neuron_batch.engine.neuron_host import installed_host_setup

    setup = installed_host_setup(settings, runtime, model_path, sampling=sampling)
    kwargs.update(setup.kwargs)
    neuron_batch["process_env"] = setup.env
    if setup.export is not None:    # (the start-up says where its graphs come from)
        neuron_batch["export"] = setup.export.describe()
    return setup.section


def _has_no_weights(model_path: str) -> bool:
    path = Path(model_path)
    if not path.is_dir():
        return False
    return not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")) and not any(
        path.glob("*.pt"))


class RequestRefused(ValueError):
    """vLLM refused one request's parameters when it was added (nothing of it ran)."""


def _is_request_error(error: Exception) -> bool:
    # ValueError on every release; vLLM 0.32 also has VLLMValidationError, outside it.
    return isinstance(error, (ValueError, TypeError)) or type(error).__name__.endswith(
        "ValidationError")


class Engine:
    """A vLLM engine fed request by request, yielding requests as they finish."""

    def __init__(self, kwargs: dict[str, Any], *, verbose: bool = False, quiet: bool = False):
        # The engine core runs in this process: the scheduler's records, signals and the
        # simulated device's clock all stay in one place.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # An untested vLLM: said on the terminal; under --quiet (nothing printed on success) as
        # a Python warning, which the run's engine.log collects.
        warn_if_untested_vllm(_as_warning if quiet else None)
        if not verbose:
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", category=DeprecationWarning)
        # Set before vLLM starts, so its platform and every process it starts see it (the
        # Neuron plugin reads its switches when the config is built; see neuron_host.py).
        own = (kwargs.get("additional_config") or {}).get("neuron_batch") or {}
        os.environ.update(own.get("process_env") or {})
        from vllm import LLM

        self.llm = LLM(**kwargs)
        self.engine = self.llm.llm_engine
        self._detokenize = not kwargs.get("skip_tokenizer_init", False)
        self._full: dict[str, int | None] = {}  # request id -> its top logprobs, for those
                                                # whose every completion is kept
        # Tools requests: the parser that reads their calls (engine_kwargs named it).
        self._tool_reader: Any = None
        self._tools: dict[str, dict[str, Any]] = {}   # request id -> the tools it gave
        if own.get("tool_call_parser"):
            from neuron_batch.engine.tool_calls import ToolCallReader

            self._tool_reader = ToolCallReader(own["tool_call_parser"], self.llm.get_tokenizer(),
                                               self.engine.model_config)
        # The simulated device charges structured outputs and logprobs but computes neither
        # (device/sampling_cost.py): what it is given is said, not asked.
        self._device_params = None
        if own.get(TARGET_KEY) is not None:
            from neuron_batch.device.sampling_cost import for_simulated

            self._device_params = for_simulated

    def add(self, request_id: str, prompt_token_ids: list[int], spec: dict[str, Any]) -> None:
        """Submit one request: `spec` is what it asks for (inputs.request_fields.sampling_spec),
        made into SamplingParams in engine/sampling_params.py, the one place."""
        from neuron_batch.engine.sampling_params import pooling_params, sampling_params

        tools = spec.get("tools")
        try:
            if tools is not None:
                spec = self._with_tools(spec, tools)
            if "embed" in spec:
                params = pooling_params(spec["embed"])
            else:
                params = sampling_params(spec, detokenize=self._detokenize)
            if self._device_params is not None:
                params = self._device_params(params)
            self.engine.add_request(request_id, {"prompt_token_ids": prompt_token_ids}, params)
        except Exception as error:  # vLLM's own checks of a request (its errors are not one
            if not _is_request_error(error):  # class across releases)
                raise
            raise RequestRefused(str(error)) from error
        if spec.get("n", 1) > 1 or spec.get("logprobs") is not None:
            self._full[request_id] = spec.get("logprobs")
        if tools is not None:
            self._tools[request_id] = tools

    def _with_tools(self, spec: dict[str, Any], tools: dict[str, Any]) -> dict[str, Any]:
        """`spec` without its tools, with what vLLM's server would set for them: the format
        the parser holds the calls to (structured output) and its say on special tokens
        (engine/tool_calls.py)."""
        if self._tool_reader is None:
            raise ValueError("tools need a tool-call parser (--tool-call-parser)")
        spec = {key: value for key, value in spec.items() if key != "tools"}
        spec.update(self._tool_reader.sampling(tools, spec.get("structured")))
        return spec

    def abort(self, request_ids: list[str]) -> None:
        if request_ids:
            self.engine.abort_request(request_ids)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished_requests()

    def step(self) -> Iterator[Finished]:
        for out in self.engine.step():
            if not out.finished:
                continue
            if not isinstance(out.outputs, list):     # a pooling request: its embedding
                yield Finished(request_id=out.request_id, token_ids=[], text=None,
                               finish_reason="stop",
                               num_prompt_tokens=len(out.prompt_token_ids or ()),
                               num_cached_tokens=out.num_cached_tokens or 0,
                               embedding=out.outputs.data.tolist())
                continue
            completion = out.outputs[0]
            choices = None
            if out.request_id in self._full:
                from neuron_batch.engine.sampling_params import plain_choices

                choices = plain_choices(out, self._detokenize, self._full.pop(out.request_id))
            done = Finished(
                request_id=out.request_id, token_ids=list(completion.token_ids),
                text=completion.text if self._detokenize else None,
                finish_reason=completion.finish_reason,
                num_prompt_tokens=len(out.prompt_token_ids or ()),
                stop_reason=completion.stop_reason, choices=choices,
                num_cached_tokens=out.num_cached_tokens or 0)
            tools = self._tools.pop(out.request_id, None)
            if tools is not None and done.finish_reason != "error":
                self._read_tool_calls(done, tools)
            yield done

    def _read_tool_calls(self, done: Finished, tools: dict[str, Any]) -> None:
        """Each completion's tool calls, read by the run's parser (engine/tool_calls.py): its
        text becomes the message's content, the calls and finish reason as vLLM's server
        gives them."""
        reader = self._tool_reader
        done.text, done.tool_calls, done.finish_reason = reader.read(
            tools, done.text, done.token_ids, done.finish_reason)
        for choice in done.choices or ():
            choice["text"], choice["tool_calls"], choice["finish_reason"] = reader.read(
                tools, choice["text"], choice["token_ids"], choice["finish_reason"])

    def close(self) -> None:
        """Shut the engine core down so the scheduler flushes its records."""
        core = getattr(self.engine, "engine_core", None)
        try:
            if core is not None:
                core.shutdown()
        finally:
            self.llm = None
            self.engine = None
