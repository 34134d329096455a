"""Figures of a bucket sweep (`neuron-batch bench --sweep-buckets`), as PNG files.

- `plot_throughput_vs_graphs`: output throughput against compile cost, Pareto front as a step.
- `plot_padding_waste`: prefill and decode padding waste per configuration.
- `plot_time_per_state`: seconds per scheduler state per configuration.
- `plot_prompt_histogram`: the workload's prompt lengths with the bucket edges of a few configs.
- `write_all`: all of them into one folder.

The rows are `ranking.rank()`'s. matplotlib (the `plot` extra) is imported inside the
functions, so importing this module costs nothing and works without it. The figures are built
as `matplotlib.figure.Figure` objects on the Agg canvas, never through pyplot: nothing touches
pyplot's global figure registry or the backend a caller's session uses, and each figure is
cleared once written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from neuron_batch.bench.ranking import (
    COST_COMPILE_S,
    DEFAULT_NAME,
    cost_key_for,
    pareto_front,
)
from neuron_batch.bench.verdict import recommend
from neuron_batch.bench.words import abbreviate_buckets

DPI = 120
#: Most configurations `plot_prompt_histogram` draws bucket edges for (more is unreadable).
MAX_BUCKET_SETS = 5
FILE_NAMES = {"throughput": "throughput_vs_graphs.png", "waste": "padding_waste.png",
              "states": "time_per_state.png", "prompts": "prompt_lengths.png"}

_PREFILL_COLOUR, _DECODE_COLOUR, _IDLE_COLOUR = "#3b75af", "#ef8636", "#b8b8b8"
_POINT_COLOUR, _FRONT_COLOUR, _FASTEST_COLOUR = "#8c9fb5", "#2a9d5c", "#c0392b"
_BUCKET_STYLES = (("#c0392b", "-"), ("#2a9d5c", "--"), ("#7b3fa0", "-."), ("#d68910", ":"),
                  ("#1f618d", (0, (5, 1, 1, 1, 1, 1))))
_STATE_PARTS = (("ACTIVE_PREFILL", "prefill", _PREFILL_COLOUR),
                ("ACTIVE_DECODE", "decode", _DECODE_COLOUR),
                ("IDLE", "idle", _IDLE_COLOUR))


# -- figure plumbing --------------------------------------------------------------------------

def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI, format="png", facecolor="white")
    figure.clear()
    return path


def _empty(path: str | Path, title: str, message: str) -> Path:
    figure = _figure(8, 3)
    ax = figure.add_subplot()
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, transform=ax.transAxes)
    ax.set_axis_off()
    return _save(figure, path)


def _thousands(axis) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))


def _ordered(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Fastest first (rank order; rows without a rank after, by throughput)."""
    return sorted(rows, key=lambda row: (row.get("rank") is None, row.get("rank") or 0,
                                         -float(row.get("output_tokens_per_s") or 0.0)))


