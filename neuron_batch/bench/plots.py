"""Figures of a bucket sweep (`neuron-batch bench --sweep-buckets`), as PNG files.

- `plot_throughput_vs_graphs` (in `plot_front.py`): output throughput against compile cost,
  Pareto front as a step.
- `plot_padding_waste`: prefill and decode padding waste per configuration.
- `plot_time_per_state`: seconds per scheduler state per configuration.
- `plot_prompt_histogram`: the workload's prompt lengths with the bucket edges of a few configs.
- `write_all`: all of them into one folder.

The rows are `ranking.rank()`'s; the figure plumbing is `figure.py`'s. matplotlib (the `plot`
extra) is imported inside the functions, so importing this module costs nothing and works
without it. The figures are built
as `matplotlib.figure.Figure` objects on the Agg canvas, never through pyplot: nothing touches
pyplot's global figure registry or the backend a caller's session uses, and each figure is
cleared once written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from neuron_batch.bench.figure import (
    ATTENTION_COLOUR,
    DECODE_COLOUR,
    IDLE_COLOUR,
    PREFILL_COLOUR,
    bar_height,
    bar_labels,
    bar_ylabel,
    embolden_labels,
    new_figure,
    ordered_rows,
    placeholder_figure,
    save_figure,
    thousands_axis,
)
from neuron_batch.bench.number_words import abbreviate_buckets
from neuron_batch.bench.plot_front import plot_throughput_vs_graphs
from neuron_batch.bench.ranking import DEFAULT_NAME, pareto_front
from neuron_batch.bench.recommendation import recommend
from neuron_batch.runtimes.runtime import Runtime, default_runtime, runtime_of

#: Most configurations `plot_prompt_histogram` draws bucket edges for (more is unreadable).
MAX_BUCKET_SETS = 5
FILE_NAMES = {"throughput": "throughput_vs_graphs.png", "waste": "padding_waste.png",
              "states": "time_per_state.png", "prompts": "prompt_lengths.png"}

_BUCKET_STYLES = (("#c0392b", "-"), ("#2a9d5c", "--"), ("#7b3fa0", "-."), ("#d68910", ":"),
                  ("#1f618d", (0, (5, 1, 1, 1, 1, 1))))
_STATE_PARTS = (("ACTIVE_PREFILL", "prefill", PREFILL_COLOUR),
                ("ACTIVE_DECODE", "decode", DECODE_COLOUR),
                ("IDLE", "idle", IDLE_COLOUR))


# -- padding waste ----------------------------------------------------------------------------

def waste_series(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """(row key of the waste, legend words, row key of the bucket list) per bar of
    padding_waste.png: the waste each of the runtime's swept bucket lists changes (nxdi:
    context-encoding padding and the KV every slot attends at its token-generation bucket but
    does not hold; vllm-neuron: chunk padding, padded decode slots, and with decode
    context-length sets the KV read but not held)."""
    runtime = runtime_of(rows[0] if rows else None)
    return [(f"{option.padding}_waste", f"{option.label}: {option.waste}", f"{name}_buckets")
            for name, option in runtime.dimensions
            if any(row.get(f"{name}_buckets") for row in rows)]


def plot_padding_waste(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Grouped horizontal bars: the padding waste (%) each bucket list of the runtime causes,
    per configuration, fastest at the top; each bar names its bucket set."""
    title = "Padding waste per configuration, by bucket list"
    if not rows:
        return placeholder_figure(path, title, "no configuration finished: nothing to plot")
    rows = ordered_rows(rows)
    series = waste_series(rows)
    figure = new_figure(11, bar_height(len(rows)) * max(1.0, len(series) / 2))
    ax = figure.add_subplot()
    count = len(rows)
    positions = list(range(count))[::-1]    # fastest on top
    height = 0.76 / max(1, len(series))
    colours = (PREFILL_COLOUR, DECODE_COLOUR, ATTENTION_COLOUR)
    top = 1.0
    for index, (key, words, buckets_key) in enumerate(series):
        offset = (len(series) - 1) / 2 - index
        values = [100.0 * float(row.get(key) or 0.0) for row in rows]
        top = max([top, *values])
        bars = ax.barh([p + offset * height for p in positions], values, height=height,
                       color=colours[index % len(colours)], label=words)
        labels = [("n/a" if row.get(key) is None else f"{value:.0f}%")
                  + f"  {abbreviate_buckets(row.get(buckets_key), 24)}"
                  for row, value in zip(rows, values)]
        ax.bar_label(bars, labels=labels, padding=3, fontsize=7)
    ax.set_yticks(positions, bar_labels(rows))
    embolden_labels(ax, rows, {rows[0]["name"], DEFAULT_NAME})
    ax.set_xlim(0, top * 1.5 + 12)         # room for the labels beside the bars
    ax.set_xticks([tick for tick in range(0, 101, 10) if tick <= top * 1.1 + 10])
    ax.set_ylim(-0.7, count - 0.3)
    ax.set_xlabel("padding waste (% of the padded work that was padding)")
    ax.set_ylabel(bar_ylabel(len(rows)))
    ax.set_title(title + " (lower is better)", pad=14 + 12 * len(series))
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    # Above the bars, never over them (a bar can reach any corner).
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=1, fontsize=9, frameon=False)
    return save_figure(figure, path)


