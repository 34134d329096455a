"""`bench --split-at N[,N...]`: a batch job split by length (`run --split-at`) against the best
single layout, on the same workload, each a fresh run.

Configurations, all under the workload's `--order`:
- "single": the layout as given (--max-model-len, --max-num-seqs, its bucket lists);
- "single fitted" (whole-prompt runtimes only): the same layout with its lists fitted to the
  whole workload (layout/split.py `fitted_buckets`, as a split fits each of its layouts), so a
  split is never credited with what better buckets alone would give;
- "split N" for each cut: requests of prompt + max_tokens <= N in their own layout, the rest
  in the given one.
The table gives each one's output tok/s, its run and compile time, USD per million output
tokens with and without the compile, and its ratio to the best single layout; split.json keeps
every figure. Compile time is counted apart from the run (a Neuron host compiles once and
reuses the artifacts for equal shapes), so both are shown. No vLLM import here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from neuron_batch.bench.ranking import compile_and_usd
from neuron_batch.bench.sweep_grid import Candidate
from neuron_batch.bench.sweep_spec import SweepSpec
from neuron_batch.errors import EXIT_INTERRUPTED, EXIT_OK, RunError
from neuron_batch.job.folder import write_json_atomic
from neuron_batch.layout.split import fitted_buckets
from neuron_batch.report.cost import per_million
from neuron_batch.report.model import Report, as_report
from neuron_batch.report.schema import or_none
from neuron_batch.settings import RunSettings

SPLIT_JSON = "split.json"
SINGLE, FITTED = "single", "single fitted"


def comparison_candidates(base: RunSettings, out_dir: Path, cuts: Sequence[int],
                          prompt_lens: Sequence[int], lengths: Sequence[int]
                          ) -> list[Candidate]:
    """The single layout as given, fitted (whole-prompt runtimes), and a split at each cut."""
    runtime = base.resolve_runtime()

    def make(name: str, settings: RunSettings, **params: Any) -> Candidate:
        folder = out_dir / "configs" / name.replace(" ", "-")
        settings = settings.replace(output=str(folder), quiet=True, resume=True,
                           metrics_textfile=None).validate()
        return Candidate(name, {"runtime": runtime.name, "order": settings.order, **params},
                         settings)

    out = [make(SINGLE, base, split_at=None)]
    fitted = fitted_buckets(runtime, prompt_lens, lengths, base.max_model_len)
    if any(fitted):
        out.append(make(FITTED, base.with_buckets(runtime, *fitted), split_at=None))
    out += [make(f"split {cut}", base.replace(split_at=cut), split_at=cut) for cut in cuts]
    return out


def run_candidates(candidates: Sequence[Candidate], *, jobs: int,
                   log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Each candidate's outcome (sweep.run_candidate: reused when its folder finished)."""
    from neuron_batch.bench.sweep import run_all

    outcomes: dict[str, dict[str, Any]] = {}

    def record(c: Candidate, outcome: dict[str, Any]) -> None:
        outcomes[c.name] = outcome
        report = outcome.get("report")
        log(f"[{len(outcomes)}/{len(candidates)}] {c.name}: " + (
            f"{as_report(report).throughput.output_tokens_per_s:,.1f} out tok/s" if report
            else f"FAILED: {outcome.get('error')}"))

    run_all(candidates, jobs=jobs, record=record)
    return outcomes


def figures(name: str, params: dict[str, Any],
            report: Report | Mapping[str, Any]) -> dict[str, Any]:
    """One row: throughput, run and compile time, USD per million output tokens."""
    report = as_report(report)      # (an outcome holds the report's JSON)
    split = report.split or {}
    compile_s, usd_with_compile = compile_and_usd(report)
    elapsed = report.throughput.elapsed_s
    with_compile = (None if usd_with_compile is None
                    else per_million(usd_with_compile, report.tokens.output))
    layouts = [{k: p.get(k) for k in ("part", "max_model_len", "max_num_seqs", "requests",
                                      "output_tokens_per_s", "buckets")}
               for p in split.get("parts", [])]
    config = report.section("config")
    return {"name": name, **params,
            "output_tokens_per_s": report.throughput.output_tokens_per_s,
            "elapsed_s": elapsed, "estimated_compile_s": compile_s,
            "usd_per_million_output_tokens": or_none(
                report.section("cost").usd_per_million_output_tokens),
            "usd_per_million_with_compile": with_compile, "parts": layouts,
            "max_model_len": or_none(config.max_model_len),
            "max_num_seqs": or_none(config.max_num_seqs)}


