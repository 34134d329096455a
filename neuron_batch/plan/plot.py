"""The plan's figure: cost against completion time, one point per simulated option (coloured by
instance type), the lower bounds of pruned options as grey crosses, the deadline as a vertical
line and the recommendation ringed. Built on the Agg canvas (bench/figure.py), never via pyplot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from neuron_batch.bench.deadline import format_hours
from neuron_batch.bench.figure import new_figure, save_figure

_COLOURS = ("#3b75af", "#ef8636", "#2a9d5c", "#c0392b", "#7b3fa0", "#8c564b", "#d68910")


def write_plot(data: dict[str, Any], path: str | Path) -> Path:
    """plan_cost_vs_time.png from plan.json's data."""
    from matplotlib.ticker import FuncFormatter

    rows = data["options"]
    pruned = [r for r in data.get("not_simulated", []) if r.get("status") == "pruned"]
    deadline = data["meta"]["deadline"]["hours"]
    figure = new_figure(9, 5.5)
    ax = figure.add_subplot()
    instances = sorted({r["instance"] for r in rows} | {r["instance"] for r in pruned})
    colour = {name: _COLOURS[i % len(_COLOURS)] for i, name in enumerate(instances)}
    for name in instances:
        mine = [r for r in rows if r["instance"] == name]
        ax.scatter([r["hours"] for r in mine], [r["usd"] for r in mine], s=36,
                   color=colour[name], label=name, zorder=3)
        bounds = [r for r in pruned if r["instance"] == name]
        ax.scatter([r["hours_at_least"] for r in bounds], [r["usd_at_least"] for r in bounds],
                   s=16, marker="x", color=colour[name], alpha=0.45, zorder=2)
    if pruned:
        ax.scatter([], [], s=16, marker="x", color="grey",
                   label="pruned: its lower bounds (never simulated)")
    best = data.get("recommendation")
    if best:
        ax.scatter([best["hours"]], [best["usd"]], s=220, facecolors="none",
                   edgecolors="black", linewidths=1.6, zorder=4)
        ax.annotate(f"recommended: {best['name']}\n{format_hours(best['hours'])}, "
                    f"${best['usd']:,.2f}", (best["hours"], best["usd"]),
                    textcoords="offset points", xytext=(12, 12), fontsize=9)
    ax.axvline(deadline, color="black", linestyle="--", linewidth=1)
    ax.text(deadline, 1.0, f" deadline {data['meta']['deadline']['text']}", rotation=0,
            va="bottom", ha="left", fontsize=9, transform=ax.get_xaxis_transform())
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis, fmt in ((ax.xaxis, "{:,.4g}"), (ax.yaxis, "${:,.4g}")):
        formatter = FuncFormatter(lambda value, _, fmt=fmt: fmt.format(value))
        axis.set_major_formatter(formatter)
        axis.set_minor_formatter(formatter)
        axis.set_tick_params(which="minor", labelsize=7)
    ax.set_xlabel("completion time, hours (compile included), log scale")
    ax.set_ylabel("cost, USD, log scale")
    ax.set_title(f"Cost against completion time: {data['meta']['num_requests']:,} requests, "
                 f"{data['meta']['architecture']}", fontsize=11, pad=18)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="best")
    return save_figure(figure, path)