# -- time per state ---------------------------------------------------------------------------

def plot_time_per_state(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Stacked horizontal bars: seconds in prefill, decode and idle per configuration, fastest
    at the top; segments wide enough carry their share of the run."""
    title = "Where the time goes: seconds per scheduler state"
    if not rows:
        return placeholder_figure(path, title, "no configuration finished: nothing to plot")
    rows = ordered_rows(rows)
    figure = new_figure(10, bar_height(len(rows)))
    ax = figure.add_subplot()
    positions = list(range(len(rows)))[::-1]
    totals = [sum(float(v) for v in (row.get("state_seconds") or {}).values()) for row in rows]
    longest = max(totals + [1e-9])
    left = [0.0] * len(rows)
    for state, word, colour in _STATE_PARTS:
        seconds = [float((row.get("state_seconds") or {}).get(state, 0.0)) for row in rows]
        bars = ax.barh(positions, seconds, left=left, height=0.62, color=colour, label=word,
                       edgecolor="white", linewidth=0.6)
        labels = [f"{value / total * 100:.0f}%" if total and value / longest >= 0.06 else ""
                  for value, total in zip(seconds, totals)]
        ax.bar_label(bars, labels=labels, label_type="center", fontsize=8,
                     color="black" if state == "IDLE" else "white")
        left = [a + b for a, b in zip(left, seconds)]
    for position, total in zip(positions, totals):
        ax.text(total + longest * 0.01, position, f"{total:,.0f} s" if total >= 100
                else f"{total:,.1f} s", va="center", fontsize=8)
    ax.set_yticks(positions, bar_labels(rows))
    embolden_labels(ax, rows, {rows[0]["name"], DEFAULT_NAME})
    ax.set_xlim(0, longest * 1.12)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    thousands_axis(ax.xaxis)
    ax.set_xlabel("time (s)")
    ax.set_ylabel(bar_ylabel(len(rows)))
    ax.set_title(title, loc="left")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=3, fontsize=9,
              frameon=False, borderaxespad=0.2)
    return save_figure(figure, path)


# -- prompt lengths and bucket edges ----------------------------------------------------------

def prompt_words(runtime: Runtime | None,
                 max_num_batched_tokens: int | None) -> tuple[str, str | None]:
    """(title, legend of the max_num_batched_tokens line or None) of prompt_lengths.png, in the
    runtime's words (None: the default one): under nxdi a prompt is never chunked, so the
    token budget is no line."""
    runtime = runtime or default_runtime()
    title = (f"Workload prompt lengths and {runtime.prefill.short} bucket edges ({runtime.name}: "
             f"{runtime.prefill_words})")
    if not (max_num_batched_tokens and runtime.chunked_prefill):
        return title, None
    return title, (f"max_num_batched_tokens = {max_num_batched_tokens:,} "
                   f"({runtime.prefill_words})")


def _length_axes(ax, log_x: bool, x_min: float, x_max: float) -> float:
    """The histogram's axes (log x when asked, thousands' separators); the y axis's top, with
    headroom for the bucket edges' markers."""
    if log_x:
        from matplotlib.ticker import LogLocator, NullFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_minor_formatter(NullFormatter())
    thousands_axis(ax.xaxis)
    thousands_axis(ax.yaxis)
    ax.set_xlim(x_min, x_max)
    y_top = float(ax.get_ylim()[1] * 1.3)
    ax.set_ylim(0, y_top)
    return y_top


