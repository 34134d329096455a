"""`neuron-batch bench`: one workload under one or many configurations, each in a fresh engine.

The dimensions swept are the runtime's own (runtimes/runtime.py). Configuration names: P = prefill
set (vllm-neuron: token buckets over chunks; nxdi: context-encoding buckets over whole prompts),
D = decode batch-size set (vllm-neuron), T = token-generation set (nxdi: attention lengths),
C = decode context-length set (vllm-neuron, opt-in, so swept with the default P and D),
S = max_num_seqs, K = KV admission rule (`--kv-reserve`: "req" reserves each request's prompt +
max_tokens, "mml" max_model_len), PC = prefix caching on/off (`--sweep-prefix-caching`),
O = submission order (`--sweep-order`: in, len, pfx); "def" is the default buckets, "uN" the
user's Nth set, "oK" the exact optimum with at most K buckets. S, K, PC and O appear in names
only when the sweep has several values of them; each prefix variant runs both phases.

A sweep runs in two phases. First the default buckets at every `--max-num-seqs` value (those
runs also show which decode batch sizes and lengths the workload produces); then the grid:
prefill bucket sets (defaults, the user's, and the exact optimum for 1..K buckets on the
workload's prefills) crossed with the decode dimension (likewise, optimised on what phase one's
decode steps did: their batch sizes, or their longest request's length).
Each finished configuration is written to sweep.json / sweep.csv at once, so a crash keeps what
finished and `--resume` skips it. Simulated configurations run in parallel processes; the
simulated device is deterministic, so the results equal a serial run's.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from neuron_batch.bench.command_line import run_command, shell_lines
from neuron_batch.bench.preflight import Loadable, layout_check, loadable
from neuron_batch.bench.sweep_grid import (  # noqa: F401  (re-exported)
    Candidate,
    candidate,
    decode_batch_histogram,
    decode_histograms,
    default_candidates,
    grid_candidates,
    prefix_variants,
)
from neuron_batch.bench.sweep_spec import SweepSpec
from neuron_batch.bench.table import MAX_WIDTH, wrap
from neuron_batch.choices import prefix_caching_word
from neuron_batch.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, RunError
from neuron_batch.inputs.prepare import PromptTokens
from neuron_batch.job.folder import REPORT, write_json_atomic
from neuron_batch.job.workload import load_workload
from neuron_batch.report.model import Report, as_report
from neuron_batch.report.schema import present
from neuron_batch.run.runner import run
from neuron_batch.settings import RunSettings

SWEEP_JSON, SWEEP_CSV = "sweep.json", "sweep.csv"


# -- running configurations -------------------------------------------------------------------

_WORKER_WORKLOADS: dict[tuple[Any, ...], Any] = {}


def run_folder(settings: RunSettings) -> Path:
    """A configuration's run folder (every candidate is given its own before it runs)."""
    if settings.output is None:
        raise ValueError("a bench configuration runs in its own folder: none was given")
    return Path(settings.output)


def run_candidate(settings: RunSettings) -> dict[str, Any]:
    """Run one configuration (in this process or a worker); never raises."""
    started = time.monotonic()
    out_dir = run_folder(settings)
    finished = finished_report(out_dir)
    if finished is not None:
        return {"status": "done", "error": None, "report": finished.to_dict(), "wall_s": 0.0,
                "reused": True}
    try:
        key = (settings.inputs, settings.prompt_column, settings.dataset_split, settings.limit,
               settings.shuffle, settings.seed, settings.model, settings.max_model_len,
               settings.max_tokens, settings.device, settings.architecture)
        workload = _WORKER_WORKLOADS.get(key)
        if workload is None:
            workload = _WORKER_WORKLOADS[key] = load_workload(settings, lambda m: None,
                                                              command="bench")
        result = run(settings, log=lambda m: None, workload=workload)
        status = "done" if result.exit_code == EXIT_OK else f"exit {result.exit_code}"
        # (the entry is sweep.json's: the report as its JSON, read back typed by ranking.py)
        report = result.report.to_dict() if result.report is not None else None
        return {"status": status, "error": None, "report": report,
                "wall_s": round(time.monotonic() - started, 3), "reused": False}
    except RunError as error:
        return {"status": "failed", "error": str(error), "report": None,
                "wall_s": round(time.monotonic() - started, 3), "reused": False}
    except Exception as error:  # a configuration that crashes must not end the sweep
        return {"status": "failed", "error": f"{type(error).__name__}: {error}", "report": None,
                "wall_s": round(time.monotonic() - started, 3), "reused": False}


