"""The prefill buckets of each plan option: the exact optimiser's best set of 1..K buckets for
the workload's prefills (chunks under vllm-neuron, whole prompts under nxdi), priced by the
placement's cost model, and the k worth its compile time. Pure Python."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from neuron_batch.layout.optimiser import plans_for_each_k, prefill_chunk_lengths
from neuron_batch.runtimes.buckets import round_model_len

if TYPE_CHECKING:   # (grid.py builds the chooser; only the types come from there)
    from neuron_batch.plan.candidates import InstanceFit, PlanSpec


class BucketChooser:
    """The optimiser's prefill sets for 1..K buckets per placement, priced by its cost model,
    and the k worth its compile time for a given number of replicas. Prefills are chunks of
    max_num_batched_tokens (vllm-neuron) or whole prompts (nxdi)."""

    def __init__(self, prompt_lens: Sequence[int], spec: PlanSpec):
        self.spec = spec
        self.prompt_lens = prompt_lens
        self._chunks: dict[tuple[Any, ...], Counter[Any]] = {}
        self._plans: dict[tuple[Any, ...], list[Any]] = {}

    def limits(self, placement: InstanceFit) -> tuple[int, int]:
        """(max_num_batched_tokens as the runtime uses it, the largest prefill bucket)."""
        mml = placement.max_model_len
        budget = self.spec.max_num_batched_tokens if placement.runtime.chunked_prefill else mml
        return budget, min(budget, mml)

    def plans(self, placement: InstanceFit) -> list[Any]:
        key = placement.hardware_key()
        if key not in self._plans:
            budget, maximum = self.limits(placement)
            if (budget, placement.max_model_len) not in self._chunks:
                self._chunks[(budget, placement.max_model_len)] = prefill_chunk_lengths(
                    self.prompt_lens, budget, placement.max_model_len)
            chunks = self._chunks[(budget, placement.max_model_len)]
            self._plans[key] = plans_for_each_k(chunks, self.spec.max_prefill_buckets,
                                                maximum, cost=placement.model.prefill_time)
        return self._plans[key]

    def choose(self, placement: InstanceFit, total_replicas: int
               ) -> tuple[tuple[int, ...], float]:
        """(prefill buckets, compile seconds) minimising compile + one replica's prefill. An
        export's one context length (a `single` option, optimum-neuron): the longest prompt
        rounded up to 128, at most max_model_len; every prompt pads to it whatever its k."""
        if placement.runtime.prefill.single:
            longest = round_model_len(max(self.prompt_lens, default=1))
            return (min(longest, placement.max_model_len),), self.compile_s(placement, 1)
        best: tuple[float, tuple[int, ...], float] | None = None
        for plan in self.plans(placement):
            compile_s = self.compile_s(placement, len(plan.buckets))
            score = compile_s + plan.cost / total_replicas
            if best is None or score < best[0] - 1e-9:
                best = (score, tuple(plan.buckets), compile_s)
        assert best is not None, "plans_for_each_k gives at least one plan"
        return best[1], best[2]

    def compile_s(self, placement: InstanceFit, num_prefill: int) -> float:
        """Start-up of the runtime's graphs (device/compile_time.py): the prefill buckets, one
        decode bucket and its attention buckets (nxdi: token generation; vllm-neuron:
        max_model_len only), traced, compiled on the instance's host and loaded; with
        `--compiled` only loaded. (A host that cannot compile the model is left out of the
        plan before this: grid.placements.)"""
        graphs = placement.runtime.num_graphs(num_prefill, 1,
                                              len(placement.attention_buckets()))
        return float(placement.target.compile_estimate(
            num_prefill, 1, graphs, compiled=self.spec.compiled)["estimated_compile_s"])
