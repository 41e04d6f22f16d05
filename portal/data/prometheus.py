"""GPU readings and trends from Prometheus (prometheus-api-client), a few queries per page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from portal.data.errors import why
from spawner.usage import Sample, samples_from_prometheus

MiB = 1024 * 1024


class MetricsUnavailableError(RuntimeError):
    """Prometheus is down, slow or returned an error; pages show a banner and go on."""


@dataclass(frozen=True)
class GpuReading:
    utilization_pct: float = 0.0
    used_bytes: float = 0.0
    temperature_c: float = 0.0
    power_w: float = 0.0
    last_xid: int = 0


READING_QUERY = '{__name__=~"DCGM_FI_DEV_(GPU_UTIL|FB_USED|GPU_TEMP|POWER_USAGE|XID_ERRORS)"}'
SUMMARY_QUERY = '{__name__=~"gpuslice:(gpu_memory_capacity_bytes|gpu_memory_allocated_bytes|gpu_memory_used_bytes):sum|gpuslice:gpu_utilization:avg"}'  # noqa: E501


def connect(url: str, timeout_s: float = 5, auth: tuple[str, str] | None = None) -> PrometheusConnect:
    """A client that gives up after timeout_s: a hung Prometheus must not hang a page."""
    # No retries: a page shows "unavailable" at once rather than backing off for seconds.
    return PrometheusConnect(url=url, disable_ssl=True, retry=Retry(total=0), timeout=timeout_s, auth=auth)


def _query(prom: PrometheusConnect, expr: str) -> list[dict]:  # type: ignore[type-arg]
    try:
        return list(prom.custom_query(expr))
    except Exception as exc:  # connection refused, timeout, PromQL error
        raise MetricsUnavailableError(f"Prometheus did not answer ({why(exc)})") from exc


def gpu_readings(prom: PrometheusConnect) -> dict[tuple[str, str], GpuReading]:
    """(node, gpu) -> readings, in one query."""
    fields: dict[tuple[str, str], dict[str, float]] = {}
    for series in _query(prom, READING_QUERY):
        metric = series["metric"]
        key = (metric.get("Hostname", ""), metric.get("gpu", ""))
        fields.setdefault(key, {})[metric["__name__"]] = float(series["value"][1])
    return {
        key: GpuReading(
            utilization_pct=f.get("DCGM_FI_DEV_GPU_UTIL", 0.0),
            used_bytes=f.get("DCGM_FI_DEV_FB_USED", 0.0) * MiB,
            temperature_c=f.get("DCGM_FI_DEV_GPU_TEMP", 0.0),
            power_w=f.get("DCGM_FI_DEV_POWER_USAGE", 0.0),
            last_xid=int(f.get("DCGM_FI_DEV_XID_ERRORS", 0.0)),
        )
        for key, f in fields.items()
    }


JOB_MEMORY_QUERY = 'sum by (user, server) (gpuslice_process_gpu_memory_bytes{server=~"job:[0-9]+"})'


def job_gpu_memory(prom: PrometheusConnect) -> dict[tuple[str, str], float]:
    """(owner, "job:ID") -> the GPU memory its processes use now, from the exporter's per-process series."""
    found = {}
    for series in _query(prom, JOB_MEMORY_QUERY):
        metric = series["metric"]
        found[(metric.get("user", ""), metric.get("server", ""))] = float(series["value"][1])
    return found


def summary(prom: PrometheusConnect) -> dict[str, float]:
    """Cluster totals from the recording rules, in one query."""
    return {s["metric"]["__name__"]: float(s["value"][1]) for s in _query(prom, SUMMARY_QUERY)}


def _range(prom: PrometheusConnect, expr: str, hours: float, points: int, now: datetime | None) -> list[dict]:  # type: ignore[type-arg]
    end = now or datetime.now()
    step = max(15, int(hours * 3600 / points))
    try:
        return list(
            prom.custom_query_range(expr, start_time=end - timedelta(hours=hours), end_time=end, step=f"{step}s")
        )
    except Exception as exc:
        raise MetricsUnavailableError(f"Prometheus did not answer ({why(exc)})") from exc


