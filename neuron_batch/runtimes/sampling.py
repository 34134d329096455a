"""Where a Neuron runtime samples a token, and what a request asks of that sampler.

A request reaches the engine as vLLM's own `SamplingParams` (the job's fields are mapped to it
once, in inputs/). This module reads what the sampler must do from those parameters, duck-typed
(no vLLM import), and says per runtime whether the device's own sampler can do it or the
logits must come to the host (sources: ../shared/notes/neuron-runtimes.md, "What a request may
ask for, per path", and the vendored plugin's source):

- NxDI line (inf2/trn1; vllm-neuron 0.2.0): on-device sampling takes only top_k, top_p and
  temperature, gathered in the runner's request-table order (`get_nxd_sampling_params`); its
  runner has no grammar bitmask and returns no logprobs from the device. With
  `on_device_sampling_config: None` the model returns fp32 logits (NxDI `NeuronBaseModel.forward`:
  `logits.float()`) and the runner's `_sample` hands them to vLLM's CPU sampler with each
  request's own metadata: the one place structured outputs (our bitmask, engine/nxdi_runner.py),
  logprobs, penalties, min_p and logit_bias can be honoured. It is one switch for the whole
  compiled model, so it is decided from the job before the engine is built. 0.1.0 has no CPU
  sampler (its `NeuronCausalLM.sample` raises "CPU sampler not implemented", its runner returns
  `logprobs=None`).
- vLLM Neuron Beta/GA (trn2/trn3): structured outputs on the device, the bitmask threaded into
  the forward as `logit_mask`, about 0.4 ms a token (scheduler 0.12 ms + runner 0.24 ms), one
  more graph (~8.4 s to compile) when the first constrained request arrives
  (`vllm-neuron/docs/design/vllm/structured-outputs-and-tool-calling.md`).

`n` never needs the host: vLLM's front end fans a request out into `n` child requests (each
`n=1`), which the device runs as `n` sequences whose prompt KV prefix caching shares.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

#: Where a release keeps its structured-output parameters on SamplingParams (0.11 and later;
#: 0.10.2 `guided_decoding`).
STRUCTURED_FIELDS = ("structured_outputs", "guided_decoding")
#: Per-request sampling parameters the on-device sampler takes (runner get_nxd_sampling_params).
DEVICE_PARAMS = ("temperature", "top_p", "top_k")
#: SamplingParams fields, with their no-op value, that only a host sampler applies.
HOST_ONLY_DEFAULTS = (("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                      ("repetition_penalty", 1.0), ("min_p", 0.0), ("logit_bias", None),
                      ("allowed_token_ids", None), ("bad_words", None))
#: `additional_config["neuron_batch"]` key: this engine's device samples on the host.
HOST_SAMPLING_KEY = "host_sampling"
#: `SamplingParams.extra_args` key: what a request asked that the simulated device charges but
#: does not compute (it has no tokenizer for a grammar and returns filler tokens, so the
#: fields themselves are taken off: device/sampling_cost.py `for_simulated`).
SIM_ASKS_KEY = "neuron_batch_asks"
#: What a request asks for, by name (records, reports, refusals).
CONSTRAINED, LOGPROBS = "structured outputs", "logprobs"


@dataclass(frozen=True)
class SamplerAsks:
    """What one request's SamplingParams ask of the sampler."""

    constrained: bool               # a grammar (json, regex, choice, grammar): a bitmask
    logprobs: bool                  # logprobs or prompt_logprobs
    prompt_logprobs: bool           # prompt_logprobs (the NxDI plugin never returns them)
    n: int                          # sequences sampled for it
    host_only: tuple[str, ...]      # other fields only a host sampler applies
    device_params: tuple            # (temperature, top_p, top_k): what the device sampler takes


def structured_of(params) -> object | None:
    """The request's structured-output parameters (either release's field), None if none."""
    for name in STRUCTURED_FIELDS:
        value = getattr(params, name, None)
        if value is not None:
            return value
    return None


