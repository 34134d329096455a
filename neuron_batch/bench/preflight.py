"""Before a sweep starts: which of its layouts can load at all, by the check `run` makes
(job/job.py `resolve_target`: the simulated device's `Target.resolve`, or a Neuron host's own
checks, run/runner.py `check_neuron_host`).

Buckets never decide whether a layout loads; `max_num_seqs` (nxdi's static KV cache: slots x
max_model_len beside the weights) and the KV admission rule (vllm-neuron's paged cache under
`--kv-reserve max-model-len`) can. So each (KV rule, max_num_seqs) pair is checked once: values
that load nowhere are left out of the sweep, saying which and why (the message says what
fits), and when none is left the sweep is refused with the message `run` would give.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from neuron_batch.errors import EXIT_USAGE, RunError
from neuron_batch.settings import RunSettings


@dataclass
class Loadable:
    """The sweep's values that load, and what was left out (value, why)."""

    seqs_values: list[int]
    kv_values: list[str]
    left_out: list[dict[str, object]] = field(default_factory=list)

    def words(self) -> list[str]:
        """One sentence per value left out."""
        return [f"left out {item['option']} {item['value']}: it cannot load "
                f"({item['error']})" for item in self.left_out]


def layout_check(base: RunSettings, workload=None) -> Callable[[RunSettings], None] | None:
    """The check `run` makes before anything loads, for settings like `base`: RunError when
    the layout cannot load. None where `run` has none before the engine starts (the CPU), or
    it needs the workload's model and none was given."""
    from neuron_batch.engine.neuron_host import runs_on_neuron
    from neuron_batch.job.job import resolve_target
    from neuron_batch.run.runner import check_neuron_host

    if base.simulated:
        if not base.architecture and workload is None:
            return None
        model_path = workload.model.path if workload is not None else None
        def check_target(settings: RunSettings) -> None:
            resolve_target(settings, model_path)
        return check_target
    if workload is not None and runs_on_neuron(base):
        return lambda settings: check_neuron_host(settings, workload)
    return None


def loadable(base: RunSettings, seqs_values: Sequence[int], kv_values: Sequence[str],
             check: Callable[[RunSettings], None] | None) -> Loadable:
    """The (max_num_seqs, kv_reserve) values of a sweep that load under `check`; RunError
    (exit 2, run's message) when none does."""
    seqs_values, kv_values = list(seqs_values), list(kv_values)
    if check is None:
        return Loadable(seqs_values, kv_values)
    errors: dict[tuple[str, int], str | None] = {}
    for kv in kv_values:
        for seqs in seqs_values:
            try:
                check(base.replace(max_num_seqs=seqs, kv_reserve=kv))
                errors[kv, seqs] = None
            except RunError as error:
                errors[kv, seqs] = str(error)
    first = next((e for e in errors.values() if e is not None), None)
    kv_ok = [kv for kv in kv_values if any(errors[kv, s] is None for s in seqs_values)]
    seqs_ok = [s for s in seqs_values if all(errors[kv, s] is None for kv in kv_ok)]
    if not kv_ok or not seqs_ok:
        several = len(seqs_values) * len(kv_values) > 1
        raise RunError((f"no layout of this sweep can load; the first: {first}" if several
                        else str(first)), EXIT_USAGE)
    left_out: list[dict[str, object]] = [
        {"option": "--kv-reserve", "value": kv, "error": errors[kv, seqs_values[0]]}
        for kv in kv_values if kv not in kv_ok]
    left_out += [{"option": "--max-num-seqs", "value": s,
                  "error": next(errors[kv, s] for kv in kv_ok if errors[kv, s] is not None)}
                 for s in seqs_values if s not in seqs_ok]
    return Loadable(seqs_ok, kv_ok, left_out)