def run_all(candidates: Sequence[Candidate], *, jobs: int,
            record: Callable[[Candidate, dict[str, Any]], None]) -> None:
    """`record(candidate, run_candidate outcome)` for each, as each finishes: in parallel
    processes when jobs > 1 (simulated runs), else one after the other; Ctrl-C cancels what
    has not started."""
    if jobs <= 1 or len(candidates) <= 1:
        for c in candidates:
            record(c, run_candidate(c.settings))
        return
    with ProcessPoolExecutor(max_workers=min(jobs, len(candidates)),
                             mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(run_candidate, c.settings): c for c in candidates}
        try:
            while futures:
                done, _ = wait(futures, return_when=FIRST_COMPLETED)
                for future in done:
                    record(futures.pop(future), future.result())
        except KeyboardInterrupt:
            for future in futures:
                future.cancel()
            raise


def finished_report(out_dir: Path) -> Report | None:
    """The report of a finished run in `out_dir` (every request done), else None."""
    try:
        report = Report.from_dict(json.loads((out_dir / REPORT).read_text(encoding="utf-8")))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    pending = report.section("requests").pending
    return report if present(pending) and pending == 0 else None


class Sweep:
    """Runs candidates (in parallel where the device allows), recording each as it finishes."""

    def __init__(self, sweep_dir: Path, *, jobs: int, log: Callable[[str], None],
                 prompt_lengths: Sequence[int], meta: dict[str, Any]):
        self.dir = sweep_dir
        self.jobs = max(1, jobs)
        self.log = log
        self.prompt_lengths = list(prompt_lengths)
        self.meta = meta
        self.entries: dict[str, dict[str, Any]] = {}

    def run(self, candidates: Sequence[Candidate]) -> None:
        run_all([c for c in candidates if c.name not in self.entries], jobs=self.jobs,
                record=self._record)

    def _record(self, c: Candidate, outcome: dict[str, Any]) -> None:
        from neuron_batch.bench.cache_effect import run_figures

        entry = {"name": c.name, "params": c.params, **outcome,
                 "command": run_command(c.settings)}
        if entry.get("report") is not None:
            # what prefix caching did, from the run's records (the verdict weighs it)
            entry["prefix"] = run_figures(run_folder(c.settings), c.settings)
        self.entries[c.name] = entry
        count = len(self.entries)
        if entry["report"] is not None:
            tput = as_report(entry["report"]).throughput.output_tokens_per_s
            how = "reused" if outcome.get("reused") else f"{outcome['wall_s']:.1f} s"
            self.log(f"[{count}] {c.name}: {tput:,.1f} output tok/s ({how})")
        else:
            self.log(f"[{count}] {c.name}: FAILED: {entry['error']}")
        self.write()

    def ordered_entries(self) -> list[dict[str, Any]]:
        return sorted(self.entries.values(), key=lambda e: e["name"])

    def write(self) -> dict[str, Any]:
        from neuron_batch.bench.ranking import rank
        from neuron_batch.bench.recommendation import recommend
        from neuron_batch.bench.sweep_files import sweep_json, write_csv

        entries = self.ordered_entries()
        by = self.meta.get("rank_by", "throughput")
        rows = rank(entries, by)
        recommendation = recommend(rows, self.meta.get("prefix_cache")) if rows else {}
        data = sweep_json(entries, rows, recommendation, self.meta)
        data["prompt_lengths"] = self.prompt_lengths
        write_json_atomic(self.dir / SWEEP_JSON, data)
        write_csv(entries, self.dir / SWEEP_CSV, by)
        return data