def _draw_bucket_edges(ax, sets: list[tuple[str, list[int]]], lengths, y_top: float) -> None:
    """Each configuration's bucket edges as vertical lines in its own colour and style, topped
    by a marker at its own height (shared edges stay distinguishable), its legend entry saying
    how many buckets and what share of prompts lie past its largest."""
    for index, (name, buckets) in enumerate(sets):
        colour, style = _BUCKET_STYLES[index % len(_BUCKET_STYLES)]
        height = y_top * (0.96 - 0.05 * index)
        label = f"{name}: {abbreviate_buckets(buckets, 34)}"
        if buckets:
            beyond = float((lengths > buckets[-1]).mean())
            label += (f" ({len(buckets)} bucket{'s' if len(buckets) != 1 else ''}; "
                      f"{_share(beyond)} of prompts > {buckets[-1]:,})")
        ax.vlines(buckets, 0, height, colors=colour, linestyles=style, linewidth=1.6,
                  alpha=0.9, zorder=3, label=label)
        ax.scatter(buckets, [height] * len(buckets), marker="v", s=40, color=colour, zorder=4)


def plot_prompt_histogram(prompt_lengths: Sequence[int],
                          bucket_sets: Mapping[str, Sequence[int] | str] | None,
                          path: str | Path, max_num_batched_tokens: int | None = None,
                          runtime: Runtime | None = None) -> Path:
    """Histogram of the workload's prompt lengths (log x when they span a wide range) with the
    prefill bucket edges (nxdi: context-encoding) of a few named configurations as vertical
    lines (the first `MAX_BUCKET_SETS`), each in its own colour and style, topped by a marker
    at its own height so shared edges stay distinguishable."""
    import numpy as np

    title, budget_label = prompt_words(runtime, max_num_batched_tokens)
    if budget_label is None:
        max_num_batched_tokens = None
    lengths = np.asarray([int(n) for n in prompt_lengths if n is not None and int(n) > 0])
    if lengths.size == 0:
        return placeholder_figure(path, title, "no prompt lengths to plot")
    sets = [(str(name), _as_buckets(buckets))
            for name, buckets in list((bucket_sets or {}).items())[:MAX_BUCKET_SETS]]
    edges_all = [b for _, buckets in sets for b in buckets]
    high = int(lengths.max())
    # A few very short prompts would stretch a log axis over empty decades; they all pad to
    # the smallest bucket anyway, so the axis starts near the 0.5th percentile (or the
    # smallest bucket edge, if lower) and the figure says how many prompts lie left of it.
    p_low = float(np.percentile(lengths, 0.5))
    low = max(1.0, min([p_low, *edges_all]))
    span_high = max([high, *edges_all, max_num_batched_tokens or 0])
    log_x = span_high / low > 30

    figure = new_figure(11, 6.4)
    ax = figure.add_subplot()
    if log_x:
        x_min, x_max = low / 1.3, span_high * 1.3
        bins = np.geomspace(low / 1.3, high + 1, 64)
    else:
        x_min, x_max = 0.0, span_high * 1.04
        bins = np.linspace(int(lengths.min()), high + 1, 64)
    shown = lengths[lengths >= bins[0]]
    left_out = int(lengths.size - shown.size)
    ax.hist(shown, bins=bins, color="#9fb7cf", edgecolor="white", linewidth=0.4,
            label="prompts", zorder=2)
    y_top = _length_axes(ax, log_x, x_min, x_max)

    if max_num_batched_tokens:
        ax.axvline(max_num_batched_tokens, color="black", linewidth=5, alpha=0.18, zorder=2.5,
                   label=budget_label)
    _draw_bucket_edges(ax, sets, lengths, y_top)

    p50, p90, p99 = (float(np.percentile(lengths, q)) for q in (50, 90, 99))
    stats = (f"{lengths.size:,} prompts: median {p50:,.0f}, p90 {p90:,.0f}, p99 {p99:,.0f}, "
             f"max {high:,} tokens")
    if left_out:
        stats += f"; {left_out:,} shorter than {bins[0]:,.0f} not shown"
    ax.set_title(f"{title}\n{stats}", fontsize=11)
    ax.set_xlabel("prompt length (tokens" + (", log scale)" if log_x else ")"))
    ax.set_ylabel("prompts per bin")
    ax.grid(True, axis="y", alpha=0.3, zorder=0)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=9, frameon=False,
              ncols=1 if len(sets) < 3 else 2)
    return save_figure(figure, path)