def compare(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The best single layout, the best split, and the ratio of their throughputs."""
    singles = [r for r in rows if r.get("split_at") is None]
    splits = [r for r in rows if r.get("split_at") is not None]
    best = lambda group: max(group, key=lambda r: r["output_tokens_per_s"]) if group else None  # noqa: E731
    single, split = best(singles), best(splits)
    ratio = (split["output_tokens_per_s"] / single["output_tokens_per_s"]
             if single and split and single["output_tokens_per_s"] else None)
    for row in rows:
        row["ratio_to_best_single"] = (row["output_tokens_per_s"] / single["output_tokens_per_s"]
                                       if single and single["output_tokens_per_s"] else None)
    return {"best_single": single and single["name"], "best_split": split and split["name"],
            "ratio": ratio}


def format_comparison(rows: list[dict[str, Any]], verdict: dict[str, Any]) -> str:
    def money(value):
        return "-" if value is None else f"{value:,.2f}"

    lines = [f"{'configuration':16} {'out tok/s':>10} {'x best single':>13} {'run h':>7} "
             f"{'compile h':>9} {'$/M out':>8} {'$/M +compile':>12}"]
    for r in rows:
        compile_h = "-" if r["estimated_compile_s"] is None else \
            f"{r['estimated_compile_s'] / 3600:.2f}"
        ratio = "-" if r["ratio_to_best_single"] is None else f"{r['ratio_to_best_single']:.2f}x"
        lines.append(f"{r['name']:16} {r['output_tokens_per_s']:>10,.1f} {ratio:>13} "
                     f"{r['elapsed_s'] / 3600:>7.2f} {compile_h:>9} "
                     f"{money(r['usd_per_million_output_tokens']):>8} "
                     f"{money(r['usd_per_million_with_compile']):>12}")
        for part in r["parts"]:
            lines.append(f"    {part['part']}: {part['requests']:,} requests, "
                         f"{part['max_num_seqs']} slots of {part['max_model_len']:,}, "
                         f"{part['output_tokens_per_s']:,.1f} out tok/s")
    if verdict.get("ratio") is not None:
        lines.append(f"best split ({verdict['best_split']}) is {verdict['ratio']:.2f}x the best "
                     f"single layout ({verdict['best_single']}) in output tok/s")
    return "\n".join(lines)


def run_split_compare(spec: SweepSpec, out_dir: Path, *, log: Callable[[str], None]) -> int:
    """The spec's base against a split at each of its cuts (its mode SPLIT_COMPARE), written
    to `out_dir`. Each cut was validated with the spec; here each is checked against the
    workload's requests, which only the inputs tell."""
    from neuron_batch.job.workload import load_workload
    from neuron_batch.layout.split import check_split

    base, cuts = spec.base, spec.cuts
    if (out_dir / SPLIT_JSON).exists() and not spec.resume:
        raise RunError(f"{out_dir} already holds a split comparison; pass --resume to continue "
                       f"it, or choose another --output")
    workload = load_workload(base, log, command="bench")
    requests = workload.prepared.requests
    for cut in cuts:
        check_split(base.replace(split_at=cut), requests)
    out_dir.mkdir(parents=True, exist_ok=True)
    candidates = comparison_candidates(base, out_dir, cuts, workload.prompt_lengths(),
                                       [r.length for r in requests])
    log(f"{len(candidates)} configurations: {', '.join(c.name for c in candidates)}")
    started = time.monotonic()
    try:
        outcomes = run_candidates(candidates, jobs=spec.workers, log=log)
    except KeyboardInterrupt:
        log(f"interrupted: finished configurations are kept in {out_dir}; --resume continues")
        return EXIT_INTERRUPTED
    rows = [figures(c.name, c.params, outcomes[c.name]["report"]) for c in candidates
            if outcomes[c.name].get("report")]
    failed = {c.name: outcomes[c.name].get("error") for c in candidates
              if not outcomes[c.name].get("report")}
    verdict = compare(rows)
    write_json_atomic(out_dir / SPLIT_JSON, {
        "inputs": list(base.inputs), "num_requests": len(requests), "cuts": list(cuts),
        "configurations": rows, "failed": failed, **verdict,
        "wall_s": round(time.monotonic() - started, 1)})
    print(format_comparison(rows, verdict), flush=True)
    if failed:
        for name, error in failed.items():
            log(f"{name} failed: {error}")
        raise RunError(f"{len(failed)} configuration(s) failed; see {out_dir / SPLIT_JSON}")
    return EXIT_OK


def rerender_comparison(out_dir: Path) -> str:
    """The table of a finished comparison again (`neuron-batch report DIR`)."""
    data = json.loads((out_dir / SPLIT_JSON).read_text(encoding="utf-8"))
    return format_comparison(data["configurations"], data)
