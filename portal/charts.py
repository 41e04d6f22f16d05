"""Pure Plotly figure builders: data in, figure out, no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

# Imported here, in full, before any figure is built: Plotly looks for pandas in sys.modules
# without importing it, and Streamlit runs each session's page in its own thread, so a page
# that builds a figure while another session's first table is importing pandas got the
# half-imported module ("partially initialized module 'pandas' has no attribute 'Series'",
# seen on the GPUs page in CI). An import statement waits until the module is complete.
import pandas  # noqa: F401
import plotly.graph_objects as go

from portal.views import GpuRow

GiB = 1024**3


def allocation_bars(rows: Sequence[GpuRow]) -> go.Figure:
    """Per GPU: capacity, allocated (slices handed out) and actually used memory, in GiB."""
    labels = [f"{r.node} GPU {r.gpu} ({r.model}{', sim' if r.simulated else ''})" for r in rows]
    figure = go.Figure(
        [
            go.Bar(name="capacity", x=labels, y=[r.capacity_bytes / GiB for r in rows], marker_color="#d0d7de"),
            go.Bar(name="allocated", x=labels, y=[r.allocated_bytes / GiB for r in rows], marker_color="#f37726"),
            go.Bar(name="used", x=labels, y=[(r.used_bytes or 0) / GiB for r in rows], marker_color="#1f77b4"),
        ]
    )
    figure.update_layout(barmode="group", yaxis_title="GiB", height=320, margin={"t": 20, "b": 20, "l": 40, "r": 10})
    return figure


def y_range(values: Sequence[float], unit: str) -> list[float]:
    """From 0 to a little above the largest value (percentages to 100): never Plotly's -1..1 for a flat line."""
    if unit == "%":
        return [0, 100]
    top = max(values, default=0.0)
    return [0, top * 1.15 if top > 0 else 1.0]


def trend(series: Mapping[str, Sequence[tuple[datetime, float]]], unit: str, title: str) -> go.Figure:
    """Lines over time, titled, each line in the legend, the y axis from 0."""
    figure = go.Figure(
        [
            go.Scatter(name=name, x=[t for t, _ in points], y=[v for _, v in points], mode="lines")
            for name, points in series.items()
        ]
    )
    values = [v for points in series.values() for _, v in points]
    figure.update_layout(
        title={"text": title, "font": {"size": 15}},
        showlegend=True,
        legend={"orientation": "h", "y": -0.2},
        yaxis={"title": unit, "range": y_range(values, unit)},
        height=300,
        margin={"t": 40, "b": 20, "l": 40, "r": 10},
    )
    return figure


def heatmap(series: Mapping[str, Sequence[tuple[datetime, float]]], unit: str) -> go.Figure:
    """Cards down, time across, the value as colour (GPU utilization over time)."""
    names = sorted(series)
    times = [t for t, _ in series[names[0]]] if names else []
    figure = go.Figure(
        go.Heatmap(
            z=[[v for _, v in series[n]] for n in names],
            x=times,
            y=names,
            colorscale="Oranges",
            colorbar={"title": unit},
        )
    )
    figure.update_layout(height=max(200, 22 * len(names) + 80), margin={"t": 20, "b": 20, "l": 10, "r": 10})
    return figure
