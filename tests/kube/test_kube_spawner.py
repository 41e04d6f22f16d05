"""KubeGpuSpawner's pod manifests and decisions, without an API server (KubeSpawner's _mock mode)."""

import asyncio
import copy
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kubernetes_validate
import pytest
import yaml
from jupyterhub.objects import Hub
from kubernetes_asyncio.client import ApiClient

from spawner.kube import CACHES, ClusterCache, KubeGpuSpawner, Snapshot, scheduling_message, usage_from_pods
from spawner.request import GpuRefused
from spawner.shares import parse_request
from spawner.sharing import build_kube
from spawner.sharing.gpushare import Gpushare
from tests.kube.conftest import gpushare_node
from tests.kube.dra import unallocatable

SHARING_FIXTURES = Path(__file__).parents[1] / "spawner" / "sharing" / "fixtures"
CARD_0 = "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"  # gpu-a's first GPU in dra_cluster.yaml

GiB = 2**30


class StubUser:
    """What KubeSpawner reads of JupyterHub's User."""

    def __init__(self, name: str, groups: tuple[str, ...] = (), admin: bool = False) -> None:
        self.name, self.id, self.admin = name, 1, admin
        self.url, self.escaped_name = f"/user/{name}/", name
        self.groups = [SimpleNamespace(name=g) for g in groups]
        self.spawners: dict[str, Any] = {}
        self.settings: dict[str, Any] = {}


def make(backend: str, user: StubUser | None = None, **options: Any) -> KubeGpuSpawner:
    spawner: KubeGpuSpawner = in_loop(
        lambda: KubeGpuSpawner(
            hub=Hub(), user=user or StubUser("ann"), api_token="t", oauth_client_id="jupyterhub-user-ann", _mock=True
        )
    )
    spawner.gpu_backend = backend
    spawner.user_options = options
    spawner.gpu_images = {"default": {"container": "ghcr.io/gpuslice/notebook-base:1.0"}}
    return spawner


def manifest(spawner: KubeGpuSpawner, gpu_memory: str, gpus: int = 0) -> dict[str, Any]:
    request = parse_request(gpu_memory, gpus, largest_card_bytes=40 * GiB, most_cards=8)
    spawner._apply(request, "ghcr.io/gpuslice/notebook-base:1.0", "ml101", [], "NVIDIA-A100-SXM4-40GB")
    return pod_of(spawner)


def pod_of(spawner: KubeGpuSpawner) -> dict[str, Any]:
    async def render() -> dict[str, Any]:
        pod = await spawner.get_pod_manifest()
        async with ApiClient() as client:
            return dict(client.sanitize_for_serialization(pod))

    return LOOP.run_until_complete(render())


LOOP = asyncio.new_event_loop()


def in_loop(build: Any) -> Any:
    """KubeSpawner must be built inside a running event loop."""

    async def inside() -> Any:
        return build()

    return LOOP.run_until_complete(inside())


@pytest.mark.parametrize(
    ("backend", "gpu_memory", "gpus", "limits"),
    [
        ("gpushare", "4GiB", 0, {"aliyun.com/gpu-mem": "4"}),
        ("hami", "4GiB", 0, {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}),
        ("timeslicing", "4GiB", 0, {"nvidia.com/gpu.shared": "1"}),
        ("mig", "4GiB", 0, {"nvidia.com/mig-1g.5gb": "1"}),
        ("whole", "0", 2, {"nvidia.com/gpu": "2"}),
    ],
)
def test_pod_manifests_for_every_backend_are_valid_kubernetes(
    backend: str, gpu_memory: str, gpus: int, limits: dict[str, str]
) -> None:
    pod = manifest(make(backend), gpu_memory, gpus)
    kubernetes_validate.validate(pod, "1.30", strict=True)
    container = pod["spec"]["containers"][0]
    for resource, amount in limits.items():
        assert container["resources"]["limits"][resource] == amount, container["resources"]
    assert pod["metadata"]["annotations"]["gpuslice.io/sharing-backend"] == backend
    assert pod["metadata"]["annotations"]["gpuslice.io/group"] == "ml101"
    assert container["image"] == "ghcr.io/gpuslice/notebook-base:1.0"


def test_a_cpu_only_server_sees_no_gpu() -> None:
    pod = manifest(make("hami"), "0")
    kubernetes_validate.validate(pod, "1.30", strict=True)
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert not any("gpu" in r for r in (container.get("resources") or {}).get("limits") or {})
    assert "JUPYTERHUB_ACTIVITY_INTERVAL" not in env  # never reclaimed for the GPU line: the default reports


