"""The cluster's Alertmanager config, written into the one Secret it reads (Kubernetes REST API).

The chart's CronJob (templates/monitoring/renew-alertmanager.yaml) runs ``gpuslice
oncall-config --write-secret NAMESPACE/NAME`` every day with a ServiceAccount that may get
and update that Secret only (``resourceNames``): the rotation's 26 weeks never run out and a
changed webhook URL reaches Alertmanager by the next morning. The Secret must exist (the
Role cannot allow ``create`` for one name); its other keys are kept.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from spawner import environ

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class SecretWriteError(RuntimeError):
    """The Secret could not be read or written; the message says what to do."""


@dataclass
class Kube:
    """The API server with a bearer token (in a pod: its service account's)."""

    url: str
    session: requests.Session

    @classmethod
    def in_cluster(cls) -> Kube:
        url = environ.read().kube_api_url()
        if not url:
            raise SecretWriteError("not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST): run this in the CronJob")
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {(SERVICE_ACCOUNT / 'token').read_text().strip()}"
        session.verify = str(SERVICE_ACCOUNT / "ca.crt")
        return cls(url, session)


def write_config(kube: Kube, namespace: str, name: str, key: str, config: str) -> bool:
    """``config`` under ``key`` of the Secret ``namespace/name``; False when it already held exactly that."""
    path = f"{kube.url}/api/v1/namespaces/{namespace}/secrets/{name}"
    secret = _call(kube, "GET", path, namespace, name)
    encoded = base64.b64encode(config.encode()).decode()
    if (secret.get("data") or {}).get(key) == encoded:
        return False
    secret.setdefault("data", {})[key] = encoded
    _call(kube, "PUT", path, namespace, name, json=secret)  # resourceVersion kept: a concurrent change is a 409
    return True


def _call(kube: Kube, method: str, path: str, namespace: str, name: str, **kwargs: Any) -> dict[str, Any]:
    try:
        response = kube.session.request(method, path, timeout=30, **kwargs)
    except requests.RequestException as exc:
        raise SecretWriteError(f"the Kubernetes API did not answer ({type(exc).__name__})") from exc
    if response.status_code == 404:
        raise SecretWriteError(
            f"the Secret {namespace}/{name} does not exist: create it once (kubectl -n {namespace} create secret "
            f"generic {name}) and the next run fills it"
        )
    if response.status_code == 403:
        raise SecretWriteError(
            f"not allowed to {method} the Secret {namespace}/{name}: the chart's Role allows only the Secret named by "
            "monitoring.alertmanagerConfig.secretName in monitoring.alertmanagerConfig.secretNamespace"
        )
    if response.status_code == 409:
        raise SecretWriteError(f"the Secret {namespace}/{name} changed while it was written: the next run tries again")
    if not response.ok:
        raise SecretWriteError(f"{method} {namespace}/{name}: HTTP {response.status_code}")
    body: dict[str, Any] = response.json()
    return body
