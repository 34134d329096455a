"""Which path honours what a request asks for: ONE table, keyed by the device kind and the
resolved `Runtime`, and the refusals it makes before anything runs.

A path either honours a request field (saying how where that matters) or refuses the request,
naming its line and field, the paths that would run it, and `--ignore-field` to run it without
the field. What each path does (../shared/notes/neuron-runtimes.md, "What a request may ask
for, per path"):

- vLLM's own engine (cpu, cuda): everything SamplingParams takes, embeddings (`/v1/embeddings`
  lines) on vLLM's pooling runner and chat lines' tools with vLLM's tool-call parser; nothing
  else runs those two (VLLM_ONLY).
- the simulated device: everything; it runs vLLM's engine and charges the device's cost of it.
- AWS's NxDI plugin (--device neuron, runtime nxdi): the plugin 0.2.0 has no grammar bitmask
  and logprobs only with CPU sampling, so both are honoured through CPU sampling: on-device
  sampling off, the bitmask applied to the host's logits before the plugin samples.
- vLLM Neuron Beta/GA (--device neuron, runtime vllm-neuron): structured outputs on device
  (the bitmask as the forward's logit mask), the rest as vLLM's own.
- Hugging Face's optimum-neuron plugin (--device neuron, runtime optimum-neuron; 0.4.5's
  `optimum/neuron/vllm/runner.py`): its runner returns `logprobs=None` on every step, has no
  grammar bitmask, builds its sampling metadata with `generators={}` (no per-request seed) and
  empty logits processors ("min_p, logits_bias, min_length ... not supported yet"), and passes
  penalties only to its CPU sampler, which an export with on-device sampling never runs. So it
  honours n, top_p, top_k, stop_token_ids, include_stop_str_in_output and ignore_eos (vLLM's
  engine around the runner does those, as it matches stop strings) and refuses the rest; so
  does the simulated device under it.

To change what a path does, change its entry here: nothing else tests a path's name. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from neuron_batch.inputs.prompt_records import InputProblem, PromptRecord
from neuron_batch.runtimes.runtime import NXDI, OPTIMUM_NEURON, VLLM_NEURON, Runtime

#: What a request may ask for beyond prompt, max_tokens, temperature and stop, by its key in
#: `PromptRecord.sampling` (SamplingParams' names), and in words.
FEATURES: Mapping[str, str] = MappingProxyType({
    "n": "n > 1 samples", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "seed": "a per-request seed", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "repetition_penalty": "repetition_penalty",
    "logit_bias": "logit_bias", "logprobs": "logprobs", "stop_token_ids": "stop_token_ids",
    "include_stop_str_in_output": "include_stop_str_in_output",
    "min_tokens": "min_tokens", "ignore_eos": "ignore_eos",
    "structured": "structured outputs",
    "embed": "embeddings (vLLM's pooling runner)",
    "tools": "tool calling (vLLM's tool-call parser)"})
#: What only vLLM's own engine runs: an embedding needs vLLM's pooling runner, which the
#: simulated device does not model (it charges generation steps) and which no Neuron plugin
#: here supports (AWS's NxDI and vLLM Neuron plugins and optimum-neuron run generation
#: models; ../shared/notes/neuron-runtimes.md). Tool calls are parsed from the output's text:
#: the simulated device makes none worth parsing, and on a Neuron host it is untried here.
VLLM_ONLY = ("embed", "tools")

CPU_SAMPLING = "through CPU sampling (on-device sampling off, logits to the host each step)"


@dataclass(frozen=True)
class RequestPath:
    """One path a request can run on, and what it does with each field."""

    name: str                           # "AWS's NxDI plugin (--device neuron, runtime nxdi)"
    # feature -> how it is honoured ("" when plainly, as vLLM does); a feature not here is
    # refused on this path
    honoured: Mapping[str, str] = field(default_factory=dict)

    def honours(self, feature: str) -> bool:
        return feature in self.honoured


def _everything(**how: str) -> Mapping[str, str]:
    """Every generation feature (`how` says how where that matters), and of VLLM_ONLY those
    `how` names."""
    return MappingProxyType({feature: how.get(feature, "") for feature in FEATURES
                             if feature not in VLLM_ONLY or feature in how})


def _only(*features: str) -> Mapping[str, str]:
    return MappingProxyType({feature: "" for feature in features})


#: THE table: (device kind, runtime name or None) -> path. The device kind is "vllm" (cpu,
#: cuda), "sim" or "neuron"; only Neuron hosts differ by runtime.
PATHS: Mapping[tuple[str, str | None], RequestPath] = MappingProxyType({
    ("vllm", None): RequestPath("vLLM's own engine (--device cpu or cuda)",
                                _everything(embed="on an embedding model (runner pooling)",
                                            tools="with --tool-call-parser's parser")),
    # (named by its runtimes: a refusal under the sim's optimum-neuron row that said "it runs
    # on the simulated Neuron device (--device sim)" contradicted itself)
    ("sim", None): RequestPath(
        "the simulated device under nxdi or vllm-neuron (--device sim --runtime nxdi or "
        "vllm-neuron)", _everything()),
    ("neuron", NXDI): RequestPath(
        "AWS's NxDI plugin (--device neuron, runtime nxdi)",
        _everything(structured=CPU_SAMPLING, logprobs=CPU_SAMPLING)),
    ("neuron", VLLM_NEURON): RequestPath(
        "vLLM Neuron (--device neuron, runtime vllm-neuron)",
        _everything(structured="on device (the grammar bitmask as the forward's logit mask)")),
    ("neuron", OPTIMUM_NEURON): RequestPath(
        "Hugging Face's optimum-neuron plugin (--device neuron, runtime optimum-neuron)",
        _only("n", "top_p", "top_k", "stop_token_ids", "include_stop_str_in_output",
              "ignore_eos")),
    # The simulated device models its runtime: what optimum-neuron's host refuses, its
    # simulation refuses too (a plan made on it must hold on the host).
    ("sim", OPTIMUM_NEURON): RequestPath(
        "the simulated device under optimum-neuron (--device sim --runtime optimum-neuron)",
        _only("n", "top_p", "top_k", "stop_token_ids", "include_stop_str_in_output",
              "ignore_eos")),
})


def path_key(device: str, runtime: Runtime) -> tuple[str, str | None]:
    """The table's key for a run's device ("cpu", "cuda", "sim", "neuron"; "auto" counts as
    "neuron" where AWS's plugin is installed, else as vLLM's own) and resolved runtime."""
    if device == "auto":
        from neuron_batch.versions import neuron_plugin_missing_message

        device = "neuron" if neuron_plugin_missing_message() is None else "cpu"
    if device == "neuron":
        return ("neuron", runtime.name)
    if device == "sim":
        # a runtime with a row of its own on the simulated device, else the common one
        return ("sim", runtime.name) if ("sim", runtime.name) in PATHS else ("sim", None)
    return ("vllm", None)


def request_path(device: str, runtime: Runtime,
                 paths: Mapping[tuple[str, str | None], RequestPath] = PATHS) -> RequestPath:
    return paths[path_key(device, runtime)]


def features_of(record: PromptRecord) -> list[str]:
    """The FEATURES a record asks for (n only when more than one)."""
    sampling = record.sampling or {}
    return [key for key in sampling if key != "n" or sampling[key] > 1]


def asks(record: PromptRecord) -> tuple[bool, int, bool]:
    """(constrained, samples n, logprobs): what one request asks that `asked_in` counts."""
    sampling = record.sampling or {}
    return "structured" in sampling, int(sampling.get("n", 1)), "logprobs" in sampling


def asked_in(each: Iterable[tuple[bool, int, bool]]) -> dict[str, int] | None:
    """How many requests asked for what changes their cost beyond their tokens (the report's
    `requests.asked`), from each one's `asks`: constrained to a structured output, sampled
    n > 1 times (and the samples in all), logprobs. None when none did."""
    counts = {"constrained": 0, "sampled_n": 0, "samples": 0, "logprobs": 0}
    for constrained, n, logprobs in each:
        counts["constrained"] += constrained
        counts["sampled_n"] += n > 1
        counts["samples"] += n if n > 1 else 0
        counts["logprobs"] += logprobs
    return counts if counts["constrained"] or counts["sampled_n"] or counts["logprobs"] else None


def refusals(records: Iterable[PromptRecord], path: RequestPath,
             paths: Mapping[tuple[str, str | None], RequestPath] = PATHS
             ) -> tuple[list[PromptRecord], list[InputProblem]]:
    """(the records `path` runs, a problem for each it cannot: its first field the path does
    not honour, the paths that would, and --ignore-field)."""
    kept, problems = [], []
    for record in records:
        refused = next((f for f in features_of(record) if not path.honours(f)), None)
        if refused is None:
            kept.append(record)
            continue
        where = (record.sampling_fields or {}).get(refused, refused)
        others = [other.name for other in paths.values()
                  if other is not path and other.honours(refused)]
        problems.append(InputProblem(
            record.source, where,
            f"{FEATURES[refused]} cannot run on {path.name}"
            + (f"; it runs on {_either(others)}" if others else "")
            # (an embedding without its pooling is no request at all)
            + ("" if refused == "embed" else
               f"; or pass --ignore-field {where} to run the request without it"),
            record.read_order, custom_id=record.id, code="unsupported_field"))
    return kept, problems


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def stop_refusals(records: Iterable[PromptRecord], *, has_tokenizer: bool, simulated: bool,
                  on_ray: bool) -> tuple[list[PromptRecord], list[InputProblem]]:
    """(the records whose stop strings the run can match, a problem for each it cannot).

    vLLM matches stop strings in the detokenized text: a run needs a tokenizer for them. The
    simulated device detokenizes its tokens with the run's tokenizer (the model's, or the
    built-in one standing in) on one engine; its Ray replicas do not. Refused before anything
    loads, naming the line and field, rather than failing the attempt in vLLM."""
    if has_tokenizer and not (simulated and on_ray):
        return list(records), []
    why = ("the simulated device's Ray replicas do not detokenize; run it without --replicas"
           if has_tokenizer else
           "the model has no tokenizer, so its tokens never become text to match; give the "
           "model's tokenizer files, or stop_token_ids instead")
    kept, problems = [], []
    for record in records:
        if not record.stop:
            kept.append(record)
            continue
        where = (record.sampling_fields or {}).get("stop") or (
            "body.stop" if record.openai is not None else "stop")
        problems.append(InputProblem(
            record.source, where, f"stop strings are matched in the text, but {why}; or pass "
            f"--ignore-field {where} to run the request without them", record.read_order,
            custom_id=record.id, code="unsupported_field"))
    return kept, problems
