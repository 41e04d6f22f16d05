"""Prometheus and Alertmanager for the single-machine platform.

Pure builders return the two configs as dicts; ``binaries`` says which Debian-packaged
servers are installed. The rule files beside this module are the one source of truth
for recording and alert rules (the Helm chart renders the same files).
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from hub.monitoring.oncall import (
    HEARTBEAT,
    heartbeat_route,
    oncall_receivers,
    oncall_routes,
    receiver,
    smtp_globals,
    time_intervals,
)
from hub.secret_files import first_line
from hub.settings import MONITORING_USER, Contact, Monitoring, OnCall, SettingsError

RULES_DIR = Path(__file__).parent
RULE_FILES = (RULES_DIR / "recording.yml", RULES_DIR / "alerts.yml")
NODE_JOBS = ("gpu-exporter", "node")  # scraped per machine: they carry its name as the node label
BINARIES = {
    "prometheus": "prometheus",
    "alertmanager": "prometheus-alertmanager",
    "node_exporter": "prometheus-node-exporter",
}


@dataclass(frozen=True)
class Ports:
    hub: int
    exporter: int
    prometheus: int
    alertmanager: int
    node_exporter: int


def binaries() -> dict[str, str | None]:
    """Where each server's binary is, or None when its Debian package is missing."""
    return {name: shutil.which(binary) for name, binary in BINARIES.items()}


def web_config(password: str) -> dict[str, Any]:
    """Prometheus's and Alertmanager's --web.config.file: basic auth, one user, a bcrypt hash."""
    return {"basic_auth_users": {MONITORING_USER: bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()}}


def prometheus_config(
    ports: Ports,
    hub_token_file: Path,
    *,
    node_exporter: bool,
    interval: str = "15s",
    node: str = "localhost",
    password_file: Path | None = None,
    rule_files: tuple[Path, ...] = RULE_FILES,
) -> dict[str, Any]:
    """Scrape the hub, the exporter, Prometheus, Alertmanager (and node_exporter when installed).

    The machine's exporters carry a ``node`` target label (the exporter's Hostname) so that
    NodeDown and GpuExporterDown name the node their GPUs' alerts are inhibited by.
    ``password_file``: Prometheus, Alertmanager and the exporters ask for basic auth, and this is its password.
    """
    auth = {"basic_auth": {"username": MONITORING_USER, "password_file": str(password_file)}} if password_file else {}

    def job(name: str, port: int, **extra: Any) -> dict[str, Any]:
        target: dict[str, Any] = {"targets": [f"127.0.0.1:{port}"]}
        if name in NODE_JOBS:
            target["labels"] = {"node": node}
        return {"job_name": name, "static_configs": [target], **extra}

    jobs = [
        job(
            "jupyterhub",
            ports.hub,
            metrics_path="/hub/metrics",
            authorization={"type": "Bearer", "credentials_file": str(hub_token_file)},
        ),
        job("gpu-exporter", ports.exporter, **auth),
        job("prometheus", ports.prometheus, **auth),
        job("alertmanager", ports.alertmanager, **auth),
    ]
    if node_exporter:
        jobs.append(job("node", ports.node_exporter, **auth))
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rule_files],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports.alertmanager}"]}], **auth}]},
        "scrape_configs": jobs,
    }


GPU_ALERTS = ("GpuXidError", "GpuEccDoubleBitErrors", "GpuTemperatureHigh", "GpuHung", "IdleGpuSlicesHeld")
# Which alert explains which: while the source fires on a node, the targets on that node are
# part of its incident and are not sent (docs/operations.md).
INHIBIT_RULES = [
    {
        "source_matchers": ['alertname="NodeDown"'],
        "target_matchers": [f'alertname=~"{"|".join((*GPU_ALERTS, "GpuExporterDown"))}"'],
        "equal": ["node"],
    },
    {
        "source_matchers": ['alertname="GpuExporterDown"'],
        "target_matchers": [f'alertname=~"{"|".join(GPU_ALERTS)}"'],
        "equal": ["node"],
    },
    {"source_matchers": ['alertname="JupyterHubDown"'], "target_matchers": ['alertname="SpawnFailureRateHigh"']},
]