def _points(values: list[list[str]]) -> list[tuple[datetime, float]]:
    return [(datetime.fromtimestamp(float(t)), float(v)) for t, v in values]


def trend(
    prom: PrometheusConnect, expr: str, hours: float, now: datetime | None = None
) -> list[tuple[datetime, float]]:
    """The first series of ``expr`` over the last ``hours`` (about 240 points)."""
    result = _range(prom, expr, hours, 240, now)
    return _points(result[0]["values"]) if result else []


def per_gpu_trend(
    prom: PrometheusConnect, metric: str, hours: float, now: datetime | None = None
) -> dict[str, list[tuple[datetime, float]]]:
    """One range query: "node GPU n" -> points, for a heatmap of every card over time."""
    return {
        f"{r['metric'].get('Hostname', '?')} GPU {r['metric'].get('gpu', '?')}": _points(r["values"])
        for r in _range(prom, metric, hours, 120, now)
    }


SPAWN_SUCCESS_QUERY = (
    'sum(increase(jupyterhub_server_spawn_duration_seconds_count{status="success"}[1h]))'
    " / (sum(increase(jupyterhub_server_spawn_duration_seconds_count[1h]))"
    " + sum(increase(gpuslice_spawn_refused_total[1h])))"
)


def spawn_success_ratio(prom: PrometheusConnect) -> float | None:
    """Share of spawn attempts in the last hour that started a server (None: no attempts)."""
    result = _query(prom, SPAWN_SUCCESS_QUERY)
    if not result:
        return None
    value = float(result[0]["value"][1])
    return None if value != value else value  # NaN: no attempts


def usage_samples(prom: PrometheusConnect, start: datetime, end: datetime, step_s: int) -> list[Sample]:
    """The utilization report's samples (spawner/usage.py's two range queries) over ``start``..``end``."""
    try:
        return samples_from_prometheus(prom.custom_query_range, start, end, step_s)
    except Exception as exc:  # connection refused, timeout, PromQL error, too many points
        raise MetricsUnavailableError(f"Prometheus did not answer ({why(exc)})") from exc


def card_series(
    prom: PrometheusConnect, expr: str, start: datetime, end: datetime, step_s: int
) -> dict[tuple[str, str], list[float | None]]:
    """``expr`` per card (Hostname, gpu) on the grid start, start + step_s, ... end; None where no sample."""
    try:
        result = prom.custom_query_range(expr, start_time=start, end_time=end, step=f"{step_s}s")
    except Exception as exc:
        raise MetricsUnavailableError(f"Prometheus did not answer ({why(exc)})") from exc
    slots = int((end - start).total_seconds() // step_s) + 1
    cards: dict[tuple[str, str], list[float | None]] = {}
    for series in result:
        values: list[float | None] = [None] * slots
        for t, v in series["values"]:
            i = round((float(t) - start.timestamp()) / step_s)
            if 0 <= i < slots:
                values[i] = float(v)
        labels = series["metric"]
        cards[(labels.get("Hostname", labels.get("node", "?")), labels.get("gpu", "?"))] = values
    return cards


def firing_alerts(
    prom: PrometheusConnect, start: datetime, end: datetime, step_s: int
) -> list[tuple[dict[str, str], list[float]]]:
    """Prometheus's own record of its alerts: each firing series of ``ALERTS`` and its sample times."""
    try:
        result = prom.custom_query_range(
            'ALERTS{alertstate="firing"}', start_time=start, end_time=end, step=f"{step_s}s"
        )
    except Exception as exc:  # connection refused, timeout, PromQL error
        raise MetricsUnavailableError(f"Prometheus did not answer ({why(exc)})") from exc
    return [(dict(r["metric"]), [float(t) for t, _ in r["values"]]) for r in result]
