"""A request's `SamplingParams`, built in this one place from the plain spec
`inputs.request_fields.sampling_spec` makes of it, and what vLLM returns for it made plain
again (the n completions, each token's logprobs).

Every path hands the engine the same SamplingParams: the CPU engine, the simulated device and
a Neuron host's plugin read what they need from it (structured outputs, logprobs, n) where the
request reaches the engine core. vLLM is imported lazily.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from neuron_batch.inputs.request_fields import default_temperature, sampling_spec
from neuron_batch.settings import RunSettings


def request_spec(request, settings: RunSettings) -> dict[str, Any]:
    """What one prepared request asks the engine for, with the run's defaults filled in: the
    one spec every engine loop (one engine, Ray replicas, a split's parts) submits and a run
    folder's request digests record. Its max_tokens after the default and the clamp; the run's
    --temperature where the request gives none; --seed + its position as its seed where
    it samples and gives none; ignore_eos with --ignore-eos and always on the simulated device
    (which does not sample its tokens)."""
    record = request.record
    return sampling_spec(record, max_tokens=request.max_tokens,
                         temperature=default_temperature(record, settings.temperature),
                         seed=settings.seed + record.index,
                         ignore_eos=settings.simulated or settings.ignore_eos)


def sim_tokenizer(job) -> str | None:
    """The tokenizer the simulated device detokenizes with: the run's (the model's, or the
    built-in one standing in for it) where a request of the job asks for stop strings, which
    vLLM matches in the text; None elsewhere (the simulation then skips the text it does not
    need)."""
    if not job.simulated or job.workload.tokenizer is None:
        return None
    if not job.workload.facts(job.settings).stop_strings:
        return None
    return job.workload.tokenizer.name_or_path


def spec_asks(spec: dict[str, Any]) -> SimpleNamespace:
    """A spec read as the SamplingParams it becomes, attribute by attribute (the structured
    form as `structured_outputs`), for what reads a job's sampling before any engine or vLLM
    object exists (runtimes/sampling.py, duck-typed)."""
    fields = {key: value for key, value in spec.items() if key != "structured"}
    return SimpleNamespace(**fields, structured_outputs=spec.get("structured"))


def sampling_params(spec: dict[str, Any], *, detokenize: bool):
    """vLLM's SamplingParams for one request's spec (keys: SamplingParams' names, with
    `structured` the one structured-output form and `logit_bias` keyed by token id strings)."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    from neuron_batch.scheduler.compat import structured_output_kwargs

    kwargs = dict(spec)
    structured = kwargs.pop("structured", None)
    if structured is not None:
        kwargs.update(structured_output_kwargs(structured))
    if kwargs.get("logit_bias"):
        kwargs["logit_bias"] = {int(token): bias for token, bias in kwargs["logit_bias"].items()}
    kwargs["stop"] = kwargs.get("stop") or None
    # FINAL_ONLY: the engine builds a request's output once, when it finishes, instead of a
    # cumulative copy for every request at every step (which nothing here reads).
    return SamplingParams(detokenize=detokenize, output_kind=RequestOutputKind.FINAL_ONLY,
                          **kwargs)


def pooling_params(embed: dict[str, Any]):
    """vLLM's PoolingParams for an embeddings request (`embed`: the spec's `embed`,
    inputs/embeddings_body.py); vLLM checks `dimensions` against the model when it is added."""
    from vllm.pooling_params import PoolingParams

    return PoolingParams(task="embed", dimensions=embed.get("dimensions"))


def plain_logprobs(logprobs, token_ids: list[int], top: int) -> list[dict[str, Any]] | None:
    """vLLM's per-token logprobs (a list, per generated token, of {token id: Logprob}: the `top`
    likeliest and the sampled one) as plain data: per token {"id", "token", "logprob", "top":
    [[id, token, logprob], ...] the `top` likeliest by rank}. `token` is None where the run
    does not detokenize."""
    if logprobs is None:
        return None
    out = []
    for token_id, alternatives in zip(token_ids, logprobs):
        own = alternatives.get(token_id)
        ranked = sorted(((lp.rank if lp.rank is not None else 1 << 30, tid, lp)
                         for tid, lp in alternatives.items()), key=lambda item: item[:2])
        out.append({"id": token_id, "token": own.decoded_token if own is not None else None,
                    "logprob": float(own.logprob) if own is not None else None,
                    "top": [[tid, lp.decoded_token, float(lp.logprob)]
                            for rank, tid, lp in ranked[:top]]})
    return out


def plain_choices(out, detokenize: bool, top_logprobs: int | None) -> list[dict[str, Any]]:
    """A finished RequestOutput's completions (n of them), each as plain data: index,
    token_ids, text, finish_reason, stop_reason and, where asked, logprobs."""
    choices = []
    for completion in out.outputs:
        token_ids = list(completion.token_ids)
        choice = {"index": completion.index, "token_ids": token_ids,
                  "text": completion.text if detokenize else None,
                  "finish_reason": completion.finish_reason,
                  "stop_reason": completion.stop_reason}
        if top_logprobs is not None:
            choice["logprobs"] = plain_logprobs(completion.logprobs, token_ids, top_logprobs)
        choices.append(choice)
    return choices
