"""A plan's results: plan.json, plan.csv, the ranked table, the recommendation in words and
the command lines that reproduce it. Pure Python apart from the plot (plot.py, matplotlib).
"""

from __future__ import annotations

import csv
import json
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from neuron_batch.bench.command_line import run_command
from neuron_batch.bench.deadline import format_hours
from neuron_batch.bench.sweep_files import _jsonable
from neuron_batch.job.folder import write_json_atomic
from neuron_batch.plan.candidates import Option
from neuron_batch.plan.plan_job import PLAN_JSON, PlanJob, layout_settings, option_settings
from neuron_batch.plan.search import objective_key
from neuron_batch.plan.words import late_words, recommendation_words
from neuron_batch.report.cost import per_million

PLAN_CSV, PLAN_PNG = "plan.csv", "plan_cost_vs_time.png"
CSV_COLUMNS = ("rank", "name", "status", "instance", "num_instances", "replicas",
               "tensor_parallel_size", "runtime", "max_model_len", "max_num_seqs",
               "prefill_buckets", "decode_buckets", "attention_buckets", "split_at",
               "split_max_num_seqs", "kv_reserve", "hours",
               "compile_hours", "price_per_hour_usd", "usd",
               "usd_per_million_output_tokens", "output_tokens_per_s",
               "replica_output_tokens_per_s", "share_requests", "meets_deadline",
               "hours_at_least", "usd_at_least", "reason", "prefix_caching", "order",
               "hit_fraction", "command")


def _split_fields(option: Option) -> dict[str, Any] | None:
    """A split option's short layout (splits.py), or None for a single layout."""
    layout = option.split
    if layout is None:
        return None
    # the lists the run fitted to its short requests, once simulated
    parts = (option.result or {}).get("split_parts") or [{}]
    return {"split_at": layout.cut, "max_model_len": layout.cut,
            "max_num_seqs": layout.max_num_seqs, "requests": layout.requests,
            "share_requests": option.share_size, "graphs": layout.num_graphs,
            "buckets": parts[0].get("buckets"), "compile_hours": layout.compile_s / 3600.0}