def _share(fraction: float) -> str:
    percent = fraction * 100
    if percent == 0 or percent >= 10:
        return f"{percent:.0f}%"
    return f"{percent:.1f}%"


def _as_buckets(buckets: Sequence[int] | str) -> list[int]:
    if isinstance(buckets, str):
        return sorted(int(part) for part in buckets.replace(" ", ",").split(",") if part)
    return sorted(int(b) for b in buckets)


def default_bucket_sets(rows: Sequence[Mapping[str, Any]],
                        recommendation: Mapping[str, Any] | None = None
                        ) -> dict[str, list[int]]:
    """The prefill buckets worth drawing over the prompts: the fastest, the default, the best
    per graph and the cheapest Pareto configuration (each once, at most `MAX_BUCKET_SETS`)."""
    if not rows:
        return {}
    recommendation = recommendation or recommend([dict(row) for row in rows])
    by_name = {row["name"]: row for row in rows}
    wanted = [recommendation.get("fastest"), DEFAULT_NAME, recommendation.get("best_per_graph"),
              *(recommendation.get("pareto") or [])[:1]]
    sets: dict[str, list[int]] = {}
    for name in wanted:
        if name in by_name and name not in sets and len(sets) < MAX_BUCKET_SETS:
            sets[name] = list(by_name[name].get("prefill_buckets") or [])
    return sets


# -- all of them ------------------------------------------------------------------------------

def write_all(rows: Sequence[Mapping[str, Any]], front: Sequence[Mapping[str, Any]] | None,
              prompt_lengths: Sequence[int] | None,
              bucket_sets: Mapping[str, Sequence[int] | str] | None,
              out_dir: str | Path, runtime: Runtime | None = None) -> list[Path]:
    """Every figure into `out_dir` (created if missing); returns the paths written.

    With no finished configuration the three per-configuration figures are left out; without
    prompt lengths the histogram is. `front` None: computed here; `bucket_sets` None: the
    fastest, default, best-per-graph and cheapest Pareto configurations. The histogram marks
    max_num_batched_tokens when every configuration has the same one and the runtime chunks
    prompts (`runtime` None: the rows')."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if rows:
        if front is None:
            front = pareto_front(list(rows))
        written.append(plot_throughput_vs_graphs(rows, front, out / FILE_NAMES["throughput"]))
        written.append(plot_padding_waste(rows, out / FILE_NAMES["waste"]))
        written.append(plot_time_per_state(rows, out / FILE_NAMES["states"]))
    if prompt_lengths is not None and len(prompt_lengths):
        if bucket_sets is None:
            bucket_sets = default_bucket_sets(rows)
        budgets = {row.get("max_num_batched_tokens") for row in rows}
        budget = budgets.pop() if len(budgets) == 1 else None
        if runtime is None and rows:
            runtime = runtime_of(rows[0])
        written.append(plot_prompt_histogram(
            prompt_lengths, bucket_sets, out / FILE_NAMES["prompts"],
            max_num_batched_tokens=int(budget) if budget else None, runtime=runtime))
    return written
