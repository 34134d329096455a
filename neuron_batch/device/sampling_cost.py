"""What the simulated device charges for sampling: nothing more where the device samples as it
always does, the logits to the host and vLLM's CPU sampler where a job's requests need it
(NxDI, `on_device_sampling_config: None`), the published on-device mask where the Beta/GA
plugin constrains a token (runtimes/sampling.py says which runtime does what, with sources).

The model (figures and sources: docs/simulated-device.md, "Sampling"):
- host sampling (NxDI): every step moves the compiled batch's fp32 logits to the host (NxDI's
  forward returns `logits.float()` for every padded row: `max_num_seqs` rows a decode, one a
  prefill): rows x vocab x 4 bytes over the host link, `HOST_LINK_BYTES_S`; then vLLM's sampler
  runs on the host over the real rows, `HOST_S_PER_LOGIT` a logit (one pass: greedy argmax;
  `LOGPROB_PASSES` more for a row that asks for logprobs: log-softmax and top-k); a
  constrained row adds vLLM's scheduler-side bitmask (`SCHEDULER_MASK_S`, AWS's figure for
  the same vLLM code) and one pass to apply it;
- on-device mask (Beta/GA): `SamplingPath.device_mask_s_per_token` a constrained token.

Pure Python (no vLLM): the executor feeds it each step's rows.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from neuron_batch.runtimes.sampling import (
    SIM_ASKS_KEY,
    STRUCTURED_FIELDS,
    SamplingPath,
    sampler_asks,
)

#: Bytes of one logit off the device: fp32 (NxDI `NeuronBaseModel.forward`: `logits.float()`).
LOGIT_BYTES = 4
#: Host link of one Neuron chip, bytes/s. AWS publishes none for inf2/trn1; assumed: half of
#: PCIe 4.0 x16's 31.5 GB/s a direction (PCI-SIG), for DMA set-up and small transfers.
HOST_LINK_BYTES_S = 16e9
#: Host seconds per logit of one sampler pass (argmax over fp32, one thread), measured on this
#: project's build machine: 0.157-0.165 ms for one row of 128,256 (docs/measurements.md, issue
#: 38: `scripts/bench_structured_sim.py --host-passes`).
HOST_S_PER_LOGIT = 1.3e-9
#: Passes more for a row with logprobs (log-softmax and top-5: 0.30-0.34 ms a 128,256 row, 2x
#: the argmax, same command).
LOGPROB_PASSES = 2
#: vLLM's scheduler filling one constrained request's bitmask, seconds (AWS's Beta design
#: note, structured outputs: 0.12 ms; the same vLLM scheduler code on either runtime).
SCHEDULER_MASK_S = 0.12e-3


@dataclass(frozen=True)
class SamplingCharge:
    """Seconds a step's sampling adds, for one device and job."""

    path: SamplingPath
    vocab: int
    #: The job samples on the host (decided from its requests before the engine is built).
    host: bool = False

    def step_s(self, padded_rows: int, rows: int, constrained: int, logprobs: int) -> float:
        """One step of `rows` requests (`padded_rows` compiled rows), `constrained` of them
        under a grammar and `logprobs` asking for logprobs."""
        if self.host:
            transfer = padded_rows * self.vocab * LOGIT_BYTES / HOST_LINK_BYTES_S
            passes = rows + constrained + LOGPROB_PASSES * logprobs
            return (transfer + passes * self.vocab * HOST_S_PER_LOGIT
                    + constrained * SCHEDULER_MASK_S)
        return constrained * self.path.device_mask_s_per_token

    def words(self) -> str:
        if self.host:
            return (f"on the host: fp32 logits of every compiled row over the host link "
                    f"({HOST_LINK_BYTES_S / 1e9:.0f} GB/s assumed), vLLM's CPU sampler")
        if self.path.device_mask_s_per_token:
            return (f"on the device; a constrained token "
                    f"{self.path.device_mask_s_per_token * 1e3:.1f} ms more (published)")
        return "on the device"


def for_simulated(params):
    """`params` as the simulated device takes them: structured outputs and logprobs taken off
    (it has no tokenizer to compile a grammar for a catalogue model, and its filler tokens
    would break one) and noted in `extra_args[SIM_ASKS_KEY]`, which it charges. The request's
    own params are not changed; those that ask neither are returned as they are."""
    asks = sampler_asks(params)
    if not (asks.constrained or asks.logprobs):
        return params
    told = params.clone() if hasattr(params, "clone") else copy.copy(params)
    for name in STRUCTURED_FIELDS + ("logprobs", "prompt_logprobs"):
        if getattr(told, name, None) is not None:
            setattr(told, name, None)
    told.extra_args = {**(told.extra_args or {}),
                       SIM_ASKS_KEY: {"constrained": asks.constrained,
                                      "logprobs": asks.logprobs}}
    return told