def _bar_labels(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return [f"#{row['rank']} {row['name']}" if row.get("rank") else str(row["name"])
            for row in rows]


def _embolden(ax, rows: Sequence[Mapping[str, Any]], names: set[str]) -> None:
    for label, row in zip(ax.get_yticklabels(), rows):
        if row["name"] in names:
            label.set_fontweight("bold")


def _bar_height(count: int) -> float:
    return 1.6 + 0.42 * max(count, 3)


def _bar_ylabel(count: int) -> str:
    return "configuration (fastest at top)" if count > 3 else "configuration"


# -- throughput against compile cost ----------------------------------------------------------

def plot_throughput_vs_graphs(rows: Sequence[Mapping[str, Any]],
                              front: Sequence[Mapping[str, Any]] | None,
                              path: str | Path) -> Path:
    """Scatter of output tok/s against compiled graphs, the Pareto front as a step line, every
    point named, the fastest (and the default) highlighted.

    The x-axis is compiled graphs; when the front was taken on estimated compile time
    (`front.cost_key`), a top axis gives the estimate in minutes if it is proportional to the
    graphs, else the x-axis is the estimate itself.
    """
    title = "Output throughput vs compile cost"
    if not rows:
        return _empty(path, title, "no configuration finished: nothing to plot")
    if front is None:
        front = pareto_front(rows)
    cost_key = getattr(front, "cost_key", None) or cost_key_for(rows)
    rows = _ordered(rows)
    fastest = rows[0]

    per_graph = {row[COST_COMPILE_S] / row["compiled_graphs"] for row in rows
                 if row.get(COST_COMPILE_S) is not None and row["compiled_graphs"]}
    minutes_axis = cost_key == COST_COMPILE_S
    proportional = minutes_axis and len(per_graph) == 1 and all(
        row["compiled_graphs"] for row in rows)
    if minutes_axis and not proportional:
        def x_of(row):
            return row[COST_COMPILE_S] / 60.0
        xlabel = "estimated compile time (min)"
    else:
        def x_of(row):
            return float(row["compiled_graphs"])
        xlabel = "compiled graphs (prefill + decode buckets)"

    figure = _figure(10, 6.2)
    ax = figure.add_subplot()
    xs = [x_of(row) for row in rows]
    ys = [float(row["output_tokens_per_s"]) for row in rows]
    front_ids = {id(row) for row in front}
    front_names = {row["name"] for row in front}
    on_front = [id(row) in front_ids or (row["name"] in front_names) for row in rows]

    for wanted, size, colour, label, order in ((False, 46, _POINT_COLOUR, "configuration", 3),
                                               (True, 60, _FRONT_COLOUR, "on the Pareto front",
                                                4)):
        chosen = [(x, y) for x, y, row, front_row in zip(xs, ys, rows, on_front)
                  if front_row == wanted and row is not fastest]
        if chosen:
            ax.scatter([x for x, _ in chosen], [y for _, y in chosen], s=size, color=colour,
                       edgecolor="white", linewidth=0.8, zorder=order, label=label)
    ax.scatter([x_of(fastest)], [fastest["output_tokens_per_s"]], s=260, marker="*",
               color=_FASTEST_COLOUR, edgecolor="black", linewidth=0.6, zorder=5,
               label=f"fastest: {fastest['name']}")
    default = next((row for row in rows if row["name"] == DEFAULT_NAME), None)
    if default is not None and default is not fastest:
        ax.scatter([x_of(default)], [default["output_tokens_per_s"]], s=110, marker="D",
                   facecolor="none", edgecolor="black", linewidth=1.4, zorder=6,
                   label="default")

    # Limits first (room for labels), then the front drawn to the right edge.
    x_low, x_high = min(xs), max(xs)
    x_pad = max((x_high - x_low) * 0.08, 1.0 if not minutes_axis or proportional else 0.5)
    y_low, y_high = min(ys), max(ys)
    y_pad = max((y_high - y_low) * 0.12, y_high * 0.03, 1.0)
    ax.set_xlim(max(0.0, x_low - x_pad), x_high + x_pad)
    ax.set_ylim(max(0.0, y_low - y_pad), y_high + y_pad)
    points = sorted(((x_of(row), float(row["output_tokens_per_s"])) for row in front))
    if points:
        step_x = [x for x, _ in points] + [ax.get_xlim()[1]]
        step_y = [y for _, y in points] + [points[-1][1]]
        cost_words = "est. compile time" if cost_key == COST_COMPILE_S else "graphs"
        ax.step(step_x, step_y, where="post", color=_FRONT_COLOUR, linewidth=1.6, alpha=0.8,
                zorder=2, label=f"Pareto front (throughput vs {cost_words})")

    if not (minutes_axis and not proportional):
        from matplotlib.ticker import MaxNLocator, MultipleLocator

        ax.xaxis.set_major_locator(MultipleLocator(1) if x_high - x_low <= 8
                                   else MaxNLocator(integer=True))
    if proportional:
        seconds_per_graph = per_graph.pop()
        top = ax.secondary_xaxis("top", functions=(
            lambda g: g * seconds_per_graph / 60.0, lambda m: m * 60.0 / seconds_per_graph))
        top.set_xlabel("estimated compile time (min)")
    _thousands(ax.yaxis)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("output throughput (tokens/s)")
    ax.set_title(f"{title}: {len(rows)} configuration{'s' if len(rows) != 1 else ''}")
    ax.grid(True, alpha=0.3, zorder=0)
    handles, labels = ax.get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3),
                  fontsize=9, frameon=False)

    importance = sorted(range(len(rows)), key=lambda i: (
        rows[i] is not fastest, rows[i] is not default, not on_front[i], i))
    step = list(zip(step_x, step_y)) if points else []
    _label_points(figure, ax, [(xs[i], ys[i], rows[i]["name"],
                                rows[i] is fastest or rows[i] is default) for i in importance],
                  step)
    return _save(figure, path)


