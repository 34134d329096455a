"""What one plan is (`PlanJob`) and the `neuron-batch run` settings of each option: one replica
on its share, and the whole layout. Shared by the search (run.py) and its report
(report.py), so neither imports the other."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from neuron_batch.bench.deadline import Deadline
from neuron_batch.choices import KvReserve
from neuron_batch.plan.candidates import Option, PlanSpec
from neuron_batch.settings import RunSettings

PLAN_JSON = "plan.json"


@dataclass
class PlanJob:
    """Everything one plan needs: the workload and engine settings (`base`, for the simulated
    device), the grid, the deadline, where to write, and how to run."""

    base: RunSettings
    spec: PlanSpec
    deadline: Deadline
    out_dir: Path
    jobs: int
    resume: bool
    log: Callable[[str], None]
    quiet: bool = False
    prune: bool = True          # False simulates every option (tests compare the two)


def plan_base(settings: RunSettings) -> tuple[RunSettings, str]:
    """The settings every simulated replica starts from: the simulated device, one engine, the
    workload in a seeded random order (what the replica shares are cut from), and KV admission
    by each request's real need; and that admission rule."""
    base = settings.replace(device="sim", shuffle=True, quiet=True, resume=True,
                            metrics_textfile=None, max_runtime=None, replicas=1, ray=None,
                            kv_reserve=KvReserve.REQUEST, num_instances=1)
    return base, KvReserve.REQUEST


def option_settings(base: RunSettings, option: Option, out_dir: Path | None) -> RunSettings:
    """One replica of `option` on its share: what the simulation runs and the command line
    reproduces."""
    settings = base.replace(instance=option.instance, tensor_parallel_size=option.tp,
                            max_num_seqs=option.max_num_seqs,
                            max_model_len=option.max_model_len, limit=option.share_size,
                            shuffle=True, output=None,
                            split_at=option.split.cut if option.split else None,
                            prefix_caching=option.prefix_caching,
                            order=option.order or base.order)
    settings = settings.with_buckets(option.runtime, option.prefill_buckets,
                                     option.decode_buckets, option.attention_buckets)
    if out_dir is None:
        return settings
    return settings.replace(output=str(out_dir / "runs" / run_folder(option, settings)))


def layout_settings(base: RunSettings, option: Option) -> RunSettings:
    """The whole layout's run: every request (the plan's --limit, if any), every replica
    (`--replicas` engines over `--num-instances` instances)."""
    settings = option_settings(base, option, None)
    return settings.replace(limit=base.limit, shuffle=base.limit is not None,
                            replicas=option.total_replicas, num_instances=option.num_instances)


def run_folder(option: Option, settings: RunSettings) -> str:
    """A folder per simulated run, named after everything it depends on, so `--resume` after
    changing a setting does not reuse a run made under the old one."""
    digest = hashlib.sha1(repr(settings).encode()).hexdigest()[:10]
    return f"tp{option.tp}-s{option.max_num_seqs}-n{option.share_size}-{digest}"