class SecretFileError(SettingsError):
    """A webhook URL's file (a mounted Secret's key) is missing, unreadable, empty or not a URL."""


def url_from_file(path: Path, who: str, key: str) -> str:
    """The URL in ``path`` (a Secret's key mounted as a file), stripped; SecretFileError says what to do."""
    remedy = (
        f"on Kubernetes add the key {path.name} to the Secret named by monitoring.oncall.existingSecret "
        f"(kubectl create secret generic NAME --from-literal={path.name}=https://...); "
        f"in gpuslice.yaml write the URL into {path} or point {key} at the file that holds it"
    )
    try:
        url = path.read_text().strip()
    except OSError as exc:
        raise SecretFileError(f"{who}: cannot read {key} {path} ({exc.strerror}): {remedy}") from None
    if not url:
        raise SecretFileError(f"{who}: {key} {path} is empty: {remedy}")
    if not url.startswith(("http://", "https://")) or any(c.isspace() for c in url):
        # The URL itself is not quoted: it usually carries a token.
        raise SecretFileError(f"{who}: {key} {path} does not hold one http(s) URL: {remedy}")
    return url


def relay_password(oncall: OnCall) -> str | None:
    """The alert mails' relay password, from smtp_auth_password_file (its first line); None without a login."""
    if oncall.smtp_auth_password_file is None:
        return None
    path = oncall.smtp_auth_password_file
    remedy = (
        f"on Kubernetes add the key {path.name} to the Secret named by monitoring.oncall.existingSecret; "
        f"in gpuslice.yaml write the password on the first line of {path}"
    )
    return first_line(path, "smtp_auth_password_file", remedy, remedy, SecretFileError, who="the alert mail relay: ")


def with_urls_read(oncall: OnCall) -> OnCall:
    """``oncall`` with every ``*_url_file`` replaced by the URL it holds (read now, never stored in settings)."""

    def contact(person: Contact | None) -> Contact | None:
        if person is None or person.webhook_url_file is None:
            return person
        url = url_from_file(person.webhook_url_file, f"on-call contact {person.name}", "webhook_url_file")
        return person.model_copy(update={"webhook_url": url, "webhook_url_file": None})

    deadman = oncall.deadman_url
    if oncall.deadman_url_file is not None:
        deadman = url_from_file(oncall.deadman_url_file, "the dead man's switch", "deadman_url_file")
    return oncall.model_copy(
        update={
            "rotation": tuple(contact(c) for c in oncall.rotation),
            "second_line": contact(oncall.second_line),
            "owner": contact(oncall.owner),
            "deadman_url": deadman,
            "deadman_url_file": None,
        }
    )


RECORDER_RECEIVER = "incident-recorder"  # portal/incidents.py reads notifications to it as records, not pages
RECORDER_PATH = "/api/alertmanager"  # portal/recorder.py's webhook


def recorder_token_path(monitoring_dir: Path) -> Path:
    """The bearer token of the recorder's webhook on one machine (0600, made by gpuslice up)."""
    return monitoring_dir / "recorder-token"


def local_recorder(monitoring_dir: Path, port: int) -> Recorder:
    """The incident recorder the hub runs on one machine, and its webhook token, made once (0600)."""
    token = recorder_token_path(monitoring_dir)
    if not token.exists():
        token.touch(mode=0o600)
        token.write_text(secrets.token_urlsafe(32))
    return Recorder(f"http://127.0.0.1:{port}{RECORDER_PATH}", credentials_file=token)


def write_alertmanager_config(options: Monitoring, monitoring_dir: Path, today: date | None = None) -> Path:
    """``alertmanager.yml`` for the platform's settings (``monitoring``) as of ``today``: written at each
    ``gpuslice up`` and renewed daily (hub/renewals.py), so the rotation's 26 weeks never run out."""
    config = alertmanager_config(
        options.webhook_url,
        options.oncall,
        today,
        recorder=local_recorder(monitoring_dir, options.recorder_port),
    )
    path = monitoring_dir / "alertmanager.yml"
    temporary = path.with_suffix(".tmp")
    # libyaml's emitter where PyYAML has it: the rotation's 26 weeks are a long document, renewed daily.
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    temporary.write_text(yaml.dump(config, Dumper=dumper, sort_keys=False))
    os.replace(temporary, path)  # Alertmanager never reads half a file
    return path


