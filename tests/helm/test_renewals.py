"""The chart's incident recorder and the CronJob that renews the cluster's Alertmanager config."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.test_chart import ALL_FEATURES, CHART, run_helm

pytestmark = pytest.mark.process  # starts helm


def rendered(tmp_path: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = run_helm("template", "gs", str(CHART), "--namespace", "jupyter", "--values", str(path))
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_without_an_alertmanager_nothing_is_added(tmp_path: Path) -> None:
    objects = rendered(tmp_path, {})
    portal = one(objects, "Deployment", "gs-gpuslice-portal")
    assert [c["name"] for c in portal["spec"]["template"]["spec"]["containers"]] == ["portal"]
    assert not [o for o in objects if o["kind"] == "CronJob"]


def test_the_recorder_runs_beside_the_store_with_its_token_and_only_alertmanager_reaches_it(tmp_path: Path) -> None:
    objects = rendered(tmp_path, {"monitoring": {"alertmanagerUrl": "http://am.monitoring:9093"}})
    pod = one(objects, "Deployment", "gs-gpuslice-portal")["spec"]["template"]["spec"]
    recorder = next(c for c in pod["containers"] if c["name"] == "incident-recorder")
    assert recorder["args"][:3] == ["python", "-m", "portal.recorder"]
    assert "--token-file=/etc/gpuslice-recorder/token" in recorder["args"]
    assert "--alertmanager-url=http://am.monitoring:9093" in recorder["args"]
    assert {m["mountPath"] for m in recorder["volumeMounts"]} >= {"/var/lib/gpuslice", "/etc/gpuslice-recorder"}
    token = next(v for v in pod["volumes"] if v["name"] == "recorder")
    assert token["secret"] == {"secretName": "gs-gpuslice-incident-recorder", "defaultMode": 0o440}
    assert "env" not in recorder or all("TOKEN" not in e["name"] for e in recorder["env"])  # a file, never env
    secret = one(objects, "Secret", "gs-gpuslice-incident-recorder")
    assert len(secret["data"]["token"]) >= 48
    ports = one(objects, "Service", "gs-gpuslice-portal")["spec"]["ports"]
    assert {"name": "recorder", "port": 9095, "targetPort": "recorder"} in ports
    rules = one(objects, "NetworkPolicy", "gs-gpuslice-portal")["spec"]["ingress"]
    recorder_rule = next(r for r in rules if r["ports"] == [{"port": 9095, "protocol": "TCP"}])
    assert recorder_rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]


def test_the_renew_cronjob_may_update_that_one_secret_and_no_other(tmp_path: Path) -> None:
    config = {"renew": True, "secretName": "gs-alertmanager", "secretNamespace": "monitoring"}
    objects = rendered(tmp_path, {"monitoring": {"alertmanagerUrl": "http://am:9093", "alertmanagerConfig": config}})
    role = one(objects, "Role", "gs-gpuslice-renew-alertmanager")
    assert role["metadata"]["namespace"] == "monitoring"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["gs-alertmanager"], "verbs": ["get", "update"]}
    ]
    binding = one(objects, "RoleBinding", "gs-gpuslice-renew-alertmanager")
    assert binding["metadata"]["namespace"] == "monitoring"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gs-gpuslice-renew-alertmanager", "namespace": "jupyter"}
    ]
    job = one(objects, "CronJob", "gs-gpuslice-renew-alertmanager")
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gs-gpuslice-renew-alertmanager"
    [container] = pod["containers"]
    assert container["args"][:2] == ["gpuslice", "oncall-config"]
    assert "--write-secret=monitoring/gs-alertmanager" in container["args"]
    assert "--recorder-url=http://gs-gpuslice-portal.jupyter.svc:9095/api/alertmanager" in container["args"]
    assert job["spec"]["schedule"] == "17 3 * * *" and job["spec"]["concurrencyPolicy"] == "Forbid"
    # In Alertmanager's namespace the chart puts that Role and its binding, and nothing else.
    elsewhere = {(o["kind"], o["metadata"]["name"]) for o in objects if o["metadata"].get("namespace") == "monitoring"}
    assert elsewhere == {("Role", "gs-gpuslice-renew-alertmanager"), ("RoleBinding", "gs-gpuslice-renew-alertmanager")}


def test_naming_the_secret_renews_it_by_default_and_renew_false_stops_it(tmp_path: Path) -> None:
    config = {"secretName": "gs-alertmanager", "secretNamespace": "monitoring"}
    objects = rendered(tmp_path, {"monitoring": {"alertmanagerConfig": config}})
    job = one(objects, "CronJob", "gs-gpuslice-renew-alertmanager")
    assert job["spec"]["schedule"] == "17 3 * * *"
    assert one(objects, "Role", "gs-gpuslice-renew-alertmanager")["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["gs-alertmanager"], "verbs": ["get", "update"]}
    ]
    (tmp_path / "off").mkdir()
    off = rendered(tmp_path / "off", {"monitoring": {"alertmanagerConfig": {**config, "renew": False}}})
    assert not [o for o in off if "renew-alertmanager" in o["metadata"]["name"]]


def install_notes(tmp_path: Path, values: dict[str, Any]) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = run_helm("install", "gs", str(CHART), "--dry-run=client", "--namespace", "jupyter", "--values", str(path))
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.partition("NOTES:")[2].split())


def test_a_rotation_nobody_renews_is_pointed_out_at_install(tmp_path: Path) -> None:
    oncall = {"rotation": [{"name": "bob", "email": "bob@example.org"}], "smtp_smarthost": "m:25", "smtp_from": "a@b.c"}
    warning = "this release does not renew it: it runs out unless you write it again"
    assert warning in install_notes(tmp_path, {"monitoring": {"oncall": oncall}})
    renewed = {"oncall": oncall, "alertmanagerConfig": {"secretName": "gs-alertmanager"}}
    notes = install_notes(tmp_path, {"monitoring": renewed})
    assert "gpuslice is installed" in notes and "runs out" not in notes


@pytest.mark.parametrize("bad", [{"alertmanagerConfig": {"renw": True}}, {"incidentRecorder": {"port": "x"}}])
def test_the_schema_refuses_a_misspelt_or_wrong_value(tmp_path: Path, bad: dict[str, Any]) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({"monitoring": bad}))
    assert run_helm("template", "gs", str(CHART), "--values", str(path)).returncode != 0


def test_all_features_renders_the_cronjobs_and_the_recorder(tmp_path: Path) -> None:
    result = run_helm("template", "gs", str(CHART), "--namespace", "jupyter", "--values", str(ALL_FEATURES))
    assert result.returncode == 0, result.stderr
    kinds = {(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(result.stdout) if o}
    assert ("CronJob", "gs-gpuslice-renew-alertmanager") in kinds
    assert ("CronJob", "gs-gpuslice-idle-notices") in kinds
    assert ("Secret", "gs-gpuslice-incident-recorder") in kinds
