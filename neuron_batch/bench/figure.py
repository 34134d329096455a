"""Figure plumbing shared by the bench plots: a matplotlib Figure on the Agg canvas (never
pyplot, so no global figure registry or backend is touched), saving, placeholders, axis
formatting, the colours and the bar-chart helpers. matplotlib is imported inside functions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DPI = 120

PREFILL_COLOUR, DECODE_COLOUR, IDLE_COLOUR = "#3b75af", "#ef8636", "#b8b8b8"
ATTENTION_COLOUR = "#7b3fa0"
POINT_COLOUR, FRONT_COLOUR, FASTEST_COLOUR = "#8c9fb5", "#2a9d5c", "#c0392b"


# -- figure plumbing --------------------------------------------------------------------------

def new_figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save_figure(figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI, format="png", facecolor="white")
    figure.clear()
    return path


def placeholder_figure(path: str | Path, title: str, message: str) -> Path:
    figure = new_figure(8, 3)
    ax = figure.add_subplot()
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=12, transform=ax.transAxes)
    ax.set_axis_off()
    return save_figure(figure, path)


def thousands_axis(axis) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))


def ordered_rows(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Fastest first (rank order; rows without a rank after, by throughput)."""
    return sorted(rows, key=lambda row: (row.get("rank") is None, row.get("rank") or 0,
                                         -float(row.get("output_tokens_per_s") or 0.0)))


def bar_labels(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    return [f"#{row['rank']} {row['name']}" if row.get("rank") else str(row["name"])
            for row in rows]


def embolden_labels(ax, rows: Sequence[Mapping[str, Any]], names: set[str]) -> None:
    for label, row in zip(ax.get_yticklabels(), rows):
        if row["name"] in names:
            label.set_fontweight("bold")


def bar_height(count: int) -> float:
    return 1.6 + 0.42 * max(count, 3)


def bar_ylabel(count: int) -> str:
    return "configuration (fastest at top)" if count > 3 else "configuration"
