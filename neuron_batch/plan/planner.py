"""`neuron-batch plan`: which instances, how many and laid out how, to finish a batch job by a
deadline for the least money, found on the simulated device.

Read top-down: `run_plan` checks the grid (grid.py: every option and its lower bounds, no
engine), states its size and an estimate, then simulates options best-bound first in parallel
processes, skipping every option whose bounds cannot beat the best simulated so far
(search.py), and writes plan.json / plan.csv / the plot after every simulation
(report.py, plot.py). Each simulation is one replica on its share of the requests, a
`neuron-batch run` (its command line is in plan.json), in a folder under runs/ that
`--resume` reuses.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuron_batch.bench.deadline import format_hours
from neuron_batch.errors import EXIT_INTERRUPTED, EXIT_OK, RunError
from neuron_batch.inputs.prepare import PromptTokens
from neuron_batch.plan.candidates import Option, PlanError
from neuron_batch.plan.grid import (
    build_options,
    model_len_candidates,
    placements,
)
from neuron_batch.plan.plan_job import (  # noqa: F401  (re-exported)
    PLAN_JSON,
    PlanJob,
    layout_settings,
    option_settings,
    plan_base,
    run_folder,
)
from neuron_batch.plan.prefix_options import CACHING_SUFFIX, caching_options, shareable_tokens
from neuron_batch.plan.report import PlanWriter
from neuron_batch.plan.search import Search, dry_run
from neuron_batch.plan.splits import split_options
from neuron_batch.plan.tighten import Tightener, bound_is_exact
from neuron_batch.plan.words import left_out_line
from neuron_batch.report.model import Report
from neuron_batch.report.schema import or_none
from neuron_batch.settings import RunSettings

if TYPE_CHECKING:
    from neuron_batch.inputs.prepare import PreparedRequest

#: CPU seconds a simulation costs per engine step and per output token, measured on the 2-core
#: development machine (the whole conversation trace at max_num_seqs 32: 147 k steps, 4.1 M
#: tokens, about 200 s); a busy machine takes longer.
SECONDS_PER_STEP = 0.0003
SECONDS_PER_TOKEN = 0.00004
#: Seconds a worker process takes to import vLLM, on top of reading the workload (which the
#: estimate takes to cost what it cost the plan itself).
VLLM_IMPORT_S = 15.0
#: How much longer than its bound a simulated run is assumed to take, for the estimate.
ESTIMATE_SLACK = 1.1


# -- one simulation, in a worker process ------------------------------------------------------

_WORKLOADS: dict[tuple[Any, ...], Any] = {}


def simulate_share(settings: RunSettings, workload_limit: int | None) -> dict[str, Any]:
    """Run one replica on its share (the first `settings.limit` requests of the shuffled
    workload); never raises. The whole workload is read once per process and sliced."""
    from neuron_batch.bench.sweep import finished_report

    started, cpu = time.monotonic(), time.process_time()
    assert settings.output is not None, "plan_job gives every simulation its folder"
    report = finished_report(Path(settings.output))
    reused = report is not None
    try:
        if report is None:
            report = _run_share(settings, workload_limit)
    except Exception as error:  # one failed simulation must not end the plan
        return {"status": "failed", "error": f"{type(error).__name__}: {error}",
                "replica_s": None, "wall_s": round(time.monotonic() - started, 1)}
    throughput = report.throughput
    prefix = None
    if settings.prefix_caching:     # what the cache served, from the run's records
        from neuron_batch.bench.cache_effect import run_figures

        prefix = run_figures(settings.output, settings)
    return {"status": "done", "error": None, "replica_s": throughput.elapsed_s,
            "prefix": prefix,
            "output_tokens": report.tokens.output,
            "replica_output_tokens_per_s": throughput.output_tokens_per_s,
            "num_requests": report.requests.completed,
            "steps": or_none(report.section("steps").total),
            "run_dir": settings.output, "reused": reused,
            "split_parts": (report.split or {}).get("parts"),
            "wall_s": round(time.monotonic() - started, 1),
            "cpu_s": round(time.process_time() - cpu, 1)}


def _run_share(settings: RunSettings, workload_limit: int | None) -> Report:
    from neuron_batch.inputs.prepare import Prepared
    from neuron_batch.job.workload import Workload, load_workload
    from neuron_batch.run.runner import run

    key = (settings.inputs, settings.prompt_column, settings.dataset_split, settings.seed,
           workload_limit, settings.model, settings.max_model_len, settings.max_tokens,
           settings.architecture)
    if key not in _WORKLOADS:
        _WORKLOADS[key] = load_workload(settings.replace(limit=workload_limit), lambda m: None,
                                        command="plan")
    full = _WORKLOADS[key]
    prepared = Prepared(full.prepared.requests[:settings.limit], full.prepared.problems,
                        full.prepared.tokenizer_name)
    share = Workload(full.model, prepared, full.problems, full.input_kind, full.tokenizer)
    result = run(settings, log=lambda m: None, workload=share)
    if result.exit_code != EXIT_OK:
        raise RunError(f"the simulated run ended with exit code {result.exit_code}")
    assert result.report is not None, "a run that exits 0 has its report"
    return result.report


class _InlinePool:
    """The pool interface, running each job at once in this process (--jobs 1)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args))
        return future

    def __enter__(self) -> _InlinePool:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


