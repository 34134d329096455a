"""`plan`'s own options, declared beside the run settings (declare.py) and read the same way:
its click options (cli/options.py `declared_options`), their ranges (`check_plan_options`) and
PlanSpec's defaults (plan/candidates.py) all come from here. The run settings plan also takes
(--architecture, --order, --max-model-len, ...) are the run's own declarations (groups.py).
Not job-file keys: a job file describes a run, and plan plans one. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from neuron_batch.device.hardware import DEFAULT_PLAN_INSTANCES
from neuron_batch.settings.declare import Declared, Kind, declared_in, setting
from neuron_batch.settings.run_settings import check_declared

_PLAN = frozenset({"plan"})


@dataclass(frozen=True)
class PlanOptions:
    """What `plan` searches over and how, beyond the run settings each option starts from."""

    deadline: str | None = setting(
        None, commands=_PLAN, in_job_file=False,
        help="When the job must be done: a duration (6h, 90m, 1h30m) or a moment (06:00 = "
             "the next 6 a.m., 2026-12-01T06:00). Required.")
    instances: str = setting(
        ",".join(DEFAULT_PLAN_INSTANCES), commands=_PLAN, in_job_file=False,
        metavar="I,I,...", help="Instance types to consider.")
    max_num_instances: int = setting(
        4, kind=Kind.INT, bound="positive", commands=_PLAN, in_job_file=False,
        help="Consider 1..N instances of each type.")
    seqs_values: str = setting(
        "8,16,32,64", option="max-num-seqs", metavar="N,N,...", commands=_PLAN,
        in_job_file=False,
        help="max_num_seqs values to consider (each is also the one decode bucket).")
    max_prefill_buckets: int = setting(
        4, kind=Kind.INT, bound="positive", commands=_PLAN, in_job_file=False,
        help="The exact optimiser picks at most this many prefill buckets, as many as are "
             "worth their compile time.")
    splits: bool = setting(
        True, kind=Kind.SWITCH, commands=_PLAN, in_job_file=False,
        help="Also weigh the job split by length (`run --split-at N`, nxdi) at every cut where "
             "the short layout's slots change; chosen only when cheaper, or alone on time. "
             "Default: on.")
    runtimes: str | None = setting(
        None, metavar="R,R", commands=_PLAN, in_job_file=False,
        help="Runtimes to weigh side by side where they run, e.g. nxdi,optimum-neuron on "
             "inf2. Default: each instance's own (nxdi on inf2/trn1).")
    prices: str | None = setting(
        None, option="price-per-hour", metavar="USD|I=USD,...", commands=_PLAN,
        in_job_file=False,
        help="Hourly prices overriding the built-in table (spot, negotiated): one number when "
             "--instances names one type, else instance=USD pairs.")
    jobs: int | None = setting(
        None, kind=Kind.INT, bound="positive", commands=_PLAN, in_job_file=False,
        help="Simulations run in parallel on this many processes. Default: the cores.")
    output: str | None = setting(
        None, kind=Kind.FOLDER, short="-o", commands=_PLAN, in_job_file=False,
        help="Where plan.json, plan.csv, the plot and the simulated runs go. Default: "
             "results/<timestamp>-plan-<input name>/.")


#: plan's own options, in the order its --help lists them.
PLAN_DECLARED: tuple[Declared, ...] = tuple(declared_in("plan", PlanOptions))
PLAN_BY_NAME: Mapping[str, Declared] = {d.name: d for d in PLAN_DECLARED}


def plan_default(name: str) -> Any:
    return PLAN_BY_NAME[name].default


def check_plan_options(options: Mapping[str, Any]) -> None:
    """SettingsError for a value outside its declared range, named by its flag."""
    for d in PLAN_DECLARED:
        if d.name in options:
            check_declared(d, options[d.name])