def test_a_gpu_server_reports_its_activity_within_the_gpu_lines_warning() -> None:
    """A use during the reclaimer's warning must reach the hub before the stop (as on one machine)."""
    spawner = make("gpushare")
    env = {e["name"]: e.get("value") for e in manifest(spawner, "4GiB")["spec"]["containers"][0]["env"]}
    assert float(env["JUPYTERHUB_ACTIVITY_INTERVAL"]) <= spawner.gpu_warning_lead / 6


def test_a_second_spawn_starts_from_the_configured_settings_not_the_last_pod() -> None:
    spawner = make("gpushare")
    manifest(spawner, "8GiB")
    pod = manifest(spawner, "0")
    assert "aliyun.com/gpu-mem" not in (pod["spec"]["containers"][0]["resources"].get("limits") or {})


def test_models_are_read_only_volume_mounts() -> None:
    spawner = make("gpushare")
    spawner.gpu_models_volume = {"persistentVolumeClaim": {"claimName": "gpuslice-models", "readOnly": True}}
    request = parse_request("1GiB", 0, largest_card_bytes=16 * GiB, most_cards=1)
    mounts = [{"name": "gpuslice-models", "mountPath": "/models/langid-97", "subPath": "langid-97", "readOnly": True}]
    spawner._apply(request, "img:1", None, mounts)
    pod = pod_of(spawner)
    kubernetes_validate.validate(pod, "1.30", strict=True)
    container = pod["spec"]["containers"][0]
    assert {"name": "gpuslice-models", "mountPath": "/models/langid-97", "subPath": "langid-97", "readOnly": True} in [
        dict(m) for m in container["volumeMounts"]
    ]
    assert {"name": "gpuslice-models", "persistentVolumeClaim": {"claimName": "gpuslice-models", "readOnly": True}} in [
        dict(v) for v in pod["spec"]["volumes"]
    ]


def test_profiles_are_limited_to_their_groups_on_the_server_side() -> None:
    spawner = make("gpushare", StubUser("ann", groups=("ml101",)), profile="a100")
    spawner.gpu_profile_groups = {"a100": ["research"]}
    with pytest.raises(GpuRefused) as refused:
        spawner._check_profile()
    assert refused.value.status_code == 403 and "only for the groups research" in refused.value.jupyterhub_message
    make("gpushare", StubUser("ann", groups=("research",)), profile="a100")._check_profile()
    make("gpushare", StubUser("root", admin=True), profile="a100")._check_profile()


def test_usage_comes_from_the_pods_annotations() -> None:
    def pod(name: str, user: str, group: str, gib: int, phase: str = "Running") -> dict[str, Any]:
        annotations = {
            "hub.jupyter.org/username": user,
            "gpuslice.io/group": group,
            "gpuslice.io/gpu-memory-bytes": str(gib * GiB),
        }
        return {"metadata": {"name": name, "annotations": annotations}, "status": {"phase": phase}}

    pods = [
        pod("jupyter-ann", "ann", "ml101", 4),
        pod("jupyter-bob", "bob", "ml101", 2),
        pod("old", "ann", "ml101", 8, "Succeeded"),
    ]
    usage = usage_from_pods(pods, "ann", except_pod="jupyter-ann--lab")
    assert usage.user_servers == 1 and usage.group_bytes == {"ml101": 6 * GiB}
    assert usage_from_pods(pods, "ann", except_pod="jupyter-ann").user_servers == 0


def test_scheduling_explanations() -> None:
    spawner = make("gpushare")
    spawner._gpu_request = (parse_request("8GiB", 0, largest_card_bytes=15 * GiB, most_cards=2), "default")
    full = {
        "metadata": {"name": "x", "annotations": {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "10"}},
        "spec": {
            "nodeName": "gpu-a",
            "containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "10"}}}],
        },
        "status": {"phase": "Running"},
    }
    nodes = [gpushare_node("gpu-a", 1, 15)]

    async def cluster(pods: list[dict[str, Any]]) -> Any:
        return build_kube(nodes, pods, Gpushare()), pods

    spawner.cluster = lambda: cluster([full])  # type: ignore[method-assign]
    text = LOOP.run_until_complete(
        spawner._scheduling_explanation("0/1 nodes are available: 1 Insufficient aliyun.com/gpu-mem.")
    )
    assert text.startswith("Waiting for a GPU: Nothing can hold 8 GiB of one GPU right now.")
    assert "The largest free slice is 5 GiB on gpu-a GPU 0" in text and text.endswith("gpu-mem.)")
    spawner.cluster = lambda: cluster([])  # type: ignore[method-assign]
    text = LOOP.run_until_complete(spawner._scheduling_explanation("0/1 nodes are available"))
    assert "workloads outside it hold the GPUs" in text
    assert scheduling_message("m", "e") == "Waiting for a GPU: e (scheduler: m)"