# -- the plan ---------------------------------------------------------------------------------

def run_plan(job: PlanJob) -> int:
    from neuron_batch.job.workload import load_workload

    if (job.out_dir / PLAN_JSON).exists() and not job.resume:
        raise RunError(f"{job.out_dir} already holds a plan; pass --resume to continue it, or "
                       f"choose another --output")
    try:
        placements(job.spec)        # a model that fits nowhere fails before the inputs load
    except PlanError as error:
        raise RunError(str(error)) from None
    job.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # (the bounds take each share in the order its simulated replica submits it)
    job = replace(job, log=_timed(job.log, started),
                  spec=replace(job.spec, order=job.base.order))
    workload = load_workload(job.base, job.log, command="plan")
    requests = workload.prepared.requests
    prompt_lens = [r.prompt_len for r in requests]
    output_lens = [r.max_tokens for r in requests]
    options, excluded = [], []
    for max_model_len in model_len_candidates(job.spec, prompt_lens, output_lens):
        try:
            found, left_out = placements(replace(job.spec, max_model_len=max_model_len))
        except PlanError as error:
            excluded.append(f"max_model_len {max_model_len}: {error}")
            continue
        excluded += [reason for reason in left_out if reason not in excluded]
        # (the placements carry their max_model_len; the spec names the one given)
        options += build_options(job.spec, found, prompt_lens, output_lens,
                                 seed=job.base.seed, excluded=excluded)
    if not options:
        raise RunError("no layout loads: " + "; ".join(excluded[-3:]))
    prefix = _prefix_caching(job, requests)
    singles = list(options)      # (splits are weighed with caching off only)
    if prefix["bound_tokens"]:
        options += caching_options(job.spec, singles, prompt_lens, output_lens,
                                   shareable_tokens(PromptTokens(requests)))
    options += split_options(job.spec, singles, prompt_lens, output_lens)
    writer = PlanWriter(job, options, excluded, workload_output_tokens=sum(output_lens),
                        num_requests=len(requests), prefix_cache=prefix)
    tighten = Tightener(job.spec, prompt_lens, output_lens)
    _announce(job, options, excluded, tighten, load_s=time.monotonic() - started)
    try:
        _search(job, options, writer, tighten)
    except KeyboardInterrupt:
        writer.write(wall_s=time.monotonic() - started, complete=False)
        job.log(f"interrupted: finished simulations are kept in {job.out_dir}; --resume "
                f"continues")
        return EXIT_INTERRUPTED
    text = writer.write(wall_s=time.monotonic() - started, complete=True, plot=True)
    print(text, flush=True)
    return EXIT_OK


def _prefix_caching(job: PlanJob, requests: Sequence[PreparedRequest]) -> dict[str, int]:
    """What the job's prompts share (bench/cache_effect.py `job_bound`), said in the log: whether
    each option is also weighed with prefix caching on."""
    from neuron_batch.bench.cache_effect import job_bound

    bound = job_bound(PromptTokens(requests))
    if bound["bound_tokens"]:
        job.log(f"prefix caching: an unbounded cache could serve {bound['bound_tokens']:,} of "
                f"the {bound['prompt_tokens']:,} prompt tokens: each option is weighed with "
                f"it off and on, in prefix order ({CACHING_SUFFIX.strip()})")
    else:
        job.log("prefix caching: off in every option, the prompts share no KV block (the "
                "cache would serve nothing and cost graphs and decode time)")
    return bound


def _timed(log: Callable[[str], None], started: float) -> Callable[[str], None]:
    """`log` with the minutes and seconds since `started` in front: where a plan's time goes."""
    def timed(message: str) -> None:
        minutes, seconds = divmod(int(time.monotonic() - started), 60)
        log(f"[{minutes:d}:{seconds:02d}] {message}")
    return timed