class PlanWriter:
    """Turns the options (as results come in) into the plan's files and text."""

    def __init__(self, job: PlanJob, options: Sequence[Option], excluded: Sequence[str], *,
                 workload_output_tokens: int, num_requests: int,
                 prefix_cache: dict[str, int] | None = None):
        self.job = job
        self.prefix_cache = prefix_cache      # the job's prompt and bound tokens
        self.options = list(options)
        self.excluded = list(excluded)
        self.output_tokens = workload_output_tokens
        self.num_requests = num_requests
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S")

    # -- records ------------------------------------------------------------------------------
    def ranked(self) -> list[Option]:
        done = [o for o in self.options if o.result and o.result.get("replica_s") is not None]
        return sorted(done, key=lambda o: (self.key(o), o.name))

    def key(self, option: Option) -> tuple[Any, ...]:
        assert option.result is not None, "ranked: simulated options only"
        seconds = option.result["replica_s"]
        return objective_key(option.hours_for(seconds), option.usd_for(seconds),
                             self.job.deadline.hours)

    def describe(self, option: Option) -> dict[str, Any]:
        """The option's fixed part: layout, configuration, price, bounds, command lines."""
        price = option.placement.price
        return {
            "name": option.name, "instance": option.instance,
            "num_instances": option.num_instances, "replicas": option.replicas,
            "total_replicas": option.total_replicas, "tensor_parallel_size": option.tp,
            "runtime": option.runtime.name, "max_model_len": option.max_model_len,
            "max_num_seqs": option.max_num_seqs, "prefill_buckets": list(option.prefill_buckets),
            "decode_buckets": list(option.decode_buckets),
            "attention_buckets": list(option.attention_buckets),
            "kv_reserve": ("n/a (static KV cache)" if option.runtime.static_kv
                           else self.job.spec.kv_reserve),
            "compile_hours": option.compile_s / 3600.0, "pricing": price.pricing,
            "price_per_hour_usd": price.per_hour_usd, "share_requests": option.share_size,
            "hours_at_least": option.hours_bound, "usd_at_least": option.usd_bound,
            "split": _split_fields(option),
            "prefix_caching": option.prefix_caching,
            "order": str(option.order or self.job.base.order),
            "command": run_command(option_settings(self.job.base, option, None)),
            "layout_command": run_command(layout_settings(self.job.base, option)),
        }

    def record(self, option: Option, rank: int | None = None) -> dict[str, Any]:
        out = self.describe(option)
        result = option.result or {}
        seconds = result.get("replica_s")
        if seconds is None:
            if result:
                out.update(status="failed", reason=result.get("error"))
            elif option.skip_reason:
                out.update(status="skipped", reason=option.skip_reason)
            elif option.pruned_by:
                out.update(status="pruned", reason=f"its bounds cannot beat {option.pruned_by}")
            else:
                out.update(status="not run", reason="the plan stopped before it")
            return out
        hours, cost = option.hours_for(seconds), option.usd_for(seconds)
        out.update(
            rank=rank, status="simulated", hours=hours, run_hours=seconds / 3600.0, usd=cost,
            usd_per_million_output_tokens=per_million(cost, self.output_tokens),
            output_tokens_per_s=self.output_tokens / seconds if seconds else None,
            replica_output_tokens_per_s=result.get("replica_output_tokens_per_s"),
            meets_deadline=hours <= self.job.deadline.hours,
            hours_to_spare=self.job.deadline.hours - hours,
            hit_fraction=(result.get("prefix") or {}).get("hit_fraction"),
            run_dir=result.get("run_dir"), simulation_wall_s=result.get("wall_s"),
            simulation_cpu_s=result.get("cpu_s"))
        return out

    def data(self, wall_s: float | None, complete: bool) -> dict[str, Any]:
        ranked = self.ranked()
        records = [self.record(o, rank) for rank, o in enumerate(ranked, 1)]
        others = [self.record(o) for o in self.options if o not in ranked]
        base, spec = self.job.base, self.job.spec
        meta = {
            "inputs": list(base.inputs), "num_requests": self.num_requests,
            "output_tokens": self.output_tokens, "architecture": spec.architecture,
            "weight_dtype": spec.weight_dtype, "max_model_len": spec.max_model_len,
            "max_num_batched_tokens": spec.max_num_batched_tokens, "limit": base.limit,
            "seed": base.seed, "deadline": self.job.deadline.to_dict(),
            "instances": list(spec.instances), "max_num_instances": spec.max_num_instances,
            "max_num_seqs_values": list(spec.seqs_values),
            "max_prefill_buckets": spec.max_prefill_buckets, "compiled": spec.compiled,
            "kv_reserve": spec.kv_reserve, "pricing": spec.pricing,
            **({"runtimes": list(spec.runtimes)} if spec.runtimes else {}),
            "prices_given": dict(spec.prices), "jobs": self.job.jobs,
            "started": self.started, "wall_s": wall_s, "complete": complete,
            "main_process_cpu_s": round(time.process_time(), 1),
            "num_options": len(self.options), "num_simulated_options": len(ranked),
            "num_simulations": len({o.sim_key for o in ranked}),
            "num_pruned": sum(1 for r in others if r["status"] == "pruned"),
            "num_skipped": sum(1 for r in others if r["status"] == "skipped"),
            "excluded": self.excluded, "prefix_cache": self.prefix_cache,
        }
        return {"meta": meta, "options": records, "not_simulated": others,
                "recommendation": records[0] if records else None}

    # -- files and text -----------------------------------------------------------------------
    def write(self, *, wall_s: float | None = None, complete: bool, plot: bool = False) -> str:
        data = _jsonable(self.data(wall_s, complete))
        out = self.job.out_dir
        write_json_atomic(out / PLAN_JSON, data)
        write_csv(data, out / PLAN_CSV)
        text = format_plan(data)
        if plot and data["options"]:
            from neuron_batch.plan.plot import write_plot

            path = write_plot(data, out / PLAN_PNG)
            text += f"\nplot: {path}\nfiles: {out / PLAN_JSON}, {out / PLAN_CSV}\n"
        return text


def rerender_plan(folder: Path) -> str:
    """`neuron-batch report DIR` of a plan folder: its table and recommendation again."""
    return format_plan(json.loads((folder / PLAN_JSON).read_text(encoding="utf-8")))


def write_csv(data: dict[str, Any], path: str | Path) -> None:
    rows = data["options"] + data["not_simulated"]
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            split = row.get("split") or {}
            row = {**row, "split_at": split.get("split_at"),
                   "split_max_num_seqs": split.get("max_num_seqs")}
            writer.writerow({k: (",".join(map(str, v)) if isinstance(v, list) else
                                 "" if v is None else v) for k, v in row.items()})


# -- text ---------------------------------------------------------------------------------------