def sampler_asks(params) -> SamplerAsks:
    """Read one request's SamplingParams (or an object with the same attribute names), and
    what the simulated device was told it asked (`SIM_ASKS_KEY`)."""
    host_only = tuple(name for name, default in HOST_ONLY_DEFAULTS
                      if getattr(params, name, default) not in (default, [], {}))
    told = (getattr(params, "extra_args", None) or {}).get(SIM_ASKS_KEY) or {}
    logprobs = (getattr(params, "logprobs", None) is not None
                or getattr(params, "prompt_logprobs", None) is not None
                or bool(told.get("logprobs")))
    device = tuple(float(getattr(params, k, 1.0) or 0.0) for k in DEVICE_PARAMS)
    if device[0] == 0.0:        # greedy: the runner makes it top_k 1 whatever else is set
        device = (0.0,)
    return SamplerAsks(constrained=structured_of(params) is not None
                       or bool(told.get("constrained")), logprobs=logprobs,
                       prompt_logprobs=getattr(params, "prompt_logprobs", None) is not None,
                       n=int(getattr(params, "n", 1) or 1), host_only=host_only,
                       device_params=device)


def sample_parent(req_id: str) -> str | None:
    """The request a child request of `n > 1` was fanned out of, by vLLM's child id
    (`"{index}_{parent}"`, v1/engine/parallel_sampling.py `get_child_info`); None otherwise. A
    plain id of that shape reads as a child too: a parent counts as sampled `n` times only
    when two of its children arrive."""
    index, sep, parent = req_id.partition("_")
    return parent if sep and index.isdigit() and parent else None


@dataclass(frozen=True)
class JobSampling:
    """What a job's requests ask of the sampler, counted before the engine is built."""

    num_requests: int = 0
    constrained_requests: int = 0
    n_sampled_requests: int = 0     # n > 1
    logprob_requests: int = 0
    prompt_logprob_requests: int = 0
    host_only: tuple[str, ...] = ()  # fields some request sets that only a host sampler applies
    #: Requests differ in temperature, top_p or top_k: on-device sampling would give one
    #: request's parameters to another.
    mixed: bool = False
    #: Requests that are embeddings (`embed` in their spec: inputs/embeddings_body.py): the
    #: engine then runs vLLM's pooling runner (a run is one kind: job/request_spec.py).
    embed_requests: int = 0
    #: Chat requests giving tools (inputs/tool_calls.py): the engine reads their tool calls.
    tool_requests: int = 0

    def host_reasons(self, device_structured: bool = False) -> list[str]:
        """Why this job needs the host's sampler where the device samples with
        `device_structured` (can the device apply a grammar bitmask?), in words."""
        reasons = []
        if self.constrained_requests and not device_structured:
            reasons.append(f"{self.constrained_requests} request(s) ask for {CONSTRAINED}")
        if self.logprob_requests:
            reasons.append(f"{self.logprob_requests} request(s) ask for {LOGPROBS}")
        if self.host_only:
            reasons.append(f"requests set {', '.join(self.host_only)}")
        if self.mixed:
            reasons.append("requests sample with different temperatures, top_p or top_k")
        return reasons

    def counts(self) -> dict[str, int]:
        return {"constrained_requests": self.constrained_requests,
                "n_sampled_requests": self.n_sampled_requests,
                "logprob_requests": self.logprob_requests}


def job_sampling(all_params: Iterable) -> JobSampling:
    """Count what every request's SamplingParams ask (one pass)."""
    tally = SamplingTally()
    for params in all_params:
        tally.add(params)
    return tally.result()