def _announce(job: PlanJob, options: list[Option], excluded: list[str], tighten: Tightener,
              load_s: float) -> None:
    spec, log = job.spec, job.log
    skipped = [o for o in options if o.skip_reason]
    kinds = sorted({(o.instance, o.tp) for o in options})
    log(f"grid: {len(kinds)} instance x TP placements ({', '.join(spec.instances)}), "
        f"1..{spec.max_num_instances} instances, max_num_seqs "
        f"{','.join(map(str, spec.seqs_values))}: {len(options)} options"
        + (f", {len(skipped)} of them skipped (e.g. {skipped[0].name}: "
           f"{skipped[0].skip_reason})" if skipped else ""))
    if excluded:
        log(left_out_line(excluded))
    at = f" ({job.deadline.at})" if job.deadline.at else ""
    compile_ = ("loading only (--compiled: the graphs compiled before)" if spec.compiled
                else "compiled fresh (tracing, compiling on each instance, loading)")
    log(f"deadline {job.deadline.text} = {format_hours(job.deadline.hours)}{at}; KV admission: "
        f"{job.spec.kv_reserve}; start-up counted as {compile_}")
    expected = dry_run(options, job.deadline.hours, tighten=tighten,
                       slack=lambda o: 1.0 if bound_is_exact(o) else ESTIMATE_SLACK)
    everything = {o.sim_key: o for o in options if not o.skip_reason}
    log(f"estimate: about {len(expected)} simulations "
        f"({_steps(expected):,} engine steps), {_minutes(expected, job.jobs, load_s)} with "
        f"{job.jobs} job(s); without pruning {len(everything)} simulations, "
        f"{_minutes(list(everything.values()), job.jobs, load_s)} (on an idle machine)")


def _steps(options: list[Option]) -> int:
    unique = {o.sim_key: o for o in options}
    return int(sum(o.bound_steps * ESTIMATE_SLACK for o in unique.values()))


def _minutes(options: list[Option], jobs: int, load_s: float) -> str:
    unique = {o.sim_key: o for o in options}.values()
    cpu = (_steps(options) * SECONDS_PER_STEP
           + sum(o.share_output_tokens for o in unique) * SECONDS_PER_TOKEN)
    seconds = cpu / max(1, min(jobs, len(unique))) + VLLM_IMPORT_S + load_s
    return f"about {seconds / 60:.0f} min" if seconds >= 90 else f"about {seconds:.0f} s"


def _search(job: PlanJob, options: list[Option], writer: PlanWriter, tighten: Tightener) -> None:
    search = Search(options, job.deadline.hours, prune=job.prune, tighten=tighten)
    pool = (_InlinePool() if job.jobs == 1 else
            ProcessPoolExecutor(max_workers=job.jobs, mp_context=get_context("spawn")))
    futures: dict[Future[Any], Option] = {}
    count = 0
    with pool:
        try:
            while True:
                while len(futures) < job.jobs and (option := search.next()) is not None:
                    settings = option_settings(job.base, option, job.out_dir)
                    job.log(f"simulating {option.name}: {option.share_size:,} requests, at "
                            f"least {option.hours_bound:.2f} h / ${option.usd_bound:,.2f}")
                    futures[pool.submit(simulate_share, settings, job.base.limit)] = option
                if not futures:
                    break
                done, _ = wait(futures, return_when=FIRST_COMPLETED)
                for future in done:
                    option = futures.pop(future)
                    result = future.result()
                    count += 1
                    search.done(option, result)
                    job.log(_progress(count, option, result, search))
                    writer.write(complete=False)
        except KeyboardInterrupt:
            for future in futures:
                future.cancel()
            raise


def _progress(count: int, option: Option, result: dict[str, Any], search: Search) -> str:
    if result.get("replica_s") is None:
        return f"[{count}] {option.name}: FAILED: {result.get('error')}"
    hours, cost = option.hours_for(result["replica_s"]), option.usd_for(result["replica_s"])
    how = "reused" if result.get("reused") else f"{result['wall_s']:.0f} s"
    best = search.best_option.name if search.best_option else "-"
    return (f"[{count}] {option.name}: {hours:.2f} h, ${cost:,.2f} "
            f"({result['replica_output_tokens_per_s']:,.0f} tok/s per replica; {how}); "
            f"best so far: {best}")
