"""The sweep's headline figure: output throughput against compile cost, with the Pareto front
drawn as a step and the fastest and recommended configurations marked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuron_batch.bench.figure import (
    FASTEST_COLOUR,
    FRONT_COLOUR,
    POINT_COLOUR,
    new_figure,
    ordered_rows,
    placeholder_figure,
    save_figure,
    thousands_axis,
)
from neuron_batch.bench.ranking import (
    COST_COMPILE_S,
    DEFAULT_NAME,
    cost_key_for,
    pareto_front,
)
from neuron_batch.runtimes.runtime import runtime_of

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
        return placeholder_figure(path, title, "no configuration finished: nothing to plot")
    if front is None:
        front = pareto_front(rows)
    cost_key = getattr(front, "cost_key", None) or cost_key_for(rows)
    rows = ordered_rows(rows)
    fastest = rows[0]
    axis = _CostAxis.of(rows, cost_key)

    figure = new_figure(10, 6.2)
    ax = figure.add_subplot()
    xs = [axis.x_of(row) for row in rows]
    ys = [float(row["output_tokens_per_s"]) for row in rows]
    front_ids = {id(row) for row in front}
    front_names = {row["name"] for row in front}
    on_front = [id(row) in front_ids or (row["name"] in front_names) for row in rows]
    default = _draw_points(ax, rows, xs, ys, on_front, axis)

    # Limits first (room for labels), then the front drawn to the right edge.
    x_low, x_high = min(xs), max(xs)
    x_pad = max((x_high - x_low) * 0.08, 0.5 if axis.in_minutes else 1.0)
    y_low, y_high = min(ys), max(ys)
    y_pad = max((y_high - y_low) * 0.12, y_high * 0.03, 1.0)
    ax.set_xlim(max(0.0, x_low - x_pad), x_high + x_pad)
    ax.set_ylim(max(0.0, y_low - y_pad), y_high + y_pad)
    step = _draw_front(ax, front, axis, cost_key)
    axis.decorate(ax, x_high - x_low)
    thousands_axis(ax.yaxis)
    ax.set_ylabel("output throughput (tokens/s)")
    ax.set_title(f"{title}: {len(rows)} configuration{'s' if len(rows) != 1 else ''}")
    ax.grid(True, alpha=0.3, zorder=0)
    handles, labels = ax.get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3),
                  fontsize=9, frameon=False)

    importance = sorted(range(len(rows)), key=lambda i: (
        rows[i] is not fastest, rows[i] is not default, not on_front[i], i))
    _label_points(figure, ax, [(xs[i], ys[i], rows[i]["name"],
                                rows[i] is fastest or rows[i] is default) for i in importance],
                  step)
    return save_figure(figure, path)


@dataclass
class _CostAxis:
    """The x-axis of the throughput plot: compiled graphs, with a top axis of estimated
    compile minutes where the estimate is proportional to them (`seconds_per_graph`), or the
    estimate itself (`in_minutes`) where it is not."""

    in_minutes: bool
    seconds_per_graph: float | None
    label: str

    @classmethod
    def of(cls, rows: Sequence[Mapping[str, Any]], cost_key: str) -> _CostAxis:
        per_graph = {row[COST_COMPILE_S] / row["compiled_graphs"] for row in rows
                     if row.get(COST_COMPILE_S) is not None and row["compiled_graphs"]}
        minutes_axis = cost_key == COST_COMPILE_S
        proportional = minutes_axis and len(per_graph) == 1 and all(
            row["compiled_graphs"] for row in rows)
        if minutes_axis and not proportional:
            return cls(True, None, "estimated compile time (min)")
        lists = runtime_of(rows[0]).bucket_options
        return cls(False, per_graph.pop() if proportional else None,
                   f"compiled graphs (of the {' and '.join(o.label for o in lists)})")

    def x_of(self, row: Mapping[str, Any]) -> float:
        return row[COST_COMPILE_S] / 60.0 if self.in_minutes else float(row["compiled_graphs"])

    def decorate(self, ax, span: float) -> None:
        """Ticks (whole graphs), the top axis in minutes where there is one, the label."""
        if not self.in_minutes:
            from matplotlib.ticker import MaxNLocator, MultipleLocator

            ax.xaxis.set_major_locator(MultipleLocator(1) if span <= 8
                                       else MaxNLocator(integer=True))
        if self.seconds_per_graph is not None:
            per_graph = self.seconds_per_graph
            top = ax.secondary_xaxis("top", functions=(
                lambda g: g * per_graph / 60.0, lambda m: m * 60.0 / per_graph))
            top.set_xlabel("estimated compile time (min)")
        ax.set_xlabel(self.label)


def _draw_points(ax, rows: Sequence[Mapping[str, Any]], xs: list[float], ys: list[float],
                 on_front: list[bool], axis: _CostAxis) -> Mapping[str, Any] | None:
    """The configurations (those on the front in their colour), the fastest as a star and
    the default as a diamond; returns the default's row (None: not among them)."""
    fastest = rows[0]
    for wanted, size, colour, label, order in ((False, 46, POINT_COLOUR, "configuration", 3),
                                               (True, 60, FRONT_COLOUR, "on the Pareto front",
                                                4)):
        chosen = [(x, y) for x, y, row, front_row in zip(xs, ys, rows, on_front)
                  if front_row == wanted and row is not fastest]
        if chosen:
            ax.scatter([x for x, _ in chosen], [y for _, y in chosen], s=size, color=colour,
                       edgecolor="white", linewidth=0.8, zorder=order, label=label)
    ax.scatter([axis.x_of(fastest)], [fastest["output_tokens_per_s"]], s=260, marker="*",
               color=FASTEST_COLOUR, edgecolor="black", linewidth=0.6, zorder=5,
               label=f"fastest: {fastest['name']}")
    default = next((row for row in rows if row["name"] == DEFAULT_NAME), None)
    if default is not None and default is not fastest:
        ax.scatter([axis.x_of(default)], [default["output_tokens_per_s"]], s=110, marker="D",
                   facecolor="none", edgecolor="black", linewidth=1.4, zorder=6,
                   label="default")
    return default


def _draw_front(ax, front: Sequence[Mapping[str, Any]], axis: _CostAxis,
                cost_key: str) -> list[tuple[float, float]]:
    """The Pareto front as a step line to the plot's right edge; its vertices (none: no
    front)."""
    points = sorted((axis.x_of(row), float(row["output_tokens_per_s"])) for row in front)
    if not points:
        return []
    step_x = [x for x, _ in points] + [ax.get_xlim()[1]]
    step_y = [y for _, y in points] + [points[-1][1]]
    cost_words = "est. compile time" if cost_key == COST_COMPILE_S else "graphs"
    ax.step(step_x, step_y, where="post", color=FRONT_COLOUR, linewidth=1.6, alpha=0.8,
            zorder=2, label=f"Pareto front (throughput vs {cost_words})")
    return list(zip(step_x, step_y))


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
