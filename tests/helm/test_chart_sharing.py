"""The chart with the dra and kai backends: their RBAC, KAI's queues from the classes' budgets, the settings."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.test_chart import render

pytestmark = pytest.mark.process  # runs helm


def values(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(text)
    return path


def hub_settings(docs: list[dict[str, Any]]) -> dict[str, Any]:
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-hub"))
    found: dict[str, Any] = yaml.safe_load(config["data"]["values.yaml"])
    return found


def test_dra_lets_the_hub_read_devices_and_claims_and_write_claim_templates(tmp_path: Path) -> None:
    docs = render(values(tmp_path, "gpuSharing: {backend: dra, dra: {slices: timeslicing}}\n"))
    nodes = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-nodes"))
    assert {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices", "resourceclaims"],
        "verbs": ["get", "watch", "list"],
    } in nodes["rules"]
    claims = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("-hub-claims"))
    assert claims["rules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaimtemplates"],
            "verbs": ["get", "create", "delete"],
        }
    ]
    assert hub_settings(docs)["backendSettings"]["slices"] == "timeslicing"
    assert not any(d["kind"] == "Queue" for d in docs)


def test_kai_makes_a_queue_per_class_from_its_budget_and_reads_the_reservation_pods(tmp_path: Path) -> None:
    text = """
gpuSharing: {backend: kai, kai: {createQueues: true, cardMemory: 16GiB, queues: {ai2: ai-two}}}
groups:
  ml101: {members: [a], maxSlice: 4GiB, budget: 40GiB}
  ai2: {members: [b], budget: 512MiB}
  open: {members: [c]}
"""
    docs = render(values(tmp_path, text))
    queues = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Queue"}
    assert set(queues) == {"gpuslice", "ml101", "ai-two", "open"}
    assert queues["ml101"]["parentQueue"] == "gpuslice" and queues["ml101"]["resources"]["gpu"]["quota"] == 2.5
    assert queues["ai-two"]["resources"]["gpu"]["limit"] == 0.03  # 512 MiB of a 16 GiB card
    assert queues["open"]["resources"]["gpu"]["quota"] == -1  # no budget: no limit
    reservations = next(
        d for d in docs if d["kind"] == "Role" and d["metadata"].get("namespace") == "kai-resource-reservation"
    )
    assert reservations["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]}]
    assert hub_settings(docs)["backendSettings"]["queues"] == {"ai2": "ai-two"}
    assert not any(d["kind"] == "Queue" for d in render(values(tmp_path, "gpuSharing: {backend: kai}\n")))


def queue_readers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Roles and ClusterRoles that grant anything on KAI's API group."""
    return [
        d
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
        and any("scheduling.run.ai" in rule.get("apiGroups", []) for rule in d.get("rules") or [])
    ]


def test_under_kai_only_the_portal_may_read_kais_queues_for_the_teaching_page(tmp_path: Path) -> None:
    docs = render(values(tmp_path, "gpuSharing: {backend: kai}\n"))
    (role,) = queue_readers(docs)  # the hub gets none: it only labels pods with their queue
    assert role["kind"] == "ClusterRole"  # Queues are cluster-scoped
    assert role["rules"] == [{"apiGroups": ["scheduling.run.ai"], "resources": ["queues"], "verbs": ["get", "list"]}]
    binding = next(
        d for d in docs if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == role["metadata"]["name"]
    )
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gs-gpuslice-portal", "namespace": "jupyter"}]
    for other in ("gpushare", "dra"):
        assert not queue_readers(render(values(tmp_path, f"gpuSharing: {{backend: {other}}}\n"))), other
    assert not queue_readers(render(values(tmp_path, "gpuSharing: {backend: kai}\nportal: {enabled: false}\n")))