@dataclass(frozen=True)
class Recorder:
    """Where the incident recorder listens, and the bearer token Alertmanager presents to it.

    ``credentials_file`` on one machine (Alertmanager reads the 0600 file); on Kubernetes the
    token itself (``credentials``), since the config lands in a Secret of the cluster's
    Alertmanager, which cannot read the recorder's files.
    """

    url: str
    credentials_file: Path | None = None
    credentials: str | None = None

    def webhook(self) -> dict[str, Any]:
        auth: dict[str, Any] = {"type": "Bearer"}
        if self.credentials_file is not None:
            auth["credentials_file"] = str(self.credentials_file)
        elif self.credentials:
            auth["credentials"] = self.credentials
        else:
            raise SettingsError("the incident recorder needs a token: its webhook is never unauthenticated")
        return {"url": self.url, "send_resolved": True, "http_config": {"authorization": auth}}


def with_recorder(routes: list[dict[str, Any]], receivers: list[dict[str, Any]], recorder: Recorder) -> None:
    """Every alert but the heartbeat to the recorder (a route that lets the others match too), and the
    recorder told of each notification a person's receiver sends, under that receiver's name."""
    routes.insert(
        0,
        {
            "matchers": [f'alertname!="{HEARTBEAT}"'],
            "receiver": RECORDER_RECEIVER,
            "group_wait": "0s",
            "continue": True,
        },
    )
    for person in receivers:
        if person.get("webhook_configs") or person.get("email_configs"):
            person.setdefault("webhook_configs", []).append(recorder.webhook())
    receivers.append({"name": RECORDER_RECEIVER, "webhook_configs": [recorder.webhook()]})


def alertmanager_config(
    webhook_url: str | None, oncall: OnCall | None = None, today: date | None = None, recorder: Recorder | None = None
) -> dict[str, Any]:
    """Alerts grouped by node (one incident per machine), the Watchdog kept apart, inhibitions by cause.

    Without an on-call rotation: critical and warning to the webhook (resolved too), info
    kept in Alertmanager. With one: hub/monitoring/oncall.py's routes and escalation, the
    webhook URLs read from their files (SecretFileError when one is missing or empty).
    With ``recorder``: every alert and every notification also to the incident recorder.
    """
    default = Contact(name="default", webhook_url=webhook_url) if webhook_url else None
    if oncall and oncall.enabled:
        oncall = with_urls_read(oncall)
        routes = oncall_routes(oncall)
        receivers = [receiver("default", default), *oncall_receivers(oncall)]
        intervals = time_intervals(oncall, today or datetime.now(UTC).date())
    else:
        routes = [
            heartbeat_route(),
            # At once. (A rotation's first page waits first_page_after so that a cause inhibits its effects;
            # here that wait kept AlertmanagerDown from the webhook after Alertmanager resumed from a hang,
            # tests/e2e/test_monitoring_faults.py, for a reason not found yet: not applied until it is.)
            {"matchers": ['severity="critical"'], "receiver": "critical", "group_wait": "0s"},
            {"matchers": ['severity="warning"'], "receiver": "warning"},
        ]
        receivers = [receiver(name, default) for name in ("default", "critical", "warning")]
        receivers.append(receiver("deadman", None))
        intervals = []
    if recorder is not None:
        heartbeat = [r for r in receivers if r["name"] == "deadman"]
        others = [r for r in receivers if r["name"] != "deadman"]
        with_recorder(routes, others, recorder)
        receivers = [*others, *heartbeat]
    config: dict[str, Any] = {
        "route": {
            "receiver": "default",
            "group_by": ["node"],
            "group_wait": "10s",
            "group_interval": oncall.group_interval if oncall and oncall.enabled else "1m",
            "repeat_interval": "4h",
            "routes": routes,
        },
        "receivers": receivers,
        "inhibit_rules": INHIBIT_RULES,
    }
    if intervals:
        config["time_intervals"] = intervals
    if oncall and (smtp := smtp_globals(oncall, relay_password(oncall))):
        config["global"] = smtp
    return config
