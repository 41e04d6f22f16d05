"""Zero to JupyterHub mode: the real z2jh 4.4.0 chart with helm/z2jh-values.yaml, and helm/gpuslice as its companion.

Everything here is rendered by a real helm, which validates values against each chart's
values.schema.json (z2jh's is the one its own tooling generates).
"""

import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import kubernetes_validate
import pytest
import yaml
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement

from tests.kube.apiserver import matches_labels, rbac_allows
from tests.kube.z2jh import (
    COMPANION,
    HAMI,
    OVERLAY,
    find,
    helm,
    hub_deployment,
    hub_values,
    rbac_objects,
    render_companion,
    render_z2jh,
    z2jh_chart,
)

REPO = Path(__file__).parents[2]
IMAGES = REPO / "images"


def selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())


def pod_labels(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, str]:
    return dict(find(docs, kind, name)["spec"]["template"]["metadata"]["labels"])


@pytest.mark.process
def test_the_overlay_renders_on_z2jh_with_its_schema_on(tmp_path: Path) -> None:
    docs = render_z2jh()
    hub = hub_deployment(docs)
    assert hub["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/gpuslice/hub:0.1.0"
    config = hub_values(docs)["hub"]["config"]
    assert config["JupyterHub"]["spawner_class"] == "spawner.kube.KubeGpuSpawner"
    assert "gpuslice-rbac" not in (hub_values(docs)["hub"].get("extraConfig") or {})  # the companion grants it
    # The schema really is checked: a misspelt key is refused.
    typo = tmp_path / "typo.yaml"
    typo.write_text("singleuser: {cloudMetaData: {blockWithIptables: false}}\n")
    result = helm("template", "jhub", str(z2jh_chart()), "-f", str(OVERLAY), "-f", str(typo))
    assert result.returncode != 0 and "cloudMetaData" in result.stderr, result.stderr


@pytest.mark.process
@pytest.mark.parametrize(("extra", "scheduler"), [((), "default-scheduler"), ((HAMI,), "hami-scheduler")])
def test_gpu_pods_name_a_scheduler_with_the_extender_not_the_user_scheduler(
    extra: tuple[Path, ...], scheduler: str
) -> None:
    docs = render_z2jh(*extra)
    values = hub_values(docs)
    # z2jh's user scheduler is a kube-scheduler profile: plugins and pluginConfig only, no
    # extenders (a top-level field of KubeSchedulerConfiguration its ConfigMap does not render).
    user_scheduler = next(d for d in docs if d["kind"] == "ConfigMap" and "config.yaml" in d["data"])
    config = yaml.safe_load(user_scheduler["data"]["config.yaml"])
    assert "extenders" not in config
    spawner = values["hub"]["config"]["KubeGpuSpawner"]
    assert spawner["gpu_scheduler_name"] == scheduler
    assert scheduler not in {p["schedulerName"] for p in config["profiles"]}


@pytest.mark.process
def test_with_hami_the_privileged_metadata_blocker_is_off() -> None:
    assert hub_values(render_z2jh())["singleuser"]["cloudMetadata"]["blockWithIptables"] is True  # z2jh's default
    hami = hub_values(render_z2jh(HAMI))
    assert hami["singleuser"]["cloudMetadata"]["blockWithIptables"] is False
    assert hami["hub"]["config"]["KubeGpuSpawner"]["gpu_backend"] == "hami"


# z2jh's naming: fullnameOverride "" (its default: hub, proxy-public), null (<release>-jupyterhub-...
# or <release>-... when the release name holds "jupyterhub"), or a name of one's own.
NAMINGS = [("jhub", '""'), ("jhub", "null"), ("my-jupyterhub", "null"), ("jhub", '"lab"')]


@pytest.mark.process
@pytest.mark.parametrize(("release", "override"), NAMINGS, ids=[f"{r}-{o}" for r, o in NAMINGS])
def test_the_companion_is_wired_to_the_z2jh_release(release: str, override: str) -> None:
    z2jh = render_z2jh(release=release, sets=(f"fullnameOverride={override}",))
    companion = render_companion(z2jh_release=release, sets=(f"z2jh.fullnameOverride={override}",))

    # No second hub or proxy; the portal and the exporter are there.
    workloads = {d["metadata"]["name"] for d in companion if d["kind"] in ("Deployment", "DaemonSet")}
    assert workloads >= {"gpuslice-portal", "gpuslice-exporter"}
    assert not [w for w in workloads if w.endswith(("-hub", "-proxy"))], workloads
    assert not [d for d in companion if d["kind"] == "Service" and "hub" in d["metadata"]["name"]]

    hub = hub_deployment(z2jh)
    hub_service = find(z2jh, "Service", hub["metadata"]["name"])
    portal = find(companion, "Deployment", "gpuslice-portal")["spec"]["template"]
    env = {e["name"]: e for e in portal["spec"]["containers"][0]["env"]}
    api = urlparse(env["JUPYTERHUB_API_URL"]["value"])
    assert api.hostname == hub_service["metadata"]["name"]
    assert api.port in {p["port"] for p in hub_service["spec"]["ports"]}
    token = env["JUPYTERHUB_API_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token["key"] in find(z2jh, "Secret", token["name"])["data"]  # z2jh's generated portal token

    # z2jh's hub NetworkPolicy lets the portal in; the portal's lets z2jh's proxy in.
    hub_policy = find(z2jh, "NetworkPolicy", hub["metadata"]["name"])
    sources = [s["podSelector"]["matchLabels"] for rule in hub_policy["spec"]["ingress"] for s in rule["from"]]
    portal_pod = {"metadata": {"labels": portal["metadata"]["labels"]}}
    assert any(matches_labels(portal_pod, selector(s)) for s in sources), sources
    portal_policy = find(companion, "NetworkPolicy", "gpuslice-portal")
    proxy_pod = {"metadata": {"labels": pod_labels(z2jh, "Deployment", f"{hub['metadata']['name'][:-3]}proxy")}}
    allowed = portal_policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert matches_labels(proxy_pod, selector(allowed)), (allowed, proxy_pod)

    # RBAC: z2jh's hub account lists nodes only thanks to the companion, and keeps its pod rights.
    account = f"system:serviceaccount:jhub:{hub['spec']['template']['spec']['serviceAccountName']}"
    assert not rbac_allows(rbac_objects(z2jh), account, "list", "nodes", "")
    both = rbac_objects(z2jh, companion)
    assert rbac_allows(both, account, "list", "nodes", "") and rbac_allows(both, account, "watch", "nodes", "")
    assert rbac_allows(both, account, "create", "pods", "jhub") and rbac_allows(both, account, "list", "events", "jhub")
    # Writing who stopped a server (an event that outlives the pod): z2jh's Role does not grant it.
    assert not rbac_allows(rbac_objects(z2jh), account, "create", "events", "jhub")
    assert rbac_allows(both, account, "create", "events", "jhub")
    assert not rbac_allows(both, account, "create", "pods", "elsewhere")


@pytest.mark.process
def test_the_overlay_names_the_companions_portal_service() -> None:
    url = urlparse(yaml.safe_load(OVERLAY.read_text())["hub"]["services"]["portal"]["url"])
    portal = find(render_companion(), "Service", "gpuslice-portal")
    assert url.hostname == portal["metadata"]["name"] and url.port == portal["spec"]["ports"][0]["port"]


@pytest.mark.process
def test_the_companion_is_valid_kubernetes_and_lints(tmp_path: Path) -> None:
    for doc in render_companion():
        kubernetes_validate.validate(doc, "1.30", strict=True)
    values = tmp_path / "companion.yaml"
    values.write_text("hub: {enabled: false}\nz2jh: {releaseName: jhub, fullnameOverride: null}\n")
    result = helm("lint", "--strict", str(COMPANION), "--values", str(values))
    assert result.returncode == 0, result.stdout + result.stderr


# -- the images ----------------------------------------------------------------------------


def constraints() -> dict[str, str]:
    pins = {}
    for line in (IMAGES / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            pins[requirement.name.lower()] = str(requirement.specifier).removeprefix("==")
    return pins


def pip_installs(dockerfile: Path) -> list[str]:
    runs = [i["value"] for i in DockerfileParser(str(dockerfile)).structure if i["instruction"] == "RUN"]
    return [cmd for run in runs for cmd in re.split(r"&&", run) if re.search(r"\bpip install\b", cmd)]


def test_hub_and_notebook_images_share_one_pinned_jupyterhub_the_one_z2jh_runs() -> None:
    pins = constraints()
    app_version = yaml.safe_load((z2jh_chart() / "Chart.yaml").read_text())["appVersion"]
    assert pins["jupyterhub"] == app_version  # z2jh starts the hub with --upgrade-db
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {Requirement(d).name.lower(): Requirement(d) for d in dependencies}
    assert declared["jupyterhub"].specifier.contains(pins["jupyterhub"])
    assert "pycurl" in declared  # z2jh's config loads tornado's curl client
    for name in ("hub", "notebook-base"):
        dockerfile = IMAGES / name / "Dockerfile"
        installs = pip_installs(dockerfile)
        assert installs, dockerfile
        for command in installs:
            assert "-c /tmp/constraints.txt" in command, command  # every install takes the shared pins
            assert "==" not in command, command  # and pins nothing of its own
        assert "COPY images/constraints.txt /tmp/constraints.txt" in dockerfile.read_text()


def test_every_image_pin_is_within_the_range_the_package_declares() -> None:
    """The images run what the virtualenv's tests ran: a pin outside pyproject.toml's range (say a
    jsonschema whose import builds rfc3987_syntax's parsers, which the range keeps out) fails here."""
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {Requirement(d).name.lower(): Requirement(d).specifier for d in dependencies}
    outside = {
        name: f"{pin} not in {declared[name]}"
        for name, pin in constraints().items()
        if name in declared and not declared[name].contains(pin)
    }
    assert not outside, outside


def test_the_hub_image_carries_pycurl_and_libcurl() -> None:
    text = (IMAGES / "hub" / "Dockerfile").read_text()
    assert any("pycurl" in command.split() for command in pip_installs(IMAGES / "hub" / "Dockerfile"))
    assert "libcurl4-openssl-dev" in text  # to build it
    assert re.search(r"apt-get install[^\n]*\blibcurl4\b", text)  # to run it