_HEADERS = ("#", "instance", "n", "replicas", "S", "L", "prefill buckets", "hours",
            "compile", "USD", "$/M out", "deadline")


def format_plan(data: dict[str, Any]) -> str:
    meta, rows = data["meta"], data["options"]
    deadline = meta["deadline"]
    lines = [f"neuron-batch plan: {meta['num_requests']:,} requests, {meta['architecture']}, "
             f"deadline {deadline['text']} ({format_hours(deadline['hours'])}); "
             f"{meta['num_options']} options, {meta['num_simulated_options']} simulated "
             f"({_plural(meta['num_simulations'], 'run')}), {meta['num_pruned']} pruned by "
             f"their bounds, "
             f"{meta['num_skipped']} skipped"]
    if rows:
        body = [[str(r["rank"]), r["instance"], str(r["num_instances"]),
                 f"{r['replicas']}xTP{r['tensor_parallel_size']}", _two(r, "max_num_seqs"),
                 _two(r, "max_model_len"),
                 ",".join(map(str, r["prefill_buckets"])), f"{r['hours']:.2f}",
                 f"{r['compile_hours']:.2f}", f"{r['usd']:,.2f}",
                 f"{r['usd_per_million_output_tokens']:,.2f}",
                 "meets" if r["meets_deadline"] else f"{late_words(-r['hours_to_spare'])} late"]
                for r in rows]
        headers: tuple[str, ...] = _HEADERS
        if any(r.get("prefix_caching") for r in rows):     # weighed on and off: say which
            headers = (*_HEADERS, "cache")
            for cells, r in zip(body, rows):
                cells.append(f"on, {r.get('order')}" if r.get("prefix_caching") else "off")
        several = len({r.get("runtime") for r in rows}) > 1 or len(meta.get("runtimes") or ()) > 1
        if several:                             # (--runtimes: say which each option uses)
            headers = (*headers, "runtime")
            for cells, r in zip(body, rows):
                cells.append(str(r.get("runtime")))
        widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(headers)]
        left = {1, 3, 6, 11, 12, 13}

        def line(cells: Sequence[str]) -> str:
            return ("  " + "  ".join(c.ljust(w) if i in left else c.rjust(w)
                                     for i, (c, w) in enumerate(zip(cells, widths)))).rstrip()
        lines += [line(headers), *(line(b) for b in body)]
        lines.append("  n = instances; replicas per instance x TP degree; S = max_num_seqs "
                     "(also the one decode bucket); L = max_model_len; prefill buckets are "
                     "context-encoding buckets on inf2/trn1 (nxdi); hours include the "
                     "start-up (compile: tracing, compiling and loading the graphs"
                     + ("; --compiled: loading only)" if meta.get("compiled") else ")"))
        if len(headers) > len(_HEADERS):
            lines.append("  cache = prefix caching on (in the order named; name ends +PC) or off")
        split = next((cells for cells, r in zip(body, rows) if r.get("split")), None)
        if split is not None:       # (the first split row's own figures as the example)
            lines.append(f"  S and L as {split[4]} and {split[5]}: a job split by length, the "
                         f"short layout first (run --split-at); prefill buckets are the long "
                         f"one's")
    lines += _closest_not_simulated(data)
    lines.append("")
    for paragraph in recommendation_words(data):
        # command lines stay whole (to copy); sentences wrap at 100 columns
        lines += ([paragraph] if paragraph.startswith("  ") or not paragraph
                  else textwrap.wrap(paragraph, 100))
    return "\n".join(lines) + "\n"


def _two(row: dict[str, Any], key: str) -> str:
    """A column's value, as short+long for a split option."""
    value = str(row.get(key, ""))
    return f"{row['split'][key]}+{value}" if row.get("split") else value


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _closest_not_simulated(data: dict[str, Any], count: int = 5) -> list[str]:
    """The pruned options that came nearest, with their lower bounds: what was ruled out."""
    deadline_h = data["meta"]["deadline"]["hours"]
    pruned = sorted((r for r in data["not_simulated"] if r["status"] == "pruned"),
                    key=lambda r: (objective_key(r["hours_at_least"], r["usd_at_least"],
                                                 deadline_h), r["name"]))
    if not pruned:
        return []
    lines = [f"  closest of the {len(pruned)} pruned options (lower bounds, never simulated):"]
    for r in pruned[:count]:
        lines.append(f"    {r['name']}: at least {r['hours_at_least']:.2f} h and "
                     f"${r['usd_at_least']:,.2f}")
    return lines