def test_a_dra_claim_kube_scheduler_cannot_allocate_is_explained_from_the_room_it_waits_for(tmp_path: Path) -> None:
    """The pod's own placement (held for it until its claim is allocated) is not room taken from it, and the hub,
    which lists every claim in the cluster, names the card its claim asks for instead of unseen workloads."""
    objects = yaml.safe_load((SHARING_FIXTURES / "dra_cluster.yaml").read_text())["items"]
    nodes = [o for o in objects if o["kind"] == "Node"]
    slices = [o for o in objects if o["kind"] == "ResourceSlice"]
    spawner = make("dra", StubUser("cara"), gpu_memory="4GiB")
    spawner.gpu_ledger_path = str(tmp_path / "ledger.sqlite")
    spawner.gpu_inventory_ttl = 3600.0

    def listed(*claims: dict[str, Any]) -> None:  # the hub's listing: nodes, the driver's slices, every claim
        cache = CACHES.setdefault(spawner.namespace, ClusterCache())
        cache._snapshot = Snapshot(nodes, [], math.inf, {"resourceslices": slices, "resourceclaims": [*claims]})

    def claim(name: str, device: str, memory: str | None) -> dict[str, Any]:
        result: dict[str, Any] = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-a", "device": device}
        if memory:
            result["consumedCapacity"] = {"memory": memory}
        meta = {"name": name, "namespace": "lab", "ownerReferences": [{"kind": "Pod", "name": name}]}
        return {"metadata": meta, "status": {"allocation": {"devices": {"results": [result]}}}}

    listed()
    LOOP.run_until_complete(spawner._check_and_place())
    assert spawner._gpu_card is not None and spawner._gpu_card.uuid == CARD_0  # the claim asks for this card
    assert CARD_0 in json.dumps(spawner._gpu_claim)
    filters, postfilter = unallocatable(1)  # the pod's PodScheduled condition and event, as kube-scheduler words it
    scheduler = f"0/1 nodes are available: {filters}. {postfilter}"
    try:
        # Another namespace's claim takes 38 GiB of that card before kube-scheduler reaches the pod.
        listed(claim("lab-notebook", "gpu-0", "38Gi"))
        text = LOOP.run_until_complete(spawner._scheduling_explanation(scheduler))
        assert text == (
            "Waiting for a GPU: its claim asks for gpu-a GPU 0 (NVIDIA A100-SXM4-40GB), the card chosen when it was "
            "placed, where 2 GiB is free now; the server starts when 4 GiB is free there; gpu-a GPU 1 has room "
            f"now: start again to be placed there. (scheduler: {scheduler})"
        )
        # The other card is taken whole too: nothing holds 4 GiB, said as the hub says it at a refusal, with
        # the 2 GiB truly free (not the 4 GiB held for this very pod).
        listed(claim("lab-notebook", "gpu-0", "38Gi"), claim("lab-trainer", "gpu-1", None))
        text = LOOP.run_until_complete(spawner._scheduling_explanation(scheduler))
        assert text.startswith("Waiting for a GPU: Nothing can hold 4 GiB of one GPU right now.")
        assert "The largest free slice is 2 GiB on gpu-a GPU 0" in text and text.endswith(f"(scheduler: {scheduler})")
    finally:
        spawner._forget_placement()
        CACHES.pop(spawner.namespace, None)


def test_notebook_pods_meet_the_restricted_profile_with_the_charts_settings() -> None:
    from tests.helm.test_chart import restricted_violations

    spawner = make("gpushare")
    spawner.uid, spawner.fs_gid = 1000, 1000
    spawner.allow_privilege_escalation = False
    spawner.pod_security_context = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    spawner.container_security_context = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
    }
    pod = manifest(spawner, "4GiB")
    assert restricted_violations({"spec": {"template": {"spec": pod["spec"]}}}) == []