class SamplingTally:
    """`job_sampling` a request at a time (for a pass over the job that does more besides)."""

    #: Distinct keys `add_keyed` remembers (a job whose every request asks its own
    #: temperature is read request by request past them).
    KEYS = 4096

    def __init__(self) -> None:
        self.num = self.constrained = self.n_sampled = self.logprob = 0
        self.prompt_logprob = self.embed = self.tools = 0
        self.host_only: set[str] = set()
        self.device: set[tuple] = set()
        self._read_for: dict[Hashable, tuple[bool, SamplerAsks | None]] = {}

    def add(self, params) -> None:
        self._count(*self._read(params))

    def add_keyed(self, key: Hashable, make: Callable[[], Any], times: int = 1) -> None:
        """`add(make())` (`times` over), where requests with equal `key` ask the same of the
        sampler: read once per key (a job's requests mostly differ in what no sampler reads:
        at 10M requests, reading each was seconds of the pass before the first step)."""
        read = self._read_for.get(key)
        if read is None:
            read = self._read(make())
            if len(self._read_for) < self.KEYS:
                self._read_for[key] = read
        self._count(*read, times)

    @staticmethod
    def _read(params) -> tuple[bool, SamplerAsks | None]:
        """(whether it names tools, what it asks of the sampler; None: an embedding request,
        pooled, not sampled)."""
        if getattr(params, "embed", None) is not None:
            return False, None
        return getattr(params, "tools", None) is not None, sampler_asks(params)

    def _count(self, tools: bool, asks: SamplerAsks | None, times: int = 1) -> None:
        self.num += times
        if asks is None:
            self.embed += times
            return
        self.tools += tools * times
        self.constrained += asks.constrained * times
        self.n_sampled += (asks.n > 1) * times
        self.logprob += asks.logprobs * times
        self.prompt_logprob += asks.prompt_logprobs * times
        self.host_only.update(asks.host_only)
        self.device.add(asks.device_params)

    def merge(self, other: SamplingTally) -> None:
        """`other`'s requests counted here too."""
        for name in ("num", "constrained", "n_sampled", "logprob", "prompt_logprob", "embed",
                     "tools"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.host_only |= other.host_only
        self.device |= other.device

    def result(self) -> JobSampling:
        return JobSampling(self.num, self.constrained, self.n_sampled, self.logprob,
                           self.prompt_logprob,
                           tuple(name for name, _ in HOST_ONLY_DEFAULTS
                                 if name in self.host_only),
                           mixed=len(self.device) > 1, embed_requests=self.embed,
                           tool_requests=self.tools)


@dataclass(frozen=True)
class SamplingPath:
    """How one runtime's plugin samples (`Runtime.sampling`)."""

    #: The device applies a grammar bitmask itself (Beta/GA: `logit_mask` in the forward).
    device_structured: bool
    #: Keys of the plugin's config section that move sampling to the host (NxDI line:
    #: `on_device_sampling_config: None`); None: the plugin has no such switch.
    host_config: tuple[tuple[str, object], ...] | None = None
    #: Seconds a constrained token costs on the device (Beta/GA: ~0.4 ms, published).
    device_mask_s_per_token: float = 0.0
    #: The plugin returns prompt logprobs (the NxDI runner's `prompt_logprobs_dict` is always
    #: empty; the Beta/GA plugin's: not documented, not refused).
    prompt_logprobs: bool = True
    #: Graphs compiled more for the first constrained request, and their compile seconds.
    structured_graphs: int = 0
    structured_compile_s: float = 0.0

    def host_reasons(self, job: JobSampling) -> list[str]:
        """Why `job` must sample on the host under this runtime (empty: on the device)."""
        if self.host_config is None:
            return []
        return job.host_reasons(self.device_structured)


#: The NxDI line: sampling moves to the host for the whole model (sources: module docstring).
NXDI_SAMPLING = SamplingPath(device_structured=False,
                             host_config=(("on_device_sampling_config", None),),
                             prompt_logprobs=False)
#: optimum-neuron 0.4.5: no grammar bitmask, no logprobs returned (its runner's
#: ModelRunnerOutput has `logprobs=None`), and no config switch: whether its CPU sampler runs is
#: fixed by the export (`on_device_sampling`). What it cannot do is refused before the run
#: (inputs/request_paths.py), so nothing here moves to the host.
OPTIMUM_SAMPLING = SamplingPath(device_structured=False, prompt_logprobs=False)
#: vLLM Neuron Beta/GA: structured outputs on the device (published figures: module docstring).
DEVICE_SAMPLING = SamplingPath(device_structured=True, device_mask_s_per_token=0.4e-3,
                               structured_graphs=1, structured_compile_s=8.4)