def _label_points(figure, ax, points: Sequence[tuple[float, float, str, bool]],
                  step: Sequence[tuple[float, float]] = ()) -> None:
    """Name every point, each label at the first nearby spot that overlaps no other label, no
    point, no segment of the `step` line (x, y vertices of a where="post" step) and no legend
    inside the axes (a leader line when it had to move further out)."""
    from matplotlib.transforms import Bbox

    figure.canvas.draw()   # settle the layout: label positions below are in final pixels
    renderer = figure.canvas.get_renderer()
    axes_box = ax.get_window_extent(renderer)
    taken = []
    legend = ax.get_legend()
    if legend is not None:
        taken.append(legend.get_window_extent(renderer).expanded(1.02, 1.05))
    radius = 7
    for x, y in ((p[0], p[1]) for p in points):
        px, py = ax.transData.transform((x, y))
        taken.append(Bbox.from_extents(px - radius, py - radius, px + radius, py + radius))
    corners = []
    for (x0, y0), (x1, y1) in zip(step, step[1:]):
        corners += [((x0, y0), (x1, y0)), ((x1, y0), (x1, y1))]
    for start, end in corners:
        (ax0, ay0), (ax1, ay1) = ax.transData.transform([start, end])
        taken.append(Bbox.from_extents(min(ax0, ax1) - 1.5, min(ay0, ay1) - 1.5,
                                       max(ax0, ax1) + 1.5, max(ay0, ay1) + 1.5))
    near = [(7, 3, "left", "bottom"), (7, -3, "left", "top"), (-7, 3, "right", "bottom"),
            (-7, -3, "right", "top"), (0, 9, "center", "bottom"), (0, -9, "center", "top")]
    far = [(dx * scale, dy * scale + (sy * 8 if dy else 0), ha, va)
           for scale in (2, 3.2) for sy in (1,)
           for dx, dy, ha, va in near]
    for x, y, name, bold in points:
        placed = None
        for index, (dx, dy, ha, va) in enumerate(near + far):
            annotation = ax.annotate(
                name, (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                fontsize=8.5, fontweight="bold" if bold else "normal", zorder=7,
                arrowprops=({"arrowstyle": "-", "color": "#777777", "linewidth": 0.6,
                             "shrinkA": 0, "shrinkB": 4} if index >= len(near) else None))
            annotation.set_in_layout(False)
            box = annotation.get_window_extent(renderer).expanded(1.04, 1.08)
            inside = (box.x0 >= axes_box.x0 and box.x1 <= axes_box.x1
                      and box.y0 >= axes_box.y0 and box.y1 <= axes_box.y1)
            if inside and not any(box.overlaps(other) for other in taken):
                placed = box
                break
            annotation.remove()
        if placed is None:   # nowhere free: the first spot, overlap and all
            dx, dy, ha, va = near[0]
            annotation = ax.annotate(name, (x, y), xytext=(dx, dy), textcoords="offset points",
                                     ha=ha, va=va, fontsize=8.5, zorder=7,
                                     fontweight="bold" if bold else "normal")
            annotation.set_in_layout(False)
            placed = annotation.get_window_extent(renderer)
        taken.append(placed)


# -- padding waste ----------------------------------------------------------------------------

def plot_padding_waste(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Grouped horizontal bars: prefill and decode padding waste (%) per configuration,
    fastest at the top."""
    title = "Padding waste per configuration"
    if not rows:
        return _empty(path, title, "no configuration finished: nothing to plot")
    rows = _ordered(rows)
    figure = _figure(10, _bar_height(len(rows)))
    ax = figure.add_subplot()
    count = len(rows)
    positions = list(range(count))[::-1]    # fastest on top
    height = 0.38
    prefill = [100.0 * float(row.get("prefill_waste") or 0.0) for row in rows]
    decode = [100.0 * float(row.get("decode_waste") or 0.0) for row in rows]
    bars_p = ax.barh([p + height / 2 for p in positions], prefill, height=height,
                     color=_PREFILL_COLOUR, label="prefill (padded tokens)")
    bars_d = ax.barh([p - height / 2 for p in positions], decode, height=height,
                     color=_DECODE_COLOUR, label="decode (padded sequence slots)")
    for bars, values, raw in ((bars_p, prefill, "prefill_waste"), (bars_d, decode,
                                                                   "decode_waste")):
        labels = [("n/a" if row.get(raw) is None else f"{value:.0f}%")
                  for row, value in zip(rows, values)]
        ax.bar_label(bars, labels=labels, padding=3, fontsize=8)
    ax.set_yticks(positions, _bar_labels(rows))
    _embolden(ax, rows, {rows[0]["name"], DEFAULT_NAME})
    top = max(prefill + decode + [1.0])
    ax.set_xlim(0, min(100.0, top * 1.15 + 3))
    ax.set_ylim(-0.7, count - 0.3)
    ax.set_xlabel("padding waste (% of the padded work that was padding)")
    ax.set_ylabel(_bar_ylabel(len(rows)))
    ax.set_title(title + " (lower is better)", pad=22)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    # Above the bars, never over them (a bar can reach any corner).
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, fontsize=9, frameon=False)
    return _save(figure, path)


# -- time per state ---------------------------------------------------------------------------

def plot_time_per_state(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Stacked horizontal bars: seconds in prefill, decode and idle per configuration, fastest
    at the top; segments wide enough carry their share of the run."""
    title = "Where the time goes: seconds per scheduler state"
    if not rows:
        return _empty(path, title, "no configuration finished: nothing to plot")
    rows = _ordered(rows)
    figure = _figure(10, _bar_height(len(rows)))
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
    ax.set_yticks(positions, _bar_labels(rows))
    _embolden(ax, rows, {rows[0]["name"], DEFAULT_NAME})
    ax.set_xlim(0, longest * 1.12)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    _thousands(ax.xaxis)
    ax.set_xlabel("time (s)")
    ax.set_ylabel(_bar_ylabel(len(rows)))
    ax.set_title(title, loc="left")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=3, fontsize=9,
              frameon=False, borderaxespad=0.2)
    return _save(figure, path)


# -- prompt lengths and bucket edges ----------------------------------------------------------

def plot_prompt_histogram(prompt_lengths: Sequence[int],
                          bucket_sets: Mapping[str, Sequence[int] | str] | None,
                          path: str | Path, max_num_batched_tokens: int | None = None) -> Path:
    """Histogram of the workload's prompt lengths (log x when they span a wide range) with the
    prefill bucket edges of a few named configurations as vertical lines (the first
    `MAX_BUCKET_SETS`), each in its own colour and style, topped by a marker at its own height
    so shared edges stay distinguishable."""
    import numpy as np

    title = "Workload prompt lengths and prefill bucket edges"
    lengths = np.asarray([int(n) for n in prompt_lengths if n is not None and int(n) > 0])
    if lengths.size == 0:
        return _empty(path, title, "no prompt lengths to plot")
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

    figure = _figure(11, 6.4)
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
    if log_x:
        from matplotlib.ticker import LogLocator, NullFormatter

        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_minor_formatter(NullFormatter())
    _thousands(ax.xaxis)
    _thousands(ax.yaxis)
    ax.set_xlim(x_min, x_max)
    y_top = ax.get_ylim()[1] * 1.3   # headroom for the edge markers
    ax.set_ylim(0, y_top)

    if max_num_batched_tokens:
        ax.axvline(max_num_batched_tokens, color="black", linewidth=5, alpha=0.18, zorder=2.5,
                   label=f"max_num_batched_tokens = {max_num_batched_tokens:,} "
                         f"(longer prompts are prefilled in chunks)")
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
    return _save(figure, path)


def _share(fraction: float) -> str:
    percent = fraction * 100
    if percent == 0 or percent >= 10:
        return f"{percent:.0f}%"
    return f"{percent:.1f}%"


def _as_buckets(buckets: Sequence[int] | str) -> list[int]:
    if isinstance(buckets, str):
        buckets = [part for part in buckets.replace(" ", ",").split(",") if part]
    return sorted(int(b) for b in buckets)


def default_bucket_sets(rows: Sequence[Mapping[str, Any]],
                        recommendation: Mapping[str, Any] | None = None
                        ) -> dict[str, list[int]]:
    """The prefill buckets worth drawing over the prompts: the fastest, the default, the best
    per graph and the cheapest Pareto configuration (each once, at most `MAX_BUCKET_SETS`)."""
    if not rows:
        return {}
    recommendation = recommendation or recommend(list(rows))
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
              out_dir: str | Path) -> list[Path]:
    """Every figure into `out_dir` (created if missing); returns the paths written.

    With no finished configuration the three per-configuration figures are left out; without
    prompt lengths the histogram is. `front` None: computed here; `bucket_sets` None: the
    fastest, default, best-per-graph and cheapest Pareto configurations. The histogram marks
    max_num_batched_tokens when every configuration has the same one.
    """
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
        written.append(plot_prompt_histogram(
            prompt_lengths, bucket_sets, out / FILE_NAMES["prompts"],
            max_num_batched_tokens=int(budget) if budget else None))
    return written
