"""The sampling charge's arithmetic (device/sampling_cost.py), pure."""

from __future__ import annotations

import pytest

from neuron_batch.device import sampling_cost as sc
from neuron_batch.runtimes.sampling import DEVICE_SAMPLING, NXDI_SAMPLING

VOCAB = 128256


def test_host_sampling_is_the_logits_over_the_link_and_the_cpu_passes():
    charge = sc.SamplingCharge(NXDI_SAMPLING, VOCAB, host=True)
    # A decode of 8 compiled slots, 5 of them running, 2 constrained, 1 with logprobs.
    got = charge.step_s(8, 5, 2, 1)
    transfer = 8 * VOCAB * 4 / sc.HOST_LINK_BYTES_S
    passes = (5 + 2 + 2 * 1) * VOCAB * sc.HOST_S_PER_LOGIT
    assert got == pytest.approx(transfer + passes + 2 * sc.SCHEDULER_MASK_S)
    # Every step pays the transfer once the model samples on the host, asked or not.
    assert charge.step_s(8, 8, 0, 0) > charge.step_s(1, 1, 0, 0) > 0
    assert "host" in charge.words()


def test_on_the_device_only_a_constrained_token_costs_and_only_under_beta():
    assert sc.SamplingCharge(NXDI_SAMPLING, VOCAB).step_s(8, 8, 0, 3) == 0.0
    beta = sc.SamplingCharge(DEVICE_SAMPLING, VOCAB)
    assert beta.step_s(8, 6, 3, 1) == pytest.approx(3 * 0.4e-3)
    assert "0.4 ms" in beta.words()