def load_previous(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads((sweep_dir / SWEEP_JSON).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return {e["name"]: e for e in data.get("configurations", []) if e.get("status") == "done"}


def render(sweep_dir: Path, *, plots: bool = True) -> str:
    """The ranked table and recommendation of a sweep (also `neuron-batch report DIR`)."""
    from neuron_batch.bench.ranking import pareto_front, rank
    from neuron_batch.bench.recommendation import recommend
    from neuron_batch.bench.table import format_table

    data = json.loads((sweep_dir / SWEEP_JSON).read_text(encoding="utf-8"))
    entries, meta = data["configurations"], data.get("meta") or {}
    rows = rank(entries, meta.get("rank_by", "throughput"))
    recommendation = recommend(rows, meta.get("prefix_cache")) if rows else {}
    failed = [e for e in entries if e.get("status") != "done"]
    notes = Loadable([], [], meta.get("left_out") or []).words()
    text = format_table(rows, recommendation, failed=failed, notes=notes)
    if plots and rows:
        from neuron_batch.bench.plots import write_all
        from neuron_batch.runtimes.runtime import runtime_of

        # the sweep's runtime as its meta names it (none: the rows')
        paths = write_all(rows, pareto_front(rows), data.get("prompt_lengths") or [], None,
                          sweep_dir, runtime=runtime_of(meta) if meta.get("runtime") else None)
        text += "\n" + "\n".join(wrap("plots: " + ", ".join(str(p) for p in paths), MAX_WIDTH,
                                      indent="  "))
    return text + "".join(f"\n{line}" for line in command_block(entries, recommendation))


def command_block(entries: Sequence[dict[str, Any]], recommendation: dict[str, Any]
                  ) -> list[str]:
    """The `neuron-batch run` lines of the fastest and of the cheapest configuration, to copy
    (each reproduces that configuration's run)."""
    commands = {e["name"]: e.get("command") for e in entries}
    fastest, cheapest = recommendation.get("fastest"), recommendation.get("cheapest")
    picks = [(f"the fastest{', also the cheapest' if cheapest == fastest else ''}", fastest)]
    pick = (recommendation.get("prefix") or {}).get("pick")
    if pick not in (None, fastest):     # the verdict leaves caching off: run that instead
        picks.insert(0, ("the recommended (prefix caching off)", pick))
    if cheapest not in (None, fastest):
        picks.append(("the cheapest", cheapest))
    lines = []
    for what, name in picks:
        command = commands.get(name)
        if command:
            lines += ["", f"To run {what}, {name}:",
                      *shell_lines(command, MAX_WIDTH, indent="  ")]
    notes = []      # (before the commands: the summary ends with a line to copy)
    if lines and "--limit" in shlex.split(commands.get(fastest) or ""):
        notes.append("(as measured, on the sweep's --limit; drop it to run the whole input)")
    if lines and cheapest is None:
        notes.append("(no price for this instance, so no cheapest: --price-per-hour USD)")
    return (["", *notes] if notes else []) + lines


def run_sweep(spec: SweepSpec, sweep_dir: Path, *, log: Callable[[str], None]) -> int:
    """The sweep `spec` asks for (its mode SWEEP), written to `sweep_dir`: EXIT_OK, or
    EXIT_INTERRUPTED after Ctrl-C with what finished kept; RunError when nothing finished."""
    base, resume = spec.base, spec.resume
    if (sweep_dir / SWEEP_JSON).exists() and not resume:
        raise RunError(f"{sweep_dir} already holds a sweep; pass --resume to continue it, or "
                       f"choose another --output")
    # A layout that cannot load is refused before anything runs, as `run` refuses it: before
    # the inputs are read where the check needs no model.
    seqs_values, kv_values = list(spec.seqs_values), list(spec.kv_values)
    check = layout_check(base)
    fits = loadable(base, seqs_values, kv_values, check) if check else None
    workload = load_workload(base, log, command="bench")
    if fits is None:
        fits = loadable(base, seqs_values, kv_values, layout_check(base, workload))
    for sentence in fits.words():
        log(sentence)
    seqs_values, kv_values = fits.seqs_values, fits.kv_values
    sweep_dir.mkdir(parents=True, exist_ok=True)
    lengths = list(workload.prompt_lengths())     # (written into the sweep's data file)
    variants = prefix_variants(base, spec.caching_values, spec.order_values)
    jobs = spec.workers
    meta = _sweep_meta(spec, workload, fits, variants, lengths)
    sweep = Sweep(sweep_dir, jobs=jobs, log=log, prompt_lengths=lengths, meta=meta)
    if resume:
        sweep.entries.update(load_previous(sweep_dir))
    try:
        phase_one = [c for i, (vbase, variant) in enumerate(variants)
                     for c in default_candidates(vbase, sweep_dir, seqs_values, kv_values,
                                                 variant=variant, baseline=i == 0)]
        started = time.monotonic()
        log(f"phase 1: the default buckets at max_num_seqs {', '.join(map(str, seqs_values))}"
            + (f", kv-reserve {', '.join(kv_values)}" if kv_values and len(kv_values) > 1
               else "")
            + (f", prefix caching x order {', '.join(v.strip(',') for _, v in variants)}"
               if len(variants) > 1 else ""))
        sweep.run(phase_one)
        first_s = max(time.monotonic() - started, 1e-3)
        grid = _phase_two(spec, sweep_dir, variants, phase_one, fits, lengths)
        remaining = [c for c in grid if c.name not in sweep.entries]
        # phase one ran min(jobs, n) configurations at a time
        per_config = first_s * min(jobs, len(phase_one)) / max(1, len(phase_one))
        estimate = per_config * len(remaining) / max(1, min(jobs, len(remaining) or 1))
        log(f"phase 2: {len(grid)} configurations ({len(remaining)} to run; prefill sets x "
            f"decode sets x max_num_seqs x kv-reserve x prefix variants), about "
            f"{estimate / 60:.1f} min with {jobs} job(s)")
        sweep.run(remaining)
    except KeyboardInterrupt:
        sweep.write()
        log(f"interrupted: {len(sweep.entries)} configuration(s) kept in {sweep_dir}; "
            f"--resume continues")
        return EXIT_INTERRUPTED
    sweep.write()
    print(render(sweep_dir), flush=True)
    check_finished(sweep.ordered_entries())
    return EXIT_OK



def _sweep_meta(spec: SweepSpec, workload, fits, variants, lengths: list[int]
                ) -> dict[str, Any]:
    """sweep.json's description of the sweep: the job, the device and what it varies."""
    base = spec.base
    return {"inputs": list(base.inputs), "device": base.device, "model": workload.model.name,
            "sim": base.to_dict()["sim"] if base.simulated else None,
            "num_requests": len(lengths),
            "max_num_batched_tokens": base.max_num_batched_tokens,
            "max_model_len": base.max_model_len, "max_num_seqs_values": list(fits.seqs_values),
            "runtime": base.resolve_runtime().name,
            "kv_reserve_values": fits.kv_values, "left_out": fits.left_out,
            "prefix_caching_values": list(dict.fromkeys(
                prefix_caching_word(v.prefix_caching) for v, _ in variants)),
            "order_values": list(dict.fromkeys(v.order.value for v, _ in variants)),
            "prefix_cache": _job_bound(workload, base),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "jobs": spec.workers,
            "rank_by": spec.rank_by}


def _phase_two(spec: SweepSpec, sweep_dir: Path, variants, phase_one, fits,
               lengths: list[int]) -> list:
    """Phase two's configurations: per prefix variant, the bucket grid drawn from the decode
    and length histograms its phase-one runs observed."""
    grid = []
    for vbase, variant in variants:
        observed = {(c.settings.max_num_seqs, c.settings.kv_reserve):
                    decode_histograms(run_folder(c.settings)) for c in phase_one
                    if (c.settings.prefix_caching, c.settings.order)
                    == (vbase.prefix_caching, vbase.order)}
        grid += grid_candidates(vbase, sweep_dir, seqs_values=fits.seqs_values,
                                prompt_lengths=lengths,
                                decode_hists={k: v[0] for k, v in observed.items()},
                                length_hists={k: v[1] for k, v in observed.items()},
                                user_prefill=spec.user_prefill, user_decode=spec.user_decode,
                                max_prefill_buckets=spec.max_prefill_buckets,
                                max_decode_buckets=spec.max_decode_buckets,
                                kv_values=fits.kv_values, variant=variant)
    return grid

def _job_bound(workload, base: RunSettings) -> dict[str, int]:
    """The job's prompt tokens and what an unbounded prefix cache could serve
    (bench/cache_effect.py), over the run's KV blocks."""
    from neuron_batch.bench.cache_effect import job_bound
    from neuron_batch.inputs.shared_prefix import DEFAULT_BLOCK

    return job_bound(PromptTokens(workload.prepared.requests),
                     base.block_size or DEFAULT_BLOCK)


def check_finished(entries: Sequence[dict[str, Any]]) -> None:
    """RunError (exit 1) when no configuration of the sweep finished, with the first failure."""
    if any(e.get("status") == "done" and e.get("report") for e in entries):
        return
    failure = next((e for e in entries if e.get("error")), entries[0] if entries else None)
    why = "" if failure is None else (f"; {failure['name']}: " + " ".join(
        str(failure.get("error") or failure.get("status")).split()))
    raise RunError(f"none of the {len(entries)} configurations finished{why}", EXIT_FAILED)


def run_repeats(spec: SweepSpec, bench_dir: Path, *, log: Callable[[str], None]) -> int:
    """One configuration (the spec's base), its warm-up runs discarded then its repeats
    measured: the spread."""
    import statistics

    base, repeats, warmup = spec.base, spec.repeats, spec.warmup_runs
    bench_dir.mkdir(parents=True, exist_ok=True)
    workload = load_workload(base, log, command="bench")
    results = []
    for i in range(warmup + repeats):
        label = f"warmup-{i + 1}" if i < warmup else f"repeat-{i - warmup + 1}"
        settings = base.replace(output=str(bench_dir / label), quiet=True, resume=True,
                           metrics_textfile=None)
        outcome = run(settings, log=lambda m: None, workload=workload)
        if outcome.report is None:
            raise RunError(f"{label} ended without a report (exit {outcome.exit_code})")
        tput = outcome.report.throughput.output_tokens_per_s
        log(f"{label}: {tput:,.1f} output tok/s")
        if i >= warmup:
            results.append({"run": label, "output_tokens_per_s": tput,
                            "elapsed_s": outcome.report.throughput.elapsed_s})
    values = [r["output_tokens_per_s"] for r in results]
    spread = {"median": statistics.median(values), "min": min(values), "max": max(values),
              "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
              "relative_spread": (max(values) - min(values)) / statistics.median(values)}
    write_json_atomic(bench_dir / "bench.json", {"repeats": results, "output_tokens_per_s": spread,
                                                  "warmup": warmup})
    print(f"output tok/s over {repeats} repeats (after {warmup} warm-up): median "
          f"{spread['median']:,.1f}, min {spread['min']:,.1f}, max {spread['max']:,.1f} "
          f"(spread {spread['relative_spread']:.1%})", flush=True)
    return EXIT_OK
