"""Prometheus: the GPUs' readings, the cluster's trends, usage reports and the anomaly models' findings."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import streamlit as st

from hub.settings import MONITORING_USER
from portal.data import prometheus
from portal.identity import Identity
from portal.sources import classes, clients
from spawner import environ, usage

if TYPE_CHECKING:
    from prometheus_api_client import PrometheusConnect

    from spawner.anomaly import Finding  # scikit-learn is optional: imported when the models run


def prometheus_url() -> str:
    return clients.deployment().prometheus_url()


def monitoring_auth() -> tuple[str, str] | None:
    """Prometheus's and Alertmanager's basic auth, from the 0600 file gpuslice up made (None: none asked)."""
    path = environ.read().get(environ.MONITORING_PASSWORD_FILE)
    return (MONITORING_USER, Path(path).read_text().strip()) if path else None


def _prometheus(timeout_s: float = 5) -> PrometheusConnect:
    """The platform's Prometheus with the monitoring password; a page's query gives up after 5 s, a report's later."""
    return prometheus.connect(prometheus_url(), timeout_s=timeout_s, auth=monitoring_auth())


@st.cache_data(ttl=10)
def gpu_readings() -> dict[tuple[str, str], prometheus.GpuReading]:
    return prometheus.gpu_readings(_prometheus())


@st.cache_data(ttl=10)
def job_gpu_memory() -> dict[tuple[str, str], float]:
    """Each batch job's GPU memory now, from the exporter's per-process series."""
    return prometheus.job_gpu_memory(_prometheus())


@st.cache_data(ttl=10)
def summary() -> dict[str, float]:
    return prometheus.summary(_prometheus())


@st.cache_data(ttl=30)
def trend(expr: str, hours: float) -> list[tuple[datetime, float]]:
    return prometheus.trend(_prometheus(), expr, hours)


@st.cache_data(ttl=30)
def utilization_heatmap(hours: float, per_node: bool = False) -> dict[str, list[tuple[datetime, float]]]:
    """Every card over time; past 64 cards one row per node (its mean), to stay readable."""
    metric = (
        'label_replace(avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL), "gpu", "all", "", "")'
        if per_node
        else "DCGM_FI_DEV_GPU_UTIL"
    )
    return prometheus.per_gpu_trend(_prometheus(), metric, hours)


@st.cache_data(ttl=30)
def spawn_success() -> float | None:
    return prometheus.spawn_success_ratio(_prometheus())


USAGE_STEP_S = 900  # a sample per 15 minutes: 8 weeks stay under Prometheus' 11,000 points per query


@st.cache_data(ttl=600)
def _usage_rows(weeks: int) -> list[usage.UsageRow]:
    end = datetime.now(UTC)
    prom = _prometheus(timeout_s=30)
    samples = prometheus.usage_samples(prom, end - timedelta(weeks=weeks), end, USAGE_STEP_S)
    return usage.usage(samples, USAGE_STEP_S, usage.group_members(classes.group_rules()))


def usage_rows(identity: Identity, weeks: int) -> list[usage.UsageRow]:
    """GPU-hours per user and week: admins everyone's, teachers their classes', everyone else their own."""
    seen = classes.scope(identity)
    return [r for r in _usage_rows(weeks) if seen.sees(r.user)]


ANOMALY_STEP_S = 60
ANOMALY_DAYS = 3  # the models learn from the first two, and look for the unusual in all three
CARD_QUERIES = {
    "utilization": "DCGM_FI_DEV_GPU_UTIL",
    "temperature": "DCGM_FI_DEV_GPU_TEMP",
    "memory": "sum by (Hostname, gpu) (gpuslice_process_gpu_memory_bytes)",
    "errors": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",  # correctable (single-bit) ECC errors, a counter
    "held": "sum by (node, gpu) (gpuslice_gpu_memory_allocated_bytes)",  # the slices servers hold
}


@st.cache_data(ttl=300)
def card_history() -> tuple[datetime, dict[str, dict[tuple[str, str], list[float | None]]]]:
    """Each card's utilization, temperature, servers' GPU memory, correctable errors and held slices.

    A sample a minute for three days.
    """
    end = datetime.now(UTC)
    start = end - timedelta(days=ANOMALY_DAYS)
    prom = _prometheus(timeout_s=30)
    return start, {
        name: prometheus.card_series(prom, q, start, end, ANOMALY_STEP_S) for name, q in CARD_QUERIES.items()
    }


def _anomaly_models() -> ModuleType:
    try:
        from spawner import anomaly  # scikit-learn: the .[anomaly] extra, which a small install may leave out
    except ImportError as exc:
        raise prometheus.MetricsUnavailableError(
            f"the anomaly models need scikit-learn ({exc.name} is missing): pip install 'gpuslice[anomaly]'"
        ) from exc
    return anomaly


def platform_load() -> dict[tuple[str, str], list[float | None]]:
    """Per card, the other held cards' mean utilization: the load the collapse model compares it with."""
    _, history = card_history()
    means = _anomaly_models().others_mean(history["utilization"], history["held"])
    return {card: [None if math.isnan(v) else float(v) for v in values] for card, values in means.items()}


def _admin(identity: Identity, what: str) -> None:
    if not identity.admin:
        raise PermissionError(f"{identity.name} may not {what}: the anomaly findings are for admins")


def anomalies(identity: Identity) -> list[tuple[tuple[str, str], Finding, datetime]]:
    """What the per-card models find (spawner/anomaly.py): (card, finding, when), newest first; admins only."""
    _admin(identity, "read the anomaly findings")
    anomaly = _anomaly_models()
    start, history = card_history()
    train = slice(0, (ANOMALY_DAYS - 1) * 86400 // ANOMALY_STEP_S)
    platform = anomaly.others_mean(history["utilization"], history["held"])
    found = []
    for card, util in history["utilization"].items():
        temp = history["temperature"].get(card)
        if temp:
            found += [(card, f) for f in anomaly.hot_for_load(util, temp, train)]
        if card in history["held"]:
            held = history["held"][card]
            found += [(card, f) for f in anomaly.utilization_collapsed(util, held, platform[card], train)]
    for card, memory in history["memory"].items():
        found += [(card, f) for f in anomaly.memory_growing(memory)]
    for card, errors in history["errors"].items():
        found += [(card, f) for f in anomaly.correctable_errors_rising(errors, train)]
    when = [(card, f, start + timedelta(seconds=f.found * ANOMALY_STEP_S)) for card, f in found]
    return sorted(when, key=lambda x: x[2], reverse=True)