def test_volumes_set_as_dicts_as_zero_to_jupyterhub_sets_them() -> None:
    # z2jh's jupyterhub_config.py: volumes and mounts are dicts keyed by name (so values files merge).
    spawner = make("gpushare")
    spawner.volumes = {
        "volume-{user_server}": {"name": "volume-{user_server}", "persistentVolumeClaim": {"claimName": "{pvc_name}"}}
    }
    spawner.volume_mounts = {"volume-{user_server}": {"name": "volume-{user_server}", "mountPath": "/home/jovyan"}}
    spawner.gpu_models_volume = {"persistentVolumeClaim": {"claimName": "gpuslice-models", "readOnly": True}}
    request = parse_request("1GiB", 0, largest_card_bytes=16 * GiB, most_cards=1)
    mounts = [{"name": "gpuslice-models", "mountPath": "/models/langid-97", "subPath": "langid-97", "readOnly": True}]
    spawner._apply(request, "img:1", None, mounts)
    pod = pod_of(spawner)
    kubernetes_validate.validate(pod, "1.30", strict=True)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["volume-ann"]["persistentVolumeClaim"] == {"claimName": "claim-ann"}
    assert "gpuslice-models" in volumes
    paths = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert paths["/home/jovyan"] == "volume-ann" and paths["/models/langid-97"] == "gpuslice-models"
    # A second spawn without models starts from the configured dicts again.
    spawner._apply(request, "img:1", None, [])
    assert [v["name"] for v in pod_of(spawner)["spec"]["volumes"]] == ["volume-ann"]


def test_gpu_pods_go_to_the_scheduler_with_the_extender_cpu_pods_keep_the_configured_one() -> None:
    spawner = make("hami")
    spawner.scheduler_name = "jhub-user-scheduler"  # what z2jh sets with its user scheduler on
    spawner.gpu_scheduler_name = "hami-scheduler"
    assert manifest(spawner, "4GiB")["spec"]["schedulerName"] == "hami-scheduler"
    assert manifest(spawner, "0")["spec"]["schedulerName"] == "jhub-user-scheduler"
    spawner.gpu_scheduler_name = ""
    assert manifest(spawner, "4GiB")["spec"]["schedulerName"] == "jhub-user-scheduler"


def test_a_spawn_adds_to_the_pod_and_leaves_kubespawners_traits_as_configured() -> None:
    spawner = make("gpushare")
    spawner.gpu_models_volume = {"persistentVolumeClaim": {"claimName": "gpuslice-models", "readOnly": True}}
    traits = ("extra_resource_limits", "extra_annotations", "environment", "image", "volumes", "volume_mounts")
    configured = {name: copy.deepcopy(getattr(spawner, name)) for name in (*traits, "scheduler_name")}
    request = parse_request("4GiB", 0, largest_card_bytes=16 * GiB, most_cards=1)
    mounts = [{"name": "gpuslice-models", "mountPath": "/models/langid-97", "subPath": "langid-97", "readOnly": True}]
    spawner._apply(request, "img:2", "ml101", mounts)
    pod = pod_of(spawner)
    assert pod["spec"]["containers"][0]["image"] == "img:2"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"] == "4"
    assert {name: getattr(spawner, name) for name in configured} == configured  # get_pod_manifest added them


def test_a_dra_pod_claims_its_gpu_from_the_template_named_after_it() -> None:
    spawner = make("dra")
    pod = manifest(spawner, "4GiB")
    kubernetes_validate.validate(pod, "1.34", strict=True)  # resourceClaimTemplateName: Kubernetes 1.31 and later
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "jupyter-ann-gpu"}]
    container = pod["spec"]["containers"][0]
    assert container["resources"]["claims"] == [{"name": "gpu"}]
    assert not any("nvidia.com" in r for r in container["resources"].get("limits") or {})
    assert spawner._gpu_claim is not None
    request = spawner._gpu_claim["spec"]["devices"]["requests"][0]
    assert request["exactly"]["capacity"] == {"requests": {"memory": "4096Mi"}}
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "t"}}
    kubernetes_validate.validate({**template, "spec": spawner._gpu_claim}, "1.34", strict=True)
    assert "resourceClaims" not in manifest(spawner, "0")["spec"]  # a CPU-only server claims nothing


def test_a_kai_pod_names_kai_its_queue_and_its_fraction() -> None:
    spawner = make("kai")
    spawner.scheduler_name = "jhub-user-scheduler"
    pod = manifest(spawner, "4GiB")
    kubernetes_validate.validate(pod, "1.30", strict=True)
    assert pod["spec"]["schedulerName"] == "kai-scheduler"
    assert pod["metadata"]["labels"]["kai.scheduler/queue"] == "ml101"
    assert pod["metadata"]["annotations"]["gpu-memory"] == "4096"
    assert manifest(spawner, "0")["spec"]["schedulerName"] == "jhub-user-scheduler"  # CPU only: not KAI's
